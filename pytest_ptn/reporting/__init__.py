"""The conformance report: collected on the pytest side, kept as plain results data, shown as a matrix."""
