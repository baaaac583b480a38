"""Backends shipped with pytest-ptn, each registered in the ``pytest_ptn.backends`` entry-point group."""
