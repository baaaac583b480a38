"""Backends shipped with pytest-ptn; each registers itself in the ``pytest_ptn.backends`` entry-point group."""
