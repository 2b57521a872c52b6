"""`python -m bench.dynamic_report`: the shapes a dynamic model is timed at, the dims read off a model, and the
report's rows (the benchmark itself optimizes and times the corpus, and is run by hand)."""

from __future__ import annotations

from onnx import TensorProto, helper

from bench.dynamic_report import markdown, symbolic_io, timing_shapes
from tests.helpers import TEST_MACHINE


def _model(x_dims: list[int | str], out_dims: list[int | str]) -> object:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, x_dims)
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, out_dims)
    return helper.make_model(helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [x], [y]))


def test_a_sequence_model_is_timed_at_a_batch_of_4_and_at_twice_its_length() -> None:
    model = _model(["batch", "sequence"], ["batch", "sequence"])
    assert timing_shapes(model, {"x": [1, 128]}) == [{"x": [1, 128]}, {"x": [4, 128]}, {"x": [1, 256]}]


def test_a_model_whose_only_symbolic_dim_is_its_batch_is_timed_at_batches_4_and_2() -> None:
    model = _model(["N", 3, 8, 8], ["N", 3, 8, 8])
    assert timing_shapes(model, {"x": [1, 3, 8, 8]}) == [{"x": [1, 3, 8, 8]}, {"x": [4, 3, 8, 8]}, {"x": [2, 3, 8, 8]}]


def test_the_dims_read_name_symbolic_dims_and_size_the_others() -> None:
    assert symbolic_io(_model(["batch", 16], ["batch", 16])) == {"x": ["batch", 16], "y": ["batch", 16]}


def test_a_row_gives_each_shape_its_ratio_and_a_returned_input_its_reason() -> None:
    timed = {"speedup": 1.1, "interval": [1.05, 1.15], "pairs": 20}
    records = [
        {
            "model": "bert_dyn",
            "tensat": {"ok": True, "seconds": 30.0, "stats": {"modelled": 0.8425}},
            "dims_kept": True,
            "shapes_verified": [{"input_ids": [1, 128]}, {"input_ids": [2, 129]}, {"input_ids": [3, 130]}],
            "per_shape": [{"shapes": {"input_ids": [1, 128]}, **timed}, {"shapes": {"input_ids": [4, 128]}, **timed}],
            "static": {"speedup": 1.0, "interval": [1.0, 1.0], "same_model": True},
        },
        {
            "model": "vit_dyn",
            "tensat": {"ok": True, "seconds": 20.0},
            "dims_kept": True,
            "returned_input": "no cheaper graph found",
        },
        {"model": "gpt2_dyn", "tensat": {"ok": False, "seconds": 1.0, "error": "tensat: error: boom"}},
    ]
    text = markdown(records, TEST_MACHINE)
    row = "| bert_dyn | yes | 84.2% | 1x128; 2x129; 3x130 | 1x128: 1.100 (1.05-1.15) | 4x128: 1.100 (1.05-1.15) | - |"
    assert row in text
    assert "| vit_dyn | yes | - | (input returned) |" in text
    assert "1.00 (input)" in text
    assert "- vit_dyn: no cheaper graph found" in text
    assert "| gpt2_dyn | failed: tensat: error: boom |" in text
