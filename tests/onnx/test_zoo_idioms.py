"""Model-zoo idioms at opsets 7-13 (bench/zoo_models.py): every one imports, lowers as documented (Dropout gone,
scalar Gather sliced, computed Reshape shapes folded, LRN/Softmax kept opaque with their own opset's meaning),
optimizes, verifies in onnxruntime and keeps the input's output names, ranks and dtypes."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto as TP
from onnx import helper, numpy_helper

import tensat
from bench.zoo_models import IDIOMS, ZOO, build_zoo_model, zoo_names
from tensat.errors import ModelError
from tensat.ir import Graph
from tensat.onnx_io import MIN_OPSET, export_model, import_model, load_model
from tensat.verify import compare_models, random_inputs, run_model
from tests.helpers import make, vi

# ---------------------------------------------------------------------------------------------------------------
# helpers


def small(name: str, **kwargs: object) -> onnx.ModelProto:
    return build_zoo_model(name, small=True, **kwargs)


def opaque_ops(graph: Graph) -> list[str]:
    """Op types of the opaque nodes (one per ONNX node, however many outputs it has)."""
    return sorted(spec.op_type for spec in graph.opaque.values())


def output_node(graph: Graph, name: str):
    return graph.nodes[dict(graph.outputs)[name]]


def op_types(model: onnx.ModelProto) -> set[str]:
    return {n.op_type for n in model.graph.node}


def optimize_and_run(model: onnx.ModelProto) -> onnx.ModelProto:
    """Optimize with analytic costs (the end-to-end latency check off), which verifies the result against the input;
    then export the result's graph as tensat writes it (where nothing was cheaper, tensat returns the input file
    itself, so this is the imported graph written back), run it and the input in onnxruntime, and require the same
    output names, ranks and dtypes. Returns the exported model."""
    result = tensat.optimize_with_details(model, cost="analytic", ilp_time_limit=5, time_limit=5, latency_check=0)
    assert result.verification is not None and result.verification.ok
    out = export_model(result.graph)
    onnx.checker.check_model(out, full_check=True)
    assert out.opset_import[0].domain == "" and out.opset_import[0].version == model.opset_import[0].version
    loaded = load_model(model)
    feeds = random_inputs(loaded, 1)
    expected, actual = run_model(loaded, feeds), run_model(out, feeds)
    assert [o.name for o in out.graph.output] == [o.name for o in model.graph.output]
    assert list(actual) == list(expected)
    for name, want in expected.items():
        got = actual[name]
        assert got.dtype == want.dtype and got.ndim == want.ndim, name
    return out


# ---------------------------------------------------------------------------------------------------------------
# the registry


def test_every_idiom_is_covered_by_a_fixture_and_a_whole_model_exists() -> None:
    covered = {idiom for entry in ZOO.values() for idiom in entry.idioms}
    assert covered == set(IDIOMS)
    assert len(zoo_names(whole=True)) >= 5
    assert all(7 <= entry.opset <= 13 for entry in ZOO.values())
    for name in zoo_names(whole=False):
        model = small(name)
        assert model.opset_import[0].version == ZOO[name].opset


def test_old_files_list_initializers_as_inputs_and_the_import_reads_them_as_weights() -> None:
    model = small("batchnorm_legacy")
    assert model.ir_version == 3
    inits = {t.name for t in model.graph.initializer}
    assert inits <= {i.name for i in model.graph.input}
    graph = import_model(model)
    assert [graph.input_name(i) for i in graph.input_ids] == ["x"]
    assert export_model(graph).ir_version >= 4  # initializers are not graph inputs there


def test_ir3_initializers_left_out_of_the_inputs_are_read_as_constants(tmp_path) -> None:
    """onnxslim's output of an opset-9 file: IR version 3, its initializers no longer graph inputs. onnxruntime runs
    it; onnx.checker rejects it. Read from a file (the checker's own path) it imports, optimizes and verifies."""
    model = small("squeezenet10")
    inits = {t.name for t in model.graph.initializer}
    inputs = [v for v in model.graph.input if v.name not in inits]
    del model.graph.input[:]
    model.graph.input.extend(inputs)
    assert model.ir_version == 3
    path = tmp_path / "slimmed.onnx"
    onnx.save(model, str(path))
    with pytest.raises(onnx.checker.ValidationError, match="not in graph input"):
        onnx.checker.check_model(str(path))
    assert load_model(str(path)).ir_version == 4
    result = tensat.optimize_with_details(str(path), cost="analytic", time_limit=5, ilp_time_limit=5, latency_check=0)
    assert result.verification is not None and result.verification.ok


# ---------------------------------------------------------------------------------------------------------------
# one idiom each


@pytest.mark.parametrize("opset", [7, 9, 10, 12])
def test_dropout_is_an_identity_and_its_mask_a_constant(opset: int) -> None:
    model = small("dropout_mask", opset=opset)
    graph = import_model(model)
    assert "opaque" not in graph.summary()
    mask_id = next(i for name, i in graph.outputs if name == "mask")
    value = graph.constant(mask_id)
    assert value is not None and value.shape == (1, 4, 8, 8)
    assert value.dtype == (np.bool_ if opset >= 10 else np.float32)
    assert np.all(value == (opset >= 12))  # opset 12 defines an all-true mask; onnxruntime writes zeros before
    out = optimize_and_run(model)
    assert "Dropout" not in op_types(out)


def test_dropout_in_training_mode_stays_opaque() -> None:
    model = small("dropout_training_mode")
    for node in model.graph.node:
        if node.op_type == "Constant" and node.output[0].endswith("training_mode"):
            node.attribute[0].t.CopyFrom(numpy_helper.from_array(np.asarray(True), node.attribute[0].t.name))
    assert opaque_ops(import_model(model)).count("Dropout") == 2


@pytest.mark.parametrize("opset", [7, 8, 9])
def test_legacy_batchnorm(opset: int) -> None:
    model = small("batchnorm_legacy", opset=opset)
    spatial = [a.i for n in model.graph.node for a in n.attribute if a.name == "spatial"]
    assert spatial == ([1, 0] if opset < 9 else [])
    counts = import_model(model).summary()
    assert "opaque" not in counts and counts["batchnorm"] == 1
    assert counts.get("mul", 0) == (1 if opset < 9 else 0)  # spatial=0: x * a + b per activation
    optimize_and_run(model)


@pytest.mark.parametrize("opset", [7, 9, 11])
def test_gemm_attributes(opset: int) -> None:
    model = small("gemm_attributes", opset=opset)
    counts = import_model(model).summary()
    assert "opaque" not in counts and counts["matmul"] == 3 and counts["transpose"] >= 1
    optimize_and_run(model)


@pytest.mark.parametrize("opset", [7, 9, 11, 12])
def test_lrn_and_softmax_keep_their_opsets_meaning(opset: int) -> None:
    """Before opset 13 a Softmax is over the dims from its axis on, flattened: read as a softmax over one axis of
    the tensor reshaped so."""
    model = small("legacy_ops", opset=opset)
    graph = import_model(model)
    assert opaque_ops(graph) == []
    assert {"lrn", "softmax", "log_softmax"} <= set(graph.summary())
    spread = graph.nodes[output_node(graph, "spread").inputs[0]]
    assert spread.op == "softmax" and len(spread.shape) == 2
    assert graph.summary()["reshape"] == 3  # both Flattens, and the flattened Softmax's way back
    out = optimize_and_run(model)
    assert out.opset_import[0].version == opset
    # the IR holds the meaning, whatever the opset: exported at opset 13, where Softmax over (1, C, H, W) at axis 1
    # means another thing, the graph still computes the model's outputs
    graph.opset_imports[""] = 13
    assert compare_models(load_model(model), export_model(graph)).ok


@pytest.mark.parametrize("opset", [7, 8, 9, 10, 11, 12, 13])
def test_computed_reshape_shape_is_folded(opset: int) -> None:
    model = small("computed_reshape", opset=opset)
    graph = import_model(model)
    counts = graph.summary()
    assert "opaque" not in counts and counts["reshape"] == 1
    assert output_node(graph, "y").shape == (1, 5)
    out = optimize_and_run(model)
    assert not op_types(out) & {"Shape", "Gather", "Unsqueeze", "Concat"}


@pytest.mark.parametrize(
    ("name", "opset"), [("squeeze_attribute", 7), ("squeeze_attribute", 11), ("squeeze_input", 13)]
)
def test_squeeze_and_unsqueeze(name: str, opset: int) -> None:
    model = small(name, opset=opset)
    squeeze = next(n for n in model.graph.node if n.op_type == "Squeeze")
    assert (len(squeeze.input) == 2) == (opset >= 13)
    counts = import_model(model).summary()
    assert "opaque" not in counts and counts["reshape"] == 2
    optimize_and_run(model)


@pytest.mark.parametrize("opset", [7, 9, 11, 13])
def test_gather_of_one_index_is_a_slice(opset: int) -> None:
    model = small("gather_scalar", opset=opset)
    graph = import_model(model)
    assert opaque_ops(graph) == [] and graph.summary()["gather"] == 1  # the two-index one
    assert output_node(graph, "pair").shape == (1, 2, 8, 8)
    assert output_node(graph, "channel").shape == (1, 8, 8)
    assert output_node(graph, "row").shape == (1, 1, 8)
    assert output_node(graph, "logit").shape == (5,)
    assert graph.summary()["slice"] == 2
    optimize_and_run(model)


@pytest.mark.parametrize("opset", [9, 13])
def test_constant_and_constant_of_shape_weights(opset: int) -> None:
    model = small("constant_weights", opset=opset)
    assert {"Constant", "ConstantOfShape"} <= op_types(model)
    graph = import_model(model)
    counts = graph.summary()
    assert "opaque" not in counts and counts["conv2d"] == 1
    assert {name.split("__")[0] for name in graph.weights} >= {"conv1.weight"}
    assert graph.summary()["fill"] == 2  # the bias and the scale, constants of one value
    out = optimize_and_run(model)
    assert not op_types(out) & {"Constant", "ConstantOfShape"}


@pytest.mark.parametrize("opset", [7, 8, 13])
def test_nodes_out_of_order_are_sorted(opset: int) -> None:
    model = small("out_of_order", opset=opset)
    with pytest.raises(onnx.checker.ValidationError):
        onnx.checker.check_model(model)
    loaded = load_model(model)
    onnx.checker.check_model(loaded)
    assert sorted(n.name for n in loaded.graph.node) == sorted(n.name for n in model.graph.node)
    assert "opaque" not in import_model(model).summary()
    optimize_and_run(model)


def test_nodes_out_of_order_in_a_file_are_sorted_before_the_check(tmp_path) -> None:
    """A path is checked by onnx.checker reading the file itself, except where the proto read from it was repaired
    (sorted): the file, still out of order, would be rejected."""
    path = tmp_path / "out_of_order.onnx"
    onnx.save(small("out_of_order"), str(path))
    with pytest.raises(onnx.checker.ValidationError, match="topologically sorted"):
        onnx.checker.check_model(str(path))
    onnx.checker.check_model(load_model(str(path)))


def test_sorting_keeps_a_sorted_graph_and_is_stable() -> None:
    model = small("squeeze_attribute")
    assert [n.name for n in load_model(model).graph.node] == [n.name for n in model.graph.node]
    # two independent chains written interleaved and backwards: each chain comes out in order, earliest file
    # position first among the ready nodes
    nodes = [
        helper.make_node("Relu", ["a1"], ["a2"], name="a2"),
        helper.make_node("Relu", ["b1"], ["b2"], name="b2"),
        helper.make_node("Relu", ["x"], ["a1"], name="a1"),
        helper.make_node("Relu", ["x"], ["b1"], name="b1"),
    ]
    model = make(nodes, [vi("x", [2])], [vi("a2", [2]), vi("b2", [2])], opset=8)
    assert [n.name for n in load_model(model).graph.node] == ["a1", "a2", "b1", "b2"]


def test_a_cycle_is_reported_at_a_node_on_it() -> None:
    nodes = [
        helper.make_node("Relu", ["b"], ["after"], name="downstream"),  # reads the cycle, is not on it
        helper.make_node("Add", ["x", "b"], ["a"], name="first"),
        helper.make_node("Relu", ["a"], ["b"], name="second"),
    ]
    model = make(nodes, [vi("x", [2])], [vi("after", [2])], opset=8)
    with pytest.raises(ModelError) as err:
        import_model(model)
    msg = str(err.value)
    assert "\n" not in msg and "cycle" in msg and ("'first'" in msg or "'second'" in msg), msg


def test_opsets_before_7_are_refused() -> None:
    assert MIN_OPSET == 7
    model = make([helper.make_node("Relu", ["x"], ["y"])], [vi("x", [2])], [vi("y", [2])], opset=6)
    with pytest.raises(ModelError) as err:
        import_model(model)
    assert "\n" not in str(err.value) and "opset 6" in str(err.value)


def test_bool_mask_read_by_another_op_is_folded_through_it() -> None:
    nodes = [
        helper.make_node("Dropout", ["x"], ["y", "m"], ratio=0.2),
        helper.make_node("Not", ["m"], ["keep"]),
        helper.make_node("Cast", ["keep"], ["kf"], to=TP.FLOAT),
        helper.make_node("Mul", ["y", "kf"], ["out"]),
    ]
    model = make(nodes, [vi("x", [2, 3])], [vi("out", [2, 3])], opset=10)
    graph = import_model(model)
    assert "opaque" not in graph.summary() and graph.summary()["mul"] == 1
    optimize_and_run(model)


# ---------------------------------------------------------------------------------------------------------------
# whole zoo-style models, small


@pytest.mark.parametrize("name", zoo_names(whole=True))
def test_whole_zoo_model(name: str) -> None:
    model = small(name)
    graph = import_model(model)
    assert set(opaque_ops(graph)) <= {"LRN", "Softmax", "LogSoftmax"}
    assert graph.summary()["conv2d"] >= 2
    out = optimize_and_run(model)
    assert "Dropout" not in op_types(out)
