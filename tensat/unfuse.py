"""Fusions onnxruntime makes that run slower on the device than the ops they replace, and the input written so
that they do not fire.

onnxruntime fuses a residual Add with the LayerNormalization reading it into one SkipLayerNormalization kernel
(a BERT-style post-norm encoder has one per sub-layer; `tensat.onnx.fusions.skip_adds` finds them). Whether that
kernel beats the Add and the LayerNormalization it replaces depends on the device and on the onnxruntime build, so
it is measured: the pair written as Add and as ONNX Sum (which the fusion does not match), at the Add's shape,
timed interleaved by the measured cost model and cached with its costs. Where the fused form is slower, the Add
becomes a `sum` node: the same value, written so that onnxruntime runs the two kernels. The end-to-end check then
times the whole graph against the input, as for any other change.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from onnx import ModelProto, helper, numpy_helper

from tensat.ir import Graph
from tensat.measure import MeasuredCost
from tensat.onnx.common import ir_version_for

Shape = tuple[int, ...]
OPSET = 17  # the first with LayerNormalization


@dataclass(frozen=True)
class SkipNormTiming:
    """One residual Add's shape, with the pair (Add or Sum, then LayerNormalization) timed both ways."""

    shape: Shape
    fused_ms: float  # Add + LayerNormalization, which onnxruntime fuses into a SkipLayerNormalization
    unfused_ms: float  # Sum + LayerNormalization, which it runs as two kernels
    adds: int  # residual Adds of this shape in the graph
    written_as_sum: bool

    def to_dict(self) -> dict[str, Any]:
        return {
            "shape": list(self.shape),
            "fused_ms": self.fused_ms,
            "unfused_ms": self.unfused_ms,
            "adds": self.adds,
            "written_as_sum": self.written_as_sum,
        }


@dataclass
class Unfused:
    """What `unfuse` measured and changed: each shape's timing, and the Adds written as Sum."""

    timings: list[SkipNormTiming] = field(default_factory=list)

    @property
    def sums(self) -> int:
        """Residual Adds written as Sum."""
        return sum(t.adds for t in self.timings if t.written_as_sum)

    @property
    def excess_ms(self) -> float:
        """What the fused kernels of the Adds written as Sum cost beyond the two kernels each replaced: their part
        of the input's price as onnxruntime runs it that per-op costs do not show."""
        return sum(t.adds * (t.fused_ms - t.unfused_ms) for t in self.timings if t.written_as_sum)

    def summary(self) -> str:
        parts = [
            f"{t.adds} at {'x'.join(map(str, t.shape))}: {t.fused_ms:.4g} ms fused against {t.unfused_ms:.4g} ms"
            + (" (written as Sum)" if t.written_as_sum else " (kept)")
            for t in self.timings
        ]
        return "residual Add + LayerNormalization, onnxruntime's SkipLayerNormalization timed: " + "; ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        return {"sums": self.sums, "excess_ms": self.excess_ms, "timings": [t.to_dict() for t in self.timings]}


def skip_norm_models(shape: Sequence[int], dtype: str = "float32") -> tuple[ModelProto, ModelProto]:
    """The residual pair at `shape`, normalized over its last axis: written with Add (which onnxruntime fuses
    into a SkipLayerNormalization) and with Sum (which it does not)."""
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    rng = np.random.default_rng(0)
    width = int(shape[-1])
    scale = numpy_helper.from_array((1.0 + 0.1 * rng.standard_normal(width)).astype(dtype), "scale")
    bias = numpy_helper.from_array((0.1 * rng.standard_normal(width)).astype(dtype), "bias")

    def model(op: str) -> ModelProto:
        nodes = [
            helper.make_node(op, ["x", "skip"], ["s"]),
            helper.make_node("LayerNormalization", ["s", "scale", "bias"], ["y"], axis=-1, epsilon=1e-5),
        ]
        inputs = [helper.make_tensor_value_info(n, elem, list(shape)) for n in ("x", "skip")]
        out = [helper.make_tensor_value_info("y", elem, list(shape))]
        graph = helper.make_graph(nodes, f"skip_norm_{op.lower()}", inputs, out, [scale, bias])
        m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
        m.ir_version = ir_version_for({"": OPSET})
        return m

    return model("Add"), model("Sum")


def unfuse(graph: Graph, measured: MeasuredCost) -> Unfused:
    """Write each of `graph`'s residual Adds onnxruntime would fuse into a SkipLayerNormalization (`Graph.skip_adds`)
    as Sum where, at its shape, the fused pair is measured slower than the two kernels by more than the cost model
    can tell apart (`MeasuredCost.resolution`). Changes `graph` in place."""
    by_shape: dict[tuple[Shape, str], list[int]] = {}
    for i in sorted(graph.skip_adds):
        n = graph.nodes[i]
        operands = [graph.nodes[j].shape for j in n.inputs]
        if n.op == "add" and all(s == n.shape for s in operands) and n.dtype in ("float32", "float16"):
            by_shape.setdefault((n.shape, n.dtype), []).append(i)
    out = Unfused()
    tolerance = measured.resolution
    for (shape, dtype), adds in by_shape.items():
        name = json.dumps({"fusion": "SkipLayerNormalization", "shape": list(shape), "dtype": dtype})
        fused_ms, unfused_ms = measured.compare_forms(name, *skip_norm_models(shape, dtype))
        slower = fused_ms > unfused_ms * (1 + tolerance.relative) + tolerance.ms
        if slower:
            for i in adds:
                graph.relabel(i, "sum")
        out.timings.append(SkipNormTiming(shape, fused_ms, unfused_ms, len(adds), slower))
    return out
