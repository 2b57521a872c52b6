"""ONNX-model-zoo-style models at opsets 7-13, built by hand (onnx.helper + numpy, seeded random weights).

Model-zoo files are older than the paper's benchmark graphs (``tensat/models.py``, opset 17) and use idioms those
do not: Dropout declaring its mask, opset-12 Dropout with ``ratio``/``training_mode`` inputs, BatchNormalization
with the opset-7 ``spatial`` attribute, Gemm with ``transA``/``transB``/``alpha``/``beta``, Flatten, LRN, Softmax
and LogSoftmax with their pre-13 (coerce to 2-D) semantics, Reshape shapes computed by Shape/Gather/Unsqueeze/
Concat, Squeeze/Unsqueeze axes as attributes (opset < 13) or inputs (13), Gather with a scalar index, weights
from Constant and ConstantOfShape nodes, nodes out of topological order, and, at opsets 7-8, IR version 3 with
every initializer also listed as a graph input.

Every builder takes size parameters (``image``, ``width``, ...) and ``opset``. The whole zoo CNNs default to
realistic benchmark sizes (each optimizes with `tensat optimize --cost analytic` in under 30 s, most of it the
end-to-end latency check) and ``ZOO[name].small`` gives their test-fixture sizes (a few seconds); the one-idiom
builders are fixture-sized by default. ``ZOO`` maps each name to its builder, default opset and the idioms it
covers; ``build_zoo_model(name, small=..., **kwargs)`` builds one.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from tensat.models import _T, BIAS_STD, _fire, _Graph, _window_out

__all__ = ["IDIOMS", "ZOO", "ZooModel", "build_zoo_model", "zoo_names"]

IDIOMS = (
    "dropout_mask",
    "dropout_training_mode",
    "batchnorm_legacy",
    "gemm_attributes",
    "flatten",
    "lrn",
    "softmax_legacy",
    "logsoftmax_legacy",
    "computed_reshape",
    "squeeze_attribute",
    "squeeze_input",
    "gather_scalar",
    "constant_weights",
    "constant_of_shape",
    "out_of_order",
    "initializers_as_inputs",
)
"""Every model-zoo idiom some builder here covers (see each ``ZooModel.idioms``)."""


def _ch(channels: int, width: float, groups: int = 1) -> int:
    """`channels` scaled by `width`, a positive multiple of `groups`."""
    return max(groups, round(channels * width / groups) * groups)


class _Zoo(_Graph):
    """`tensat.models._Graph` for an older opset: multi-output nodes, Constant nodes, zoo-era finishing."""

    def __init__(self, name: str, seed: int, opset: int) -> None:
        if not 7 <= opset <= 13:
            raise ValueError(f"zoo models are built at opsets 7-13, not {opset}")
        super().__init__(name, seed)
        self.opset = opset
        self.outputs: list[onnx.ValueInfoProto] = []

    def nodes(self, op: str, inputs: Sequence[str], outputs: Sequence[str], name: str, **attrs: object) -> list[str]:
        """A node with several outputs, uniquely named (an output may share the node's name, as `node`'s does);
        an empty output name stays empty (omitted)."""
        base, name = name, self.unique(name)
        outs = [name if o == base else self.unique(o) if o else "" for o in outputs]
        self.graph.node.append(helper.make_node(op, list(inputs), outs, name=name, **attrs))
        return outs

    def ints(self, name: str, values: Sequence[int] | int) -> str:
        """An int64 initializer (a scalar when `values` is an int)."""
        return self.const(name, np.asarray(values, dtype=np.int64))

    def constant(self, name: str, array: np.ndarray) -> str:
        """A Constant node holding `array` (the zoo's other way to store a weight)."""
        return self.nodes("Constant", [], [name], name, value=numpy_helper.from_array(np.asarray(array)))[0]

    def conv_bn(
        self, x: _T, cout: int, kernel: int, name: str, *, stride: int = 1, pad: int = 0, relu: bool = True
    ) -> _T:
        """Bias-free Conv + BatchNormalization (+ Relu), MXNet/Caffe2-zoo style."""
        n, cin, h, w = x.shape
        weight = self.randn(f"{name}.weight", (cout, cin, kernel, kernel), math.sqrt(2.0 / (cin * kernel * kernel)))
        shape = (n, cout, _window_out(h, kernel, stride, pad), _window_out(w, kernel, stride, pad))
        y = self.node(
            "Conv",
            [x.name, weight],
            shape,
            name,
            kernel_shape=[kernel, kernel],
            strides=[stride, stride],
            pads=[pad] * 4,
        )
        y = self.batchnorm(y, f"{name}.bn")
        return self.relu(y, f"{name}.relu") if relu else y

    def batchnorm(self, x: _T, name: str, spatial: int = 1) -> _T:
        """Inference BatchNormalization; at opsets 7-8 with the legacy `spatial` (and `momentum`) attributes.
        `spatial=0` normalizes per activation: its parameters have the shape of one sample (C, H, W)."""
        shape = (x.shape[1],) if spatial else x.shape[1:]
        scale = self.const(f"{name}.scale", (1.0 + 0.1 * self.rng.standard_normal(shape)).astype(np.float32))
        shift = self.randn(f"{name}.shift", shape, 0.1)
        mean = self.randn(f"{name}.mean", shape, 0.1)
        var = self.const(f"{name}.var", (0.5 + self.rng.random(shape)).astype(np.float32))
        attrs: dict[str, object] = {"epsilon": 1e-5, "momentum": 0.9}
        if self.opset < 9:
            attrs["spatial"] = spatial
        elif not spatial:
            raise ValueError("BatchNormalization has no spatial attribute from opset 9 on")
        return self.node("BatchNormalization", [x.name, scale, shift, mean, var], x.shape, name, **attrs)

    def pool(
        self,
        op: str,
        x: _T,
        kernel: int,
        stride: int,
        pads: Sequence[int],
        name: str,
        output: str | None = None,
        **attrs: object,
    ) -> _T:
        """MaxPool/AveragePool with explicit (top, left, bottom, right) pads (Caffe's ceil mode as extra pads)."""
        n, c, h, w = x.shape
        shape = (n, c, (h + pads[0] + pads[2] - kernel) // stride + 1, (w + pads[1] + pads[3] - kernel) // stride + 1)
        return self.node(
            op,
            [x.name],
            shape,
            name,
            output,
            kernel_shape=[kernel, kernel],
            strides=[stride, stride],
            pads=list(pads),
            **attrs,
        )

    def lrn(self, x: _T, name: str, size: int = 5) -> _T:
        return self.node("LRN", [x.name], x.shape, name, size=size, alpha=1e-4, beta=0.75, bias=1.0)

    def gemm(self, x: _T, n_out: int, name: str, *, relu: bool = False, output: str | None = None) -> _T:
        """A fully connected layer as one Gemm, the weight stored (out, in) with transB=1 as Caffe writes it."""
        w = self.randn(f"{name}.weight", (n_out, x.shape[-1]), math.sqrt((2.0 if relu else 1.0) / x.shape[-1]))
        b = self.randn(f"{name}.bias", (n_out,), BIAS_STD)
        y = self.node("Gemm", [x.name, w, b], (x.shape[0], n_out), name, None if relu else output, transB=1)
        return self.relu(y, f"{name}.relu", output) if relu else y

    def dropout(self, x: _T, name: str, *, mask: bool = True, ratio: float = 0.5) -> tuple[_T, _T | None]:
        """Dropout as the zoo writes it: the mask output declared (float before opset 10, bool after); from
        opset 12 the ratio and training_mode (a false Constant) are inputs."""
        if self.opset >= 12:
            r = self.const(f"{name}.ratio", np.asarray(ratio, dtype=np.float32))
            t = self.constant(f"{name}.training_mode", np.asarray(False))
            ins, attrs = [x.name, r, t], {}
        else:
            ins, attrs = [x.name], {"ratio": ratio}
        outs = self.nodes("Dropout", ins, [name, f"{name}.mask" if mask else ""], name, **attrs)
        return _T(outs[0], x.shape), (_T(outs[1], x.shape) if mask else None)

    def softmax(self, x: _T, name: str, *, axis: int | None = None, log: bool = False, output: str | None = None) -> _T:
        """Softmax/LogSoftmax; before opset 13 it normalizes over the 2-D coercion of `x` at `axis` (default 1)."""
        attrs = {} if axis is None else {"axis": axis}
        return self.node("LogSoftmax" if log else "Softmax", [x.name], x.shape, name, output, **attrs)

    def squeeze(self, x: _T, axes: Sequence[int], name: str, output: str | None = None) -> _T:
        """Squeeze with `axes` as an attribute (opset < 13) or an int64 input (opset 13)."""
        rank = len(x.shape)
        drop = {a % rank for a in axes}
        shape = [d for i, d in enumerate(x.shape) if i not in drop]
        if self.opset >= 13:
            return self.node("Squeeze", [x.name, self.ints(f"{name}.axes", list(axes))], shape, name, output)
        return self.node("Squeeze", [x.name], shape, name, output, axes=list(axes))

    def unsqueeze(self, x: _T, axes: Sequence[int], name: str, output: str | None = None) -> _T:
        """Unsqueeze with `axes` as an attribute (opset < 13) or an int64 input (opset 13)."""
        rank = len(x.shape) + len(axes)
        add = {a % rank for a in axes}
        dims = iter(x.shape)
        shape = [1 if i in add else next(dims) for i in range(rank)]
        if self.opset >= 13:
            return self.node("Unsqueeze", [x.name, self.ints(f"{name}.axes", list(axes))], shape, name, output)
        return self.node("Unsqueeze", [x.name], shape, name, output, axes=list(axes))

    def gather(self, x: _T, index: int | Sequence[int], axis: int, name: str, output: str | None = None) -> _T:
        """Gather with a constant index: a scalar drops the axis, a 1-D list keeps it with the list's length."""
        scalar = isinstance(index, int)
        shape = list(x.shape)
        if scalar:
            del shape[axis]
        else:
            shape[axis] = len(index)
        return self.node("Gather", [x.name, self.ints(f"{name}.index", index)], shape, name, output, axis=axis)

    def computed_flatten(self, x: _T, name: str, output: str | None = None) -> _T:
        """PyTorch's ``x.view(x.size(0), -1)``: Reshape to [Shape(x)[0], -1] via Shape/Gather/Unsqueeze/Concat."""
        shape = self.node("Shape", [x.name], (len(x.shape),), f"{name}.shape")
        batch = self.node("Gather", [shape.name, self.ints(f"{name}.zero", 0)], (), f"{name}.batch", axis=0)
        batch = self.unsqueeze(batch, [0], f"{name}.unsqueeze")
        rest = self.constant(f"{name}.rest", np.asarray([-1], dtype=np.int64))
        target = self.node("Concat", [batch.name, rest], (2,), f"{name}.target", axis=0)
        flat = (x.shape[0], math.prod(x.shape[1:]))
        return self.node("Reshape", [x.name, target.name], flat, name, output)

    def output(self, x: _T, elem_type: int = TensorProto.FLOAT) -> None:
        self.outputs.append(helper.make_tensor_value_info(x.name, elem_type, list(x.shape)))

    def finish(self, doc: str, *, reverse: bool = False) -> onnx.ModelProto:
        """The model, with the IR version its opset shipped with (3 for opsets 7-8, which list every initializer
        as a graph input, as the zoo's files of that age do); `reverse` writes the nodes in reverse order."""
        graph = self.graph
        graph.output.extend(self.outputs)
        graph.doc_string = doc
        imports = [helper.make_opsetid("", self.opset)]
        self.proto.ir_version = helper.find_min_ir_version_for(imports)
        if self.proto.ir_version < 4:
            graph.input.extend(
                helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)) for t in graph.initializer
            )
        if reverse:
            nodes = list(graph.node)[::-1]
            del graph.node[:]
            graph.node.extend(nodes)
        self.proto.producer_name = "tensat.bench.zoo_models"
        self.proto.opset_import.extend(imports)
        return self.proto


# ---------------------------------------------------------------------------------------------------------------
# whole models


def caffenet(
    *, image: int = 227, width: float = 1.0, fc: int = 4096, classes: int = 1000, opset: int = 9, seed: int = 0
) -> onnx.ModelProto:
    """BVLC CaffeNet/AlexNet: 11x11/4 conv 96, LRN, 3x3/2 max pool, 5x5 conv 256 (2 groups), LRN, pool, 3x3 convs
    384, 384 (2 groups), 256 (2 groups), pool, Flatten, Gemm (transB) ``fc`` + relu + Dropout (mask declared)
    twice, Gemm ``classes``, Softmax. Channels scale with ``width``. Input ``data_0``, output ``prob_1``."""
    g = _Zoo("caffenet", seed, opset)
    x = g.input("data_0", (1, 3, image, image))
    x = g.conv(x, _ch(96, width), 11, "conv1", stride=4)
    x = g.maxpool(g.lrn(x, "norm1"), 3, 2, 0, "pool1")
    x = g.conv(x, _ch(256, width, 2), 5, "conv2", pad=2, groups=2)
    x = g.maxpool(g.lrn(x, "norm2"), 3, 2, 0, "pool2")
    x = g.conv(x, _ch(384, width, 2), 3, "conv3", pad=1)
    x = g.conv(x, _ch(384, width, 2), 3, "conv4", pad=1, groups=2)
    x = g.conv(x, _ch(256, width, 2), 3, "conv5", pad=1, groups=2)
    x = g.maxpool(x, 3, 2, 0, "pool5")
    x = g.flatten(x, "flatten")
    x, _ = g.dropout(g.gemm(x, fc, "fc6", relu=True), "drop6")
    x, _ = g.dropout(g.gemm(x, fc, "fc7", relu=True), "drop7")
    x = g.softmax(g.gemm(x, classes, "fc8"), "prob", output="prob_1")
    g.output(x)
    return g.finish(caffenet.__doc__ or "")


def squeezenet10(
    *, image: int = 224, width: float = 1.0, classes: int = 1000, opset: int = 8, batchnorm: bool = False, seed: int = 0
) -> onnx.ModelProto:
    """SqueezeNet 1.0 as in the zoo's opset-7/8 file: 7x7/2 conv 96, 3x3/2 max pools, fire modules 16/64 x2,
    32/128 x2, 48/192 x2, 64/256 x2, Dropout, 1x1 conv ``classes`` + relu, GlobalAveragePool, Softmax over
    (1, classes, 1, 1). ``batchnorm`` adds a legacy (``spatial``) BatchNormalization after the first conv.
    Input ``data_0``, output ``softmaxout_1``."""
    g = _Zoo("squeezenet10", seed, opset)
    x = g.input("data_0", (1, 3, image, image))
    x = g.conv(x, _ch(96, width), 7, "conv1", stride=2, relu=not batchnorm)
    if batchnorm:
        x = g.relu(g.batchnorm(x, "conv1.bn"), "conv1.relu")
    x = g.maxpool(x, 3, 2, 0, "pool1")
    for i, (s, e) in enumerate([(16, 64), (16, 64), (32, 128)], start=2):
        x = _fire(g, x, _ch(s, width), _ch(e, width), f"fire{i}")
    x = g.maxpool(x, 3, 2, 0, "pool4")
    for i, (s, e) in enumerate([(32, 128), (48, 192), (48, 192), (64, 256)], start=5):
        x = _fire(g, x, _ch(s, width), _ch(e, width), f"fire{i}")
    x = g.maxpool(x, 3, 2, 0, "pool8")
    x = _fire(g, x, _ch(64, width), _ch(256, width), "fire9")
    x, _ = g.dropout(x, "drop9", mask=False)
    x = g.conv(x, classes, 1, "conv10")
    x = g.global_avgpool(x, "pool10")
    x = g.softmax(x, "softmax", output="softmaxout_1")
    g.output(x)
    return g.finish(squeezenet10.__doc__ or "")


def resnet_v1(
    *,
    image: int = 224,
    width: float = 1.0,
    blocks: Sequence[int] = (2, 2, 2, 2),
    classes: int = 1000,
    opset: int = 8,
    seed: int = 0,
) -> onnx.ModelProto:
    """ResNet-18 v1 (``blocks`` per stage; (3, 4, 6, 3) is ResNet-34) as the MXNet-converted zoo files: bias-free
    convs each followed by a legacy BatchNormalization (``spatial=1``, ``momentum``), 3x3/2 max pool, basic
    blocks with projection shortcuts, GlobalAveragePool, Flatten, Gemm (transB). Input ``data``, output
    ``resnetv15_dense0_fwd``."""
    g = _Zoo("resnet_v1", seed, opset)
    x = g.input("data", (1, 3, image, image))
    x = g.conv_bn(x, _ch(64, width), 7, "stem", stride=2, pad=3)
    x = g.maxpool(x, 3, 2, 1, "stem.pool")
    for s, n in enumerate(blocks):
        cout = _ch(64 * 2**s, width)
        for b in range(n):
            p = f"stage{s + 1}.block{b + 1}"
            stride = 2 if s > 0 and b == 0 else 1
            y = g.conv_bn(x, cout, 3, f"{p}.conv1", stride=stride, pad=1)
            y = g.conv_bn(y, cout, 3, f"{p}.conv2", pad=1, relu=False)
            if stride != 1 or x.shape[1] != cout:
                x = g.conv_bn(x, cout, 1, f"{p}.down", stride=stride, relu=False)
            x = g.relu(g.add(y, x, f"{p}.add"), f"{p}.relu")
    x = g.flatten(g.global_avgpool(x, "pool"), "flatten")
    g.output(g.gemm(x, classes, "dense", output="resnetv15_dense0_fwd"))
    return g.finish(resnet_v1.__doc__ or "")


_GOOGLENET = [  # (1x1, 3x3 reduce, 3x3, 5x5 reduce, 5x5, pool proj); None: a max pool between stages
    (64, 96, 128, 16, 32, 32),
    (128, 128, 192, 32, 96, 64),
    None,
    (192, 96, 208, 16, 48, 64),
    (160, 112, 224, 24, 64, 64),
    (128, 128, 256, 24, 64, 64),
    (112, 144, 288, 32, 64, 64),
    (256, 160, 320, 32, 128, 128),
    None,
    (256, 160, 320, 32, 128, 128),
    (384, 192, 384, 48, 128, 128),
]


def googlenet(
    *, image: int = 224, width: float = 1.0, modules: int = 2, classes: int = 1000, opset: int = 9, seed: int = 0
) -> onnx.ModelProto:
    """GoogLeNet (Inception v1) as the Caffe2-converted zoo file: 7x7/2 conv 64, 3x3/2 max pools with Caffe's
    ceil-mode padding, LRN, 1x1 conv 64, 3x3 conv 192, LRN, the first ``modules`` of its nine inception modules
    (1x1, 1x1-3x3, 1x1-5x5, 3x3 max pool-1x1, Concat), AveragePool over the last feature map, Dropout (mask
    declared), Reshape to (1, -1), Gemm (transB), Softmax. Input ``data_0``, output ``prob_1``.

    The default keeps two modules (3a, 3b): with more, the ILP runs to its time limit (as on Inception-v3) and
    `tensat optimize` takes minutes; ``modules=9`` is the whole network."""
    g = _Zoo("googlenet", seed, opset)
    x = g.input("data_0", (1, 3, image, image))
    x = g.conv(x, _ch(64, width), 7, "conv1", stride=2, pad=3)
    x = g.lrn(g.pool("MaxPool", x, 3, 2, (0, 0, 1, 1), "pool1"), "norm1")
    x = g.conv(x, _ch(64, width), 1, "conv2.reduce")
    x = g.conv(x, _ch(192, width), 3, "conv2", pad=1)
    x = g.pool("MaxPool", g.lrn(x, "norm2"), 3, 2, (0, 0, 1, 1), "pool2")
    specs = _GOOGLENET[: [i for i, spec in enumerate(_GOOGLENET) if spec is not None][modules - 1] + 1]
    for k, spec in enumerate(specs):
        if spec is None:
            x = g.pool("MaxPool", x, 3, 2, (0, 0, 1, 1), f"pool{k}")
            continue
        c1, r3, c3, r5, c5, pp = (_ch(c, width) for c in spec)
        p = f"inception{k}"
        a = g.conv(x, c1, 1, f"{p}.1x1")
        b = g.conv(g.conv(x, r3, 1, f"{p}.3x3_reduce"), c3, 3, f"{p}.3x3", pad=1)
        c = g.conv(g.conv(x, r5, 1, f"{p}.5x5_reduce"), c5, 5, f"{p}.5x5", pad=2)
        d = g.conv(g.pool("MaxPool", x, 3, 1, (1, 1, 1, 1), f"{p}.pool"), pp, 1, f"{p}.pool_proj")
        x = g.concat([a, b, c, d], f"{p}.concat")
    x = g.pool("AveragePool", x, x.shape[2], 1, (0, 0, 0, 0), "pool5", count_include_pad=0)
    x, _ = g.dropout(x, "drop5", ratio=0.4)
    x = g.reshape(x, (1, x.shape[1]), "reshape")
    x = g.softmax(g.gemm(x, classes, "loss3.classifier"), "prob", output="prob_1")
    g.output(x)
    return g.finish(googlenet.__doc__ or "")


def reshape_classifier(
    *, image: int = 32, channels: int = 32, classes: int = 10, opset: int = 11, seed: int = 0
) -> onnx.ModelProto:
    """A PyTorch-exported CIFAR-style classifier: two 3x3 conv + relu + 2x2 max pool stages, ``x.view(x.size(0),
    -1)`` (Reshape of a Shape/Gather/Unsqueeze/Concat shape), Gemm (transB) + relu, Gemm, LogSoftmax.
    Input ``input``, output ``output``."""
    g = _Zoo("reshape_classifier", seed, opset)
    x = g.input("input", (1, 3, image, image))
    x = g.maxpool(g.conv(x, channels, 3, "conv1", pad=1), 2, 2, 0, "pool1")
    x = g.maxpool(g.conv(x, 2 * channels, 3, "conv2", pad=1), 2, 2, 0, "pool2")
    x = g.computed_flatten(x, "view")
    x = g.gemm(x, 4 * channels, "fc1", relu=True)
    g.output(g.softmax(g.gemm(x, classes, "fc2"), "log_softmax", log=True, output="output"))
    return g.finish(reshape_classifier.__doc__ or "")


# ---------------------------------------------------------------------------------------------------------------
# one idiom each (small by default: these are test fixtures first)


def dropout_model(*, image: int = 8, channels: int = 4, opset: int = 9, seed: int = 0) -> onnx.ModelProto:
    """Two Dropouts (ratio/training_mode inputs from opset 12): one declares a mask nothing reads, the other's
    mask is a graph output ``mask`` and, cast to float, is added to the result ``y``."""
    g = _Zoo("dropout", seed, opset)
    x = g.input("x", (1, 3, image, image))
    x, _ = g.dropout(g.conv(x, channels, 3, "conv1", pad=1), "drop1")
    x, mask = g.dropout(g.conv(x, channels, 3, "conv2", pad=1), "drop2", ratio=0.3)
    assert mask is not None
    mask_type = TensorProto.BOOL if opset >= 10 else TensorProto.FLOAT
    mask = g.node("Identity", [mask.name], mask.shape, "mask.identity", output="mask")
    as_float = g.node("Cast", [mask.name], mask.shape, "mask.cast", to=TensorProto.FLOAT)
    g.output(g.add(x, as_float, "add", output="y"))
    g.output(mask, mask_type)
    return g.finish(dropout_model.__doc__ or "")


def batchnorm_model(*, image: int = 8, channels: int = 4, opset: int = 7, seed: int = 0) -> onnx.ModelProto:
    """Bias-free conv + BatchNormalization (``spatial=1`` before opset 9) + relu, then a per-activation
    BatchNormalization (``spatial=0``, parameters shaped (C, H, W); opsets 7-8 only). Output ``y``."""
    g = _Zoo("batchnorm", seed, opset)
    x = g.input("x", (1, 3, image, image))
    x = g.conv_bn(x, channels, 3, "conv1", pad=1)
    if opset < 9:
        x = g.batchnorm(x, "bn2", spatial=0)
    g.output(g.relu(g.conv(x, channels, 3, "conv2", pad=1, relu=False), "relu", output="y"))
    return g.finish(batchnorm_model.__doc__ or "")


def gemm_model(
    *, batch: int = 2, features: int = 16, hidden: int = 8, opset: int = 9, seed: int = 0
) -> onnx.ModelProto:
    """Gemm with transB, Gemm with transA (its A a Transpose of the activations) and alpha/beta, Gemm with
    alpha/beta and a one-element C broadcast. Output ``y``."""
    g = _Zoo("gemm", seed, opset)
    x = g.input("x", (batch, features))
    h = g.gemm(x, hidden, "fc1", relu=True)
    t = g.transpose(h, (1, 0), "transpose")
    w2 = g.randn("fc2.weight", (hidden, hidden), math.sqrt(1.0 / hidden))
    c2 = g.randn("fc2.bias", (1, hidden), BIAS_STD)
    h = g.node("Gemm", [t.name, w2, c2], (batch, hidden), "fc2", transA=1, alpha=0.5, beta=2.0)
    w3 = g.randn("fc3.weight", (hidden, hidden), math.sqrt(1.0 / hidden))
    c3 = g.randn("fc3.bias", (1,), 0.1)
    g.output(g.node("Gemm", [h.name, w3, c3], (batch, hidden), "fc3", "y", transA=0, transB=1, alpha=1.5, beta=0.5))
    return g.finish(gemm_model.__doc__ or "")


def legacy_ops_model(
    *, image: int = 8, channels: int = 6, classes: int = 5, opset: int = 7, seed: int = 0
) -> onnx.ModelProto:
    """LRN; Softmax over a 4-D tensor at axis 1 (before opset 13: over C*H*W together) as output ``spread``;
    Flatten at axis 2; Flatten, Gemm and LogSoftmax (default axis) as output ``y``."""
    g = _Zoo("legacy_ops", seed, opset)
    x = g.input("x", (1, 3, image, image))
    x = g.lrn(g.conv(x, channels, 3, "conv1", pad=1), "norm1", size=3)
    g.output(g.softmax(x, "softmax_spread", axis=1, output="spread"))
    half = g.node("Flatten", [x.name], (channels, image * image), "flatten2", axis=2)
    g.output(g.softmax(half, "softmax_rows", axis=1, output="rows"))
    x = g.flatten(x, "flatten")
    g.output(g.softmax(g.gemm(x, classes, "fc"), "log_softmax", log=True, output="y"))
    return g.finish(legacy_ops_model.__doc__ or "")


def computed_reshape_model(
    *, image: int = 8, channels: int = 4, classes: int = 5, opset: int = 11, seed: int = 0
) -> onnx.ModelProto:
    """``x.view(x.size(0), -1)`` between a conv and a Gemm: Shape, Gather (scalar index), Unsqueeze (attribute or
    input axes), Concat with a Constant -1, Reshape. Output ``y``."""
    g = _Zoo("computed_reshape", seed, opset)
    x = g.input("x", (1, 3, image, image))
    x = g.computed_flatten(g.conv(x, channels, 3, "conv1", pad=1), "view")
    g.output(g.gemm(x, classes, "fc", output="y"))
    return g.finish(computed_reshape_model.__doc__ or "")


def squeeze_model(
    *, image: int = 8, channels: int = 4, classes: int = 5, opset: int = 11, seed: int = 0
) -> onnx.ModelProto:
    """GlobalAveragePool, Squeeze of the two 1-sized axes (negative axes from opset 11), Gemm, Unsqueeze back to
    rank 4; axes attributes before opset 13, inputs from 13. Output ``y`` (1, classes, 1, 1)."""
    g = _Zoo("squeeze", seed, opset)
    x = g.input("x", (1, 3, image, image))
    x = g.global_avgpool(g.conv(x, channels, 3, "conv1", pad=1), "gap")
    x = g.squeeze(x, [-1, -2] if opset >= 11 else [2, 3], "squeeze")
    x = g.gemm(x, classes, "fc")
    g.output(g.unsqueeze(x, [2, 3], "unsqueeze", output="y"))
    return g.finish(squeeze_model.__doc__ or "")


def gather_model(*, image: int = 8, channels: int = 4, opset: int = 11, seed: int = 0) -> onnx.ModelProto:
    """Gather with constant indices on float activations: a scalar index takes one channel (rank 4 -> 3), a
    1-element list one row (rank kept), a scalar one row of a Gemm output (rank 2 -> 1; index -1 from opset 11),
    a 2-element list two channels. Outputs ``channel``, ``row``, ``logit``, ``pair``."""
    g = _Zoo("gather", seed, opset)
    x = g.input("x", (1, 3, image, image))
    x = g.conv(x, channels, 3, "conv1", pad=1)
    channel = g.gather(x, 1, 1, "take_channel")
    g.output(g.relu(channel, "channel.relu", output="channel"))
    g.output(g.gather(channel, [0], 1, "take_row", output="row"))
    y = g.gemm(g.flatten(x, "flatten"), 5, "fc")
    g.output(g.gather(y, -1 if opset >= 11 else 0, 0, "take_logits", output="logit"))
    g.output(g.gather(x, [0, 2], 1, "take_pair", output="pair"))
    return g.finish(gather_model.__doc__ or "")


def constants_model(*, image: int = 8, channels: int = 4, opset: int = 9, seed: int = 0) -> onnx.ModelProto:
    """Weights in Constant nodes (conv weight and bias), a bias from ConstantOfShape (shape from a Constant) and a
    ConstantOfShape scale multiplied in. ConstantOfShape needs opset 9. Output ``y``."""
    if opset < 9:
        raise ValueError("ConstantOfShape exists from opset 9 on")
    g = _Zoo("constants", seed, opset)
    x = g.input("x", (1, 3, image, image))
    w = g.constant("conv1.weight", g.rng.standard_normal((channels, 3, 3, 3)).astype(np.float32) * 0.3)
    b = g.constant("conv1.bias", g.rng.standard_normal(channels).astype(np.float32) * BIAS_STD)
    y = g.node("Conv", [x.name, w, b], (1, channels, image, image), "conv1", kernel_shape=[3, 3], pads=[1] * 4)
    shape = g.constant("bias.shape", np.asarray([1, channels, 1, 1], dtype=np.int64))
    bias = g.nodes(
        "ConstantOfShape",
        [shape],
        ["bias"],
        "bias",
        value=numpy_helper.from_array(np.asarray([0.25], dtype=np.float32)),
    )[0]
    y = g.node("Add", [y.name, bias], y.shape, "add")
    full = g.constant("scale.shape", np.asarray(y.shape, dtype=np.int64))
    scale = g.nodes(
        "ConstantOfShape",
        [full],
        ["scale"],
        "scale",
        value=numpy_helper.from_array(np.asarray([0.5], dtype=np.float32)),
    )[0]
    g.output(g.node("Mul", [y.name, scale], y.shape, "mul", "y"))
    return g.finish(constants_model.__doc__ or "")


def out_of_order_model(*, image: int = 8, channels: int = 4, opset: int = 8, seed: int = 0) -> onnx.ModelProto:
    """A small residual conv net (conv, relu, conv, Add, max pool, two outputs) whose nodes are written in reverse
    topological order. Outputs ``y`` and ``z``."""
    g = _Zoo("out_of_order", seed, opset)
    x = g.input("x", (1, 3, image, image))
    a = g.conv(x, channels, 3, "conv1", pad=1)
    b = g.conv(a, channels, 3, "conv2", pad=1, relu=False)
    s = g.relu(g.add(a, b, "add"), "relu", output="y")
    g.output(s)
    g.output(g.pool("MaxPool", g.conv(s, channels, 1, "conv3"), 2, 2, (0, 0, 0, 0), "pool", "z"))
    return g.finish(out_of_order_model.__doc__ or "", reverse=True)


# ---------------------------------------------------------------------------------------------------------------
# registry


@dataclass(frozen=True)
class ZooModel:
    """A registry entry: its builder, the opset it is built at by default, the idioms it covers and the builder
    arguments of its small (test-fixture) version."""

    builder: Callable[..., onnx.ModelProto]
    opset: int
    idioms: tuple[str, ...]
    small: dict[str, object] = field(default_factory=dict)
    whole: bool = False

    def build(self, small: bool = False, **kwargs: object) -> onnx.ModelProto:
        """Build at the default opset (or ``opset=``), full size or small, ``kwargs`` overriding either."""
        args: dict[str, object] = {"opset": self.opset, **(self.small if small else {}), **kwargs}
        return self.builder(**args)


ZOO: dict[str, ZooModel] = {
    "caffenet": ZooModel(
        caffenet,
        9,
        ("lrn", "dropout_mask", "gemm_attributes", "flatten", "softmax_legacy"),
        dict(image=67, width=0.125, fc=32, classes=10),
        whole=True,
    ),
    "squeezenet10": ZooModel(
        squeezenet10,
        8,
        ("dropout_mask", "softmax_legacy", "batchnorm_legacy", "initializers_as_inputs"),
        dict(image=64, width=0.125, classes=10, batchnorm=True),
        whole=True,
    ),
    "resnet_v1": ZooModel(
        resnet_v1,
        8,
        ("batchnorm_legacy", "flatten", "gemm_attributes", "initializers_as_inputs"),
        dict(image=32, width=0.125, blocks=(1, 1), classes=10),
        whole=True,
    ),
    "googlenet": ZooModel(
        googlenet,
        9,
        ("lrn", "dropout_mask", "gemm_attributes", "softmax_legacy"),
        dict(image=32, width=0.0625, classes=10),
        whole=True,
    ),
    "reshape_classifier": ZooModel(
        reshape_classifier,
        11,
        ("computed_reshape", "gemm_attributes", "logsoftmax_legacy"),
        dict(image=8, channels=4, classes=5),
        whole=True,
    ),
    "dropout_mask": ZooModel(dropout_model, 9, ("dropout_mask",)),
    "dropout_training_mode": ZooModel(dropout_model, 12, ("dropout_mask", "dropout_training_mode")),
    "batchnorm_legacy": ZooModel(batchnorm_model, 7, ("batchnorm_legacy", "initializers_as_inputs")),
    "gemm_attributes": ZooModel(gemm_model, 9, ("gemm_attributes",)),
    "legacy_ops": ZooModel(
        legacy_ops_model, 7, ("lrn", "softmax_legacy", "logsoftmax_legacy", "flatten", "initializers_as_inputs")
    ),
    "computed_reshape": ZooModel(computed_reshape_model, 11, ("computed_reshape", "squeeze_attribute")),
    "squeeze_attribute": ZooModel(squeeze_model, 11, ("squeeze_attribute",)),
    "squeeze_input": ZooModel(squeeze_model, 13, ("squeeze_input",)),
    "gather_scalar": ZooModel(gather_model, 11, ("gather_scalar",)),
    "constant_weights": ZooModel(constants_model, 9, ("constant_weights", "constant_of_shape")),
    "out_of_order": ZooModel(out_of_order_model, 8, ("out_of_order", "initializers_as_inputs")),
}
"""Name -> zoo model; ``whole`` ones are zoo CNNs (full size by default), the others one idiom each."""


def zoo_names(whole: bool | None = None) -> list[str]:
    """Registry names: all, or only the whole models (True) or only the idiom fixtures (False)."""
    return [name for name, m in ZOO.items() if whole is None or m.whole == whole]


def build_zoo_model(name: str, *, small: bool = False, seed: int = 0, **kwargs: object) -> onnx.ModelProto:
    """Build registry model ``name`` with seeded weights (``small`` for its test-fixture size)."""
    try:
        entry = ZOO[name]
    except KeyError:
        raise ValueError(f"unknown zoo model {name!r}; valid names: {', '.join(ZOO)}") from None
    return entry.build(small, seed=seed, **kwargs)
