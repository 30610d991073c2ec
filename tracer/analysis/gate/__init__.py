"""Comparing runs: diff, the CI history and the pytest budget check."""
