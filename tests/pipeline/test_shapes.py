"""Models with symbolic input dims: optimized at one shape (the one given, else 1 for a batch dim and 128 for any
other), written back with their symbolic dims and verified at other sizes of them; the input, as given, where that
fails."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import tensat
import tensat.api as api
from tensat.onnx.symbolic import _named, _polymorphic, generalize, other_shapes, representative
from tensat.onnx_io import symbolic_inputs
from tensat.verify import run_model


def _dynamic(tmp_path: Path, *, cancelling: bool, flatten: bool = False) -> Path:
    """x[batch, 16] @ w, then a Relu; with `cancelling`, a Transpose pair before the Relu (a gain the rules find);
    with `flatten`, y is reshaped to one row per batch through a target computed from x's shape."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 16])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 8])
    w = numpy_helper.from_array(np.random.default_rng(0).standard_normal((16, 8)).astype(np.float32), "w")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"])]
    if cancelling:
        nodes += [
            helper.make_node("Transpose", ["m"], ["t"], perm=[1, 0]),
            helper.make_node("Transpose", ["t"], ["u"], perm=[1, 0]),
            helper.make_node("Relu", ["u"], ["r"]),
        ]
    else:
        nodes.append(helper.make_node("Relu", ["m"], ["r"]))
    inits = [w]
    if flatten:  # r[batch, 8] -> [batch, 2, 4] -> [batch, 8], the targets read from x's shape at run time
        inits += [numpy_helper.from_array(np.array([2, 4], np.int64), "two_four")]
        inits += [numpy_helper.from_array(np.array([8], np.int64), "eight")]
        nodes += [
            helper.make_node("Shape", ["x"], ["xs"], start=0, end=1),
            helper.make_node("Concat", ["xs", "two_four"], ["split_shape"], axis=0),
            helper.make_node("Reshape", ["r", "split_shape"], ["s"]),
            helper.make_node("Concat", ["xs", "eight"], ["flat_shape"], axis=0),
            helper.make_node("Reshape", ["s", "flat_shape"], ["y"]),
        ]
    else:
        nodes[-1].output[0] = "y"
    model = helper.make_model(
        helper.make_graph(nodes, "g", [x], [y], inits), opset_imports=[helper.make_opsetid("", 17)], ir_version=8
    )
    path = tmp_path / "dynamic.onnx"
    onnx.save(model, str(path))
    return path


FAST = dict(cost="analytic", latency_check=0)


def test_the_input_returned_unchanged_keeps_its_symbolic_dims(tmp_path: Path) -> None:
    """The shapes given fix the dims only for the search: a run that returns the input writes the model as given,
    which runs at any batch."""
    src, out = _dynamic(tmp_path, cancelling=False), tmp_path / "out.onnx"
    result = tensat.optimize_with_details(str(src), output=str(out), input_shapes={"x": [2, 16]}, **FAST)
    assert result.returned_input is not None
    written = onnx.load(str(out))
    assert symbolic_inputs(written) == {"x": ["batch"]}
    assert run_model(written, {"x": np.ones((5, 16), np.float32)})["y"].shape == (5, 8)


@pytest.mark.parametrize("flatten", [False, True], ids=["elementwise", "reshaped"])
def test_an_optimized_model_keeps_its_symbolic_dims_verified_at_three_shapes(tmp_path: Path, flatten: bool) -> None:
    """With no shape given, the batch dim is optimized at 1; the model written declares it symbolic again, its
    Reshapes (their targets folded at batch 1 on reading) copy it (0) or absorb it (-1), and it is verified at
    batch 1, 2 and 3, and runs at any other."""
    src, out = _dynamic(tmp_path, cancelling=True, flatten=flatten), tmp_path / "out.onnx"
    result = tensat.optimize_with_details(str(src), output=str(out), **FAST)
    assert result.returned_input is None, result.returned_input
    assert result.shapes_verified == [{"x": [1, 16]}, {"x": [2, 16]}, {"x": [3, 16]}]
    assert "symbolic dims kept" in result.summary()
    written = onnx.load(str(out))
    assert symbolic_inputs(written) == {"x": ["batch"]}
    feeds = {"x": np.random.default_rng(1).standard_normal((7, 16)).astype(np.float32)}
    np.testing.assert_allclose(run_model(written, feeds)["y"], run_model(str(src), feeds)["y"], rtol=1e-5, atol=1e-6)


def test_a_written_model_that_holds_at_one_shape_only_returns_the_input(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Verification at other sizes catches a graph right at the shape it was optimized at only (here, one written
    back without its symbolic dims): the input is returned as given, and the run says at which shape it failed."""
    src, out = _dynamic(tmp_path, cancelling=True), tmp_path / "out.onnx"

    def fixed(candidate: onnx.ModelProto, given: onnx.ModelProto, shapes: dict) -> onnx.ModelProto:
        return candidate

    monkeypatch.setattr(api, "generalize", fixed)
    result = tensat.optimize_with_details(str(src), output=str(out), **FAST)
    assert result.returned_input is not None and "does not match the input at x=2,16" in result.returned_input
    assert result.shapes_verified == []
    assert symbolic_inputs(onnx.load(str(out))) == {"x": ["batch"]}


def test_reshape_targets_are_written_for_every_size() -> None:
    sizes = {"batch": 1, "seq": 64}
    assert _polymorphic([1, 64, 12, 64], ["batch", "seq", 768], sizes) == [0, 0, 12, 64]
    assert _polymorphic([64, 768], ["batch", "seq", 768], sizes) == [-1, 768]
    assert _polymorphic([1, 64, 768], ["batch", "seq", 12, 64], sizes) == [0, 0, 768]
    assert _polymorphic([1, 2048], ["batch", 2048, 1, 1], {"batch": 1}) == [0, 2048]
    assert _polymorphic([3, 5], ["seq", 7], {"seq": 2}) is None  # no dim absorbs the sequence's size
    # a dim inference could not name is taken as fixed (the run verifies it at other sizes)
    assert _polymorphic([4, 16], ["?", 16], sizes) == [4, 16]
    assert _polymorphic([1, 256], ["batch", "unk__3", 256], sizes) == [0, 256]


def test_the_representative_shape_and_the_others() -> None:
    def model(*dims: object) -> onnx.ModelProto:
        x = helper.make_tensor_value_info("x", TensorProto.FLOAT, list(dims))
        graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [x], [x])
        graph.output[0].name = "y"
        return helper.make_model(graph)

    assert representative(model("N", 3, 224, 224)) == {"x": [1, 3, 224, 224]}
    assert representative(model(1, "seq")) == {"x": [1, 128]}  # any other dim at 128
    assert representative(model("seq", 8)) == {"x": [128, 8]}  # on the first axis too
    assert representative(model("batch", "seq"), {"x": [2, 16]}) == {"x": [2, 16]}  # as given
    assert representative(model(2, 3)) is None  # nothing symbolic
    assert other_shapes(model("batch", 3), {"x": [1, 3]}) == [{"x": [2, 3]}, {"x": [3, 3]}]
    # a sequence twice and three times as long: a few samples more may leave a strided stack's frames unchanged
    assert other_shapes(model("batch", "seq"), {"x": [1, 512]}) == [{"x": [2, 1024]}, {"x": [3, 1536]}]


def test_a_symbolic_dim_that_is_not_a_batch_is_optimized_at_128(tmp_path: Path) -> None:
    """With no shape given, a sequence dim takes 128; an input given no shape takes the sizes a given input gives
    its dims of the same name."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq"])
    mask = helper.make_tensor_value_info("mask", TensorProto.FLOAT, ["batch", "seq"])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "seq"])
    model = helper.make_model(
        helper.make_graph([helper.make_node("Mul", ["x", "mask"], ["y"])], "g", [x, mask], [y]),
        opset_imports=[helper.make_opsetid("", 17)],
        ir_version=8,
    )
    result = tensat.optimize_with_details(model, **FAST)
    assert result.shapes_verified[:1] in ([], [{"x": [1, 128], "mask": [1, 128]}])
    assert tensat.onnx_io.load_model(model, {"x": [2, 16]}).graph.input[1].type.tensor_type.shape.dim[1].dim_value == 16
    assert symbolic_inputs(onnx.load_from_string(result.output.SerializeToString())) == {
        "x": ["batch", "seq"],
        "mask": ["batch", "seq"],
    }


def _shape_computed(tmp_path: Path) -> Path:
    """y = (x, transposed twice) + ConstantOfShape(Shape(x)), for x[batch, seq]: at fixed sizes the second operand
    is a constant, which written into the model would fix it to those sizes."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq"])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "seq"])
    one = helper.make_tensor("one", TensorProto.FLOAT, [1], [1.5])
    nodes = [
        helper.make_node("Transpose", ["x"], ["t"], perm=[1, 0]),
        helper.make_node("Transpose", ["t"], ["u"], perm=[1, 0]),
        helper.make_node("Shape", ["x"], ["xs"]),
        helper.make_node("ConstantOfShape", ["xs"], ["ones"], value=one),
        helper.make_node("Add", ["u", "ones"], ["y"]),
    ]
    model = helper.make_model(
        helper.make_graph(nodes, "g", [x], [y]), opset_imports=[helper.make_opsetid("", 17)], ir_version=8
    )
    path = tmp_path / "shape_computed.onnx"
    onnx.save(model, str(path))
    return path


def test_a_value_computed_from_a_symbolic_shape_is_computed_in_the_model_written(tmp_path: Path) -> None:
    """A constant at the sizes read that varies with the symbolic dims is read as the nodes that compute it (kept
    verbatim), not folded: the model written still computes it from Shape, and holds at every size."""
    src, out = _shape_computed(tmp_path), tmp_path / "out.onnx"
    graph = tensat.onnx_io.import_model(str(src), {"x": [1, 8]})
    opaque = sorted(spec.op_type for spec in graph.opaque.values())
    assert opaque == ["ConstantOfShape", "Shape"]
    result = tensat.optimize_with_details(str(src), output=str(out), pre_pass="none", **FAST)
    assert result.returned_input is None, result.returned_input
    assert len(result.shapes_verified) == 3
    written = onnx.load(str(out))
    assert [n.op_type for n in written.graph.node] == ["Shape", "ConstantOfShape", "Add"]
    feeds = {"x": np.random.default_rng(2).standard_normal((5, 7)).astype(np.float32)}
    np.testing.assert_allclose(run_model(written, feeds)["y"], feeds["x"] + 1.5)


def test_the_elements_that_vary_are_told_from_those_that_do_not(tmp_path: Path) -> None:
    """Shape(x)[1:] of x[batch, 16] is 16 at every batch: folded to a constant; Shape(x) concatenated with 4 varies
    in its first element only, and an element-wise op on it keeps that mask."""
    from tensat.onnx.importer import _Importer
    from tensat.onnx_io import load_model

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 16])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 16])
    four = numpy_helper.from_array(np.array([4], np.int64), "four")
    nodes = [
        helper.make_node("Shape", ["x"], ["tail"], start=1),
        helper.make_node("Shape", ["x"], ["head"], start=0, end=1),
        helper.make_node("Concat", ["head", "four"], ["cat"], axis=0),
        helper.make_node("Mul", ["cat", "cat"], ["sq"]),
        helper.make_node("Relu", ["x"], ["y"]),
    ]
    model = helper.make_model(
        helper.make_graph(nodes, "g", [x], [y], [four]), opset_imports=[helper.make_opsetid("", 17)], ir_version=8
    )
    importer = _Importer(load_model(model, {"x": [1, 16]}))
    importer.run()
    assert "tail" not in importer.varying and importer.consts["tail"].tolist() == [16]
    assert importer.varying["head"].tolist() == [True]
    assert importer.varying["cat"].tolist() == [True, False]
    assert importer.varying["sq"].tolist() == [True, False]


def test_a_result_kept_is_also_timed_at_another_size(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A result the end-to-end check keeps at the shape it was optimized at (here, whatever it times) is timed at
    the second shape verified too, and kept only where it is not measurably slower there."""
    monkeypatch.setattr(api, "_faster", lambda by_threads: True)
    src, out = _dynamic(tmp_path, cancelling=True), tmp_path / "out.onnx"
    result = tensat.optimize_with_details(str(src), output=str(out), cost="analytic", latency_check=2)
    if result.returned_input is None:
        assert result.latency_other_shape is not None
        shapes, timed = result.latency_other_shape
        assert shapes == {"x": [2, 16]} and timed.interval[1] >= 1.0 and timed.pairs >= 5
        assert "end to end at 1 thread at x=2,16" in result.summary()
        assert result.to_dict()["latency_other_shape"]["shapes"] == shapes
        assert symbolic_inputs(onnx.load(str(out))) == {"x": ["batch"]}  # the model written back, not the one timed
    else:  # two models of one speed: rarely, measurably slower by chance
        assert "measurably slower end to end at x=2,16" in result.returned_input


def test_a_sequence_too_short_for_the_model_is_sized_by_running_it(tmp_path: Path) -> None:
    """A waveform of 128 samples is too short for a kernel of 300: the run takes the next default size the model
    runs at (512), and says so."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 1, "samples"])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 2, "frames"])
    w = numpy_helper.from_array(np.random.default_rng(3).standard_normal((2, 1, 300)).astype(np.float32), "w")
    model = helper.make_model(
        helper.make_graph([helper.make_node("Conv", ["x", "w"], ["y"], strides=[50])], "g", [x], [y], [w]),
        opset_imports=[helper.make_opsetid("", 17)],
        ir_version=8,
    )
    result = tensat.optimize_with_details(model, **FAST)
    assert result.shapes_optimized == {"x": [1, 1, 512]}
    assert "symbolic dims batch, samples; optimized at x=1,1,512" in result.summary()
    assert result.to_dict()["shapes_optimized"] == {"x": [1, 1, 512]}


def test_a_reshape_after_an_onnxruntime_kernel_is_written_for_every_size() -> None:
    """Shape inference reads through the kernels the exporter writes (here FusedMatMul, and SimplifiedLayerNorm in
    the default domain), so a Reshape after them still gets its target written with 0 and -1."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 16])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [8, 16])
    w = numpy_helper.from_array(np.ones((1, 16, 16), np.float32), "w")  # of the same rank, as the exporter writes
    scale = numpy_helper.from_array(np.ones(16, np.float32), "scale")
    target = numpy_helper.from_array(np.array([8, 16], np.int64), "target")
    nodes = [
        helper.make_node("FusedMatMul", ["x", "w"], ["m"], domain="com.microsoft", transB=1, alpha=0.5),
        helper.make_node("SimplifiedLayerNormalization", ["m", "scale"], ["n"], axis=-1, epsilon=1e-5),
        helper.make_node("Reshape", ["n", "target"], ["y"]),
    ]
    candidate = helper.make_model(
        helper.make_graph(nodes, "g", [x], [y], [w, scale, target]),
        opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)],
    )
    given = onnx.ModelProto()
    given.CopyFrom(candidate)
    for vi, dims in ((given.graph.input[0], ["batch", "seq", 16]), (given.graph.output[0], ["rows", 16])):
        vi.CopyFrom(helper.make_tensor_value_info(vi.name, TensorProto.FLOAT, dims))
    written = generalize(candidate, given, {"x": [1, 8, 16]})
    assert written is not None
    targets = {t.name: numpy_helper.to_array(t).tolist() for t in written.graph.initializer}
    assert targets[written.graph.node[2].input[1]] == [-1, 16]


def test_a_dim_inference_cannot_name_is_named_by_its_size() -> None:
    """At batch 1 and sequence 128, an unnamed dim of size 128 is the sequence, one of size 4 a dim derived from
    them; one of no known size is what the Reshape's element count leaves (here 1: the batch)."""
    sizes = {"batch": 1, "sequence": 128}
    unnamed = ["unk__9", "unk__7", "unk__10", 64]
    assert _named(unnamed, ["?", 128, 4, 64], sizes, 128 * 256) == (["batch", "sequence", "?2", 64], {**sizes, "?2": 4})
    assert _named(unnamed, None, sizes, 128 * 256)[0] == ["?", "?", "?", 64]  # three unknowns: left unnamed
    assert _named(["batch", "sequence", 256], [1, 128, 256], sizes, 0)[0] == ["batch", "sequence", 256]
    # frames a conv stack derives from the samples: named anew, so the target absorbs them with -1
    source, named = _named(["batch", 128, 1, "unk__3"], [1, 128, 1, 6], {"batch": 1, "samples": 2048}, 128 * 6)
    assert _polymorphic([1, 128, 6], source, named) == [0, 128, -1]
