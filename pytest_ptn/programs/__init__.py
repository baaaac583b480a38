"""The programs under test: the scenario catalogue, the torch programs built from it, and their exports."""
