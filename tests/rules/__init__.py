"""Tests of the rules layer: the rule language, the rule library and the concrete-graph matcher."""
