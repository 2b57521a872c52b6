"""Tests of the base layer: the operator registry."""
