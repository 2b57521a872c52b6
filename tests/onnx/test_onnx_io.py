"""ONNX import/export: round trips reproduce outputs, every IR op exports for every opset, bad input is refused
with one-line messages."""

from __future__ import annotations

import os

import numpy as np
import onnx
import pytest
from onnx import TensorProto as TP
from onnx import helper, numpy_helper

from tensat import ops
from tensat.errors import ModelError
from tensat.ir import Graph
from tensat.onnx.external import content_digest
from tensat.onnx_io import EXPORTERS, IMPORTERS, export_model, import_model, load_model, save_model
from tensat.verify import random_inputs, run_model
from tests.helpers import bad_model_inputs, make, slow_params, vi

RNG = np.random.default_rng(1234)


# ---------------------------------------------------------------------------------------------------------------
# helpers


def init(name: str, array) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(array), name)


def randn(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


def roundtrip(model: onnx.ModelProto, input_shapes=None, seed: int = 0) -> tuple[Graph, onnx.ModelProto]:
    """Import, export, check, run both in onnxruntime and require outputs equal within 1e-5 of their scale."""
    graph = import_model(model, input_shapes)
    out = export_model(graph)
    onnx.checker.check_model(out, full_check=True)
    original = load_model(model, input_shapes)
    assert [i.name for i in out.graph.input] == [
        i.name for i in original.graph.input if i.name not in {t.name for t in original.graph.initializer}
    ]
    assert [o.name for o in out.graph.output] == [o.name for o in original.graph.output]
    for a, b in zip(out.graph.output, original.graph.output):
        assert a.type.tensor_type.elem_type == b.type.tensor_type.elem_type
        assert [d.dim_value for d in a.type.tensor_type.shape.dim] == [
            d.dim_value for d in b.type.tensor_type.shape.dim
        ]
    feeds = random_inputs(original, seed)
    expected, actual = run_model(original, feeds), run_model(out, feeds)
    assert expected.keys() == actual.keys()
    for name, want in expected.items():
        got = actual[name]
        assert got.shape == want.shape and got.dtype == want.dtype, name
        if want.dtype.kind == "f":
            scale = max(float(np.max(np.abs(want))), 1e-30) if want.size else 1.0
            assert float(np.max(np.abs(got - want), initial=0.0)) <= 1e-5 * scale, name
        else:
            np.testing.assert_array_equal(got, want)
    return graph, out


def op_types(model: onnx.ModelProto) -> list[str]:
    return [n.op_type for n in model.graph.node]


def ops_of(graph: Graph) -> dict[str, int]:
    return graph.summary()


# ---------------------------------------------------------------------------------------------------------------
# built-in benchmark models (tensat.models)


BENCH_SIZES = {
    "bert": dict(layers=2, seq=16, hidden=64, heads=4),
    "nasrnn": dict(steps=2, hidden=64),
    "nasnet_a": dict(image=32, channels=16, stages=1, cells=1),
    "squeezenet": dict(image=64),
    "resnext50": dict(image=32),
    "resnet50": dict(image=32),
    "inception_v3": dict(image=75),
    "vgg19": dict(image=32),
}


@pytest.mark.parametrize("name", slow_params(sorted(BENCH_SIZES)))
def test_bench_model_roundtrip(name: str) -> None:
    from tensat.models import build_model

    model = build_model(name, **BENCH_SIZES[name])
    graph, _ = roundtrip(model)
    assert "opaque" not in ops_of(graph), f"{name} should lower to IR ops only"


# ---------------------------------------------------------------------------------------------------------------
# hand-written models: opset idioms


def idioms_model(opset: int) -> onnx.ModelProto:
    """Constant/ConstantOfShape weights, bias-less Conv, BatchNorm, Split with sizes, Slice with negative indices,
    Flatten, Gemm (transB, alpha, beta), Sum of 3, Reshape with 0/-1, Squeeze/Unsqueeze, Shape-computed Reshape,
    Dropout, Identity, Transpose, Sub of a constant; attributes or inputs as `opset` wants."""
    nodes, inits = [], []

    inits += [
        init("W", randn(4, 3, 3, 3)),
        init("s", randn(4)),
        init("b", randn(4)),
        init("m", randn(4)),
        init("v", np.abs(randn(4)) + 0.5),
        init("Wg", randn(5, 84)),
        init("Cg", randn(5)),
        init("Wsub", randn(2, 5)),
    ]
    nodes.append(helper.make_node("Conv", ["x", "W"], ["c"], pads=[1, 1, 1, 1]))
    nodes.append(helper.make_node("BatchNormalization", ["c", "s", "b", "m", "v"], ["bn"], epsilon=1e-3))
    nodes.append(helper.make_node("Relu", ["bn"], ["r"]))
    if opset < 13:
        nodes.append(helper.make_node("Split", ["r"], ["s1", "s2"], axis=1, split=[1, 3]))
    else:
        inits.append(init("split", np.array([1, 3], np.int64)))
        nodes.append(helper.make_node("Split", ["r", "split"], ["s1", "s2"], axis=1))
    starts, ends, axes = [-2, 1, -7], [100000, -1, 1000], [1, 2, 3]
    if opset < 10:
        nodes.append(helper.make_node("Slice", ["s2"], ["sl"], starts=starts, ends=ends, axes=axes))
    else:
        inits += [
            init("st", np.array(starts, np.int64)),
            init("en", np.array(ends, np.int64)),
            init("ax", np.array(axes, np.int64)),
        ]
        nodes.append(helper.make_node("Slice", ["s2", "st", "en", "ax"], ["sl"]))
    nodes.append(helper.make_node("Flatten", ["sl"], ["flat"]))  # (2, 2*6*7 = 84)
    nodes.append(helper.make_node("Gemm", ["flat", "Wg", "Cg"], ["gemm"], transB=1, alpha=0.5, beta=2.0))
    nodes.append(helper.make_node("Constant", [], ["k"], value=numpy_helper.from_array(randn(5), "k")))
    nodes.append(
        helper.make_node("Constant", [], ["shape25"], value=numpy_helper.from_array(np.array([2, 5], np.int64)))
    )
    nodes.append(
        helper.make_node(
            "ConstantOfShape", ["shape25"], ["cos"], value=numpy_helper.from_array(np.array([0.25], np.float32))
        )
    )
    nodes.append(helper.make_node("Sum", ["gemm", "k", "cos"], ["sum"]))
    inits.append(init("rshape", np.array([0, -1, 1], np.int64)))
    nodes.append(helper.make_node("Reshape", ["sum", "rshape"], ["rs"]))  # (2, 5, 1)
    if opset < 13:
        nodes.append(helper.make_node("Squeeze", ["rs"], ["sq"], axes=[2]))
        nodes.append(helper.make_node("Unsqueeze", ["sq"], ["uq"], axes=[0]))
    else:
        inits += [init("ax2", np.array([2], np.int64)), init("ax0", np.array([0], np.int64))]
        nodes.append(helper.make_node("Squeeze", ["rs", "ax2"], ["sq"]))
        nodes.append(helper.make_node("Unsqueeze", ["sq", "ax0"], ["uq"]))
    nodes.append(helper.make_node("Sub", ["uq", "Wsub"], ["out1"]))  # (1, 2, 5)
    # a PyTorch-style computed reshape: Shape -> Gather -> Unsqueeze -> Concat -> Reshape
    inits += [init("zero", np.array(0, np.int64)), init("minus1", np.array([-1], np.int64))]
    nodes.append(helper.make_node("Shape", ["s1"], ["shp"]))
    nodes.append(helper.make_node("Gather", ["shp", "zero"], ["n"], axis=0))
    if opset < 13:
        nodes.append(helper.make_node("Unsqueeze", ["n"], ["n1"], axes=[0]))
    else:
        nodes.append(helper.make_node("Unsqueeze", ["n", "ax0"], ["n1"]))
    nodes.append(helper.make_node("Concat", ["n1", "minus1"], ["shape2"], axis=0))
    nodes.append(helper.make_node("Dropout", ["s1"], ["d"]))
    nodes.append(helper.make_node("Identity", ["d"], ["idn"]))
    nodes.append(helper.make_node("Reshape", ["idn", "shape2"], ["flat2"]))  # (2, 64)
    nodes.append(helper.make_node("Transpose", ["flat2"], ["out2"]))  # (64, 2)
    return make(nodes, [vi("x", [2, 3, 8, 8])], [vi("out1", [1, 2, 5]), vi("out2", [64, 2])], inits, opset=opset)


@pytest.mark.parametrize("opset", [9, 10, 11, 13, 17, 18, 21])
def test_opset_idioms(opset: int) -> None:
    model = idioms_model(opset)
    onnx.checker.check_model(model, full_check=True)
    graph, out = roundtrip(model)
    counts = ops_of(graph)
    assert "opaque" not in counts
    assert counts["conv2d"] == 1 and counts["batchnorm"] == 1 and counts["matmul"] == 1
    assert "Gather" not in op_types(out) and "Shape" not in op_types(out)  # folded
    assert op_types(out).count("Split") == 1  # the two split parts partition the tensor: one Split again


def test_gemm_variants() -> None:
    inits = [init("B", randn(6, 4)), init("C", randn(1, 6))]
    nodes = [
        helper.make_node("Gemm", ["a", "B", "C"], ["y1"], transA=1, transB=1, alpha=2.0, beta=0.5),
        helper.make_node("Gemm", ["y1", "bb"], ["y2"]),
        helper.make_node("Gemm", ["y1", "bb", "cc"], ["y3"], beta=3.0),
    ]
    model = make(
        nodes,
        [vi("a", [4, 3]), vi("bb", [6, 2]), vi("cc", [3, 2])],
        [vi("y2", [3, 2]), vi("y3", [3, 2])],
        inits,
        opset=13,
    )
    graph, _ = roundtrip(model)
    assert "opaque" not in ops_of(graph)


def test_a_gemm_with_transb_exports_with_transb_and_its_weight_as_stored() -> None:
    weight = randn(6, 4)  # stored (N, K), read transposed
    model = make(
        [
            helper.make_node("Gemm", ["a", "W", "C"], ["g"], transB=1),
            helper.make_node("Relu", ["g"], ["y"]),
        ],
        [vi("a", [3, 4])],
        [vi("y", [3, 6])],
        [init("W", weight), init("C", randn(6))],
        opset=13,
    )
    _, out = roundtrip(model)
    (gemm,) = [n for n in out.graph.node if n.op_type == "Gemm"]
    assert {a.name: a.i for a in gemm.attribute}.get("transB") == 1  # not a transposed copy of the weight
    stored = {t.name: numpy_helper.to_array(t) for t in out.graph.initializer}[gemm.input[1]]
    np.testing.assert_array_equal(stored, weight)


def test_equal_constants_are_one_weight_whatever_their_names() -> None:
    """Two initializers of one value, and a third folded from a transposed copy (onnxslim's Gemm over a shared
    weight), read as one weight node: the two products then share it, as a merge rule needs. Unequal ones stay."""
    w = randn(4, 6)
    model = make(
        [
            helper.make_node("MatMul", ["a", "W1"], ["p"]),
            helper.make_node("MatMul", ["a", "W2"], ["q"]),
            helper.make_node("Gemm", ["a", "WT"], ["r"], transB=1),
            helper.make_node("MatMul", ["a", "V"], ["s"]),
            helper.make_node("Sum", ["p", "q", "r", "s"], ["y"]),
        ],
        [vi("a", [3, 4])],
        [vi("y", [3, 6])],
        [init("W1", w), init("W2", w.copy()), init("WT", np.ascontiguousarray(w.T)), init("V", w + 1)],
        opset=13,
    )
    graph, _ = roundtrip(model)
    matmuls = [graph.nodes[i] for i in graph.live() if graph.nodes[i].op == "matmul"]
    assert len(matmuls) == 2 and len({m.inputs[1] for m in matmuls}) == 2  # W1, W2 and WT's transpose are one


@pytest.mark.parametrize(
    "array",
    [
        np.arange(12, dtype=np.float32).reshape(3, 4),
        np.arange(12, dtype=np.float32).reshape(3, 4).T,  # not C-contiguous
        np.array(2.5, dtype=np.float32),  # a scalar keeps its empty shape
        np.array([1, -2, 3], dtype=np.int64),
        np.array([True, False]),
        np.arange(4, dtype=np.float16),
    ],
)
def test_initializers_are_written_as_from_array_writes_them(array: np.ndarray) -> None:
    from tensat.onnx.exporter import _put_tensor  # private helper, tested directly

    tensor = TP()
    _put_tensor(tensor, array, "w")
    assert tensor.name == "w" and list(tensor.dims) == list(array.shape)
    assert tensor.data_type == numpy_helper.from_array(array, "w").data_type
    read = numpy_helper.to_array(tensor)
    assert read.shape == array.shape
    np.testing.assert_array_equal(read, array)


def test_conv_and_pool_variants() -> None:
    inits = [init("W", randn(4, 2, 3, 3)), init("B", randn(4)), init("W2", randn(4, 4, 1, 1))]
    nodes = [
        helper.make_node("Conv", ["x", "W", "B"], ["c1"], auto_pad="SAME_LOWER", strides=[2, 2], group=2),
        helper.make_node("Conv", ["x", "W"], ["c2a"], auto_pad="SAME_UPPER", group=2),
        helper.make_node("Conv", ["x", "W"], ["c2b"], pads=[2, 1, 2, 3], dilations=[2, 2], group=2),
        helper.make_node("Add", ["c2a", "c2b"], ["c2"]),
        helper.make_node("Conv", ["c2", "W2"], ["c3"], auto_pad="VALID", strides=[2, 1]),
        helper.make_node("Tanh", ["c3"], ["t"]),
        helper.make_node(
            "AveragePool", ["c1"], ["p1"], kernel_shape=[3, 3], auto_pad="SAME_UPPER", count_include_pad=0
        ),
        helper.make_node("AveragePool", ["c1"], ["p2"], kernel_shape=[2, 2], pads=[1, 1, 1, 1], count_include_pad=1),
        helper.make_node("MaxPool", ["c2"], ["p3"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 0, 1, 0]),
        helper.make_node("MaxPool", ["c2"], ["p4"], kernel_shape=[2, 2], strides=[2, 2], ceil_mode=1),
        helper.make_node("GlobalAveragePool", ["t"], ["g"]),
        helper.make_node("Sigmoid", ["g"], ["out"]),
    ]
    outs = [
        vi("p1", [1, 4, 5, 5]),
        vi("p2", [1, 4, 6, 6]),
        vi("p3", [1, 4, 5, 4]),
        vi("p4", [1, 4, 5, 5]),
        vi("out", [1, 4, 1, 1]),
    ]
    graph, out = roundtrip(make(nodes, [vi("x", [1, 4, 9, 9])], outs, inits, opset=13))
    counts = ops_of(graph)
    assert counts["conv2d"] == 4 and counts["avgpool"] == 2 and counts["maxpool"] == 2  # ceil_mode's with end pads
    assert "opaque" not in counts
    assert op_types(out).count("Tanh") == 1  # activation after conv stays a separate node


def test_3d_pools_are_modelled_and_the_numpy_semantics_match_onnxruntime() -> None:
    """Pools over three spatial axes (NCDHW) are read as the pool ops, with pads and auto_pad per axis; a 3-D pool
    the rules use (LRN's window sum down the channels) checks against onnxruntime's, each padding counted or not."""
    nodes = [
        helper.make_node(
            "AveragePool", ["x"], ["a1"], kernel_shape=[3, 1, 2], pads=[1, 0, 0, 1, 0, 1], count_include_pad=1
        ),
        helper.make_node(
            "AveragePool", ["x"], ["a2"], kernel_shape=[3, 2, 2], auto_pad="SAME_UPPER", strides=[1, 2, 2]
        ),
        helper.make_node("MaxPool", ["x"], ["m"], kernel_shape=[2, 2, 2], strides=[2, 2, 2]),
    ]
    outs = [vi("a1", [1, 2, 7, 5, 4]), vi("a2", [1, 2, 7, 3, 2]), vi("m", [1, 2, 3, 2, 2])]
    graph, _ = roundtrip(make(nodes, [vi("x", [1, 2, 7, 5, 4])], outs, [], opset=13))
    counts = ops_of(graph)
    assert counts["avgpool"] == 2 and counts["maxpool"] == 1 and "opaque" not in counts


def test_multi_input_multi_output() -> None:
    inits = [init("w", randn(5))]
    nodes = [
        helper.make_node("MatMul", ["a", "b"], ["ab"]),
        helper.make_node("Relu", ["a"], ["ra"]),
        helper.make_node("Add", ["ab", "w"], ["abw"]),
        helper.make_node("Identity", ["a"], ["a_copy"]),
    ]
    inputs = [vi("a", [3, 4]), vi("b", [4, 5]), vi("unused", [2])]
    outputs = [
        vi("abw", [3, 5]),
        vi("ra", [3, 4]),
        vi("a", [3, 4]),
        vi("abw", [3, 5]),
        vi("w", [5]),
        vi("a_copy", [3, 4]),
    ]
    graph, out = roundtrip(make(nodes, inputs, outputs, inits))
    assert [i.name for i in out.graph.input] == ["a", "b", "unused"]
    assert [o.name for o in out.graph.output] == ["abw", "ra", "a", "abw", "w", "a_copy"]


def test_unmodelled_ops_stay_opaque() -> None:
    inits = [
        init("gamma", randn(8)),
        init("beta", randn(8)),
        init("idx", np.array([0, 3, 1], np.int64)),
        init("table", randn(6, 8)),
    ]
    nodes = [
        helper.make_node("LayerNormalization", ["x", "gamma", "beta"], ["ln"], axis=-1, epsilon=1e-5),
        helper.make_node("Softmax", ["ln"], ["sm"], axis=-1),
        helper.make_node("Gather", ["sm", "idx"], ["g1"], axis=1),  # indices from an initializer
        helper.make_node("Gather", ["table", "ids"], ["g2"], axis=0),  # indices from a graph input
        helper.make_node("Div", ["g2", "g2b"], ["dv"]),
        helper.make_node("Sub", ["x", "x2"], ["sub"]),  # subtrahend not a weight: opaque
        helper.make_node("Relu", ["sub"], ["r"]),
        helper.make_node("Cast", ["ids"], ["idsf"], to=TP.FLOAT),
    ]
    inputs = [vi("x", [2, 4, 8]), vi("ids", [2, 3], TP.INT64), vi("g2b", [2, 3, 8]), vi("x2", [2, 4, 8])]
    outputs = [vi("g1", [2, 3, 8]), vi("dv", [2, 3, 8]), vi("r", [2, 4, 8]), vi("idsf", [2, 3])]
    graph, out = roundtrip(make(nodes, inputs, outputs, inits, opset=17))
    assert {"LayerNormalization", "Softmax", "Gather", "Div", "Sub", "Cast", "Relu"} <= set(op_types(out))
    ln = next(n for n in out.graph.node if n.op_type == "LayerNormalization")
    assert len(ln.output) == 1 and {a.name for a in ln.attribute} == {"axis", "epsilon"}


def test_integer_arithmetic_is_modelled_and_other_types_are_opaque() -> None:
    """Add, Sub and Mul of integers are exact, and modelled (a decoder's positions); an integer Div (which truncates)
    and arithmetic of a type tensat does not hold (float64) stay opaque."""
    nodes = [
        helper.make_node("Add", ["i", "j"], ["s"]),
        helper.make_node("Sub", ["s", "i"], ["d"]),
        helper.make_node("Mul", ["d", "j"], ["p"]),
        helper.make_node("Div", ["p", "two"], ["q"]),
        helper.make_node("Add", ["f", "f"], ["g"]),
    ]
    inputs = [vi("i", [3], TP.INT64), vi("j", [3], TP.INT64), vi("f", [3], TP.DOUBLE)]
    two = [init("two", np.full(3, 2, np.int64))]
    model = make(nodes, inputs, [vi("q", [3], TP.INT64), vi("g", [3], TP.DOUBLE)], two)
    graph, _ = roundtrip(model)
    found = ops_of(graph)
    assert found.get("opaque") == 2 and found["add"] == 1 and found["sub"] == 1 and found["mul"] == 1


def test_optional_input_gap_and_custom_domain() -> None:
    inits = [init("hi", np.array(0.5, np.float32))]
    nodes = [
        helper.make_node("Clip", ["x", "", "hi"], ["c"]),
        helper.make_node("Gelu", ["c"], ["g"], domain="com.microsoft"),
    ]
    model = make(nodes, [vi("x", [2, 3])], [vi("g", [2, 3])], inits, opset=13, extra_opsets=[("com.microsoft", 1)])
    graph, out = roundtrip(model)
    clip = next(n for n in out.graph.node if n.op_type == "Clip")
    assert list(clip.input)[1] == ""
    assert any(o.domain == "com.microsoft" for o in out.opset_import)


def test_if_with_outer_scope_capture() -> None:
    then_g = helper.make_graph([helper.make_node("Add", ["y", "w"], ["t_out"])], "then", [], [vi("t_out", [2, 3])])
    else_g = helper.make_graph([helper.make_node("Mul", ["y", "y"], ["e_out"])], "else", [], [vi("e_out", [2, 3])])
    nodes = [
        helper.make_node("Relu", ["x"], ["y"]),
        helper.make_node("If", ["cond"], ["z"], then_branch=then_g, else_branch=else_g),
        helper.make_node("Tanh", ["z"], ["out"]),
    ]
    model = make(nodes, [vi("x", [2, 3]), vi("cond", [], TP.BOOL)], [vi("out", [2, 3])], [init("w", randn(2, 3))])
    for seed in (0, 1, 2, 3):
        roundtrip(model, seed=seed)


def test_dynamic_dims_take_representative_sizes() -> None:
    nodes = [helper.make_node("Relu", ["x"], ["y"]), helper.make_node("Flatten", ["y"], ["z"])]
    model = make(nodes, [vi("x", ["batch", 3, 4, 4])], [vi("z", ["batch", 48])])
    assert import_model(model).nodes[0].shape == (1, 3, 4, 4)  # a batch dim is taken as 1
    tall = make(nodes, [vi("x", ["batch", 3, "height", 4])], [vi("z", ["batch", "flat"])])
    assert import_model(tall).nodes[0].shape == (1, 3, 128, 4)  # any other at 128
    graph, out = roundtrip(model, {"x": [2, 3, 4, 4]})
    assert [d.dim_value for d in out.graph.output[0].type.tensor_type.shape.dim] == [2, 48]
    for shapes, needle in [
        ({"y": [1, 3, 4, 4]}, "'y'"),
        ({"x": [1, 3, 4]}, "rank"),
        ({"x": [1, 5, 4, 4]}, "axis 1"),
        ({"x": [0, 3, 4, 4]}, "'x'"),
    ]:
        with pytest.raises(ModelError) as err:
            import_model(model, shapes)
        assert "\n" not in str(err.value) and needle in str(err.value)


def test_data_dependent_shape_is_refused() -> None:
    nodes = [helper.make_node("NonZero", ["x"], ["nz"]), helper.make_node("Transpose", ["nz"], ["out"])]
    model = make(nodes, [vi("x", [3, 4])], [vi("out", ["n", 2], TP.INT64)])
    with pytest.raises(ModelError) as err:
        import_model(model)
    assert "\n" not in str(err.value) and "NonZero" in str(err.value)


# ---------------------------------------------------------------------------------------------------------------
# bad input


def test_a_no_op_reshape_of_any_type_is_dropped_and_broadcast_constants_stay_small() -> None:
    emb = randn(16, 4)
    nodes = [
        helper.make_node("Reshape", ["ids", "shape"], ["ids2"]),  # an exporter's view(-1, seq): a no-op here
        helper.make_node("Gather", ["emb", "ids2"], ["e"]),
        helper.make_node("Pow", ["e", "three"], ["y"]),
    ]
    model = make(
        nodes,
        [vi("ids", [1, 8], TP.INT64)],
        [vi("y", [1, 8, 4])],
        [init("emb", emb), init("shape", np.array([1, 8], np.int64)), init("three", np.float32(3.0))],
    )
    graph, out = roundtrip(model)
    assert [n.op_type for n in out.graph.node] == ["Gather", "Pow"]
    exponent = next(t for t in out.graph.initializer if t.name == out.graph.node[1].input[1])
    assert len(exponent.dims) <= 1 and numpy_helper.to_array(exponent).tolist() in (3.0, [3.0])


def test_bad_inputs_raise_one_line_model_errors(tmp_path) -> None:
    for source, needle in bad_model_inputs(tmp_path):
        with pytest.raises(ModelError) as err:
            import_model(source)
        msg = str(err.value)
        assert "\n" not in msg, msg
        assert needle in msg, (needle, msg)


def test_not_a_model_object() -> None:
    with pytest.raises(ModelError):
        load_model(42)  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------------------------------------
# external data


def _external_model(tmp_path, location: str = "weights.bin") -> str:
    model = make(
        [helper.make_node("MatMul", ["x", "w"], ["y"])],
        [vi("x", [2, 256])],
        [vi("y", [2, 128])],
        [init("w", randn(256, 128))],
    )
    path = str(tmp_path / "m.onnx")
    onnx.save_model(model, path, save_as_external_data=True, location=location, size_threshold=0)
    return path


def _set_location(path: str, location: str) -> None:
    model = onnx.load(path, load_external_data=False)
    for tensor in model.graph.initializer:
        for entry in tensor.external_data:
            if entry.key == "location":
                entry.value = location
    onnx.save_model(model, path)


def test_external_data_in_model_dir_loads(tmp_path) -> None:
    path = _external_model(tmp_path)
    graph = import_model(path)
    assert ops_of(graph)["matmul"] == 1
    roundtrip(load_model(path))


@pytest.mark.parametrize("kind", ["parent", "absolute", "symlink"])
def test_external_data_outside_dir_is_refused(tmp_path, kind: str) -> None:
    inner = tmp_path / "inner"
    inner.mkdir()
    path = _external_model(inner)
    os.replace(inner / "weights.bin", tmp_path / "x.bin")
    if kind == "parent":
        _set_location(path, "../x.bin")
    elif kind == "absolute":
        _set_location(path, str(tmp_path / "x.bin"))
    else:
        os.symlink(tmp_path / "x.bin", inner / "weights.bin")
    with pytest.raises(ModelError) as err:
        import_model(path)
    assert "\n" not in str(err.value) and "outside the model's directory" in str(err.value)


def test_a_model_s_content_digest_changes_with_its_weights_on_disk(tmp_path) -> None:
    """The end-to-end verdicts are kept by the models' contents: a model kept on disk hashes its data file too,
    whose rewrite leaves the proto's bytes as they were."""
    path = _external_model(tmp_path)
    model = load_model(path, keep_external=True)
    data = model.SerializeToString()
    before = content_digest(model, data)
    assert content_digest(model, data) == before
    weights = tmp_path / "weights.bin"
    weights.write_bytes(bytes(reversed(weights.read_bytes())))
    os.utime(weights, ns=(os.stat(weights).st_atime_ns, os.stat(weights).st_mtime_ns + 10**9))
    assert content_digest(model, data) != before
    inline = onnx.load(path)
    assert content_digest(inline, inline.SerializeToString()) != content_digest(model, data)


def test_external_data_proto_without_directory(tmp_path) -> None:
    path = _external_model(tmp_path)
    with pytest.raises(ModelError) as err:
        import_model(onnx.load(path, load_external_data=False))
    assert "'w'" in str(err.value) and "\n" not in str(err.value)


def test_external_data_missing_file(tmp_path) -> None:
    path = _external_model(tmp_path)
    os.unlink(tmp_path / "weights.bin")
    with pytest.raises(ModelError) as err:
        import_model(path)
    assert "weights.bin" in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("external", [False, True])
def test_a_runtime_op_beside_a_large_weight_passes_the_checker(tmp_path, external: bool) -> None:
    """tensat writes onnxruntime's SimplifiedLayerNormalization in the default domain: a model of it with a weight
    over 1 MiB (tensat's own output for a T5 encoder) loads, with its weight in the file or beside it."""
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["m"]),
        helper.make_node("SimplifiedLayerNormalization", ["m", "g"], ["y"], axis=-1, epsilon=1e-6),
    ]
    inits = [
        numpy_helper.from_array(np.full((512, 1024), 0.01, np.float32), "w"),
        numpy_helper.from_array(np.ones(1024, np.float32), "g"),
    ]
    path = str(tmp_path / "m.onnx")
    model = make(nodes, [vi("x", [1, 8, 512])], [vi("y", [1, 8, 1024])], inits)
    onnx.save_model(model, path, save_as_external_data=external, location="m.data", size_threshold=0)
    loaded = load_model(path, keep_external=external)
    assert [n.op_type for n in loaded.graph.node] == ["MatMul", "SimplifiedLayerNormalization"]
    assert {t.name for t in loaded.graph.initializer} == {"w", "g"}


@pytest.mark.slow  # a 2.25 GiB write and read back: most of a minute where the disk is slow
@pytest.mark.skipif(os.environ.get("TENSAT_SKIP_2GIB") == "1", reason="TENSAT_SKIP_2GIB=1: no 2.3 GiB disk to spare")
def test_model_over_2gib_with_external_data(tmp_path) -> None:
    """A real > 2 GiB model with external data loads, imports, exports, saves (external data) and runs the same.

    The source weights lie in a sparse file (no disk), zeros but for their first element (a weight of one value
    would be read as a `fill`). The weights stay on disk: imported as arrays mapped from the file, exported as
    references to it, and saved by copying the file a block at a time; the test costs one 2.25 GiB write.
    """
    from tensat.verify import compare_models

    rows, cols, count = 1024, 72 * 1024, 8  # 8 weights of 288 MiB: 2.25 GiB
    size = rows * cols * 4
    with open(tmp_path / "big.onnx.data", "wb") as f:
        f.truncate(size * count)
        for k in range(count):
            f.seek(k * size)
            f.write(np.float32(k + 1).tobytes())
    nodes, inits, prev = [], [], "x"
    for k in range(count):
        w = TP(name=f"w{k}", data_type=TP.FLOAT, dims=[rows, cols], data_location=TP.EXTERNAL)
        for key, value in (("location", "big.onnx.data"), ("offset", str(k * size)), ("length", str(size))):
            w.external_data.add(key=key, value=value)
        inits.append(w)
        nodes.append(helper.make_node("Add", [prev, f"w{k}"], [f"a{k}"]))
        prev = f"a{k}"
    src = str(tmp_path / "big.onnx")
    with open(src, "wb") as f:
        f.write(make(nodes, [vi("x", [rows, cols])], [vi(prev, [rows, cols])], inits).SerializeToString())
    os.makedirs(tmp_path / "out")
    target = str(tmp_path / "out" / "big_out.onnx")
    try:
        graph = import_model(src)
        assert ops_of(graph)["add"] == count
        out = export_model(graph, keep_external=True)
        assert all(t.data_location == TP.EXTERNAL for t in out.graph.initializer)
        del graph
        save_model(out, target)
        del out
        assert os.path.getsize(target + ".data") > 2**31 and os.path.getsize(target) < 1 << 20
        assert sorted(os.listdir(tmp_path / "out")) == ["big_out.onnx", "big_out.onnx.data"]
        report = compare_models(src, target)
        assert report.ok, report.detail
    finally:  # pytest keeps the last runs' tmp_path: do not leave 2.25 GiB behind each time
        for name in os.listdir(tmp_path / "out"):
            os.remove(tmp_path / "out" / name)


def test_large_model_paths_with_a_lowered_limit(tmp_path, monkeypatch) -> None:
    """The > 2 GiB code paths (external-data save, path-based checks, sessions from files), with the limit lowered."""
    from tensat.onnx import external
    from tensat.session import make_session
    from tensat.verify import compare_models

    monkeypatch.setattr(external, "PROTO_LIMIT", 4096)
    monkeypatch.setattr(external, "_LARGE_TENSOR", 1024)
    model = make(
        [helper.make_node("MatMul", ["x", "w"], ["y"]), helper.make_node("Add", ["y", "b"], ["z"])],
        [vi("x", [2, 64])],
        [vi("z", [2, 32])],
        [init("w", randn(64, 32)), init("b", randn(32))],
    )
    path = tmp_path / "m.onnx"
    save_model(model, path)
    assert sorted(os.listdir(tmp_path)) == ["m.onnx", "m.onnx.data"]
    assert os.path.getsize(path) < 4096 and os.path.getsize(tmp_path / "m.onnx.data") >= 64 * 32 * 4
    assert model.graph.initializer[0].HasField("raw_data")  # the caller's proto is untouched
    loaded = load_model(model)  # checker through a temporary external-data copy
    assert len(loaded.graph.initializer) == 2
    graph, out = roundtrip(str(path))
    assert ops_of(graph)["matmul"] == 1
    assert make_session(out).get_outputs()[0].name == "z"
    assert compare_models(str(path), out).ok


# ---------------------------------------------------------------------------------------------------------------
# export


def test_every_registry_op_has_an_exporter() -> None:
    assert set(ops.REGISTRY) <= set(EXPORTERS)
    assert {"Conv", "Gemm", "Split", "Slice", "BatchNormalization"} <= set(IMPORTERS)


def all_ops_graph(opset: int) -> Graph:
    """One IR graph using every op (weights shaped to need folding)."""
    g = Graph(opset_imports={"": opset})
    x = g.input("x", (1, 4, 8, 8))
    y = g.input("y", (1, 8))
    w1, w2 = g.weight(randn(4, 4, 3, 3), "w1"), g.weight(randn(4, 4, 3, 3), "w2")
    wcat = g.add("concat", [w1, w2], axis=0)  # weight-only: folded
    zero = g.weight(np.zeros(8, np.float32), "zero")
    c = g.add("conv2d", [x, wcat, zero], strides=(1, 1), pads=(1, 1, 1, 1), dilations=(1, 1), group=1, act=2)
    b = g.add(
        "batchnorm",
        [c, g.weight(randn(8)), g.weight(randn(8)), g.weight(randn(8)), g.weight(np.abs(randn(8)) + 1)],
        epsilon=1e-5,
    )
    s1 = g.add("slice", [b], axis=1, start=0, size=3)
    s2 = g.add("slice", [b], axis=1, start=3, size=5)  # s1, s2 partition axis 1: one Split
    s3 = g.add("slice", [b], axis=2, start=2, size=4)  # alone: a Slice
    m = g.add("maxpool", [s1], kernel=(2, 2), strides=(2, 2), pads=(0, 0, 0, 0))
    a = g.add("avgpool", [s2], kernel=(3, 3), strides=(2, 2), pads=(1, 1, 1, 1), count_include_pad=0)
    cat = g.add("concat", [g.add("concat", [m, a], axis=1), g.add("sigmoid", [m])], axis=1)  # (1, 11, 4, 4)
    gap = g.add("globalavgpool", [cat])
    flat = g.reshape(gap, (1, 11))
    mm = g.add("matmul", [flat, g.weight(randn(11, 8))])
    t = g.add("tanh", [g.add("add", [mm, y])])
    prod = g.add("mul", [t, g.add("relu", [y])])
    tr = g.add("transpose", [s3], perm=(0, 2, 3, 1))
    g.output("prod", prod)
    g.output("tr", tr)
    return g


@pytest.mark.parametrize("opset", [7, 8, 9, 10, 11, 12, 13, 14, 17, 18, 19, 21])
def test_export_every_op_every_opset(opset: int) -> None:
    g = all_ops_graph(opset)
    model = export_model(g)
    onnx.checker.check_model(model, full_check=True)
    assert model.opset_import[0].version == opset
    assert model.ir_version <= 13
    types = op_types(model)
    assert types.count("Split") == 1 and types.count("Slice") == 1
    assert types.count("Concat") == 1  # the chain became one 3-input Concat
    assert len(next(n for n in model.graph.node if n.op_type == "Concat").input) == 3
    conv = next(n for n in model.graph.node if n.op_type == "Conv")
    assert len(conv.input) == 2  # zero bias dropped
    assert {
        "Relu",
        "BatchNormalization",
        "MaxPool",
        "AveragePool",
        "GlobalAveragePool",
        "Reshape",
        "MatMul",
        "Tanh",
        "Add",
        "Mul",
        "Transpose",
        "Sigmoid",
    } <= set(types)
    feeds = random_inputs(model, 3)
    ref = g.evaluate(feeds, [n for _, n in g.outputs])
    got = run_model(model, feeds)
    for name, node in g.outputs:
        np.testing.assert_allclose(got[name], ref[node], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("opset", [7, 8, 9, 10, 11, 12, 13, 17, 21])
def test_weight_transforms_export_on_computed_tensors_every_opset(opset: int) -> None:
    """rsqrt, enlarge and merge usually fold into weights; on a graph input they are emitted as ONNX nodes."""
    g = Graph(opset_imports={"": opset})
    w = g.input("w", (4, 2, 1, 3))
    enlarged = g.add("enlarge", [w], kernel=(3, 3))
    merged = g.add("merge", [enlarged], group=2, count=2)
    g.output("rsqrt", g.add("rsqrt", [g.add("mul", [w, w])], epsilon=1e-3))
    g.output("merged", merged)
    model = export_model(g)
    onnx.checker.check_model(model, full_check=True)
    assert model.opset_import[0].version == opset and model.ir_version >= 4
    assert {"Pad", "Tile", "Sqrt", "Reciprocal"} <= set(op_types(model))
    feeds = random_inputs(model, 5)
    ref = g.evaluate(feeds, [n for _, n in g.outputs])
    got = run_model(model, feeds)
    for name, node in g.outputs:
        np.testing.assert_allclose(got[name], ref[node], rtol=1e-5, atol=1e-6)


def test_weight_only_subgraphs_fold() -> None:
    g = Graph()
    x = g.input("x", (2, 6))
    wa, wb = g.weight(randn(6, 3), "wa"), g.weight(randn(6, 5), "wb")
    w = g.add("concat", [wa, wb], axis=1)
    w = g.add("mul", [w, g.weight(np.full((1, 1), 2.0, np.float32), "two")])
    y = g.add("matmul", [x, w])
    g.output("y", y)
    model = export_model(g)
    assert op_types(model) == ["MatMul"]
    assert len(model.graph.initializer) == 1
    folded = numpy_helper.to_array(model.graph.initializer[0])
    np.testing.assert_array_equal(folded, np.concatenate([g.weights["wa"], g.weights["wb"]], axis=1) * 2)


def test_export_is_deterministic() -> None:
    model = idioms_model(13)
    a = export_model(import_model(model)).SerializeToString()
    b = export_model(import_model(model)).SerializeToString()
    g = import_model(model)
    assert a == b == export_model(g).SerializeToString() == export_model(g).SerializeToString()


def test_output_is_input_and_weight() -> None:
    g = Graph()
    x = g.input("x", (3,))
    w = g.weight(randn(3), "w")
    g.output("x", x)
    g.output("x_again", x)
    g.output("w_out", w)
    g.output("s", g.add("add", [x, w]))
    model = export_model(g)
    onnx.checker.check_model(model, full_check=True)
    feeds = {"x": randn(3)}
    out = run_model(model, feeds)
    np.testing.assert_array_equal(out["x"], feeds["x"])
    np.testing.assert_array_equal(out["x_again"], feeds["x"])
    np.testing.assert_array_equal(out["w_out"], g.weights["w"])


# ---------------------------------------------------------------------------------------------------------------
# saving


def test_save_model_roundtrip(tmp_path) -> None:
    model = idioms_model(13)
    path = tmp_path / "m.onnx"
    save_model(model, path)
    assert onnx.load(str(path)).SerializeToString() == model.SerializeToString()
    assert os.listdir(tmp_path) == ["m.onnx"]


def test_save_model_is_atomic(tmp_path, monkeypatch) -> None:
    path = tmp_path / "m.onnx"
    path.write_bytes(b"old contents")

    def broken_fsync(fd: int) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(os, "fsync", broken_fsync)
    with pytest.raises(OSError):
        save_model(idioms_model(13), path)
    assert path.read_bytes() == b"old contents"
    assert os.listdir(tmp_path) == ["m.onnx"]
    monkeypatch.undo()
    fresh = tmp_path / "fresh.onnx"
    monkeypatch.setattr(os, "fsync", broken_fsync)
    with pytest.raises(OSError):
        save_model(idioms_model(13), fresh)
    assert not fresh.exists() and os.listdir(tmp_path) == ["m.onnx"]


# ---------------------------------------------------------------------------------------------------------------
# more lowering cases


def test_misc_lowerings() -> None:
    inits = [
        init("w1d", randn(6)),
        init("ratio", np.array(0.3, np.float32)),
        init("train", np.array(False)),
        init("st", np.array([0, 1], np.int64)),
        init("en", np.array([4, 6], np.int64)),
        init("ax", np.array([0, 1], np.int64)),
        init("stp", np.array([2, 1], np.int64)),
        init("rs", np.array([3, -1, 2], np.int64)),
        init("wg", randn(6, 4)),
    ]
    nodes = [
        helper.make_node("Split", ["x"], ["p0", "p1", "p2"], axis=-1, num_outputs=3),  # 6 -> 2, 2, 2
        helper.make_node("Concat", ["p2", "p0", "p1"], ["cat"], axis=-1),
        helper.make_node("Sum", ["cat"], ["sum1"]),
        helper.make_node("MatMul", ["sum1", "w1d"], ["mv"]),  # 1-D right operand: (4,)
        helper.make_node("Dropout", ["x", "ratio", "train"], ["dx"]),
        helper.make_node("Slice", ["dx", "st", "en", "ax", "stp"], ["strided"]),  # step 2: a strided slice
        helper.make_node("Flatten", ["x"], ["f0"], axis=0),
        helper.make_node("Flatten", ["x"], ["fneg"], axis=-1),
        helper.make_node("Squeeze", ["f0"], ["sq"]),  # no axes: every 1 dim
        helper.make_node("Transpose", ["x"], ["same"], perm=[0, 1]),
        helper.make_node("Gemm", ["x", "wg"], ["gm"]),  # no C (opset 11+)
        helper.make_node("Reshape", ["x", "rs"], ["r3"]),  # (4, 6) -> (3, 4, 2)
        helper.make_node("Shape", ["r3"], ["shp"], start=-2),
        helper.make_node("Cast", ["shp"], ["shpf"], to=TP.FLOAT),
        helper.make_node("ReduceSum", ["shpf"], ["total"], keepdims=0),
        helper.make_node("Mul", ["mv", "total"], ["mvs"]),
    ]
    outputs = [
        vi("mvs", [4]),
        vi("strided", [2, 5]),
        vi("fneg", [4, 6]),
        vi("sq", [24]),
        vi("same", [4, 6]),
        vi("gm", [4, 4]),
        vi("r3", [3, 4, 2]),
    ]
    graph, out = roundtrip(make(nodes, [vi("x", [4, 6])], outputs, inits, opset=18))
    counts = ops_of(graph)
    assert "opaque" not in counts and counts["stride"] == 1
    assert "Shape" not in op_types(out) and "Cast" not in op_types(out)


def test_initializers_listed_as_inputs() -> None:
    """IR version 3 style: initializers also appear as graph inputs; they are weights."""
    w = randn(3, 3)
    model = make(
        [helper.make_node("MatMul", ["x", "w"], ["y"])],
        [vi("x", [2, 3]), vi("w", [3, 3])],
        [vi("y", [2, 3])],
        [init("w", w)],
        opset=9,
        ir=3,
    )
    graph, out = roundtrip(model)
    assert [i.name for i in out.graph.input] == ["x"]
    assert ops_of(graph)["matmul"] == 1


def test_sequence_values_inside_opaque_ops() -> None:
    inits = [init("sizes", np.array([3, 3], np.int64)), init("pos", np.array(1, np.int64))]
    nodes = [
        helper.make_node("SplitToSequence", ["x", "sizes"], ["seq"], axis=1),
        helper.make_node("SequenceAt", ["seq", "pos"], ["part"]),
        helper.make_node("Relu", ["part"], ["out"]),
    ]
    graph, _ = roundtrip(make(nodes, [vi("x", [3, 6])], [vi("out", [3, 3])], inits))
    assert ops_of(graph)["relu"] == 1
    # a sequence computed from constants cannot become a weight: it stays an op
    inits.append(init("c", randn(3, 6)))
    nodes = [
        helper.make_node("SplitToSequence", ["c", "sizes"], ["seq"], axis=1),
        helper.make_node("SequenceAt", ["seq", "pos"], ["part"]),
        helper.make_node("Add", ["x", "part"], ["out"]),
    ]
    graph, out = roundtrip(make(nodes, [vi("x", [3, 3])], [vi("out", [3, 3])], inits))
    assert op_types(out) == ["SplitToSequence", "SequenceAt", "Add"]


def test_constant_subgraph_through_onnxruntime() -> None:
    """Constants through ops tensat does not model (Range, Cast, Exp) fold into one weight."""
    nodes = [
        helper.make_node("Constant", [], ["start"], value_float=0.0),
        helper.make_node("Constant", [], ["limit"], value_float=6.0),
        helper.make_node("Constant", [], ["delta"], value_float=1.0),
        helper.make_node("Range", ["start", "limit", "delta"], ["rng"]),
        helper.make_node("Exp", ["rng"], ["e"]),
        helper.make_node("Mul", ["x", "e"], ["y"]),
    ]
    graph, out = roundtrip(make(nodes, [vi("x", [2, 6])], [vi("y", [2, 6])]))
    assert op_types(out) == ["Mul"]
    assert ops_of(graph) == {"input": 1, "mul": 1, "weight": 1}


def test_local_functions_are_inlined() -> None:
    double = helper.make_function(
        "my.fns", "Double", ["a"], ["b"], [helper.make_node("Add", ["a", "a"], ["b"])], [helper.make_opsetid("", 17)]
    )
    model = make(
        [helper.make_node("Double", ["x"], ["y"], domain="my.fns"), helper.make_node("Relu", ["y"], ["z"])],
        [vi("x", [2, 3])],
        [vi("z", [2, 3])],
        extra_opsets=[("my.fns", 1)],
    )
    model.functions.append(double)
    graph, out = roundtrip(model)
    assert ops_of(graph) == {"add": 1, "input": 1, "relu": 1}
    assert [o.domain for o in out.opset_import] == [""]


def test_loop_with_nested_outer_scope_capture() -> None:
    then_g = helper.make_graph([helper.make_node("Add", ["acc_in", "w"], ["t"])], "t", [], [vi("t", [2])])
    else_g = helper.make_graph([helper.make_node("Sub", ["acc_in", "w"], ["e"])], "e", [], [vi("e", [2])])
    body = helper.make_graph(
        [
            helper.make_node("Identity", ["cond_in"], ["cond_out"]),
            helper.make_node("If", ["flag"], ["acc_out"], then_branch=then_g, else_branch=else_g),
        ],
        "body",
        [vi("i", [], TP.INT64), vi("cond_in", [], TP.BOOL), vi("acc_in", [2])],
        [vi("cond_out", [], TP.BOOL), vi("acc_out", [2])],
    )
    model = make(
        [helper.make_node("Relu", ["x"], ["w"]), helper.make_node("Loop", ["trip", "", "x"], ["res"], body=body)],
        [vi("x", [2]), vi("flag", [], TP.BOOL)],
        [vi("res", [2])],
        [init("trip", np.array(3, np.int64))],
    )
    for seed in range(3):
        graph, _ = roundtrip(model, seed=seed)
    assert list(graph.opaque) == ["Loop_1@1"]  # the empty condition input is remembered in the key


def test_other_domains_and_3d_conv_are_opaque() -> None:
    model = make(
        [
            helper.make_node("Normalizer", ["x"], ["y"], domain="ai.onnx.ml", norm="L2"),
            helper.make_node("Relu", ["y"], ["z"]),
        ],
        [vi("x", [2, 3])],
        [vi("z", [2, 3])],
        extra_opsets=[("ai.onnx.ml", 1)],
    )
    graph, out = roundtrip(model)
    assert ops_of(graph)["opaque"] == 1 and ("ai.onnx.ml", 1) in [(o.domain, o.version) for o in out.opset_import]
    conv3d = make(
        [helper.make_node("Conv", ["x", "w"], ["y"])],
        [vi("x", [1, 2, 5, 5, 5])],
        [vi("y", [1, 3, 3, 3, 3])],
        [init("w", randn(3, 2, 3, 3, 3))],
    )
    graph, _ = roundtrip(conv3d)
    assert ops_of(graph)["opaque"] == 1


def test_reading_back_tensats_own_export_without_the_checker_gives_the_same_graph():
    """The pipeline prices the model it writes by reading it back with `check=False` (onnx.checker costs seconds on
    big models); the graph is the one a checked import gives."""
    from tensat.models import SMALL_SIZES, build_model

    written = export_model(import_model(build_model("inception_v3", **SMALL_SIZES["inception_v3"])))
    checked, unchecked = import_model(written).compact(), import_model(written, check=False).compact()
    assert unchecked.nodes == checked.nodes and unchecked.outputs == checked.outputs
    assert unchecked.weights.keys() == checked.weights.keys()


@pytest.mark.parametrize(
    "attrs",
    [
        {"kernel_shape": [3], "pads": [1, 1]},
        {"kernel_shape": [5], "strides": [2], "pads": [2, 1], "group": 2},
        {"kernel_shape": [4], "strides": [3], "auto_pad": "SAME_UPPER"},
        {"kernel_shape": [3], "dilations": [2], "pads": [0, 2]},
    ],
    ids=["padded", "strided, grouped", "auto_pad", "dilated"],
)
def test_a_1d_conv_is_read_as_conv1d(attrs: dict) -> None:
    """Whisper's and wav2vec 2.0's Conv1d: read as the 1-D op it is (its pads resolved), and written so that it
    computes what the model does."""
    group = attrs.get("group", 1)
    w = randn(6, 4 // group, attrs["kernel_shape"][0])
    model = make(
        [helper.make_node("Conv", ["x", "w", "b"], ["c"], **attrs), helper.make_node("Relu", ["c"], ["y"])],
        [vi("x", [1, 4, 19])],
        [vi("y", [1, 6, None])],
        [init("w", w), init("b", randn(6))],
    )
    graph, out = roundtrip(model)
    summary = ops_of(graph)
    assert "opaque" not in summary and "conv2d" not in summary and summary["conv1d"] == 1
    conv = next(graph.nodes[i] for i in graph.live() if graph.nodes[i].op == "conv1d")
    assert len(conv.shape) == 3 and len(conv.attr["pads"]) == 2


def _topk_model(opset: int = 17) -> onnx.ModelProto:
    """Three TopKs: both outputs read, of the largest and of the smallest, and only the indices read (integers)."""
    inits = [init("k3", np.array([3], np.int64)), init("k2", np.array([2], np.int64))]
    nodes = [
        helper.make_node("TopK", ["x", "k3"], ["v", "i"], axis=1),
        helper.make_node("TopK", ["x", "k2"], ["low", "low_i"], axis=0, largest=0),
        helper.make_node("TopK", ["n", "k2"], ["n_v", "n_i"], axis=-1),
        helper.make_node("Cast", ["i"], ["i_f"], to=TP.FLOAT),
        helper.make_node("Add", ["v", "i_f"], ["vi"]),
    ]
    inputs = [vi("x", [4, 6]), vi("n", [3, 5], TP.INT64)]
    outputs = [vi("vi", [4, 3]), vi("low", [2, 6]), vi("low_i", [2, 6], TP.INT64), vi("n_i", [3, 2], TP.INT64)]
    return make(nodes, inputs, outputs, inits, opset=opset)


def test_a_topk_is_modelled_as_its_two_outputs_and_written_back_as_one_node() -> None:
    graph, out = roundtrip(_topk_model())
    counts = ops_of(graph)
    assert "opaque" not in counts and counts["topk"] == 5  # the values and indices of two, the indices of the third
    assert op_types(out).count("TopK") == 3
    read = {name for n in out.graph.node for name in n.input} | {o.name for o in out.graph.output}
    assert sorted(sum(name in read for name in n.output) for n in out.graph.node if n.op_type == "TopK") == [1, 2, 2]


def test_topk_ties_go_to_the_lower_index_as_in_onnxruntime() -> None:
    model = _topk_model()
    graph = import_model(model)
    x = np.array([[1, 3, 3, 0, 3, 1], [2, 2, 2, 2, 2, 2], [1, 0, 1, 1, 0, 0], [5, -1, 5, -1, 5, 4]], np.float32)
    n = np.array([[7, 7, 1, 7, 2], [-3, 0, 0, -3, 9], [np.iinfo(np.int64).min, 4, 4, 0, 4]], np.int64)
    feeds = {"x": x, "n": n}
    want = run_model(model, feeds)
    got = run_model(export_model(graph), feeds)
    ours = graph.evaluate(feeds, [i for _, i in graph.outputs])
    for name, i in graph.outputs:
        np.testing.assert_array_equal(got[name], want[name])
        np.testing.assert_array_equal(ours[i], want[name])


def test_an_unsorted_topk_stays_opaque() -> None:
    """ONNX leaves the order of an unsorted TopK's outputs open: no one meaning to model."""
    nodes = [helper.make_node("TopK", ["x", "k"], ["v", "i"], axis=1, sorted=0)]
    model = make(nodes, [vi("x", [4, 6])], [vi("v", [4, 2])], [init("k", np.array([2], np.int64))])
    assert "topk" not in ops_of(import_model(model)) and ops_of(import_model(model))["opaque"] == 1


def test_scatters_without_a_reduction_are_modelled_and_with_one_stay_opaque() -> None:
    inits = [
        init("where", np.array([[2], [0]], np.int64)),
        init("cols", np.array([[1, 0, 2], [3, 2, 0]], np.int64)),
    ]
    nodes = [
        helper.make_node("ScatterND", ["x", "where", "u"], ["nd"]),
        helper.make_node("ScatterND", ["x", "where", "u"], ["nd_sum"], reduction="add"),
        helper.make_node("ScatterElements", ["ids", "cols", "tok"], ["shifted"], axis=1),
    ]
    inputs = [vi("x", [3, 4]), vi("u", [2, 4]), vi("ids", [2, 5], TP.INT64), vi("tok", [2, 3], TP.INT64)]
    outputs = [vi("nd", [3, 4]), vi("nd_sum", [3, 4]), vi("shifted", [2, 5], TP.INT64)]
    graph, out = roundtrip(make(nodes, inputs, outputs, inits, opset=18))
    counts = ops_of(graph)
    assert counts["scatter_nd"] == 1 and counts["scatter_elements"] == 1 and counts["opaque"] == 1
    assert sorted(op_types(out)) == ["ScatterElements", "ScatterND", "ScatterND"]


def test_a_scatter_before_opset_11_is_read_and_written_as_scatter() -> None:
    cols = init("cols", np.array([[1, 0, 2], [3, 2, 0]], np.int64))
    nodes = [helper.make_node("Scatter", ["x", "cols", "u"], ["y"], axis=1)]
    model = make(nodes, [vi("x", [2, 5]), vi("u", [2, 3])], [vi("y", [2, 5])], [cols], opset=10)
    graph, out = roundtrip(model)
    assert ops_of(graph)["scatter_elements"] == 1 and op_types(out) == ["Scatter"]
