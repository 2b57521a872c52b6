"""Tests of the benchmarks: the report, its README table, and the e-graph growth notebook."""
