"""Fixture files here are inputs of tests, not tests: ``divergent.run.jsonl`` fails
to replay on purpose, so the ``*.run.jsonl`` collector of the graphrun pytest
plugin must not pick it up."""

collect_ignore_glob = ["*.run.jsonl"]
