"""The test suite, one folder per layer of the codebase (the layers are listed and checked in test_layers.py).

base (operators), rules (the rule library and the concrete-graph matcher), extraction, onnx (import, export,
verification, the built-in models), costs (the analytic and the measured cost models), search (the e-graph and the
sequential search), pipeline (`tensat.optimize` end to end, its faults and properties, the comparison of the two
searches), cli (the `tensat` command: its flags, help and error style), bench (the benchmark report and the notebook).
A test file lives in the folder of the layer it tests and may use any layer below it. helpers.py holds what tests of
several folders share; conftest.py the hypothesis profiles.
"""
