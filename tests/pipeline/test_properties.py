"""Property tests: random valid graphs go through `tensat.optimize` and come out computing the same outputs (checked
in onnxruntime and against numpy) at no higher cost.

Two generators. `ir_cases` builds IR graphs directly (the bulk of the examples: no ONNX import, one e-graph per
example) out of motifs the rewrite rules match: matmuls and convolutions sharing an input, activations after convs,
concat then slice, matmul chains and batched matmuls, transposes, reshapes, padded pooling, batchnorm, strided,
dilated, grouped and asymmetrically padded convolutions, element-wise ops with broadcast weights,
and opaque ONNX ops (Softmax, LayerNormalization, Gather, a two-output Split) mixed in; several inputs, several
outputs. `onnx_cases` builds ONNX models of native ops (Gemm, Sub, Flatten, Split, Slice...) that go through the
file importer and the `tensat optimize` command line. Sizes come from the loaded hypothesis profile (see
tests/conftest.py): 300 IR examples in the regular run.
"""

from __future__ import annotations

import json
import os
import tempfile
import warnings
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

import tensat
from tensat.cli import main
from tensat.cost import AnalyticCost, graph_cost
from tensat.ir import Graph, OpaqueSpec
from tensat.onnx_io import export_model
from tensat.verify import random_inputs, run_model

Draw = Callable[[st.SearchStrategy[Any]], Any]

RTOL, ATOL = 1e-4, 1e-5  # float32, relative to each output's largest magnitude (as tensat.verify compares)

# Warnings a healthy run may give; any other (a search that crashed and fell back to the input, an egglog error, a
# cost-model fallback) is a bug the graceful fallback would otherwise hide.
EXPECTED_WARNINGS = (
    "exploration stopped at its",
    "ILP extraction did not prove optimality",
    "the optimized graph did not run measurably faster",
)


def _scaled(factor: float, least: int) -> settings:
    """Settings running `factor` times the loaded profile's max_examples (at least `least`)."""
    return settings(max_examples=max(least, int(settings.default.max_examples * factor)))


def _close(got: np.ndarray, want: np.ndarray, what: str) -> None:
    """Assert float32 agreement scaled by the expected output's magnitude (NaN/inf in the same places)."""
    assert got.shape == want.shape and got.dtype == want.dtype, (what, got.shape, want.shape, got.dtype, want.dtype)
    if got.dtype.kind not in "fc":
        assert np.array_equal(got, want), what
        return
    assert np.array_equal(np.isnan(got), np.isnan(want)), what
    inf = np.isinf(want)
    assert np.array_equal(np.isinf(got), inf) and np.array_equal(got[inf], want[inf]), what
    finite = np.isfinite(want)
    if finite.any():
        scale = float(np.max(np.abs(want[finite].astype(np.float64))))
        err = float(np.max(np.abs(got[finite].astype(np.float64) - want[finite].astype(np.float64))))
        assert err <= ATOL + RTOL * scale, f"{what}: max abs error {err:.3g} at scale {scale:.3g}"


# -------------------------------------------------------------------------------------------------------------------
# IR graphs


@dataclass
class _IRBuilder:
    """A random IR graph under construction: 2-D "matrices" and 4-D NCHW "images" to build on."""

    draw: Draw
    rng: np.random.Generator
    g: Graph = field(default_factory=Graph)
    mats: list[int] = field(default_factory=list)
    imgs: list[int] = field(default_factory=list)
    made: list[int] = field(default_factory=list)
    opaque: int = 0

    def shape(self, i: int) -> tuple[int, ...]:
        """The shape of tensor `i`."""
        return self.g.nodes[i].shape

    def weight(self, shape: tuple[int, ...], fan_in: int = 1, positive: bool = False) -> int:
        """A fresh float32 weight, scaled by 1/sqrt(fan_in) (positive: in [0.5, 1.5), e.g. a variance)."""
        if positive:
            array = self.rng.uniform(0.5, 1.5, shape)
        else:
            array = self.rng.standard_normal(shape) / np.sqrt(max(fan_in, 1))
        return self.g.weight(array.astype(np.float32), f"w{len(self.g.weights)}")

    def keep(self, i: int) -> int:
        """Record a new tensor: it may be built on and become an output."""
        rank = len(self.shape(i))
        if rank == 2 and i not in self.mats:
            self.mats.append(i)
        elif rank == 4 and i not in self.imgs:
            self.imgs.append(i)
        self.made.append(i)
        return i

    def pick(self, pool: list[int]) -> int:
        """Mostly a recent tensor (chains), sometimes any (sharing, fan-out)."""
        recent = pool[-3:]
        return self.draw(st.sampled_from(recent) | st.sampled_from(pool))

    def act(self, x: int) -> int:
        """`x`, or an activation of it (the conv-activation fusion rules match these)."""
        op = self.draw(st.sampled_from(["relu", "sigmoid", "tanh", None]))
        return x if op is None else self.keep(self.g.add(op, [x]))

    # -- motifs on matrices --------------------------------------------------------------------------------------

    def matmul_shared(self) -> None:
        """One to three matmuls reading the same input (the multi-pattern merge), each maybe activated."""
        x = self.pick(self.mats)
        k = self.shape(x)[1]
        for _ in range(self.draw(st.integers(1, 3))):
            n = self.draw(st.integers(1, 5))
            self.act(self.keep(self.g.add("matmul", [x, self.weight((k, n), k)])))

    def matmul_chain(self) -> None:
        """x @ W1 @ W2, nested either way (associativity)."""
        x = self.pick(self.mats)
        k = self.shape(x)[1]
        n, p = self.draw(st.integers(1, 5)), self.draw(st.integers(1, 5))
        w1, w2 = self.weight((k, n), k), self.weight((n, p), n)
        if self.draw(st.booleans()):
            self.keep(self.g.add("matmul", [self.g.add("matmul", [x, w1]), w2]))
        else:
            self.keep(self.g.add("matmul", [x, self.g.add("matmul", [w1, w2])]))

    def gram(self) -> None:
        """x @ x^T or x^T @ x (transpose rules through matmul)."""
        x = self.pick(self.mats)
        xt = self.keep(self.g.add("transpose", [x], perm=(1, 0)))
        first = self.draw(st.booleans())
        self.keep(self.g.add("matmul", [x, xt] if first else [xt, x]))

    def elementwise(self) -> None:
        """add or mul of two same-shaped tensors, or of a tensor and a (broadcast) weight."""
        pool = self.draw(st.sampled_from([p for p in (self.mats, self.imgs) if p]))
        x = self.pick(pool)
        shape = self.shape(x)
        same = [j for j in pool if self.shape(j) == shape and j != x]
        kind = self.draw(st.sampled_from(["same", "row", "col", "full"] if same else ["row", "col", "full"]))
        if kind == "same":
            y = self.draw(st.sampled_from(same))
        elif kind == "row":  # a broadcast weight: (1, n) for matrices, (1, C, 1, 1) for images
            y = self.weight((1, shape[1]) if len(shape) == 2 else (1, shape[1], 1, 1))
        elif kind == "col":  # (m, 1) for matrices, (1, 1, H, W) for images
            y = self.weight((shape[0], 1) if len(shape) == 2 else (1, 1) + shape[2:])
        else:
            y = self.weight(shape)
        op = self.draw(st.sampled_from(["add", "mul"]))
        a, b = (x, y) if self.draw(st.booleans()) else (y, x)
        self.act(self.keep(self.g.add(op, [a, b])))

    def concat_slice(self) -> None:
        """Concat of two tensors, then slices: exactly the parts back, or a random window."""
        pool = self.draw(st.sampled_from([p for p in (self.mats, self.imgs) if p]))
        a = self.pick(pool)
        shape = self.shape(a)
        axis = self.draw(st.integers(0, len(shape) - 1))
        partners = [
            j for j in pool if self.shape(j)[:axis] + self.shape(j)[axis + 1 :] == shape[:axis] + shape[axis + 1 :]
        ]
        b = self.draw(st.sampled_from(partners))
        if self.draw(st.booleans()):
            b = self.g.add(self.draw(st.sampled_from(["relu", "tanh"])), [b])
        cat = self.keep(self.g.add("concat", [a, b], axis=axis))
        total, first = self.shape(cat)[axis], shape[axis]
        if self.draw(st.booleans()):  # exactly the parts: slice-of-concat rules
            self.act(self.keep(self.g.add("slice", [cat], axis=axis, start=0, size=first)))
            self.act(self.keep(self.g.add("slice", [cat], axis=axis, start=first, size=total - first)))
        else:
            start = self.draw(st.integers(0, total - 1))
            size = self.draw(st.integers(1, total - start))
            self.act(self.keep(self.g.add("slice", [cat], axis=axis, start=start, size=size)))

    def transpose(self) -> None:
        """A random permutation, sometimes undone right after."""
        pool = self.draw(st.sampled_from([p for p in (self.mats, self.imgs) if p]))
        x = self.pick(pool)
        rank = len(self.shape(x))
        perm = tuple(self.draw(st.permutations(range(rank))))
        y = self.keep(self.g.add("transpose", [x], perm=perm))
        if self.draw(st.booleans()):
            back = tuple(int(i) for i in np.argsort(perm))
            self.act(self.keep(self.g.add("transpose", [y], perm=back)))

    def reshape(self) -> None:
        """Images to matrices, matrices to other matrices or to images."""
        pool = self.draw(st.sampled_from([p for p in (self.mats, self.imgs) if p]))
        x = self.pick(pool)
        shape = self.shape(x)
        size = int(np.prod(shape))
        if len(shape) == 4:
            target = (shape[0] * shape[1], shape[2] * shape[3])
        else:
            target = self.draw(
                st.sampled_from([(1, size), (size, 1), (shape[1], shape[0]), (1, shape[0], shape[1], 1)])
            )
        self.act(self.keep(self.g.reshape(x, target)))

    # -- motifs on images ----------------------------------------------------------------------------------------

    def conv_shared(self) -> None:
        """One to three convs with equal attributes reading the same input (the conv merge), grouped or
        depthwise sometimes, maybe with a fused activation, a batchnorm and an activation after."""
        x = self.pick(self.imgs)
        _, c, h, w = self.shape(x)
        k = self.draw(st.sampled_from([kk for kk in (1, 3) if kk <= h + 2 and kk <= w + 2]))
        dilation = self.draw(st.sampled_from([1, 1, 1, 2])) if k == 3 and min(h, w) >= 5 else 1
        pads = tuple(self.draw(st.integers(0, k // 2)) for _ in range(4))  # top, left, bottom, right
        reach = dilation * (k - 1) + 1
        if h + pads[0] + pads[2] < reach or w + pads[1] + pads[3] < reach:
            pads = (k // 2,) * 4
        stride = self.draw(st.sampled_from([1, 1, 2]))
        group = self.draw(st.sampled_from([1, 1, 1] + ([2] if c % 2 == 0 else []) + ([c] if c > 1 else [])))
        fused = self.draw(st.sampled_from([0, 0, 0, 2]))
        for _ in range(self.draw(st.integers(1, 3))):
            m = group * self.draw(st.integers(1, 3))
            wt = self.weight((m, c // group, k, k), c // group * k * k)
            b = self.weight((m,))
            y = self.keep(
                self.g.add(
                    "conv2d",
                    [x, wt, b],
                    strides=(stride, stride),
                    pads=pads,
                    dilations=(dilation, dilation),
                    group=group,
                    act=fused,
                )
            )
            if self.draw(st.booleans()):
                y = self.keep(
                    self.g.add(
                        "batchnorm",
                        [y, self.weight((m,)), self.weight((m,)), self.weight((m,)), self.weight((m,), positive=True)],
                        epsilon=1e-5,
                    )
                )
            self.act(y)

    def pool(self) -> None:
        """Max, average (padded, with or without the padding counted) or global average pooling."""
        x = self.pick(self.imgs)
        _, _, h, w = self.shape(x)
        kind = self.draw(st.sampled_from(["maxpool", "avgpool", "globalavgpool"]))
        if kind == "globalavgpool" or min(h, w) < 2:
            self.keep(self.g.add("globalavgpool", [x]))
            return
        k, s = 2, self.draw(st.sampled_from([1, 2]))
        pads = tuple(self.draw(st.integers(0, 1)) for _ in range(4))
        extra = {"count_include_pad": self.draw(st.sampled_from([0, 1]))} if kind == "avgpool" else {}
        self.act(self.keep(self.g.add(kind, [x], kernel=(k, k), strides=(s, s), pads=pads, **extra)))

    def batchnorm(self) -> None:
        """Inference batchnorm over axis 1 of a matrix or an image."""
        pool = self.draw(st.sampled_from([p for p in (self.mats, self.imgs) if p]))
        x = self.pick(pool)
        c = self.shape(x)[1]
        stats = [self.weight((c,)), self.weight((c,)), self.weight((c,)), self.weight((c,), positive=True)]
        self.act(self.keep(self.g.add("batchnorm", [x, *stats], epsilon=1e-5)))

    def image_matmul(self) -> None:
        """A batched matmul: an image (1, C, H, W) times a (W, n) weight, broadcast over N and C."""
        x = self.pick(self.imgs)
        width = self.shape(x)[3]
        self.act(self.keep(self.g.add("matmul", [x, self.weight((width, self.draw(st.integers(1, 4))), width)])))

    # -- opaque ONNX ops -----------------------------------------------------------------------------------------

    def _opaque(self, op_type: str, inputs: list[int], shapes: list[tuple[int, ...]], **attrs: Any) -> list[int]:
        self.opaque += 1
        key = f"{op_type}_{self.opaque}"
        encoded = tuple(helper.make_attribute(k, v).SerializeToString() for k, v in attrs.items())
        self.g.opaque[key] = OpaqueSpec(op_type, "", encoded, len(shapes))
        return [self.g.add("opaque", inputs, key=key, index=k, shape=s, dtype="float32") for k, s in enumerate(shapes)]

    def opaque_op(self) -> None:
        """An ONNX op tensat does not model: Softmax, LayerNormalization, Gather or a two-output Split."""
        pool = self.draw(st.sampled_from([p for p in (self.mats, self.imgs) if p]))
        x = self.pick(pool)
        shape = self.shape(x)
        kind = self.draw(st.sampled_from(["Softmax", "LayerNormalization", "Gather", "Split"]))
        if kind == "Softmax":
            outs = self._opaque("Softmax", [x], [shape], axis=-1)
        elif kind == "LayerNormalization":
            n = shape[-1]
            outs = self._opaque(
                "LayerNormalization", [x, self.weight((n,), positive=True), self.weight((n,))], [shape], axis=-1
            )
        elif kind == "Gather":
            rows = self.draw(st.lists(st.integers(0, shape[0] - 1), min_size=1, max_size=3))
            idx = self.g.weight(np.array(rows, dtype=np.int64), f"idx{len(self.g.weights)}")
            outs = self._opaque("Gather", [x, idx], [(len(rows),) + shape[1:]], axis=0)
        else:
            if shape[-1] < 2:
                return
            first = self.draw(st.integers(1, shape[-1] - 1))
            sizes = self.g.weight(np.array([first, shape[-1] - first], dtype=np.int64), f"split{len(self.g.weights)}")
            outs = self._opaque(
                "Split", [x, sizes], [shape[:-1] + (first,), shape[:-1] + (shape[-1] - first,)], axis=len(shape) - 1
            )
        for o in outs:
            self.act(self.keep(o))

    def motifs(self) -> list[Callable[[], None]]:
        """The motifs that apply to the tensors built so far, weighted towards the ones rules merge."""
        out: list[Callable[[], None]] = [
            self.elementwise,
            self.concat_slice,
            self.transpose,
            self.reshape,
            self.opaque_op,
            self.batchnorm,
        ]
        if self.mats:
            out += [self.matmul_shared] * 3 + [self.matmul_chain, self.gram]
        if self.imgs:
            out += [self.conv_shared] * 3 + [self.pool] * 2 + [self.image_matmul]
        return out


def _outputs(draw: Draw, graph: Graph, made: list[int]) -> list[int]:
    """Up to 4 of the tensors nothing reads (so little is dead code), plus up to one read by other nodes."""
    read = {j for n in graph.nodes for j in n.inputs}
    made = list(dict.fromkeys(made))
    sinks = [i for i in made if i not in read]
    chosen = draw(st.lists(st.sampled_from(sinks), min_size=1, max_size=4, unique=True)) if sinks else [made[-1]]
    inner = [i for i in made if i in read]
    if inner and draw(st.booleans()):
        chosen.append(draw(st.sampled_from(inner)))
    return chosen


@st.composite
def ir_cases(draw: Draw) -> tuple[Graph, dict[str, Any]]:
    """A random valid IR graph and the options to optimize it with."""
    b = _IRBuilder(draw, np.random.default_rng(draw(st.integers(0, 2**32 - 1))))
    for k in range(draw(st.integers(1, 3))):
        if draw(st.booleans()):
            b.mats.append(b.g.input(f"x{k}", (draw(st.integers(1, 4)), draw(st.integers(2, 6)))))
        else:
            c, h, w = draw(st.integers(1, 4)), draw(st.integers(3, 6)), draw(st.integers(3, 6))
            b.imgs.append(b.g.input(f"x{k}", (1, c, h, w)))
    for _ in range(draw(st.integers(2, 8))):
        draw(st.sampled_from(b.motifs()))()
    if not b.made:
        b.act(b.keep(b.g.add("relu", [(b.mats or b.imgs)[0]])))
    outputs = _outputs(draw, b.g, b.made)
    if draw(st.integers(0, 9)) == 0:  # rarely: a graph input, a weight, or the same tensor twice, as an output
        weights = [i for i, n in enumerate(b.g.nodes) if n.op == "weight" and n.dtype == "float32"]
        outputs.append(draw(st.sampled_from(b.g.input_ids + weights + outputs)))
    for k, node in enumerate(outputs):
        b.g.output(f"y{k}", node)
    tight = draw(st.integers(0, 7)) == 0  # a node limit the e-graph hits: rollback and fill (kept short)
    options = dict(
        extractor=draw(st.sampled_from(["greedy", "ilp"])),
        k_multi=draw(st.sampled_from([0, 1, 1, 2])),
        iter_limit=draw(st.sampled_from([1, 2, 3, 4])),
        node_limit=60 if tight else 50_000,
        time_limit=0.3 if tight else 5.0,
        ilp_time_limit=5.0,
        seed=draw(st.integers(0, 2**16)),
        cost="analytic",
        latency_check=0,
    )
    return b.g, options


def _feeds(graph: Graph, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {graph.input_name(i): rng.standard_normal(graph.nodes[i].shape).astype(np.float32) for i in graph.input_ids}


def test_optimize_preserves_outputs_and_never_raises_cost() -> None:
    """Random IR graphs: verified in onnxruntime by optimize itself, then independently against numpy on fresh
    inputs; cost never rises; interface unchanged. Most examples must actually be rewritten."""
    seen: Counter[str] = Counter()
    analytic = AnalyticCost()
    examples = _scaled(0.5, 50)

    @examples
    @given(case=ir_cases())
    def check(case: tuple[Graph, dict[str, Any]]) -> None:
        graph, options = case
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            result = tensat.optimize_with_details(graph, **options)
        assert isinstance(result.output, Graph) and result.verification.ok
        assert not [w for w in result.warnings if not w.startswith(EXPECTED_WARNINGS)], result.warnings
        assert result.cost_after <= result.cost_before * (1 + 1e-9)
        before, after = graph_cost(graph.compact(), analytic), graph_cost(result.graph, analytic)
        assert after <= before * (1 + 1e-9), (before, after)
        optimized = result.graph
        assert [name for name, _ in optimized.outputs] == [name for name, _ in graph.outputs]
        assert [optimized.input_name(i) for i in optimized.input_ids] == [graph.input_name(i) for i in graph.input_ids]

        feeds = _feeds(graph, options["seed"] + 1)
        got = run_model(export_model(optimized), feeds)
        if not graph.opaque:  # numpy reference of the input graph: catches an exporter bug hitting both sides
            ref = graph.evaluate(feeds, [n for _, n in graph.outputs])
            want = {name: ref[n].astype(np.float32) for name, n in graph.outputs}
        else:
            want = run_model(export_model(graph), feeds)
        for name, _ in graph.outputs:
            _close(got[name], want[name], f"output {name}")

        seen["examples"] += 1
        seen["fired"] += any(sum(it.matches.values()) for it in result.exploration.iterations)
        seen["changed"] += optimized.summary() != graph.compact().summary()
        seen["cheaper"] += result.cost_after < result.cost_before * (1 - 1e-9)
        seen["opaque"] += bool(graph.opaque)

    check()
    n = seen["examples"]
    assert n >= examples.max_examples
    assert seen["fired"] >= n // 2, seen
    assert seen["changed"] >= n // 10 and seen["cheaper"] >= n // 20, seen
    assert seen["opaque"] >= n // 10, seen


# -------------------------------------------------------------------------------------------------------------------
# ONNX models through the command line


@dataclass
class _OnnxBuilder:
    """A random ONNX model under construction, of native ops the importer lowers (plus a few it keeps opaque)."""

    draw: Draw
    rng: np.random.Generator
    nodes: list[onnx.NodeProto] = field(default_factory=list)
    inits: list[onnx.TensorProto] = field(default_factory=list)
    inputs: list[onnx.ValueInfoProto] = field(default_factory=list)
    shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)
    mats: list[str] = field(default_factory=list)
    imgs: list[str] = field(default_factory=list)
    made: list[str] = field(default_factory=list)

    def name(self, base: str) -> str:
        """A fresh tensor name."""
        return f"{base}{len(self.shapes) + len(self.inits)}"

    def init(self, array: np.ndarray) -> str:
        """A fresh initializer holding `array`."""
        name = self.name("c")
        self.inits.append(numpy_helper.from_array(array, name))
        return name

    def weight(self, shape: tuple[int, ...], fan_in: int = 1) -> str:
        """A fresh float32 initializer scaled by 1/sqrt(fan_in)."""
        return self.init((self.rng.standard_normal(shape) / np.sqrt(max(fan_in, 1))).astype(np.float32))

    def node(self, op: str, inputs: list[str], shape: tuple[int, ...], **attrs: Any) -> str:
        """Append a one-output node; its output may be built on and become a graph output."""
        out = self.name("t")
        self.nodes.append(helper.make_node(op, inputs, [out], **attrs))
        self.shapes[out] = shape
        (self.mats if len(shape) == 2 else self.imgs if len(shape) == 4 else []).append(out)
        self.made.append(out)
        return out

    def act(self, x: str) -> str:
        """`x`, or Relu/Sigmoid/Tanh of it."""
        op = self.draw(st.sampled_from(["Relu", "Sigmoid", "Tanh", None]))
        return x if op is None else self.node(op, [x], self.shapes[x])

    def pick(self, pool: list[str]) -> str:
        """Mostly a recent tensor, sometimes any."""
        return self.draw(st.sampled_from(pool[-3:]) | st.sampled_from(pool))

    def dense(self) -> None:
        """MatMul (+ bias Add) or Gemm (transB sometimes) layers sharing an input."""
        x = self.pick(self.mats)
        m, k = self.shapes[x]
        for _ in range(self.draw(st.integers(1, 3))):
            n = self.draw(st.integers(1, 5))
            kind = self.draw(st.sampled_from(["MatMul", "Gemm", "GemmT"]))
            if kind == "MatMul":
                y = self.node("MatMul", [x, self.weight((k, n), k)], (m, n))
                if self.draw(st.booleans()):
                    y = self.node("Add", [y, self.weight((n,))], (m, n))
            elif kind == "Gemm":
                y = self.node("Gemm", [x, self.weight((k, n), k), self.weight((n,))], (m, n))
            else:
                y = self.node("Gemm", [x, self.weight((n, k), k), self.weight((n,))], (m, n), transB=1)
            self.act(y)

    def conv(self) -> None:
        """Convs sharing an input, with or without bias, maybe BatchNormalization and an activation."""
        x = self.pick(self.imgs)
        _, c, h, w = self.shapes[x]
        k = 3 if min(h, w) >= 3 and self.draw(st.booleans()) else 1
        pad = self.draw(st.integers(0, k // 2))
        for _ in range(self.draw(st.integers(1, 3))):
            m = self.draw(st.integers(1, 4))
            inputs = [x, self.weight((m, c, k, k), c * k * k)]
            if self.draw(st.booleans()):
                inputs.append(self.weight((m,)))
            oh, ow = h + 2 * pad - k + 1, w + 2 * pad - k + 1
            y = self.node("Conv", inputs, (1, m, oh, ow), pads=[pad] * 4, kernel_shape=[k, k])
            if self.draw(st.booleans()):
                stats = [
                    self.weight((m,)),
                    self.weight((m,)),
                    self.weight((m,)),
                    self.init(self.rng.uniform(0.5, 1.5, (m,)).astype(np.float32)),
                ]
                y = self.node("BatchNormalization", [y, *stats], (1, m, oh, ow), epsilon=1e-5)
            self.act(y)

    def pool(self) -> None:
        """MaxPool, AveragePool or GlobalAveragePool."""
        x = self.pick(self.imgs)
        n, c, h, w = self.shapes[x]
        kind = self.draw(st.sampled_from(["MaxPool", "AveragePool", "GlobalAveragePool"]))
        if kind == "GlobalAveragePool" or min(h, w) < 2:
            self.node("GlobalAveragePool", [x], (n, c, 1, 1))
        else:
            self.node(kind, [x], (n, c, h - 1, w - 1), kernel_shape=[2, 2])

    def flatten(self) -> None:
        """Flatten or Reshape of an image to a matrix."""
        x = self.pick(self.imgs)
        n, c, h, w = self.shapes[x]
        if self.draw(st.booleans()):
            self.act(self.node("Flatten", [x], (n, c * h * w), axis=1))
        else:
            shape = self.init(np.array([c, h * w], dtype=np.int64))
            self.act(self.node("Reshape", [x, shape], (c, h * w)))

    def concat_split(self) -> None:
        """Concat, then Split into two parts or a Slice window."""
        pool = self.draw(st.sampled_from([p for p in (self.mats, self.imgs) if p]))
        a = self.pick(pool)
        shape = self.shapes[a]
        axis = len(shape) - 1 if len(shape) == 2 else 1
        partners = [
            j for j in pool if self.shapes[j][:axis] + self.shapes[j][axis + 1 :] == shape[:axis] + shape[axis + 1 :]
        ]
        b = self.draw(st.sampled_from(partners))
        total = shape[axis] + self.shapes[b][axis]
        cat = self.node("Concat", [a, b], shape[:axis] + (total,) + shape[axis + 1 :], axis=axis)
        if self.draw(st.booleans()):
            first = self.draw(st.integers(1, total - 1)) if total > 1 else 0
            if first:
                sizes = self.init(np.array([first, total - first], dtype=np.int64))
                outs = [self.name("t"), self.name("u")]
                self.nodes.append(helper.make_node("Split", [cat, sizes], outs, axis=axis))
                for o, size in zip(outs, (first, total - first)):
                    self.shapes[o] = shape[:axis] + (size,) + shape[axis + 1 :]
                    (self.mats if len(shape) == 2 else self.imgs).append(o)
                    self.made.append(o)
                    self.act(o)
        else:
            start = self.draw(st.integers(0, total - 1))
            stop = self.draw(st.integers(start + 1, total))
            args = [self.init(np.array(v, dtype=np.int64)) for v in ([start], [stop], [axis])]
            self.act(self.node("Slice", [cat, *args], shape[:axis] + (stop - start,) + shape[axis + 1 :]))

    def misc(self) -> None:
        """Transpose, Sub/Mul by a bias, or an op kept opaque: Softmax, LayerNormalization, Gather."""
        x = self.pick(self.mats)
        m, k = self.shapes[x]
        kind = self.draw(st.sampled_from(["Transpose", "Sub", "Mul", "Softmax", "LayerNormalization", "Gather"]))
        if kind == "Transpose":
            self.act(self.node("Transpose", [x], (k, m), perm=[1, 0]))
        elif kind in ("Sub", "Mul"):
            self.act(self.node(kind, [x, self.weight((k,))], (m, k)))
        elif kind == "Softmax":
            self.node("Softmax", [x], (m, k), axis=-1)
        elif kind == "LayerNormalization":
            self.node("LayerNormalization", [x, self.weight((k,)), self.weight((k,))], (m, k), axis=-1)
        else:
            rows = self.draw(st.lists(st.integers(0, m - 1), min_size=1, max_size=3))
            self.act(self.node("Gather", [x, self.init(np.array(rows, dtype=np.int64))], (len(rows), k), axis=0))

    def motifs(self) -> list[Callable[[], None]]:
        """The motifs that apply to the tensors built so far, weighted towards the ones rules merge."""
        out: list[Callable[[], None]] = [self.concat_split]
        if self.mats:
            out += [self.dense, self.dense, self.misc]
        if self.imgs:
            out += [self.conv, self.conv, self.pool, self.flatten]
        return out


@st.composite
def onnx_cases(draw: Draw) -> tuple[onnx.ModelProto, list[str]]:
    """A random checker-valid ONNX model (opset 17) and command-line flags to optimize it with."""
    b = _OnnxBuilder(draw, np.random.default_rng(draw(st.integers(0, 2**32 - 1))))
    for k in range(draw(st.integers(1, 2))):
        if draw(st.booleans()):
            shape: tuple[int, ...] = (draw(st.integers(1, 4)), draw(st.integers(2, 6)))
            b.mats.append(f"in{k}")
        else:
            shape = (1, draw(st.integers(1, 4)), draw(st.integers(3, 5)), draw(st.integers(3, 5)))
            b.imgs.append(f"in{k}")
        b.shapes[f"in{k}"] = shape
        b.inputs.append(helper.make_tensor_value_info(f"in{k}", TensorProto.FLOAT, list(shape)))
    for _ in range(draw(st.integers(1, 5))):
        draw(st.sampled_from(b.motifs()))()
    if not b.made:
        first = (b.mats or b.imgs)[0]
        b.node("Relu", [first], b.shapes[first])
    outputs = list(dict.fromkeys([b.made[-1]] + draw(st.lists(st.sampled_from(b.made), max_size=2))))
    graph = helper.make_graph(
        b.nodes,
        "random",
        b.inputs,
        [helper.make_tensor_value_info(o, TensorProto.FLOAT, list(b.shapes[o])) for o in outputs],
        b.inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    flags = [
        "--extractor",
        draw(st.sampled_from(["greedy", "ilp"])),
        "--k-multi",
        str(draw(st.sampled_from([0, 1, 2]))),
        "--iter-limit",
        str(draw(st.integers(1, 3))),
        "--ilp-time-limit",
        "5",
        "--time-limit",
        "5",
        "--cost",
        "analytic",
        "--latency-check",
        "0.5",
    ]
    return model, flags


@_scaled(0.1, 10)
@given(case=onnx_cases())
def test_cli_optimizes_random_onnx_models(case: tuple[onnx.ModelProto, list[str]]) -> None:
    """Random ONNX files through `tensat optimize`: exit 0, same interface, same outputs on fresh inputs, cost not
    higher, nothing but the output and the stats file left in the directory."""
    model, flags = case
    with tempfile.TemporaryDirectory(prefix="tensat-prop-") as tmp:
        src, out, stats = (os.path.join(tmp, n) for n in ("in.onnx", "out.onnx", "stats.json"))
        onnx.save(model, src)
        assert main(["optimize", src, "-o", out, "--stats", stats, "-q", *flags]) == 0
        assert sorted(os.listdir(tmp)) == ["in.onnx", "out.onnx", "stats.json"]
        optimized = onnx.load(out)
        with open(stats, encoding="utf-8") as f:
            data = json.load(f)
    onnx.checker.check_model(optimized, full_check=True)
    assert not [w for w in data["warnings"] if not w.startswith(EXPECTED_WARNINGS)], data["warnings"]
    assert data["cost_after"] <= data["cost_before"] * (1 + 1e-9) and data["verification"]["ok"]
    assert [i.name for i in optimized.graph.input] == [i.name for i in model.graph.input]
    assert [o.name for o in optimized.graph.output] == [o.name for o in model.graph.output]
    feeds = random_inputs(model, seed=12345)
    want, got = run_model(model, feeds), run_model(optimized, feeds)
    for name in want:
        _close(got[name], want[name], f"output {name}")
