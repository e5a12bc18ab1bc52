"""Helpers shared by the test suite and the benchmark: servers the tests start themselves."""
