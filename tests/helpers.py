"""What tests of several folders share: the repository root, ONNX model builders, the corpus of bad model inputs,
small versions of the benchmark graphs for the matcher and the sequential search, and IR graphs of layouts."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto as TP
from onnx import helper, numpy_helper

from tensat import onnx_io, ops
from tensat.ir import Graph
from tensat.models import build_model

ROOT = Path(__file__).resolve().parents[1]  # the repository: README, notebooks/, bench/ and pyproject.toml


# a machine as `bench.machine.machine_info` describes one, for the benchmarks' report tests
TEST_MACHINE = {
    "cpu": "test CPU",
    "cores": 2,
    "memory_gib": 23.5,
    "gpus": [],
    "python": "3.11",
    "versions": {},
    "highs": "1.0",
    "date": "today",
}


# the benchmark graphs a test over all of them takes longest on: their convolutions and sizes make such a test run
# several times as long as on the others, which cover the same code in the default run
HEAVY_GRAPHS = ("inception_v3", "resnet50", "resnext50", "vgg19")


def slow_params(names: Iterable[str], slow: Iterable[str] = HEAVY_GRAPHS) -> list:
    """`names` as pytest parameters, those among `slow` marked slow (run with `pytest -m slow`)."""
    marked = set(slow)
    return [pytest.param(n, marks=pytest.mark.slow) if n in marked else n for n in names]


def vi(name: str, shape, elem: int = TP.FLOAT) -> onnx.ValueInfoProto:
    """A tensor value info, float by default."""
    return helper.make_tensor_value_info(name, elem, shape)


def make(nodes, inputs, outputs, inits=(), opset: int = 17, extra_opsets=(), ir: int | None = None) -> onnx.ModelProto:
    """A model of `nodes` at `opset` (and the domains of `extra_opsets`), with the lowest IR version they allow."""
    graph = helper.make_graph(nodes, "test", inputs, outputs, initializer=list(inits))
    imports = [helper.make_opsetid("", opset)] + [helper.make_opsetid(d, v) for d, v in extra_opsets]
    model = helper.make_model(graph, opset_imports=imports)
    model.ir_version = ir if ir is not None else helper.find_min_ir_version_for(imports, ignore_unknown=True)
    return model


def _big_enough_model() -> onnx.ModelProto:
    w = numpy_helper.from_array(np.random.default_rng(1234).standard_normal(64).astype(np.float32), "w")
    return make([helper.make_node("Add", ["x", "w"], ["y"])], [vi("x", [64])], [vi("y", [64])], [w])


def bad_model_inputs(tmp_path: Path) -> list[tuple[object, str]]:
    """Inputs no layer may accept, as (path or model, a word the one-line error must contain): missing, empty,
    noise and truncated files, a directory, and models failing the checker, with an unknown domain, a dangling
    input, a cycle, too old an opset or too new an IR version. The importer, the API and the command line are tested
    on them."""
    cases: list[tuple[object, str]] = [(str(tmp_path / "missing.onnx"), "not found"), (str(tmp_path), "directory")]
    empty = tmp_path / "empty.onnx"
    empty.write_bytes(b"")
    cases.append((str(empty), "empty"))
    noise = tmp_path / "noise.onnx"
    noise.write_bytes(np.random.default_rng(0).integers(0, 256, 4096, dtype=np.uint8).tobytes())
    cases.append((str(noise), "not an ONNX model"))
    text = tmp_path / "text.onnx"
    text.write_text("this is not a model\n")
    cases.append((str(text), "not an ONNX model"))
    truncated = tmp_path / "truncated.onnx"
    data = _big_enough_model().SerializeToString()
    truncated.write_bytes(data[: len(data) // 2])
    cases.append((str(truncated), "truncated.onnx"))
    bad_arity = make([helper.make_node("Relu", ["x", "x"], ["y"])], [vi("x", [2])], [vi("y", [2])])
    cases.append((bad_arity, "onnx.checker"))
    unknown = make(
        [helper.make_node("Foo", ["x"], ["y"], domain="x.y")], [vi("x", [2])], [vi("y", [2])], extra_opsets=[("x.y", 1)]
    )
    cases.append((unknown, "unknown opset domain 'x.y'"))
    dangling = make([helper.make_node("Add", ["x", "ghost"], ["y"], name="adder")], [vi("x", [2])], [vi("y", [2])])
    cases.append((dangling, "'ghost'"))
    cycle = make(
        [helper.make_node("Add", ["x", "b"], ["a"], name="n1"), helper.make_node("Relu", ["a"], ["b"], name="n2")],
        [vi("x", [2])],
        [vi("b", [2])],
    )
    cases.append((cycle, "cycle"))
    old = make([helper.make_node("Relu", ["x"], ["y"])], [vi("x", [2])], [vi("y", [2])], opset=6)
    cases.append((old, "opset 6"))
    newer = make([helper.make_node("Relu", ["x"], ["y"])], [vi("x", [2])], [vi("y", [2])], ir=14)
    cases.append((newer, "IR version 14"))  # helper.make_model's default in onnx 1.23; onnxruntime 1.31 reads 13
    return cases


# Small versions of the benchmark graphs (the same structure, sizes that evaluate in milliseconds), smaller than
# tensat.models.SMALL_SIZES: the matcher's tests evaluate every match on them.
TINY_SIZES = {
    "bert": dict(layers=1, seq=8, hidden=32, heads=4),
    "nasrnn": dict(steps=2, hidden=16),
    "resnext50": dict(image=32),
    "nasnet_a": dict(image=32, channels=8, stages=1, cells=2),
    "inception_v3": dict(image=75),
    "squeezenet": dict(image=32),
    "vgg19": dict(image=32, fc=32),
    "resnet50": dict(image=32),
}


def resize(g: Graph, x: int, size: tuple[int, int], mode: str, transform: str, nearest: str = "floor") -> int:
    """A Resize of `x` to `size` added to `g`, its mode, coordinate transformation and rounding by their names."""
    codes = dict(
        mode=ops.RESIZE_MODES.index(mode),
        transform=ops.RESIZE_TRANSFORMS.index(transform),
        nearest=ops.RESIZE_NEAREST.index(nearest),
    )
    return g.add("resize", [x], size=size, **codes)


def decode_head() -> tuple[Graph, int, int]:
    """SegFormer's decode head: a token grid read as an image (a Transpose and a Reshape) and upsampled, beside a
    convolution's feature map of the same extent, upsampled too; onnxruntime runs the first Resize in NCHW and the
    second as its blocked Upsample. Returns the graph and the two Resizes."""
    rng = np.random.default_rng(0)

    def weight(*shape: int) -> int:
        return g.weight((rng.standard_normal(shape) * 0.1).astype(np.float32))

    conv = dict(strides=(1, 1), pads=(0, 0, 0, 0), dilations=(1, 1), group=1, act=0)
    g = Graph()
    grid = g.reshape(g.add("transpose", [g.input("t", (1, 196, 32))], perm=(0, 2, 1)), (1, 32, 14, 14))
    fm = g.add("conv2d", [g.input("x", (1, 16, 14, 14)), weight(32, 16, 1, 1), weight(32)], **conv)
    ups = [resize(g, x, (28, 28), "linear", "half_pixel") for x in (grid, fm)]
    g.output("y", g.add("conv2d", [g.add("concat", ups, axis=1), weight(32, 64, 1, 1), weight(32)], **conv))
    return g, ups[0], ups[1]


def tiny_graph(name: str) -> Graph:
    """The benchmark graph `name` at TINY_SIZES, imported into the IR."""
    return onnx_io.import_model(build_model(name, **TINY_SIZES[name])).compact()


def interrupt_rename_onto(monkeypatch, target: Path) -> None:
    """Make `os.replace` raise KeyboardInterrupt when it renames a file onto `target`, as Ctrl-C between a save's
    data file and its model; other renames go through. `monkeypatch.undo()` restores it."""
    import os

    real_replace = os.replace

    def interrupted(a, b) -> None:
        if str(b) == str(target):
            raise KeyboardInterrupt
        real_replace(a, b)

    monkeypatch.setattr(os, "replace", interrupted)
