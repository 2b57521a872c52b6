"""The operator registry: numpy semantics agree with onnxruntime, shape functions agree with numpy."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from tensat import ops

ort.set_default_logger_severity(3)
RNG = np.random.default_rng(0)


def run_one(op_type: str, inputs: list[np.ndarray], attrs: dict, out_rank: int) -> np.ndarray:
    """Run a single ONNX node in onnxruntime on CPU."""
    names = [f"i{k}" for k in range(len(inputs))]
    node = helper.make_node(op_type, names, ["y"], **attrs)
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, a.shape) for n, a in zip(names, inputs)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None] * out_rank)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, dict(zip(names, inputs)))[0]


def rand(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


CONV_CASES = [
    # x shape, w shape, strides, pads, dilations, group
    ((1, 4, 9, 9), (6, 4, 3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1),
    ((2, 4, 10, 8), (6, 2, 3, 3), (2, 1), (0, 1, 2, 1), (1, 1), 2),
    ((1, 6, 11, 11), (6, 1, 3, 3), (1, 1), (2, 2, 2, 2), (2, 2), 6),
    ((1, 3, 7, 7), (5, 3, 1, 1), (2, 2), (0, 0, 0, 0), (1, 1), 1),
    ((1, 3, 8, 8), (4, 3, 1, 7), (1, 1), (0, 3, 0, 3), (1, 1), 1),
]


@pytest.mark.parametrize("xs,ws,strides,pads,dilations,group", CONV_CASES)
@pytest.mark.parametrize("act", [0, 1, 2, 3])
def test_conv2d_matches_onnxruntime(xs, ws, strides, pads, dilations, group, act):
    x, w, b = rand(*xs), rand(*ws), rand(ws[0])
    attrs = dict(strides=strides, pads=pads, dilations=dilations, group=group, act=act)
    shape = ops.shape_of("conv2d", [x.shape, w.shape, b.shape], attrs)
    got = ops.evaluate("conv2d", [x, w, b], attrs)
    onnx_pads = [pads[0], pads[1], pads[2], pads[3]]
    want = run_one(
        "Conv",
        [x, w, b],
        dict(strides=strides, pads=onnx_pads, dilations=dilations, group=group, kernel_shape=ws[2:]),
        4,
    )
    want = ops.ACTIVATIONS[act](want)
    assert got.shape == shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


POOL_CASES = [
    ((1, 3, 9, 9), (3, 3), (2, 2), (1, 1, 1, 1)),
    ((2, 2, 8, 7), (2, 2), (2, 2), (0, 0, 0, 0)),
    ((1, 4, 10, 10), (3, 3), (1, 1), (1, 1, 1, 1)),
    ((1, 1, 7, 9), (3, 2), (2, 1), (0, 1, 1, 0)),
]


@pytest.mark.parametrize("xs,kernel,strides,pads", POOL_CASES)
def test_pools_match_onnxruntime(xs, kernel, strides, pads):
    x = rand(*xs)
    onnx_attrs = dict(kernel_shape=kernel, strides=strides, pads=list(pads))
    attrs = dict(kernel=kernel, strides=strides, pads=pads)
    got = ops.evaluate("maxpool", [x], attrs)
    np.testing.assert_allclose(got, run_one("MaxPool", [x], onnx_attrs, 4), rtol=1e-6)
    assert got.shape == ops.shape_of("maxpool", [x.shape], attrs)
    for cip in (0, 1):
        got = ops.evaluate("avgpool", [x], dict(attrs, count_include_pad=cip))
        want = run_one("AveragePool", [x], dict(onnx_attrs, count_include_pad=cip), 4)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_elementwise_and_structural_ops_match_onnxruntime():
    a, b = rand(2, 3, 4), rand(1, 3, 1)
    np.testing.assert_allclose(ops.evaluate("add", [a, b], {}), run_one("Add", [a, b], {}, 3), rtol=1e-6)
    np.testing.assert_allclose(ops.evaluate("mul", [a, b], {}), run_one("Mul", [a, b], {}, 3), rtol=1e-6)
    for name, onnx_name in (("relu", "Relu"), ("sigmoid", "Sigmoid"), ("tanh", "Tanh"), ("abs", "Abs")):
        np.testing.assert_allclose(ops.evaluate(name, [a], {}), run_one(onnx_name, [a], {}, 3), rtol=1e-5, atol=1e-6)
    m1, m2 = rand(4, 5, 6), rand(1, 6, 3)
    np.testing.assert_allclose(ops.evaluate("matmul", [m1, m2], {}), run_one("MatMul", [m1, m2], {}, 3), rtol=1e-5)
    np.testing.assert_allclose(
        ops.evaluate("transpose", [a], {"perm": (2, 0, 1)}), run_one("Transpose", [a], {"perm": [2, 0, 1]}, 3)
    )
    x = rand(2, 3, 5, 5)
    np.testing.assert_allclose(
        ops.evaluate("globalavgpool", [x], {}), run_one("GlobalAveragePool", [x], {}, 4), rtol=1e-5, atol=1e-6
    )
    scale, bias, mean = rand(3), rand(3), rand(3)
    var = np.abs(rand(3)) + 0.1
    np.testing.assert_allclose(
        ops.evaluate("batchnorm", [x, scale, bias, mean, var], {"epsilon": 1e-3}),
        run_one("BatchNormalization", [x, scale, bias, mean, var], {"epsilon": 1e-3}, 4),
        rtol=1e-4,
        atol=1e-5,
    )


@pytest.mark.parametrize(
    "op,shapes,attrs",
    [
        ("add", [(2, 3), (3, 3)], {}),
        ("matmul", [(2, 3), (4, 5)], {}),
        (
            "conv2d",
            [(1, 4, 8, 8), (6, 3, 3, 3), (6,)],
            dict(strides=(1, 1), pads=(0, 0, 0, 0), dilations=(1, 1), group=1, act=0),
        ),
        (
            "conv2d",
            [(1, 4, 8, 8), (6, 2, 3, 3), (6,)],
            dict(strides=(1, 1), pads=(0, 0, 0, 0), dilations=(1, 1), group=4, act=0),
        ),
        (
            "conv2d",
            [(1, 4, 8, 8), (6, 4, 3, 3), (6,)],
            dict(strides=(1, 1), pads=(-1, 0, 1, 0), dilations=(1, 1), group=1, act=0),
        ),
        (
            "conv2d",
            [(1, 4, 8, 8), (6, 4, 3, 3), (6,)],
            dict(strides=(0, 1), pads=(0, 0, 0, 0), dilations=(1, 1), group=1, act=0),
        ),
        (
            "conv2d",
            [(1, 4, 8, 8), (6, 4, 3, 3), (6,)],
            dict(strides=(1, 1), pads=(0, 0, 0, 0), dilations=(0, 1), group=1, act=0),
        ),
        ("maxpool", [(1, 4, 8, 8)], dict(kernel=(3, 3), strides=(1, 1), pads=(0, -1, 0, 1))),
        ("avgpool", [(1, 4, 8, 8)], dict(kernel=(0, 3), strides=(1, 1), pads=(0, 0, 0, 0), count_include_pad=0)),
        ("concat", [(2, 3), (3, 3)], {"axis": 1}),
        ("concat", [(2, 3), (2, 3)], {"axis": 2}),
        ("slice", [(4, 5)], {"axis": 1, "start": 3, "size": 3}),
        ("transpose", [(4, 5)], {"perm": (0, 0)}),
        ("reshape", [(4, 5)], {"shape": (3, 7)}),
        ("batchnorm", [(1, 3, 2, 2), (4,), (3,), (3,), (3,)], {"epsilon": 1e-5}),
    ],
)
def test_shape_functions_reject_ill_typed(op, shapes, attrs):
    with pytest.raises(ops.ShapeError):
        ops.shape_of(op, shapes, attrs)


def test_every_op_has_a_complete_definition():
    for name, d in ops.REGISTRY.items():
        assert ops.BY_EGG[d.egg] is d
        assert d.egg_decl().startswith(f"(constructor {d.egg} ")
        assert d.egg_shape_rules(d), f"{name} has no egglog shape rule"
        if name not in ("input", "weight", "opaque"):
            assert d.evaluate is not None, f"{name} has no numpy semantics"


def test_every_op_declares_what_its_consumers_need():
    """The ONNX layer, the rule verifier and the cost models read each op's OpDef; they keep no tables of their own."""
    from tensat.onnx_io import EXPORTERS, IMPORTERS

    for op in ops.REGISTRY.values():
        assert op.name in EXPORTERS
        assert all(t in IMPORTERS for t in op.onnx_types), op.name
        if op.leaf or op.inputs is None:
            continue
        assert op.equations is not None, op.name
        assert op.ranks is None or len(op.ranks) == 1 + op.inputs, op.name
        for name in op.attr_names:
            assert name in op.domains or name in op.solved, f"{op.name}: no verifier domain for :{name}"


def test_abs_is_modelled_end_to_end():
    """An element-wise op declared by one line of tensat/ops/elementwise.py: imported (not opaque), optimized (the
    transposes cancel) and exported as Abs, verified against the input model."""
    import tensat
    from tensat.onnx_io import import_model

    nodes = [
        helper.make_node("Transpose", ["x"], ["t1"], perm=[1, 0]),
        helper.make_node("Transpose", ["t1"], ["t2"], perm=[1, 0]),
        helper.make_node("Abs", ["t2"], ["a"]),
        helper.make_node("Mul", ["a", "a"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "abs",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 8])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    assert "abs" in {n.op for n in import_model(model).nodes}
    result = tensat.optimize_with_details(  # tensat's own rules cancel them, not the pre-pass
        model, cost="analytic", latency_check=0, time_limit=20, ilp_time_limit=5, pre_pass="none"
    )
    assert result.returned_input is None
    assert result.verification is not None and result.verification.ok
    assert [n.op_type for n in result.output.graph.node] == ["Abs", "Mul"]
    assert ops.evaluate("abs", [np.array([-3, 2], np.int64)], {}).tolist() == [3, 2]
