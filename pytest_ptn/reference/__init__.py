"""The reference implementation of the rules: packaging planner, zip package format and sharing loader."""
