"""Tests of the extraction layer: extraction over egraph-serialize JSON e-graphs and its command line."""
