"""Tests of the cli layer: the tensat command's flags, help, and error style."""
