"""Recorded runs: replay, divergence, regression, export/import, the pytest plugin."""
