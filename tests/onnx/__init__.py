"""Tests of the onnx layer: ONNX import and export, numerical verification, the built-in benchmark models."""
