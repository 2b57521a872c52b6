"""Tests for the built-in benchmark models in tensat/models.py: builders and catalog."""

from __future__ import annotations

import functools
import subprocess
import sys

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import numpy_helper

from tensat import models
from tensat.models import (
    MODELS,
    ModelInfo,
    build_model,
    catalog,
    describe,
    example_inputs,
    format_catalog,
    model_names,
)
from tests.helpers import HEAVY_GRAPHS, slow_params

ALLOWED_OPS = {
    "Conv",
    "Relu",
    "Sigmoid",
    "Tanh",
    "MaxPool",
    "AveragePool",
    "GlobalAveragePool",
    "Add",
    "Mul",
    "MatMul",
    "Concat",
    "Reshape",
    "Transpose",
    "Flatten",
}

SMALL: dict[str, dict[str, object]] = {
    "bert": dict(layers=2, seq=16, hidden=128, heads=4),
    "resnext50": dict(image=64),
    "nasnet_a": dict(image=64, channels=16),
    "nasrnn": dict(steps=3, hidden=64),
    "inception_v3": dict(image=107),
    "squeezenet": dict(image=64),
    "vgg19": dict(image=32, fc=256),
    "resnet50": dict(image=64),
}

# name -> (node count, float parameter count) of the full-size default build.
FULL: dict[str, tuple[int, int]] = {
    "bert": (113, 33_554_432),
    "resnext50": (123, 24_994_792),
    "nasnet_a": (424, 45_034_856),
    "nasrnn": (230, 4_194_816),
    "inception_v3": (220, 23_817_352),
    "squeezenet": (65, 1_235_496),
    "vgg19": (46, 143_667_240),
    "resnet50": (123, 25_530_472),
}


def _run(model: onnx.ModelProto, seed: int = 0) -> list[np.ndarray]:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, example_inputs(model, seed))


def _expected_output_shapes(name: str, kwargs: dict[str, object]) -> list[tuple[int, ...]]:
    if name == "bert":
        seq, hidden = kwargs.get("seq", 64), kwargs.get("hidden", 1024)
        layers = kwargs.get("layers", 8)
        count = 1 if kwargs.get("wiring") == "sequential" else layers + 1
        return [(seq, hidden)] * count
    if name == "nasrnn":
        return [(1, kwargs.get("hidden", 512))]
    return [(1, 1000)]


def _check_outputs(name: str, kwargs: dict[str, object], outs: list[np.ndarray]) -> None:
    assert [o.shape for o in outs] == _expected_output_shapes(name, kwargs)
    for o in outs:
        assert o.dtype == np.float32
        assert np.isfinite(o).all()
        assert 1e-3 < float(o.std()) < 1e3, float(o.std())


def _check_structure(model: onnx.ModelProto) -> None:
    onnx.checker.check_model(model, full_check=True)
    assert model.ir_version == models.IR_VERSION == 8
    assert [(o.domain, o.version) for o in model.opset_import] == [("", models.OPSET)]
    graph = model.graph
    node_names = [n.name for n in graph.node]
    assert all(node_names) and len(set(node_names)) == len(node_names)
    produced = [o for n in graph.node for o in n.output]
    assert len(set(produced)) == len(produced)
    inits = {t.name: t for t in graph.initializer}
    assert not set(inits) & {i.name for i in graph.input}
    for node in graph.node:
        assert node.op_type in ALLOWED_OPS, node.op_type
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        assert "auto_pad" not in attrs
        if node.op_type == "Conv":
            assert len(node.input) == 3 and "pads" in attrs
        if node.op_type == "AveragePool":
            assert attrs["count_include_pad"] == 0 and "pads" in attrs
        if node.op_type == "Reshape":
            assert inits[node.input[1]].data_type == onnx.TensorProto.INT64
    for t in graph.initializer:
        if t.data_type == onnx.TensorProto.FLOAT:
            assert np.isfinite(numpy_helper.to_array(t)).all()


@functools.cache
def _small(name: str) -> onnx.ModelProto:
    return build_model(name, **SMALL[name])


def test_model_names() -> None:
    expected = ["bert", "resnext50", "nasnet_a", "nasrnn", "inception_v3", "squeezenet", "vgg19", "resnet50"]
    assert model_names() == expected
    assert list(MODELS) == expected
    for name in expected:
        assert MODELS[name].__doc__


def test_unknown_model() -> None:
    with pytest.raises(ValueError, match="resnext50"):
        build_model("alexnet")


def test_bad_sizes() -> None:
    with pytest.raises(ValueError):
        build_model("bert", hidden=100, heads=16)
    with pytest.raises(ValueError):
        build_model("bert", layers=1, seq=8, hidden=32, heads=4, wiring="parallel")
    with pytest.raises(ValueError):
        build_model("inception_v3", image=64)


@pytest.mark.parametrize("name", slow_params(SMALL))
def test_small_model_runs(name: str) -> None:
    model = _small(name)
    _check_structure(model)
    _check_outputs(name, SMALL[name], _run(model))


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(layers=2, seq=16, hidden=128, heads=4, wiring="sequential"),
        dict(layers=3, seq=64, hidden=1024, heads=16, wiring="sequential"),
    ],
)
def test_bert_sequential_wiring(kwargs: dict[str, object]) -> None:
    model = build_model("bert", **kwargs)
    _check_structure(model)
    assert [o.name for o in model.graph.output] == ["y"]
    _check_outputs("bert", kwargs, _run(model))


def test_nasrnn_unshared_weights() -> None:
    shared = build_model("nasrnn", steps=3, hidden=32)
    unshared = build_model("nasrnn", steps=3, hidden=32, share_weights=False)
    assert len(shared.graph.initializer) == 16 + 1
    assert len(unshared.graph.initializer) == 3 * 16 + 1
    assert len(shared.graph.node) == len(unshared.graph.node)
    _check_structure(unshared)
    _check_outputs("nasrnn", dict(hidden=32), _run(unshared))


def test_io_names() -> None:
    assert [i.name for i in build_model("nasrnn", steps=3, hidden=16).graph.input] == ["x0", "x1", "x2"]
    bert = build_model("bert", layers=2, seq=8, hidden=32, heads=4)
    assert [i.name for i in bert.graph.input] == ["x"]
    assert [o.name for o in bert.graph.output] == ["attn0", "attn1", "y"]
    for name in ("resnext50", "squeezenet", "vgg19"):
        model = _small(name)
        assert [i.name for i in model.graph.input] == ["x"]
        assert [o.name for o in model.graph.output] == ["logits"]


def test_nasnet_adapter_downsamples_larger_prev() -> None:
    g = models._Graph("cell", seed=0)
    prev = g.input("prev", (1, 8, 16, 16))
    cur = g.input("cur", (1, 8, 8, 8))
    out = models._nas_normal_cell(g, prev, cur, 4, "cell")
    assert out.shape == (1, 20, 8, 8)
    out = models._nas_reduction_cell(g, prev, out, 4, "red")
    assert out.shape == (1, 20, 4, 4)
    model = g.model([out])
    _check_structure(model)
    res = _run(model)[0]
    assert res.shape == (1, 20, 4, 4) and np.isfinite(res).all()


@pytest.mark.slow
def test_deterministic() -> None:
    kwargs = SMALL["nasnet_a"]
    a = build_model("nasnet_a", seed=3, **kwargs).SerializeToString()
    b = build_model("nasnet_a", seed=3, **kwargs).SerializeToString()
    c = build_model("nasnet_a", seed=4, **kwargs).SerializeToString()
    assert a == b
    assert a != c
    for name in model_names():
        assert build_model(name, **SMALL[name]).SerializeToString() == _small(name).SerializeToString()


def test_full_size_deterministic() -> None:
    assert build_model("nasrnn").SerializeToString() == build_model("nasrnn").SerializeToString()


@pytest.mark.parametrize("name", slow_params(FULL, (*HEAVY_GRAPHS, "nasnet_a")))
def test_full_size_model(name: str) -> None:
    model = build_model(name)
    _check_structure(model)
    nodes, params = FULL[name]
    assert len(model.graph.node) == nodes
    assert sum(int(np.prod(t.dims)) for t in model.graph.initializer if t.data_type == onnx.TensorProto.FLOAT) == params
    if name != "vgg19":
        _check_outputs(name, {}, _run(model))


@pytest.mark.slow
def test_full_size_vgg19_runs() -> None:
    _check_outputs("vgg19", {}, _run(build_model("vgg19")))


# ---------------------------------------------------------------------------------------------------------------
# catalog, describe, format_catalog


@functools.cache
def _catalog() -> tuple[ModelInfo, ...]:
    return tuple(catalog())


def _float_params(model: onnx.ModelProto) -> int:
    return sum(int(np.prod(t.dims)) for t in model.graph.initializer if t.data_type == onnx.TensorProto.FLOAT)


def test_public_api() -> None:
    for name in (
        "build_model",
        "model_names",
        "catalog",
        "describe",
        "ModelInfo",
        "example_inputs",
        "MODELS",
        "SMALL_SIZES",
        "format_catalog",
    ):
        assert name in models.__all__
    assert all(hasattr(models, name) for name in models.__all__)
    import tensat.models

    assert tensat.models is models
    # `import tensat` stays light: the model builders load only on demand, and nothing comes from bench/.
    code = "import sys, tensat; print('tensat.models' in sys.modules, 'bench' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]


def test_catalog_matches_built_models() -> None:
    infos = _catalog()
    assert [i.name for i in infos] == model_names()
    assert set(models._DESCRIPTIONS) == set(MODELS)
    for info in infos:
        assert (info.onnx_nodes, info.parameters) == FULL[info.name]
        assert info.description and "\n" not in info.description
    for name in ("squeezenet", "nasrnn"):
        model = build_model(name)
        info = next(i for i in infos if i.name == name)
        assert info.onnx_nodes == len(model.graph.node)
        assert info.parameters == _float_params(model)
        assert info.inputs == {k: v.shape for k, v in example_inputs(model).items()}


def test_describe() -> None:
    info = describe("squeezenet")
    assert info == next(i for i in _catalog() if i.name == "squeezenet")
    assert info.inputs == {"x": (1, 3, 224, 224)}
    assert "SqueezeNet" in info.description
    assert describe("nasrnn").inputs == {f"x{t}": (1, 512) for t in range(5)}
    assert describe("bert").inputs == {"x": (64, 1024)}
    with pytest.raises(AttributeError):
        info.name = "other"  # type: ignore[misc]


@pytest.mark.parametrize(
    "call",
    [
        lambda: describe("alexnet"),
        lambda: catalog(["squeezenet", "alexnet"]),
        lambda: build_model("alexnet"),
    ],
)
def test_unknown_name_lists_valid_names(call) -> None:
    with pytest.raises(ValueError) as info:
        call()
    message = str(info.value)
    assert "'alexnet'" in message and "\n" not in message
    assert all(name in message for name in model_names())


def test_catalog_rejects_a_string() -> None:
    with pytest.raises(TypeError):
        catalog("bert")


def test_format_catalog() -> None:
    infos = [i for i in _catalog() if i.name in ("squeezenet", "nasrnn", "vgg19")]
    lines = format_catalog(infos).splitlines()
    assert len(lines) == 2 + len(infos)
    assert lines[0].split()[:5] == ["name", "ONNX", "nodes", "parameters", "inputs"]
    assert set(lines[1].replace(" ", "")) == {"-"}
    rows = {line.split()[0]: line for line in lines[2:]}
    assert "1.2M" in rows["squeezenet"] and "x 1x3x224x224" in rows["squeezenet"]
    assert "143.7M" in rows["vgg19"]
    assert "x0..x4 1x512" in rows["nasrnn"] and "4.2M" in rows["nasrnn"]
    for info in infos:
        assert rows[info.name].endswith(info.description)
    # Aligned: numbers end under their (right-aligned) headers, descriptions start together.
    for header in ("ONNX nodes", "parameters"):
        end = lines[0].index(header) + len(header)
        assert all(line[end - 1] != " " and line[end : end + 1] in ("", " ") for line in lines[2:])
    start = lines[0].index("description")
    assert all(line[start - 1] == " " and line[start] != " " for line in lines[2:])


def test_format_catalog_synthetic() -> None:
    tiny = ModelInfo("tiny", "A tiny graph", {"a": (2, 3), "b": (4,)}, 3, 1_249_999)
    text = format_catalog([tiny])
    assert text.splitlines()[2].split() == ["tiny", "3", "1.2M", "a", "2x3,", "b", "4", "A", "tiny", "graph"]
    assert format_catalog([]).splitlines()[0].startswith("name")
