"""ONNX builders for the Tensat benchmark graphs (MLSys 2021) plus a ResNet-50 control.

Every builder returns an ``onnx.ModelProto`` (opset 17, IR version 8, batch 1,
float32) whose weights are seeded random initializers.  Weights use a scaled
normal init (std = sqrt(gain / fan_in), gain 2 before a ReLU and 1 otherwise),
with a few extra down-scalings where branches are summed, so activations stay
O(1) from the input to the output.  Biases are small random values.

Only standard ops are used: Conv (explicit pads, bias input), Relu, Sigmoid,
Tanh, MaxPool, AveragePool (always ``count_include_pad=0``), GlobalAveragePool,
Add, Mul, MatMul, Concat, Reshape (int64 shape initializer), Transpose and
Flatten.  Node names are unique; a node's output tensor carries the node's name,
except for graph outputs, which have short names (``logits``, ``y``, ``h``, ...).

Public API: :func:`build_model` and :func:`model_names` build the graphs;
:func:`catalog` / :func:`describe` report their inputs, node and parameter counts as
:class:`ModelInfo`, and :func:`format_catalog` prints those as a table.
"""

from __future__ import annotations

import contextvars
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper

OPSET = 17
IR_VERSION = 8
BIAS_STD = 0.01

__all__ = [
    "IR_VERSION",
    "MODELS",
    "OPSET",
    "SMALL_SIZES",
    "ModelInfo",
    "build_model",
    "catalog",
    "describe",
    "example_inputs",
    "format_catalog",
    "model_names",
]


@dataclass(frozen=True)
class _T:
    """A tensor in the graph being built: its ONNX name and static shape."""

    name: str
    shape: tuple[int, ...]


def _pair(v: int | Sequence[int]) -> tuple[int, int]:
    if isinstance(v, int):
        return v, v
    a, b = v
    return int(a), int(b)


def _window_out(size: int, kernel: int, stride: int, pad: int) -> int:
    out = (size + 2 * pad - kernel) // stride + 1
    if out < 1:
        raise ValueError(f"window {kernel}/{stride} pad {pad} does not fit a size of {size}")
    return out


_STRUCTURE_ONLY: contextvars.ContextVar[bool] = contextvars.ContextVar("structure_only", default=False)


class _Graph:
    """Incremental ONNX graph builder that tracks shapes and draws seeded weights."""

    def __init__(self, name: str, seed: int) -> None:
        self.proto = onnx.ModelProto()
        self.graph = self.proto.graph
        self.graph.name = name
        self.rng = np.random.default_rng(seed)
        self._taken: set[str] = set()

    def unique(self, base: str) -> str:
        name, k = base, 1
        while name in self._taken:
            name = f"{base}_{k}"
            k += 1
        self._taken.add(name)
        return name

    def input(self, name: str, shape: Sequence[int]) -> _T:
        name = self.unique(name)
        self.graph.input.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, list(shape)))
        return _T(name, tuple(shape))

    def const(self, name: str, array: np.ndarray) -> str:
        """Add ``array`` (float32 or int64) as an initializer, written in place."""
        name = self.unique(name)
        dtypes = {np.dtype(np.float32): (TensorProto.FLOAT, "<f4"), np.dtype(np.int64): (TensorProto.INT64, "<i8")}
        elem, layout = dtypes[array.dtype]
        tensor = self.graph.initializer.add()
        tensor.name = name
        tensor.data_type = elem
        tensor.dims.extend(array.shape)
        tensor.raw_data = array.astype(layout, copy=False).tobytes()
        return name

    def randn(self, name: str, shape: Sequence[int], std: float) -> str:
        if _STRUCTURE_ONLY.get():  # a catalog entry counts weights; drawing them is most of a big model's build time
            name = self.unique(name)
            tensor = self.graph.initializer.add()
            tensor.name, tensor.data_type = name, TensorProto.FLOAT
            tensor.dims.extend(shape)
            return name
        data = self.rng.standard_normal(tuple(shape), dtype=np.float32)
        data *= np.float32(std)
        return self.const(name, data)

    def node(
        self,
        op: str,
        inputs: Sequence[str],
        shape: Sequence[int],
        name: str,
        output: str | None = None,
        **attrs: Any,
    ) -> _T:
        name = self.unique(name)
        if output is not None and output in self._taken:
            raise ValueError(f"output name {output!r} is already used")
        out = self.unique(output) if output is not None else name
        self.graph.node.append(helper.make_node(op, list(inputs), [out], name=name, **attrs))
        return _T(out, tuple(shape))

    def unary(self, op: str, x: _T, name: str, output: str | None = None) -> _T:
        return self.node(op, [x.name], x.shape, name, output)

    def relu(self, x: _T, name: str, output: str | None = None) -> _T:
        return self.unary("Relu", x, name, output)

    def sigmoid(self, x: _T, name: str) -> _T:
        return self.unary("Sigmoid", x, name)

    def tanh(self, x: _T, name: str, output: str | None = None) -> _T:
        return self.unary("Tanh", x, name, output)

    def binary(self, op: str, a: _T, b: _T, name: str, output: str | None = None) -> _T:
        if a.shape != b.shape:
            raise ValueError(f"{op} {name}: shape mismatch {a.shape} vs {b.shape}")
        return self.node(op, [a.name, b.name], a.shape, name, output)

    def add(self, a: _T, b: _T, name: str, output: str | None = None) -> _T:
        return self.binary("Add", a, b, name, output)

    def mul(self, a: _T, b: _T, name: str) -> _T:
        return self.binary("Mul", a, b, name)

    def conv(
        self,
        x: _T,
        cout: int,
        kernel: int | Sequence[int],
        name: str,
        *,
        stride: int | Sequence[int] = 1,
        pad: int | Sequence[int] = 0,
        groups: int = 1,
        relu: bool = True,
        gain: float | None = None,
    ) -> _T:
        """Conv with bias (and a ReLU when ``relu``); ``pad`` is symmetric per axis."""
        n, cin, h, w = x.shape
        kh, kw = _pair(kernel)
        sh, sw = _pair(stride)
        ph, pw = _pair(pad)
        if cin % groups or cout % groups:
            raise ValueError(f"conv {name}: channels {cin}->{cout} not divisible by {groups} groups")
        fan_in = cin // groups * kh * kw
        if gain is None:
            gain = 2.0 if relu else 1.0
        weight = self.randn(f"{name}.weight", (cout, cin // groups, kh, kw), math.sqrt(gain / fan_in))
        bias = self.randn(f"{name}.bias", (cout,), BIAS_STD)
        shape = (n, cout, _window_out(h, kh, sh, ph), _window_out(w, kw, sw, pw))
        y = self.node(
            "Conv",
            [x.name, weight, bias],
            shape,
            name,
            kernel_shape=[kh, kw],
            strides=[sh, sw],
            pads=[ph, pw, ph, pw],
            dilations=[1, 1],
            group=groups,
        )
        return self.relu(y, f"{name}.relu") if relu else y

    def _pool(self, op: str, x: _T, kernel: int, stride: int, pad: int, name: str, **attrs: Any) -> _T:
        n, c, h, w = x.shape
        shape = (n, c, _window_out(h, kernel, stride, pad), _window_out(w, kernel, stride, pad))
        return self.node(
            op, [x.name], shape, name, kernel_shape=[kernel, kernel], strides=[stride, stride], pads=[pad] * 4, **attrs
        )

    def maxpool(self, x: _T, kernel: int, stride: int, pad: int, name: str) -> _T:
        return self._pool("MaxPool", x, kernel, stride, pad, name)

    def avgpool(self, x: _T, kernel: int, stride: int, pad: int, name: str) -> _T:
        return self._pool("AveragePool", x, kernel, stride, pad, name, count_include_pad=0)

    def global_avgpool(self, x: _T, name: str) -> _T:
        return self.node("GlobalAveragePool", [x.name], (x.shape[0], x.shape[1], 1, 1), name)

    def flatten(self, x: _T, name: str) -> _T:
        return self.node("Flatten", [x.name], (x.shape[0], math.prod(x.shape[1:])), name, axis=1)

    def concat(self, xs: Sequence[_T], name: str, axis: int = 1) -> _T:
        base = list(xs[0].shape)
        for t in xs[1:]:
            if len(t.shape) != len(base) or any(a != b for i, (a, b) in enumerate(zip(t.shape, base)) if i != axis):
                raise ValueError(f"concat {name}: incompatible shapes {[t.shape for t in xs]}")
        base[axis] = sum(t.shape[axis] for t in xs)
        return self.node("Concat", [t.name for t in xs], base, name, axis=axis)

    def reshape(self, x: _T, shape: Sequence[int], name: str, output: str | None = None) -> _T:
        if math.prod(shape) != math.prod(x.shape):
            raise ValueError(f"reshape {name}: {x.shape} -> {tuple(shape)}")
        target = self.const(f"{name}.shape", np.asarray(shape, dtype=np.int64))
        return self.node("Reshape", [x.name, target], shape, name, output)

    def transpose(self, x: _T, perm: Sequence[int], name: str) -> _T:
        return self.node("Transpose", [x.name], [x.shape[p] for p in perm], name, perm=list(perm))

    def matmul(self, a: _T, b: _T, name: str, output: str | None = None) -> _T:
        if a.shape[-1] != b.shape[-2] or a.shape[:-2] != b.shape[:-2]:
            raise ValueError(f"matmul {name}: {a.shape} @ {b.shape}")
        return self.node("MatMul", [a.name, b.name], (*a.shape[:-1], b.shape[-1]), name, output)

    def weight(self, name: str, shape: Sequence[int], std: float) -> _T:
        return _T(self.randn(name, shape, std), tuple(shape))

    def matmul_weight(self, x: _T, n_out: int, name: str, std: float, output: str | None = None) -> _T:
        """``x @ W`` with a fresh (in, out) weight of the given std, no bias."""
        w = self.weight(f"{name}.weight", (x.shape[-1], n_out), std)
        return self.matmul(x, w, name, output)

    def linear(self, x: _T, n_out: int, name: str, *, relu: bool = False, output: str | None = None) -> _T:
        """Fully connected layer as MatMul + Add (bias), optionally + Relu."""
        std = math.sqrt((2.0 if relu else 1.0) / x.shape[-1])
        y = self.matmul_weight(x, n_out, name, std)
        bias = _T(self.randn(f"{name}.bias", (n_out,), BIAS_STD), (n_out,))
        y = self.node("Add", [y.name, bias.name], y.shape, f"{name}.add", None if relu else output)
        return self.relu(y, f"{name}.relu", output) if relu else y

    def model(self, outputs: Sequence[_T], doc: str = "") -> onnx.ModelProto:
        """Finish the graph with ``outputs`` and return the model (no copy of the weights)."""
        self.graph.output.extend(
            helper.make_tensor_value_info(t.name, TensorProto.FLOAT, list(t.shape)) for t in outputs
        )
        self.graph.doc_string = doc
        self.proto.ir_version = IR_VERSION
        self.proto.producer_name = "tensat.models"
        self.proto.opset_import.append(helper.make_opsetid("", OPSET))
        return self.proto


def _classifier(g: _Graph, x: _T, classes: int = 1000) -> _T:
    """Global average pool, flatten and an FC layer producing ``logits``."""
    x = g.global_avgpool(x, "head.gap")
    x = g.flatten(x, "head.flatten")
    return g.linear(x, classes, "head.fc", output="logits")


def _stem(g: _Graph, x: _T) -> _T:
    """ResNet-style stem: 7x7/2 conv to 64 + ReLU, 3x3/2 max pool (pad 1)."""
    x = g.conv(x, 64, 7, "stem.conv", stride=2, pad=3)
    return g.maxpool(x, 3, 2, 1, "stem.maxpool")


def bert(
    *, layers: int = 8, seq: int = 64, hidden: int = 1024, heads: int = 16, wiring: str = "tensat", seed: int = 0
) -> onnx.ModelProto:
    """Tensat's BERT: ``layers`` multi-head attention layers on a (seq, hidden) input ``x``.

    Per layer: Q, K, V = h @ W (hidden x hidden each), reshaped to (seq, heads,
    hidden/heads); Q and V transposed (1,0,2), K transposed (1,2,0); logits = Q @ K;
    attn = logits @ V, transposed back (1,0,2) and reshaped to (seq, hidden); a final
    hidden x hidden MatMul.  No softmax, no layer norm, no biases.  W_q is scaled by
    1/sqrt(hidden/heads) and W_v by 1/sqrt(seq) so the two batched matmuls keep O(1)
    values.

    ``wiring="tensat"`` (default) follows the dataflow of Tensat's ``bert.rs`` (and of
    TASO's ``bert.py``): the input goes through a Relu (Tensat), each layer's final
    linear MatMul is applied to the layer *input* and feeds the next layer, and every
    layer's attention result is a graph output (``attn0``.. plus the final ``y``).
    The graph is then numerically stable at any depth.  Unlike those sources, K is
    transposed (1,2,0) for a real Q @ K^T; they use (1,0,2), which only type-checks
    because seq == hidden/heads == 64.

    ``wiring="sequential"`` applies the final linear MatMul to the attention result
    and feeds that to the next layer (single output ``y``).  Each layer is then a
    homogeneous cubic map, so the output scales like (input scale)**(3**layers): no
    weight scaling keeps it O(1) for generic inputs beyond ~3 layers.
    """
    if hidden % heads:
        raise ValueError(f"hidden={hidden} is not divisible by heads={heads}")
    if wiring not in ("tensat", "sequential"):
        raise ValueError(f"wiring must be 'tensat' or 'sequential', not {wiring!r}")
    d_head = hidden // heads
    std = 1.0 / math.sqrt(hidden)
    g = _Graph("bert", seed)
    h = g.input("x", (seq, hidden))
    if wiring == "tensat":
        h = g.relu(h, "input.relu")
    outputs: list[_T] = []
    for i in range(layers):
        p = f"layer{i}"
        q = g.matmul_weight(h, hidden, f"{p}.q", std / math.sqrt(d_head))
        k = g.matmul_weight(h, hidden, f"{p}.k", std)
        v = g.matmul_weight(h, hidden, f"{p}.v", std / math.sqrt(seq))
        q = g.transpose(g.reshape(q, (seq, heads, d_head), f"{p}.q.reshape"), (1, 0, 2), f"{p}.q.transpose")
        k = g.transpose(g.reshape(k, (seq, heads, d_head), f"{p}.k.reshape"), (1, 2, 0), f"{p}.k.transpose")
        v = g.transpose(g.reshape(v, (seq, heads, d_head), f"{p}.v.reshape"), (1, 0, 2), f"{p}.v.transpose")
        logits = g.matmul(q, k, f"{p}.logits")
        attn = g.matmul(logits, v, f"{p}.attn")
        attn = g.transpose(attn, (1, 0, 2), f"{p}.attn.transpose")
        last = i == layers - 1
        if wiring == "tensat":
            outputs.append(g.reshape(attn, (seq, hidden), f"{p}.attn.reshape", output=f"attn{i}"))
            h = g.matmul_weight(h, hidden, f"{p}.linear", std, output="y" if last else None)
        else:
            attn = g.reshape(attn, (seq, hidden), f"{p}.attn.reshape")
            h = g.matmul_weight(attn, hidden, f"{p}.linear", std, output="y" if last else None)
    return g.model([*outputs, h], bert.__doc__ or "")


def nasrnn(*, steps: int = 5, hidden: int = 512, share_weights: bool = True, seed: int = 0) -> onnx.ModelProto:
    """NasRNN cell (Zoph & Le) unrolled ``steps`` times on inputs ``x0``.. of shape (1, hidden).

    Each step computes 8 combines t_i = x @ W1_i + h @ W2_i and the NAS cell tree
    (relu/sigmoid/tanh, Add/Mul) down to the new state h = tanh(mid6).  The initial
    state ``h0`` is a (1, hidden) initializer; the output ``h`` is the final state.
    With ``share_weights`` (default) the 16 weight matrices are shared across steps,
    otherwise every step gets its own (as in Tensat's ``nasrnn.rs``).
    """
    g = _Graph("nasrnn", seed)
    xs = [g.input(f"x{t}", (1, hidden)) for t in range(steps)]
    h = g.weight("h0", (1, hidden), 1.0)
    std = 1.0 / math.sqrt(2 * hidden)
    shared: list[tuple[_T, _T]] = []
    for t, x in enumerate(xs):
        p = f"step{t}"
        if not shared or not share_weights:
            wp = "cell" if share_weights else p
            shared = [
                (g.weight(f"{wp}.w_x{i}", (hidden, hidden), std), g.weight(f"{wp}.w_h{i}", (hidden, hidden), std))
                for i in range(8)
            ]
        ts = [
            g.add(g.matmul(x, wx, f"{p}.t{i}.x"), g.matmul(h, wh, f"{p}.t{i}.h"), f"{p}.t{i}")
            for i, (wx, wh) in enumerate(shared)
        ]
        m0 = g.add(g.relu(ts[0], f"{p}.t0.relu"), g.sigmoid(ts[3], f"{p}.t3.sigmoid"), f"{p}.mid0")
        m1 = g.add(g.sigmoid(ts[1], f"{p}.t1.sigmoid"), g.tanh(ts[2], f"{p}.t2.tanh"), f"{p}.mid1")
        m2 = g.mul(g.sigmoid(ts[4], f"{p}.t4.sigmoid"), g.tanh(ts[5], f"{p}.t5.tanh"), f"{p}.mid2")
        m3 = g.mul(g.sigmoid(ts[6], f"{p}.t6.sigmoid"), g.relu(ts[7], f"{p}.t7.relu"), f"{p}.mid3")
        m4 = g.add(g.sigmoid(m1, f"{p}.mid1.sigmoid"), g.tanh(m2, f"{p}.mid2.tanh"), f"{p}.mid4")
        m5 = g.mul(g.tanh(m0, f"{p}.mid0.tanh"), g.tanh(m3, f"{p}.mid3.tanh"), f"{p}.mid5")
        m6 = g.mul(g.tanh(m4, f"{p}.mid4.tanh"), g.tanh(m5, f"{p}.mid5.tanh"), f"{p}.mid6")
        h = g.tanh(m6, f"{p}.h", output="h" if t == steps - 1 else None)
    return g.model([h], nasrnn.__doc__ or "")


def _resnet_like(
    name: str, doc: str, *, image: int, stages: Sequence[tuple[int, int]], expansion: int, groups: int, seed: int
) -> onnx.ModelProto:
    """Shared body of ResNet-50 / ResNeXt-50 (bottleneck blocks, bias instead of BN)."""
    g = _Graph(name, seed)
    x = _stem(g, g.input("x", (1, 3, image, image)))
    for s, (blocks, width) in enumerate(stages):
        for b in range(blocks):
            p = f"stage{s + 1}.block{b}"
            stride = 2 if s > 0 and b == 0 else 1
            out_c = width * expansion
            y = g.conv(x, width, 1, f"{p}.conv1")
            y = g.conv(y, width, 3, f"{p}.conv2", stride=stride, pad=1, groups=groups)
            y = g.conv(y, out_c, 1, f"{p}.conv3", relu=False, gain=0.25)
            if stride != 1 or x.shape[1] != out_c:
                x = g.conv(x, out_c, 1, f"{p}.shortcut", stride=stride, relu=False, gain=0.5)
            x = g.relu(g.add(y, x, f"{p}.add"), f"{p}.relu")
    return g.model([_classifier(g, x)], doc)


def resnext50(*, image: int = 224, seed: int = 0) -> onnx.ModelProto:
    """ResNeXt-50 (32 groups): stem, stages 3x128, 4x256, 6x512, 3x1024 of bottleneck
    blocks (1x1 -> 3x3 grouped conv carrying the stride -> 1x1 to 2*width, 1x1
    projection shortcut when the shape changes, add, relu), GAP and FC 1000.
    Input ``x`` (1, 3, image, image), output ``logits`` (1, 1000)."""
    return _resnet_like(
        "resnext50",
        resnext50.__doc__ or "",
        image=image,
        stages=[(3, 128), (4, 256), (6, 512), (3, 1024)],
        expansion=2,
        groups=32,
        seed=seed,
    )


def resnet50(*, image: int = 224, seed: int = 0) -> onnx.ModelProto:
    """ResNet-50 (control with little to gain): stem, bottleneck stages 3,4,6,3 of widths
    64,128,256,512 (expansion 4, stride on the 3x3 conv), conv biases instead of
    batch norm, GAP and FC 1000.  Input ``x`` (1, 3, image, image), output ``logits``."""
    return _resnet_like(
        "resnet50",
        resnet50.__doc__ or "",
        image=image,
        stages=[(3, 64), (4, 128), (6, 256), (3, 512)],
        expansion=4,
        groups=1,
        seed=seed,
    )


def _sep_conv(g: _Graph, x: _T, kernel: int, name: str, stride: int = 1, gain: float = 1.0) -> _T:
    """Separable conv: depthwise KxK ("same" pad) + 1x1 conv, no activations."""
    c = x.shape[1]
    y = g.conv(x, c, kernel, f"{name}.depthwise", stride=stride, pad=kernel // 2, groups=c, relu=False)
    return g.conv(y, c, 1, f"{name}.pointwise", relu=False, gain=gain)


def _nas_adapt(g: _Graph, prev: _T, cur: _T, channels: int, name: str) -> tuple[_T, _T]:
    """Bring ``cur`` (1x1 conv + relu) and ``prev`` (1x1, or 3x3/2 if larger) to ``channels``."""
    cur = g.conv(cur, channels, 1, f"{name}.adapt_cur", gain=1.0)
    if prev.shape[2:] == cur.shape[2:]:
        prev = g.conv(prev, channels, 1, f"{name}.adapt_prev", gain=1.0)
    else:
        prev = g.conv(prev, channels, 3, f"{name}.adapt_prev", stride=2, pad=1, gain=1.0)
        if prev.shape != cur.shape:
            raise ValueError(f"{name}: cannot fit prev {prev.shape} to cur {cur.shape}")
    return prev, cur


def _nas_normal_cell(g: _Graph, prev: _T, cur: _T, channels: int, name: str) -> _T:
    """Tensat's normal cell; sep convs summed with another sep conv get half the variance."""
    prev, cur = _nas_adapt(g, prev, cur, channels, name)
    outs = [
        g.add(_sep_conv(g, cur, 3, f"{name}.b0.sep3_cur"), cur, f"{name}.b0.add"),
        g.add(
            _sep_conv(g, prev, 3, f"{name}.b1.sep3_prev", gain=0.5),
            _sep_conv(g, cur, 3, f"{name}.b1.sep3_cur", gain=0.5),
            f"{name}.b1.add",
        ),
        g.add(g.avgpool(cur, 3, 1, 1, f"{name}.b2.avg3_cur"), prev, f"{name}.b2.add"),
        g.add(
            g.avgpool(prev, 3, 1, 1, f"{name}.b3.avg3_prev_a"),
            g.avgpool(prev, 3, 1, 1, f"{name}.b3.avg3_prev_b"),
            f"{name}.b3.add",
        ),
        g.add(
            _sep_conv(g, prev, 3, f"{name}.b4.sep3_prev_a", gain=0.5),
            _sep_conv(g, prev, 3, f"{name}.b4.sep3_prev_b", gain=0.5),
            f"{name}.b4.add",
        ),
    ]
    return g.concat(outs, f"{name}.concat")


def _nas_reduction_cell(g: _Graph, prev: _T, cur: _T, channels: int, name: str) -> _T:
    """Tensat's stride-2 reduction cell (all stride-2 branches give ceil(H/2))."""
    prev, cur = _nas_adapt(g, prev, cur, channels, name)
    o0 = g.add(
        _sep_conv(g, prev, 7, f"{name}.b0.sep7_prev", stride=2, gain=0.5),
        _sep_conv(g, cur, 5, f"{name}.b0.sep5_cur", stride=2, gain=0.5),
        f"{name}.b0.add",
    )
    o1 = g.add(
        g.maxpool(cur, 3, 2, 1, f"{name}.b1.max3_cur"),
        _sep_conv(g, prev, 7, f"{name}.b1.sep7_prev", stride=2),
        f"{name}.b1.add",
    )
    o2 = g.add(
        g.avgpool(cur, 3, 2, 1, f"{name}.b2.avg3_cur"),
        _sep_conv(g, prev, 5, f"{name}.b2.sep5_prev", stride=2),
        f"{name}.b2.add",
    )
    o3 = g.add(
        g.maxpool(cur, 3, 2, 1, f"{name}.b3.max3_cur"), _sep_conv(g, o0, 3, f"{name}.b3.sep3_o0"), f"{name}.b3.add"
    )
    o4 = g.add(g.avgpool(o0, 3, 1, 1, f"{name}.b4.avg3_o0"), o1, f"{name}.b4.add")
    return g.concat([o0, o1, o2, o3, o4], f"{name}.concat")


def nasnet_a(
    *, image: int = 224, channels: int = 128, stages: int = 3, cells: int = 5, seed: int = 0
) -> onnx.ModelProto:
    """NasNet-A as in Tensat's ``nasneta.rs``: ResNet stem, then ``stages`` x (``cells``
    normal cells + a reduction cell) starting at ``channels`` (doubled for each
    reduction cell and the stage after it), GAP and FC 1000.

    Every cell adapts ``cur`` and ``prev`` to its channel count with 1x1 conv + relu
    (3x3/2 for a larger ``prev``) and concatenates five pairwise sums, so it outputs
    5x channels.  Separable conv = depthwise KxK + 1x1 conv.  Input ``x``
    (1, 3, image, image), output ``logits`` (1, 1000).
    """
    g = _Graph("nasnet_a", seed)
    x = _stem(g, g.input("x", (1, 3, image, image)))
    c = channels
    for s in range(stages):
        prev = cur = x
        for j in range(cells):
            prev, cur = cur, _nas_normal_cell(g, prev, cur, c, f"stage{s + 1}.normal{j}")
        c *= 2
        x = _nas_reduction_cell(g, prev, cur, c, f"stage{s + 1}.reduction")
    return g.model([_classifier(g, x)], nasnet_a.__doc__ or "")


def _inception_a(g: _Graph, x: _T, pool_features: int, p: str) -> _T:
    b1 = g.conv(x, 64, 1, f"{p}.branch1x1")
    b5 = g.conv(g.conv(x, 48, 1, f"{p}.branch5x5_1"), 64, 5, f"{p}.branch5x5_2", pad=2)
    b3 = g.conv(x, 64, 1, f"{p}.branch3x3dbl_1")
    b3 = g.conv(b3, 96, 3, f"{p}.branch3x3dbl_2", pad=1)
    b3 = g.conv(b3, 96, 3, f"{p}.branch3x3dbl_3", pad=1)
    bp = g.conv(g.avgpool(x, 3, 1, 1, f"{p}.branch_pool.avgpool"), pool_features, 1, f"{p}.branch_pool")
    return g.concat([b1, b5, b3, bp], f"{p}.concat")


def _inception_b(g: _Graph, x: _T, p: str) -> _T:
    b3 = g.conv(x, 384, 3, f"{p}.branch3x3", stride=2)
    bd = g.conv(x, 64, 1, f"{p}.branch3x3dbl_1")
    bd = g.conv(bd, 96, 3, f"{p}.branch3x3dbl_2", pad=1)
    bd = g.conv(bd, 96, 3, f"{p}.branch3x3dbl_3", stride=2)
    bp = g.maxpool(x, 3, 2, 0, f"{p}.branch_pool")
    return g.concat([b3, bd, bp], f"{p}.concat")


def _inception_c(g: _Graph, x: _T, c7: int, p: str) -> _T:
    b1 = g.conv(x, 192, 1, f"{p}.branch1x1")
    b7 = g.conv(x, c7, 1, f"{p}.branch7x7_1")
    b7 = g.conv(b7, c7, (1, 7), f"{p}.branch7x7_2", pad=(0, 3))
    b7 = g.conv(b7, 192, (7, 1), f"{p}.branch7x7_3", pad=(3, 0))
    bd = g.conv(x, c7, 1, f"{p}.branch7x7dbl_1")
    bd = g.conv(bd, c7, (7, 1), f"{p}.branch7x7dbl_2", pad=(3, 0))
    bd = g.conv(bd, c7, (1, 7), f"{p}.branch7x7dbl_3", pad=(0, 3))
    bd = g.conv(bd, c7, (7, 1), f"{p}.branch7x7dbl_4", pad=(3, 0))
    bd = g.conv(bd, 192, (1, 7), f"{p}.branch7x7dbl_5", pad=(0, 3))
    bp = g.conv(g.avgpool(x, 3, 1, 1, f"{p}.branch_pool.avgpool"), 192, 1, f"{p}.branch_pool")
    return g.concat([b1, b7, bd, bp], f"{p}.concat")


def _inception_d(g: _Graph, x: _T, p: str) -> _T:
    b3 = g.conv(g.conv(x, 192, 1, f"{p}.branch3x3_1"), 320, 3, f"{p}.branch3x3_2", stride=2)
    b7 = g.conv(x, 192, 1, f"{p}.branch7x7x3_1")
    b7 = g.conv(b7, 192, (1, 7), f"{p}.branch7x7x3_2", pad=(0, 3))
    b7 = g.conv(b7, 192, (7, 1), f"{p}.branch7x7x3_3", pad=(3, 0))
    b7 = g.conv(b7, 192, 3, f"{p}.branch7x7x3_4", stride=2)
    bp = g.maxpool(x, 3, 2, 0, f"{p}.branch_pool")
    return g.concat([b3, b7, bp], f"{p}.concat")


def _inception_e(g: _Graph, x: _T, p: str) -> _T:
    b1 = g.conv(x, 320, 1, f"{p}.branch1x1")
    b3 = g.conv(x, 384, 1, f"{p}.branch3x3_1")
    b3 = g.concat(
        [
            g.conv(b3, 384, (1, 3), f"{p}.branch3x3_2a", pad=(0, 1)),
            g.conv(b3, 384, (3, 1), f"{p}.branch3x3_2b", pad=(1, 0)),
        ],
        f"{p}.branch3x3.concat",
    )
    bd = g.conv(x, 448, 1, f"{p}.branch3x3dbl_1")
    bd = g.conv(bd, 384, 3, f"{p}.branch3x3dbl_2", pad=1)
    bd = g.concat(
        [
            g.conv(bd, 384, (1, 3), f"{p}.branch3x3dbl_3a", pad=(0, 1)),
            g.conv(bd, 384, (3, 1), f"{p}.branch3x3dbl_3b", pad=(1, 0)),
        ],
        f"{p}.branch3x3dbl.concat",
    )
    bp = g.conv(g.avgpool(x, 3, 1, 1, f"{p}.branch_pool.avgpool"), 192, 1, f"{p}.branch_pool")
    return g.concat([b1, b3, bd, bp], f"{p}.concat")


def inception_v3(*, image: int = 299, seed: int = 0) -> onnx.ModelProto:
    """Inception-v3 (torchvision layout, conv bias + ReLU instead of BN + ReLU): v3 stem,
    Mixed 5b-5d = A(32), A(64), A(64); 6a = B; 6b-6e = C(128), C(160), C(160), C(192);
    7a = D; 7b, 7c = E; GAP and FC 1000.  Branch average pools are 3x3/1 pad 1 with
    ``count_include_pad=0`` (torchvision counts the padding).  Input ``x``
    (1, 3, image, image) with image >= 75, output ``logits`` (1, 1000)."""
    g = _Graph("inception_v3", seed)
    x = g.input("x", (1, 3, image, image))
    x = g.conv(x, 32, 3, "Conv2d_1a_3x3", stride=2)
    x = g.conv(x, 32, 3, "Conv2d_2a_3x3")
    x = g.conv(x, 64, 3, "Conv2d_2b_3x3", pad=1)
    x = g.maxpool(x, 3, 2, 0, "maxpool1")
    x = g.conv(x, 80, 1, "Conv2d_3b_1x1")
    x = g.conv(x, 192, 3, "Conv2d_4a_3x3")
    x = g.maxpool(x, 3, 2, 0, "maxpool2")
    for tag, pf in (("5b", 32), ("5c", 64), ("5d", 64)):
        x = _inception_a(g, x, pf, f"Mixed_{tag}")
    x = _inception_b(g, x, "Mixed_6a")
    for tag, c7 in (("6b", 128), ("6c", 160), ("6d", 160), ("6e", 192)):
        x = _inception_c(g, x, c7, f"Mixed_{tag}")
    x = _inception_d(g, x, "Mixed_7a")
    x = _inception_e(g, x, "Mixed_7b")
    x = _inception_e(g, x, "Mixed_7c")
    return g.model([_classifier(g, x)], inception_v3.__doc__ or "")


def _fire(g: _Graph, x: _T, squeeze: int, expand: int, p: str) -> _T:
    s = g.conv(x, squeeze, 1, f"{p}.squeeze")
    return g.concat(
        [g.conv(s, expand, 1, f"{p}.expand1x1"), g.conv(s, expand, 3, f"{p}.expand3x3", pad=1)], f"{p}.concat"
    )


def squeezenet(*, image: int = 224, seed: int = 0) -> onnx.ModelProto:
    """SqueezeNet 1.1: 3x3/2 conv to 64 + relu, 3x3/2 max pools (floor mode) and fire
    modules 16/64/64 x2, 32/128/128 x2, 48/192/192 x2, 64/256/256 x2, 1x1 conv to
    1000 + relu, GAP, flatten.  Input ``x`` (1, 3, image, image), output ``logits``."""
    g = _Graph("squeezenet", seed)
    x = g.input("x", (1, 3, image, image))
    x = g.conv(x, 64, 3, "conv1", stride=2)
    x = g.maxpool(x, 3, 2, 0, "maxpool1")
    x = _fire(g, x, 16, 64, "fire2")
    x = _fire(g, x, 16, 64, "fire3")
    x = g.maxpool(x, 3, 2, 0, "maxpool2")
    x = _fire(g, x, 32, 128, "fire4")
    x = _fire(g, x, 32, 128, "fire5")
    x = g.maxpool(x, 3, 2, 0, "maxpool3")
    x = _fire(g, x, 48, 192, "fire6")
    x = _fire(g, x, 48, 192, "fire7")
    x = _fire(g, x, 64, 256, "fire8")
    x = _fire(g, x, 64, 256, "fire9")
    x = g.conv(x, 1000, 1, "conv10")
    x = g.global_avgpool(x, "head.gap")
    x = g.node("Flatten", [x.name], (1, 1000), "head.flatten", output="logits", axis=1)
    return g.model([x], squeezenet.__doc__ or "")


def vgg19(*, image: int = 224, fc: int = 4096, seed: int = 0) -> onnx.ModelProto:
    """VGG-19: 16 3x3 same convs (64x2, 128x2, 256x4, 512x4, 512x4) each + relu, a 2x2/2
    max pool after each group, flatten, FC ``fc`` + relu, FC ``fc`` + relu, FC 1000.
    The first FC's input size is 512 * (image // 32)**2 (25088 at 224).  Input ``x``
    (1, 3, image, image), output ``logits`` (1, 1000)."""
    g = _Graph("vgg19", seed)
    x = g.input("x", (1, 3, image, image))
    for s, (n, c) in enumerate([(2, 64), (2, 128), (4, 256), (4, 512), (4, 512)]):
        for i in range(n):
            x = g.conv(x, c, 3, f"conv{s + 1}_{i + 1}", pad=1)
        x = g.maxpool(x, 2, 2, 0, f"pool{s + 1}")
    x = g.flatten(x, "flatten")
    x = g.linear(x, fc, "fc6", relu=True)
    x = g.linear(x, fc, "fc7", relu=True)
    x = g.linear(x, 1000, "fc8", output="logits")
    return g.model([x], vgg19.__doc__ or "")


MODELS: dict[str, Callable[..., onnx.ModelProto]] = {
    "bert": bert,
    "resnext50": resnext50,
    "nasnet_a": nasnet_a,
    "nasrnn": nasrnn,
    "inception_v3": inception_v3,
    "squeezenet": squeezenet,
    "vgg19": vgg19,
    "resnet50": resnet50,
}

# Small versions of every benchmark graph (builder keyword arguments): same structure, sizes that run in seconds.
# The one source of truth for the tests and `python -m bench --small`.
SMALL_SIZES: dict[str, dict[str, int]] = {
    "bert": dict(layers=2, seq=16, hidden=64, heads=4),
    "nasrnn": dict(steps=2, hidden=32),
    "resnext50": dict(image=32),
    "resnet50": dict(image=32),
    "nasnet_a": dict(image=32, channels=8, stages=2, cells=2),
    "inception_v3": dict(image=75),
    "squeezenet": dict(image=64),
    "vgg19": dict(image=32, fc=64),
}


def model_names() -> list[str]:
    """Names accepted by :func:`build_model`, in the paper's order (ResNet-50 last)."""
    return list(MODELS)


def _builder(name: str) -> Callable[..., onnx.ModelProto]:
    """The builder of model ``name``; ValueError (one line, listing the valid names) for an unknown one."""
    try:
        return MODELS[name]
    except KeyError:
        raise ValueError(f"unknown model {name!r}; valid names: {', '.join(MODELS)}") from None


def build_model(name: str, *, seed: int = 0, **kwargs: object) -> onnx.ModelProto:
    """Build benchmark ``name`` with seeded weights; ``kwargs`` go to its builder."""
    return _builder(name)(seed=seed, **kwargs)


def example_inputs(model: onnx.ModelProto, seed: int = 0) -> dict[str, np.ndarray]:
    """Seeded standard-normal float32 feeds for every graph input of ``model``."""
    rng = np.random.default_rng(seed)
    init = {t.name for t in model.graph.initializer}
    feeds = {}
    for vi in model.graph.input:
        if vi.name in init:
            continue
        shape = [d.dim_value for d in vi.type.tensor_type.shape.dim]
        feeds[vi.name] = rng.standard_normal(shape, dtype=np.float32)
    return feeds


# One line per model, for its default size (what `catalog` builds).
_DESCRIPTIONS: dict[str, str] = {
    "bert": "BERT attention stack (Tensat wiring): 8 layers, 16 heads, hidden 1024, 64 tokens, no softmax/norm",
    "resnext50": "ResNeXt-50 (32 groups, conv bias instead of batch norm), 224x224 image",
    "nasnet_a": "NasNet-A (Tensat's nasneta.rs): 3 stages of 5 normal + 1 reduction cell, 224x224 image",
    "nasrnn": "NasRNN cell (Zoph & Le) unrolled 5 steps, hidden 512, weights shared across steps",
    "inception_v3": "Inception-v3 (torchvision layout, conv bias instead of batch norm), 299x299 image",
    "squeezenet": "SqueezeNet 1.1 (Fire modules), 224x224 image",
    "vgg19": "VGG-19: 16 3x3 convs and FC 4096-4096-1000, 224x224 image",
    "resnet50": "ResNet-50 (control with little to gain; conv bias instead of batch norm), 224x224 image",
}


@dataclass(frozen=True)
class ModelInfo:
    """What a built-in model is, as built at its default size: graph inputs, ONNX node and weight counts."""

    name: str
    description: str
    inputs: dict[str, tuple[int, ...]]
    onnx_nodes: int
    parameters: int


def _info(name: str, model: onnx.ModelProto) -> ModelInfo:
    graph = model.graph
    init = {t.name for t in graph.initializer}
    inputs = {
        vi.name: tuple(d.dim_value for d in vi.type.tensor_type.shape.dim) for vi in graph.input if vi.name not in init
    }
    params = sum(math.prod(t.dims) for t in graph.initializer if t.data_type == TensorProto.FLOAT)
    return ModelInfo(name, _DESCRIPTIONS[name], inputs, len(graph.node), params)


def catalog(names: Sequence[str] | None = None) -> list[ModelInfo]:
    """:class:`ModelInfo` for ``names`` (default: every model, in :func:`model_names` order).

    Each model's structure is built at its default size to count its nodes and weights (its
    random weights are not drawn, so this is quick).  ValueError for an unknown name, before building anything.
    """
    if isinstance(names, str):
        raise TypeError("catalog() takes a sequence of model names, not a string; use describe(name)")
    names = model_names() if names is None else list(names)
    for name in names:
        _builder(name)
    token = _STRUCTURE_ONLY.set(True)
    try:
        return [_info(name, build_model(name)) for name in names]
    finally:
        _STRUCTURE_ONLY.reset(token)


def describe(name: str) -> ModelInfo:
    """:class:`ModelInfo` for model ``name``; ValueError listing the valid names for an unknown one."""
    return catalog([name])[0]


def _format_inputs(inputs: dict[str, tuple[int, ...]]) -> str:
    """``x 1x3x224x224``; three or more consecutive inputs of one shape become ``x0..x4 1x512``."""
    runs: list[tuple[list[str], tuple[int, ...]]] = []
    for name, shape in inputs.items():
        if runs and runs[-1][1] == shape:
            runs[-1][0].append(name)
        else:
            runs.append(([name], shape))
    parts = []
    for names, shape in runs:
        dims = "x".join(map(str, shape)) or "scalar"
        if len(names) >= 3:
            parts.append(f"{names[0]}..{names[-1]} {dims}")
        else:
            parts.extend(f"{n} {dims}" for n in names)
    return ", ".join(parts)


def format_catalog(infos: Sequence[ModelInfo]) -> str:
    """An aligned plain-text table of ``infos``: name, ONNX nodes, parameters (millions), inputs, description."""
    header = ("name", "ONNX nodes", "parameters", "inputs", "description")
    rows = [
        (i.name, str(i.onnx_nodes), f"{i.parameters / 1e6:.1f}M", _format_inputs(i.inputs), i.description)
        for i in infos
    ]
    widths = [max(len(r[c]) for r in [header, *rows]) for c in range(len(header))]
    right = {1, 2}  # numeric columns

    def line(cells: Sequence[str]) -> str:
        text = "  ".join(
            cell.rjust(w) if c in right else cell.ljust(w) for c, (cell, w) in enumerate(zip(cells, widths))
        )
        return text.rstrip()

    rule = ["-" * w for w in widths]
    return "\n".join(line(r) for r in [header, rule, *rows])
