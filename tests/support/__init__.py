"""Real servers and helpers the test suite (and benchmarks) run against."""
