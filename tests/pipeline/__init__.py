"""Tests of the pipeline layer: tensat.optimize end to end, its faults and properties, the comparison."""
