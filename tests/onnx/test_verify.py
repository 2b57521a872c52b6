"""Numerical verification: accepts what computes the same, catches wrong graphs, checks interfaces."""

from __future__ import annotations

import dataclasses

import numpy as np
import onnx
import pytest
from onnx import TensorProto as TP
from onnx import helper, numpy_helper

from tensat.errors import ModelError, VerificationError
from tensat.ir import Graph
from tensat.onnx_io import export_model, import_model, save_model
from tensat.session import Serialized, make_session
from tensat.verify import VerifyReport, compare_models, random_inputs, run_model, verify

RNG = np.random.default_rng(7)


def randn(*shape: int, std: float = 1.0) -> np.ndarray:
    return (RNG.standard_normal(shape) * std).astype(np.float32)


def make(nodes, inputs, outputs, inits=(), opset: int = 17) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes, "v", inputs, outputs, initializer=[numpy_helper.from_array(a, n) for n, a in inits]
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model


def vi(name: str, shape, elem: int = TP.FLOAT) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, elem, shape)


def split_model() -> onnx.ModelProto:
    """x (2, 8) -> halves a, b -> out = concat(relu(a) * w, b) + bias."""
    inits = [("w", randn(2, 4)), ("bias", randn(8, std=0.01)), ("sizes", np.array([4, 4], np.int64))]
    nodes = [
        helper.make_node("Split", ["x", "sizes"], ["a", "b"], axis=1),
        helper.make_node("Relu", ["a"], ["ra"]),
        helper.make_node("Mul", ["ra", "w"], ["m"]),
        helper.make_node("Concat", ["m", "b"], ["c"], axis=1),
        helper.make_node("Add", ["c", "bias"], ["out"]),
    ]
    return make(nodes, [vi("x", [2, 8])], [vi("out", [2, 8])], inits)


def rebuild(graph: Graph, edit) -> Graph:
    """A copy of `graph` with each node passed through `edit(new_graph, old_node, new_inputs) -> new id | None`."""
    out = Graph(opset_imports=dict(graph.opset_imports), name=graph.name)
    out.opaque = dict(graph.opaque)
    remap: dict[int, int] = {}
    for i, n in enumerate(graph.nodes):
        if n.op == "input":
            remap[i] = out.input(n.attr["name"], n.shape, n.dtype)
            continue
        if n.op == "weight":
            remap[i] = out.weight(graph.weights[n.attr["name"]], n.attr["name"])
            continue
        inputs = [remap[j] for j in n.inputs]
        new = edit(out, n, inputs)
        remap[i] = new if new is not None else out.add(n.op, inputs, **n.attr)
    out.outputs = [(name, remap[i]) for name, i in graph.outputs]
    return out


def test_same_graph_is_accepted() -> None:
    model = split_model()
    optimized = export_model(import_model(model))
    report = verify(model, optimized)
    assert isinstance(report, VerifyReport)
    assert report.ok and report.outputs == ["out"] and report.max_abs_error == 0.0 and report.seconds > 0
    assert "\n" not in report.detail


def test_a_serialized_model_runs_verifies_and_saves_as_its_proto(tmp_path) -> None:
    """`Serialized` (a proto with its bytes, made once for every session the checks open) behaves as the proto."""
    model = split_model()
    wrapped = Serialized(model)
    assert wrapped.data is wrapped.data and wrapped.data == model.SerializeToString()
    report = compare_models(wrapped, Serialized(model))
    assert report.ok and report.max_abs_error == 0.0
    feeds = random_inputs(model, seed=2)
    np.testing.assert_array_equal(run_model(wrapped, feeds)["out"], run_model(model, feeds)["out"])
    save_model(wrapped, tmp_path / "m.onnx")
    assert (tmp_path / "m.onnx").read_bytes() == model.SerializeToString()


def test_swapped_slices_are_caught() -> None:
    model = split_model()
    graph = import_model(model)

    def swap(g: Graph, n, inputs):
        if n.op == "slice":
            other = 4 - n.attr["start"]
            return g.add("slice", inputs, axis=n.attr["axis"], start=other, size=n.attr["size"])
        return None

    bad = export_model(rebuild(graph, swap))
    report = compare_models(model, bad)
    assert not report.ok and "'out'" in report.detail
    with pytest.raises(VerificationError) as err:
        verify(model, bad)
    assert "\n" not in str(err.value) and "'out'" in str(err.value)


def test_dropped_bias_add_is_caught() -> None:
    """The bias has std 0.01 against O(1) outputs: a small but real error the tolerance must see."""
    model = split_model()
    graph = import_model(model)

    def drop_add(g: Graph, n, inputs):
        return inputs[0] if n.op == "add" else None

    with pytest.raises(VerificationError, match="'out'"):
        verify(model, export_model(rebuild(graph, drop_add)))


def test_reassociated_float32_math_passes() -> None:
    """(x @ A) @ B against x @ (A @ B) and a re-ordered long sum: float32 rounding differences only."""
    a, b = randn(256, 256, std=1 / 16), randn(256, 64, std=1 / 16)
    terms = [(f"t{k}", randn(1, 64)) for k in range(12)]
    nodes = [helper.make_node("MatMul", ["x", "A"], ["xa"]), helper.make_node("MatMul", ["xa", "B"], ["y0"])]
    prev = "y0"
    for k, (name, _) in enumerate(terms):
        nodes.append(helper.make_node("Add", [prev, name], [f"s{k}"]))
        prev = f"s{k}"
    original = make(nodes, [vi("x", [32, 256])], [vi(prev, [32, 64])], [("A", a), ("B", b), *terms])
    total = sum(t for _, t in reversed(terms))
    nodes2 = [helper.make_node("MatMul", ["x", "AB"], ["y"]), helper.make_node("Add", ["y", "T"], [prev])]
    optimized = make(nodes2, [vi("x", [32, 256])], [vi(prev, [32, 64])], [("AB", a @ b), ("T", total)])
    report = verify(original, optimized)
    assert report.ok and 0 < report.max_rel_error < 1e-4


def test_nan_pattern_must_match() -> None:
    original = make([helper.make_node("Sqrt", ["x"], ["y"])], [vi("x", [16])], [vi("y", [16])])
    optimized = make(
        [helper.make_node("Abs", ["x"], ["ax"]), helper.make_node("Sqrt", ["ax"], ["y"])],
        [vi("x", [16])],
        [vi("y", [16])],
    )
    report = compare_models(original, optimized)
    assert not report.ok and "NaN" in report.detail
    assert verify(original, original).ok  # NaNs in the same places are fine


def test_interface_mismatches_fail() -> None:
    base = make([helper.make_node("Relu", ["x"], ["y"])], [vi("x", [4])], [vi("y", [4])])
    renamed = make([helper.make_node("Relu", ["x"], ["z"])], [vi("x", [4])], [vi("z", [4])])
    report = compare_models(base, renamed)
    assert not report.ok and "'y'" in report.detail
    reshaped = make(
        [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Unsqueeze", ["r", "ax"], ["y"])],
        [vi("x", [4])],
        [vi("y", [1, 4])],
        [("ax", np.array([0], np.int64))],
    )
    report = compare_models(base, reshaped)
    assert not report.ok and "'y'" in report.detail
    extra_input = make([helper.make_node("Add", ["x", "q"], ["y"])], [vi("x", [4]), vi("q", [4])], [vi("y", [4])])
    assert "'q'" in compare_models(base, extra_input).detail
    broken = make([helper.make_node("Relu", ["x"], ["y"])], [vi("x", [4])], [vi("y", [4])])
    broken.graph.node[0].op_type = "Reluu"
    report = compare_models(base, broken)
    assert not report.ok and "onnxruntime" in report.detail and "\n" not in report.detail


def test_original_failure_is_a_model_error() -> None:
    broken = make([helper.make_node("Reluu", ["x"], ["y"])], [vi("x", [4])], [vi("y", [4])])
    with pytest.raises(ModelError):
        compare_models(broken, broken)


def test_integer_outputs_compared_exactly() -> None:
    original = make([helper.make_node("Add", ["i", "i"], ["y"])], [vi("i", [8], TP.INT64)], [vi("y", [8], TP.INT64)])
    same = make(
        [helper.make_node("Mul", ["i", "two"], ["y"])],
        [vi("i", [8], TP.INT64)],
        [vi("y", [8], TP.INT64)],
        [("two", np.array(2, np.int64))],
    )
    off = make(
        [helper.make_node("Add", ["i", "i"], ["s"]), helper.make_node("Add", ["s", "one"], ["y"])],
        [vi("i", [8], TP.INT64)],
        [vi("y", [8], TP.INT64)],
        [("one", np.array(1, np.int64))],
    )
    assert verify(original, same).ok
    assert not compare_models(original, off).ok


def test_random_inputs_types_and_seeds() -> None:
    model = make(
        [helper.make_node("Identity", ["f"], ["y"])],
        [
            vi("f", [3, 4]),
            vi("i", [50], TP.INT64),
            vi("b", [2], TP.BOOL),
            vi("h", [5], TP.FLOAT16),
            vi("s", [], TP.FLOAT),
        ],
        [vi("y", [3, 4])],
    )
    feeds = random_inputs(model, seed=5)
    assert feeds["f"].dtype == np.float32 and feeds["f"].shape == (3, 4)
    assert feeds["i"].dtype == np.int64 and feeds["i"].min() >= 0 and feeds["i"].max() < 4
    assert feeds["b"].dtype == np.bool_ and feeds["h"].dtype == np.float16 and feeds["s"].shape == ()
    again = random_inputs(model, seed=5)
    assert all(np.array_equal(feeds[k], again[k]) for k in feeds)
    assert not np.array_equal(feeds["f"], random_inputs(model, seed=6)["f"])
    dynamic = make([helper.make_node("Identity", ["x"], ["y"])], [vi("x", ["n"])], [vi("y", ["n"])])
    with pytest.raises(ModelError, match="'x'"):
        random_inputs(dynamic)


def test_sessions_and_runs() -> None:
    model = split_model()
    session = make_session(model, threads=1)
    assert [i.name for i in session.get_inputs()] == ["x"]
    with pytest.raises(ValueError):
        make_session(model, provider="tpu")
    feeds = random_inputs(model)
    out = run_model(model, feeds)
    assert set(out) == {"out"} and out["out"].shape == (2, 8)
    with pytest.raises(ModelError, match="'x'"):
        run_model(model, {})


def test_report_is_a_dataclass() -> None:
    fields = [f.name for f in dataclasses.fields(VerifyReport)]
    assert fields == ["ok", "max_abs_error", "max_rel_error", "outputs", "seconds", "detail"]


def test_models_by_path(tmp_path) -> None:
    model = split_model()
    path = tmp_path / "m.onnx"
    onnx.save_model(model, str(path))
    assert verify(str(path), model).ok
