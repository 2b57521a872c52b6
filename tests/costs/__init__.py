"""Tests of the costs layer: the measured cost model, its cache, the latency check and the cost report."""
