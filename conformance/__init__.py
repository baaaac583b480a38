"""The pytest-ptn conformance suite. Installed as ``pytest_ptn.conformance``; run it with
``pytest --ptn-backend=NAME`` from any folder."""
