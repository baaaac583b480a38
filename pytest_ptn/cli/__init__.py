"""``python -m pytest_ptn``: the verbs run outside a pytest run (list, report, expectations, new-backend)."""
