"""Tests of the search layer: the e-graph exploration and the TASO-style sequential search."""
