"""A corpus of real-architecture ONNX models, exported from PyTorch, to try tensat on.

    python -m bench.real_models export                      # every model -> bench/corpus/ (skips existing ones)
    python -m bench.real_models export --only bert,resnet50 # a subset (names as listed by `list`)
    python -m bench.real_models export --force --out DIR    # re-export everything into DIR
    python -m bench.real_models list                        # the model names, exporters and opsets

The models are built from transformers configs (plus a compact DenseNet written here) with seeded random weights,
in eval mode, at batch 1 with static input shapes, and exported with the dynamo exporter (its default opset) and,
for some, with the TorchScript exporter at opsets 13-17 too. Fifteen are exported again with symbolic dims
(`<name>_dyn`: a symbolic batch, and for token and waveform inputs a symbolic sequence), as models are exported for
serving; each of those is checked at batch 2 as well.  Unlike tensat/models.py, which writes the paper's
graphs op by op, these graphs carry the exporters' own idioms: decomposed LayerNorm, attention-mask arithmetic,
Shape/Gather/Unsqueeze chains, Transpose-wrapped channels-last norms, pre-activation BatchNorm and so on.

Every export is checked in onnxruntime against the PyTorch outputs, and bench/corpus/manifest.json records per
model its architecture, source, exporter, opset, inputs, node count, file size, export time, onnxruntime latency
and that check's largest difference.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from bench.machine import machine_info
from tensat.files import atomic_write_json, atomic_write_text
from tensat.session import make_session

DEFAULT_OUT = Path(__file__).resolve().parent / "corpus"
RESULTS = Path(__file__).resolve().parent / "results"


def per_model_parser(stem: str, doc: str, models: Sequence[str]) -> argparse.ArgumentParser:
    """The command line of the report `python -m bench.<stem>` over corpus models (`per_model_report`): --corpus,
    --only (default `models`) and --out-dir; `doc` is the report's module docstring, whose first line describes
    it. The arguments parsed carry `stem`."""
    parser = argparse.ArgumentParser(prog=f"python -m bench.{stem}", description=doc.splitlines()[0])
    parser.set_defaults(stem=stem)
    parser.add_argument("--corpus", type=Path, default=DEFAULT_OUT, help="the corpus directory (default bench/corpus)")
    parser.add_argument("--only", default=",".join(models), help="comma-separated model names")
    parser.add_argument("--out-dir", type=Path, default=RESULTS, help=f"where to write {stem}.md/.json")
    return parser


def per_model_report(
    args: argparse.Namespace,
    record: Callable[[Path], dict[str, Any]],
    render: Callable[[Sequence[dict[str, Any]], dict[str, Any]], str],
) -> int:
    """Run `record` on each of the comma-separated corpus models `args.only` and write `<stem>`.json (the machine
    beside the records) and `<stem>`.md (`render` of both) to `args.out_dir` (`args` from `per_model_parser`); the
    exit status, 1 with nothing written where a model is not in the corpus."""
    paths = [args.corpus / f"{name}.onnx" for name in args.only.split(",") if name]
    missing = [p.name for p in paths if not p.exists()]
    if missing:
        print(f"python -m bench.{args.stem}: error: not in the corpus: {', '.join(missing)}", file=sys.stderr)
        return 1
    info = machine_info()
    records = []
    for path in paths:
        print(f"[{path.stem}]", flush=True)
        records.append(record(path))
    args.out_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_json(args.out_dir / f"{args.stem}.json", {"machine": info, "results": records})
    atomic_write_text(args.out_dir / f"{args.stem}.md", render(records, info))
    return 0


MANIFEST = "manifest.json"
SEED = 0
VOCAB = 8192

__all__ = ["ENTRIES", "Entry", "export", "main"]


@dataclass(frozen=True)
class Built:
    """A model ready to export: the wrapped module, its example inputs, and the ONNX input/output names."""

    module: Any
    inputs: tuple[Any, ...]
    input_names: tuple[str, ...]
    output_names: tuple[str, ...]


@dataclass(frozen=True)
class Architecture:
    """A model family: how to build it, and where it comes from (a transformers class or "torch")."""

    key: str
    description: str
    source: str
    build: Callable[[], Built]


@dataclass(frozen=True)
class Entry:
    """One corpus model: an architecture exported by one exporter at one opset (None: the exporter's default)."""

    name: str
    arch: Architecture
    exporter: str
    opset: int | None
    dynamic: bool = False  # exported with symbolic dims (`DYNAMIC_AXES`) rather than at the example's shapes


def _wrap(model: Any, input_names: Sequence[str], output_names: Sequence[str], **kwargs: Any) -> Any:
    """An ``nn.Module`` whose forward takes positional tensors and returns a tuple of the named output tensors.

    transformers 5.x models take many keyword arguments (``use_cache``, ``return_dict``, ...), and the TorchScript
    exporter binds positional inputs to the wrong ones; the wrapper passes every input by keyword instead.
    """
    import torch  # bench extra, not a runtime dependency

    class Wrapped(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
            out = self.model(**dict(zip(input_names, tensors)), return_dict=True, **kwargs)
            return tuple(getattr(out, name) for name in output_names)

    return Wrapped().eval()


def _tokens(seq: int, vocab: int = VOCAB, padded: int = 0) -> tuple[Any, Any]:
    """Seeded token ids of shape (1, seq) and an attention mask whose last ``padded`` positions are 0."""
    import torch  # bench extra, not a runtime dependency

    gen = torch.Generator().manual_seed(SEED)
    ids = torch.randint(0, vocab, (1, seq), generator=gen, dtype=torch.int64)
    mask = torch.ones(1, seq, dtype=torch.int64)
    if padded:
        mask[:, -padded:] = 0
    return ids, mask


def _image(size: int) -> Any:
    """A seeded (1, 3, size, size) float32 image."""
    import torch  # bench extra, not a runtime dependency

    gen = torch.Generator().manual_seed(SEED)
    return torch.randn(1, 3, size, size, generator=gen)


def _pixels(model: Any, outs: tuple[str, ...], size: int = 224) -> Built:
    """An image model over one seeded ``size`` x ``size`` image, its outputs ``outs``."""
    names = ("pixel_values",)
    return Built(_wrap(model, names, outs), (_image(size),), names, outs)


def _hf(config: Any, cls_name: str) -> Any:
    """The transformers model ``cls_name`` built from ``config`` with seeded random weights, in eval mode."""
    import torch  # bench extra, not a runtime dependency
    import transformers

    torch.manual_seed(SEED)
    return _realistic(getattr(transformers, cls_name)(config)).eval()


def _realistic(model: Any) -> Any:
    """Give a freshly initialized model the parameter statistics of a trained one where its init is degenerate.

    transformers initializes every bias to 0 and every norm scale to 1, and the class token and ViT's position
    embeddings to std 0.02. Zero biases are a no-op any simplifier removes (an Add of zeros, a gain no trained
    model offers), and the class token's row is then near-constant, so a LayerNorm over it amplifies rounding
    differences between equivalent graphs a hundredfold. Biases and norm shifts get seeded values of std 0.05,
    norm scales 1 + 0.1 noise, the class token and position embeddings std 0.5."""
    import torch  # bench extra, not a runtime dependency

    gen = torch.Generator().manual_seed(SEED + 2)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("cls_token", "embeddings.position_embeddings")):
                p.copy_(0.5 * torch.randn(p.shape, generator=gen))
            elif bool(torch.all(p == 0)):
                p.copy_(0.05 * torch.randn(p.shape, generator=gen))
            elif bool(torch.all(p == 1)):
                p.copy_(1 + 0.1 * torch.randn(p.shape, generator=gen))
    return model


def _trained_like(model: Any, convs: bool = True) -> Any:
    """Give a convnet the weight scales and BatchNorm statistics of a trained one, in place.

    transformers initializes some convnets (MobileNetV2, EfficientNet) with std 0.02 weights, under which the
    activations vanish to ~1e-20 and any numerical check passes trivially; and a fresh BatchNorm (mean 0, var 1,
    scale 1, shift 0) is an identity.  With ``convs``, convs get He-normal weights (fan in; not for residual
    nets, whose HF init is already scaled and whose activations He-normal blows up); every BatchNorm gets seeded
    non-trivial statistics.
    """
    import torch  # bench extra, not a runtime dependency
    from torch import nn

    gen = torch.Generator().manual_seed(SEED + 1)
    with torch.no_grad():
        for module in model.modules():
            if convs and isinstance(module, nn.Conv2d):
                fan_in = module.weight[0].numel()
                module.weight.copy_(torch.randn(module.weight.shape, generator=gen) * (2.0 / fan_in) ** 0.5)
            elif isinstance(module, nn.BatchNorm2d):
                n = module.num_features
                module.running_mean.copy_(0.1 * torch.randn(n, generator=gen))
                module.running_var.copy_(torch.rand(n, generator=gen) + 0.5)
                module.weight.copy_(0.5 * torch.rand(n, generator=gen) + 0.5)
                module.bias.copy_(0.1 * torch.randn(n, generator=gen))
    return model.eval()


# the size of the text models: 4 layers of width 256 and 4 heads, eager attention (as an exporter needs it)
SMALL_TEXT: dict[str, Any] = dict(
    vocab_size=VOCAB, hidden_size=256, num_hidden_layers=4, num_attention_heads=4, attn_implementation="eager"
)


def _encoder(config: Any, cls_name: str, outs: tuple[str, ...] = ("last_hidden_state",)) -> Built:
    """A transformers encoder over 128 tokens whose last 16 are padding, its outputs `outs`."""
    names = ("input_ids", "attention_mask")
    return Built(_wrap(_hf(config, cls_name), names, outs), _tokens(128, padded=16), names, outs)


def _decoder(config: Any, cls_name: str) -> Built:
    """A transformers decoder over 64 tokens with an all-ones mask (as GPT-2's: with no mask, transformers looks
    for packed sequences with torch.diff, which the TorchScript exporter cannot export), its last hidden state."""
    names, outs = ("input_ids", "attention_mask"), ("last_hidden_state",)
    return Built(_wrap(_hf(config, cls_name), names, outs, use_cache=False), _tokens(64), names, outs)


def _bert() -> Built:
    from transformers import BertConfig  # bench extra, not a runtime dependency

    config = BertConfig(**SMALL_TEXT, intermediate_size=1024, max_position_embeddings=512)
    return _encoder(config, "BertModel", ("last_hidden_state", "pooler_output"))


def _t5_encoder() -> Built:
    from transformers import T5Config  # bench extra, not a runtime dependency

    config = T5Config(
        vocab_size=VOCAB, d_model=256, d_kv=64, d_ff=1024, num_layers=4, num_heads=4, attn_implementation="eager"
    )
    return _encoder(config, "T5EncoderModel")


def _gpt2() -> Built:
    from transformers import GPT2Config  # bench extra, not a runtime dependency

    config = GPT2Config(vocab_size=VOCAB, n_positions=256, n_embd=256, n_layer=4, n_head=4, attn_implementation="eager")
    # With no attention mask, transformers looks for packed sequences in the position ids with torch.diff, which
    # the TorchScript exporter cannot export; an all-ones mask (as HF's own decoder exports take) avoids that.
    names, outs = ("input_ids", "attention_mask"), ("logits",)
    model = _wrap(_hf(config, "GPT2LMHeadModel"), names, outs, use_cache=False)
    return Built(model, _tokens(64), names, outs)


def _llama() -> Built:
    from transformers import LlamaConfig  # bench extra, not a runtime dependency

    config = LlamaConfig(**SMALL_TEXT, intermediate_size=688, num_key_value_heads=2, max_position_embeddings=256)
    return _decoder(config, "LlamaModel")


def _vit() -> Built:
    from transformers import ViTConfig  # bench extra, not a runtime dependency

    config = ViTConfig(
        image_size=224,
        patch_size=16,
        hidden_size=384,
        num_hidden_layers=4,
        num_attention_heads=6,
        intermediate_size=1536,
        attn_implementation="eager",
    )
    return _pixels(_hf(config, "ViTModel"), ("last_hidden_state", "pooler_output"))


def _swin() -> Built:
    from transformers import SwinConfig  # bench extra, not a runtime dependency

    config = SwinConfig(
        image_size=224,
        patch_size=4,
        embed_dim=64,
        depths=[2, 2, 2, 2],
        num_heads=[2, 4, 8, 16],
        window_size=7,
        attn_implementation="eager",
    )
    return _pixels(_hf(config, "SwinModel"), ("last_hidden_state", "pooler_output"))


def _resnet50() -> Built:
    from transformers import ResNetConfig  # bench extra, not a runtime dependency

    config = ResNetConfig(
        embedding_size=64, hidden_sizes=[256, 512, 1024, 2048], depths=[3, 4, 6, 3], layer_type="bottleneck"
    )
    return _pixels(_trained_like(_hf(config, "ResNetModel"), convs=False), ("pooler_output",), 160)


def _regnet_x() -> Built:
    from transformers import RegNetConfig  # bench extra, not a runtime dependency

    # RegNetX-400MF: ResNeXt-style stages of grouped 3x3 convs (group width 16), no squeeze-excitation.
    config = RegNetConfig(
        embedding_size=32, hidden_sizes=[32, 64, 160, 384], depths=[1, 2, 7, 12], groups_width=16, layer_type="x"
    )
    return _pixels(_trained_like(_hf(config, "RegNetModel"), convs=False), ("pooler_output",))


def _mobilenet_v2() -> Built:
    from transformers import MobileNetV2Config  # bench extra, not a runtime dependency

    config = MobileNetV2Config(image_size=224, depth_multiplier=1.0, num_labels=1000)
    model = _trained_like(_hf(config, "MobileNetV2ForImageClassification"))
    return _pixels(model, ("logits",))


def _efficientnet_b0() -> Built:
    from transformers import EfficientNetConfig  # bench extra, not a runtime dependency

    # hidden_dim defaults to B7's 2560; B0's head conv has 1280 channels.
    config = EfficientNetConfig(image_size=224, width_coefficient=1.0, depth_coefficient=1.0, hidden_dim=1280)
    model = _trained_like(_hf(config, "EfficientNetModel"))
    return _pixels(model, ("pooler_output",))


def _convnext() -> Built:
    from transformers import ConvNextConfig  # bench extra, not a runtime dependency

    config = ConvNextConfig(hidden_sizes=[64, 128, 256, 512], depths=[2, 2, 4, 2], image_size=224)
    return _pixels(_hf(config, "ConvNextModel"), ("pooler_output",))


def _audio(samples: int) -> Any:
    """A seeded (1, samples) float32 waveform."""
    import torch  # bench extra, not a runtime dependency

    gen = torch.Generator().manual_seed(SEED)
    return 0.1 * torch.randn(1, samples, generator=gen)


def _waveform(model: Any) -> Built:
    """An audio model over one seeded second at 16 kHz, its last hidden state."""
    names, outs = ("input_values",), ("last_hidden_state",)
    return Built(_wrap(model, names, outs), (_audio(16000),), names, outs)


def _wav2vec2() -> Built:
    from transformers import Wav2Vec2Config  # bench extra, not a runtime dependency

    # The base model's convolutional feature encoder (GroupNorm after the first conv, GELU) narrowed to 128
    # channels, its grouped positional conv, and a 4-layer encoder, over one second at 16 kHz.
    config = Wav2Vec2Config(
        hidden_size=256,
        num_hidden_layers=4,
        num_attention_heads=4,
        intermediate_size=1024,
        conv_dim=(128,) * 7,
        num_conv_pos_embeddings=64,
        num_conv_pos_embedding_groups=16,
        attn_implementation="eager",
    )
    return _waveform(_hf(config, "Wav2Vec2Model"))


def _whisper_encoder() -> Built:
    import torch  # bench extra, not a runtime dependency
    from transformers import WhisperConfig, WhisperModel

    # Whisper's encoder: two Conv1d over 80 log-mel bins, sinusoidal positions, 4 pre-norm layers, 400 frames.
    config = WhisperConfig(
        d_model=256,
        encoder_layers=4,
        encoder_attention_heads=4,
        encoder_ffn_dim=1024,
        decoder_layers=1,
        decoder_attention_heads=4,
        decoder_ffn_dim=256,
        num_mel_bins=80,
        max_source_positions=200,
        attn_implementation="eager",
    )
    torch.manual_seed(SEED)
    encoder = _realistic(WhisperModel(config).get_encoder()).eval()
    gen = torch.Generator().manual_seed(SEED)
    names, outs = ("input_features",), ("last_hidden_state",)
    return Built(_wrap(encoder, names, outs), (torch.randn(1, 80, 400, generator=gen),), names, outs)


def _clip_vision() -> Built:
    from transformers import CLIPVisionConfig  # bench extra, not a runtime dependency

    # CLIP's image tower: QuickGELU (x * sigmoid(1.702 x)), pre-LayerNorm, 4 layers, 32x32 patches.
    config = CLIPVisionConfig(
        hidden_size=256,
        intermediate_size=1024,
        num_hidden_layers=4,
        num_attention_heads=4,
        image_size=224,
        patch_size=32,
        attn_implementation="eager",
    )
    return _pixels(_hf(config, "CLIPVisionModel"), ("last_hidden_state", "pooler_output"))


def _segformer() -> Built:
    from transformers import SegformerConfig  # bench extra, not a runtime dependency

    # SegFormer-B0's hierarchical encoder: overlapping patch merges, efficient attention with reduction convs,
    # a depthwise conv in each MLP.
    config = SegformerConfig(depths=[2, 2, 2, 2], hidden_sizes=[32, 64, 160, 256], attn_implementation="eager")
    return _pixels(_hf(config, "SegformerModel"), ("last_hidden_state",))


def _mobilevit() -> Built:
    from transformers import MobileViTConfig  # bench extra, not a runtime dependency

    # MobileViT-XXS: MobileNetV2 blocks and transformer blocks over unfolded 2x2 patches.
    config = MobileViTConfig(
        image_size=256,
        hidden_sizes=[64, 80, 96],
        neck_hidden_sizes=[16, 16, 24, 48, 64, 80, 320],
        expand_ratio=2.0,
    )
    model = _trained_like(_hf(config, "MobileViTModel"), convs=False)
    return _pixels(model, ("pooler_output",), 256)


def _albert() -> Built:
    from transformers import AlbertConfig  # bench extra, not a runtime dependency

    # ALBERT: factorized embeddings (128 -> 256) and one layer's weights shared by all 4.
    config = AlbertConfig(**SMALL_TEXT, embedding_size=128, intermediate_size=1024)
    return _encoder(config, "AlbertModel", ("last_hidden_state", "pooler_output"))


def _qwen2() -> Built:
    from transformers import Qwen2Config  # bench extra, not a runtime dependency

    config = Qwen2Config(**SMALL_TEXT, intermediate_size=688, num_key_value_heads=2, max_position_embeddings=256)
    return _decoder(config, "Qwen2Model")


def _opt() -> Built:
    from transformers import OPTConfig  # bench extra, not a runtime dependency

    config = OPTConfig(**SMALL_TEXT, ffn_dim=1024, max_position_embeddings=256, word_embed_proj_dim=256)
    return _decoder(config, "OPTModel")


def _deberta_v2() -> Built:
    from transformers import DebertaV2Config  # bench extra, not a runtime dependency

    config = DebertaV2Config(**SMALL_TEXT, intermediate_size=1024)
    return _encoder(config, "DebertaV2Model")


def _levit() -> Built:
    from transformers import LevitConfig  # bench extra, not a runtime dependency

    model = _trained_like(_hf(LevitConfig(), "LevitModel"))
    return _pixels(model, ("last_hidden_state",))


def _convnextv2() -> Built:
    from transformers import ConvNextV2Config  # bench extra, not a runtime dependency

    config = ConvNextV2Config(hidden_sizes=[40, 80, 160, 320], depths=[2, 2, 4, 2], image_size=224)
    return _pixels(_hf(config, "ConvNextV2Model"), ("last_hidden_state", "pooler_output"))


def _segformer_seg() -> Built:
    from transformers import SegformerConfig  # bench extra, not a runtime dependency

    config = SegformerConfig(
        depths=[2, 2, 2, 2], hidden_sizes=[32, 64, 160, 256], decoder_hidden_size=128, attn_implementation="eager"
    )
    model = _hf(config, "SegformerForSemanticSegmentation")
    return _pixels(model, ("logits",), 256)


def _dpt() -> Built:
    from transformers import DPTConfig  # bench extra, not a runtime dependency

    config = DPTConfig(
        hidden_size=256,
        intermediate_size=1024,
        num_hidden_layers=4,
        num_attention_heads=4,
        backbone_out_indices=[0, 1, 2, 3],
        neck_hidden_sizes=[32, 64, 128, 256],
        fusion_hidden_size=64,
        head_hidden_size=32,
        attn_implementation="eager",
    )
    return _pixels(_hf(config, "DPTForDepthEstimation"), ("predicted_depth",))


def _swin2sr() -> Built:
    from transformers import Swin2SRConfig  # bench extra, not a runtime dependency

    config = Swin2SRConfig(
        img_size=64, embed_dim=60, depths=[2, 2], num_heads=[3, 3], window_size=8, upscale=2, upsampler="pixelshuffle"
    )
    return _pixels(_hf(config, "Swin2SRForImageSuperResolution"), ("reconstruction",), 64)


def _densenet_module(growth: int, blocks: Sequence[int], init_features: int, bn_size: int) -> Any:
    """A torchvision-style DenseNet: pre-activation dense layers concatenated per block, BN-ReLU-Conv-AvgPool
    transitions that halve the channels, and a final BN-ReLU-GlobalAvgPool-Linear head."""
    import torch  # bench extra, not a runtime dependency
    from torch import nn

    class DenseLayer(nn.Module):
        def __init__(self, cin: int) -> None:
            super().__init__()
            self.body = nn.Sequential(
                nn.BatchNorm2d(cin),
                nn.ReLU(),
                nn.Conv2d(cin, bn_size * growth, 1, bias=False),
                nn.BatchNorm2d(bn_size * growth),
                nn.ReLU(),
                nn.Conv2d(bn_size * growth, growth, 3, padding=1, bias=False),
            )

        def forward(self, features: list[torch.Tensor]) -> torch.Tensor:
            return self.body(torch.cat(features, 1))

    class DenseBlock(nn.Module):
        def __init__(self, layers: int, cin: int) -> None:
            super().__init__()
            self.layers = nn.ModuleList(DenseLayer(cin + i * growth) for i in range(layers))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            features = [x]
            for layer in self.layers:
                features.append(layer(features))
            return torch.cat(features, 1)

    class DenseNet(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            stages: list[nn.Module] = [
                nn.Conv2d(3, init_features, 7, stride=2, padding=3, bias=False),
                nn.BatchNorm2d(init_features),
                nn.ReLU(),
                nn.MaxPool2d(3, stride=2, padding=1),
            ]
            channels = init_features
            for i, layers in enumerate(blocks):
                stages.append(DenseBlock(layers, channels))
                channels += layers * growth
                if i + 1 < len(blocks):
                    stages += [
                        nn.BatchNorm2d(channels),
                        nn.ReLU(),
                        nn.Conv2d(channels, channels // 2, 1, bias=False),
                        nn.AvgPool2d(2, stride=2),
                    ]
                    channels //= 2
            stages += [nn.BatchNorm2d(channels), nn.ReLU()]
            self.features = nn.Sequential(*stages)
            self.classifier = nn.Linear(channels, 1000)

        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor]:
            pooled = torch.flatten(nn.functional.adaptive_avg_pool2d(self.features(x), 1), 1)
            return (self.classifier(pooled),)

    torch.manual_seed(SEED)
    return _trained_like(DenseNet())


def _densenet() -> Built:
    model = _densenet_module(growth=16, blocks=(6, 12, 16, 12), init_features=32, bn_size=4)
    return Built(model, (_image(224),), ("pixel_values",), ("logits",))


# Architectures added after tensat's rules and cost model were written, exported as a user of transformers would:
# the vision and audio transformers with the library's default attention (where that is
# scaled_dot_product_attention, the exporter writes it out with a NaN guard after the softmax), the text models with
# eager attention as above.
def _distilbert() -> Built:
    from transformers import DistilBertConfig  # bench extra, not a runtime dependency

    config = DistilBertConfig(
        vocab_size=VOCAB, dim=256, n_layers=4, n_heads=4, hidden_dim=1024, attn_implementation="eager"
    )
    return _encoder(config, "DistilBertModel")


def _roberta() -> Built:
    from transformers import RobertaConfig  # bench extra, not a runtime dependency

    return _encoder(RobertaConfig(**SMALL_TEXT, intermediate_size=1024), "RobertaModel")


def _electra() -> Built:
    from transformers import ElectraConfig  # bench extra, not a runtime dependency

    return _encoder(ElectraConfig(**SMALL_TEXT, intermediate_size=1024, embedding_size=128), "ElectraModel")


def _mpnet() -> Built:
    from transformers import MPNetConfig  # bench extra, not a runtime dependency

    config = MPNetConfig(
        vocab_size=VOCAB, hidden_size=256, num_hidden_layers=4, num_attention_heads=4, intermediate_size=1024
    )
    return _encoder(config, "MPNetModel")


def _mistral() -> Built:
    from transformers import MistralConfig  # bench extra, not a runtime dependency

    config = MistralConfig(**SMALL_TEXT, intermediate_size=688, num_key_value_heads=2, max_position_embeddings=256)
    return _decoder(config, "MistralModel")


def _phi() -> Built:
    from transformers import PhiConfig  # bench extra, not a runtime dependency

    return _decoder(PhiConfig(**SMALL_TEXT, intermediate_size=1024, max_position_embeddings=256), "PhiModel")


def _gpt_neox() -> Built:
    from transformers import GPTNeoXConfig  # bench extra, not a runtime dependency

    return _decoder(GPTNeoXConfig(**SMALL_TEXT, intermediate_size=1024, max_position_embeddings=256), "GPTNeoXModel")


def _bloom() -> Built:
    from transformers import BloomConfig  # bench extra, not a runtime dependency

    config = BloomConfig(vocab_size=VOCAB, hidden_size=256, n_layer=4, n_head=4, attn_implementation="eager")
    return _decoder(config, "BloomModel")


def _gemma() -> Built:
    from transformers import GemmaConfig  # bench extra, not a runtime dependency

    config = GemmaConfig(
        **SMALL_TEXT, intermediate_size=688, num_key_value_heads=2, head_dim=64, max_position_embeddings=256
    )
    return _decoder(config, "GemmaModel")


# a small vision transformer: 4 layers of width 192, 3 heads (DeiT-Tiny's width)
SMALL_VIT: dict[str, Any] = dict(hidden_size=192, num_hidden_layers=4, num_attention_heads=3, intermediate_size=768)


def _deit() -> Built:
    from transformers import DeiTConfig  # bench extra, not a runtime dependency

    return _pixels(_hf(DeiTConfig(**SMALL_VIT), "DeiTModel"), ("last_hidden_state",))


def _beit() -> Built:
    from transformers import BeitConfig  # bench extra, not a runtime dependency

    config = BeitConfig(**SMALL_VIT, use_relative_position_bias=True)
    return _pixels(_hf(config, "BeitModel"), ("last_hidden_state",))


def _dinov2() -> Built:
    from transformers import Dinov2Config  # bench extra, not a runtime dependency

    return _pixels(_hf(Dinov2Config(**SMALL_VIT, image_size=224), "Dinov2Model"), ("last_hidden_state",))


def _yolos() -> Built:
    from transformers import YolosConfig  # bench extra, not a runtime dependency

    config = YolosConfig(**SMALL_VIT, image_size=[224, 224], num_detection_tokens=10)
    return _pixels(_hf(config, "YolosModel"), ("last_hidden_state",))


def _swinv2() -> Built:
    from transformers import Swinv2Config  # bench extra, not a runtime dependency

    config = Swinv2Config(embed_dim=48, depths=[2, 2, 2, 2], num_heads=[2, 4, 8, 16], window_size=7)
    return _pixels(_hf(config, "Swinv2Model"), ("last_hidden_state",))


def _poolformer() -> Built:
    from transformers import PoolFormerConfig  # bench extra, not a runtime dependency

    config = PoolFormerConfig(hidden_sizes=[32, 64, 160, 256], depths=[1, 1, 2, 1])
    return _pixels(_hf(config, "PoolFormerModel"), ("last_hidden_state",))


def _regnet_y() -> Built:
    from transformers import RegNetConfig  # bench extra, not a runtime dependency

    config = RegNetConfig(
        embedding_size=32, hidden_sizes=[32, 64, 160, 384], depths=[1, 2, 4, 1], groups_width=16, layer_type="y"
    )
    return _pixels(_trained_like(_hf(config, "RegNetModel"), convs=False), ("pooler_output",))


def _mobilenet_v1() -> Built:
    from transformers import MobileNetV1Config  # bench extra, not a runtime dependency

    model = _trained_like(_hf(MobileNetV1Config(depth_multiplier=0.5), "MobileNetV1Model"))
    return _pixels(model, ("pooler_output",))


def _resnet18() -> Built:
    from transformers import ResNetConfig  # bench extra, not a runtime dependency

    config = ResNetConfig(embedding_size=64, hidden_sizes=[64, 128, 256, 512], depths=[2, 2, 2, 2], layer_type="basic")
    return _pixels(_trained_like(_hf(config, "ResNetModel"), convs=False), ("pooler_output",))


def _hubert() -> Built:
    from transformers import HubertConfig  # bench extra, not a runtime dependency

    config = HubertConfig(
        hidden_size=192,
        num_hidden_layers=4,
        num_attention_heads=3,
        intermediate_size=768,
        conv_dim=(64,) * 7,
        num_conv_pos_embeddings=32,
    )
    return _waveform(_hf(config, "HubertModel"))


def _mixtral() -> Built:
    from transformers import MixtralConfig  # bench extra, not a runtime dependency

    # transformers' default experts (grouped_mm) have no ONNX function, and its eager ones a data-dependent loop
    # torch.export refuses; batched_mm gathers each routed token's expert weights and multiplies them in a batch
    config = MixtralConfig(
        **SMALL_TEXT,
        intermediate_size=344,
        num_key_value_heads=2,
        max_position_embeddings=256,
        num_local_experts=4,
        num_experts_per_tok=2,
        experts_implementation="batched_mm",
    )
    return _decoder(config, "MixtralModel")


def _falcon() -> Built:
    from transformers import FalconConfig  # bench extra, not a runtime dependency

    config = FalconConfig(**SMALL_TEXT, new_decoder_architecture=True, num_kv_heads=2, max_position_embeddings=256)
    return _decoder(config, "FalconModel")


def _bart() -> Built:
    from transformers import BartConfig  # bench extra, not a runtime dependency

    config = BartConfig(
        vocab_size=VOCAB,
        d_model=256,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=1024,
        decoder_ffn_dim=1024,
        max_position_embeddings=256,
    )
    names, outs = ("input_ids", "attention_mask"), ("last_hidden_state",)
    return Built(_wrap(_hf(config, "BartModel"), names, outs, use_cache=False), _tokens(64), names, outs)


def _mobilebert() -> Built:
    from transformers import MobileBertConfig  # bench extra, not a runtime dependency

    return _encoder(MobileBertConfig(vocab_size=VOCAB, num_hidden_layers=4), "MobileBertModel")


ARCHITECTURES: dict[str, Architecture] = {
    a.key: a
    for a in [
        Architecture(
            "bert", "BERT encoder with pooler (4 layers, width 256, seq 128)", "transformers.BertModel", _bert
        ),
        Architecture(
            "t5_encoder",
            "T5 encoder: RMS-style T5LayerNorm, relative position bias (4 layers, width 256, seq 128)",
            "transformers.T5EncoderModel",
            _t5_encoder,
        ),
        Architecture(
            "gpt2",
            "GPT-2 decoder with causal mask and LM head (4 layers, width 256, seq 64)",
            "transformers.GPT2LMHeadModel",
            _gpt2,
        ),
        Architecture(
            "llama",
            "Llama decoder: RMSNorm, rotary, SiLU gate, grouped-query attention (4 layers, width 256, seq 64)",
            "transformers.LlamaModel",
            _llama,
        ),
        Architecture(
            "vit", "ViT-S/16-style encoder with pooler (4 layers, width 384, 224x224)", "transformers.ViTModel", _vit
        ),
        Architecture(
            "swin",
            "Swin transformer, shifted windows (depths 2-2-2-2, width 64, 224x224)",
            "transformers.SwinModel",
            _swin,
        ),
        Architecture("resnet50", "ResNet-50 bottleneck (160x160)", "transformers.ResNetModel", _resnet50),
        Architecture(
            "regnet_x", "RegNetX-400MF, ResNeXt-style grouped convs (224x224)", "transformers.RegNetModel", _regnet_x
        ),
        Architecture(
            "mobilenet_v2",
            "MobileNetV2 classifier: depthwise convs, ReLU6 (224x224)",
            "transformers.MobileNetV2ForImageClassification",
            _mobilenet_v2,
        ),
        Architecture(
            "efficientnet_b0",
            "EfficientNet-B0: depthwise convs, SiLU, squeeze-excitation (224x224)",
            "transformers.EfficientNetModel",
            _efficientnet_b0,
        ),
        Architecture(
            "convnext",
            "ConvNeXt: depthwise 7x7, channels-last LayerNorm between permutes (depths 2-2-4-2, width 64, 224x224)",
            "transformers.ConvNextModel",
            _convnext,
        ),
        Architecture(
            "densenet",
            "DenseNet-121-style, pre-activation BatchNorm, growth 16 (blocks 6-12-16-12, 224x224)",
            "torch",
            _densenet,
        ),
        Architecture(
            "wav2vec2",
            "wav2vec 2.0: conv feature encoder with GroupNorm, grouped positional conv (4 layers, width 256, 1 s)",
            "transformers.Wav2Vec2Model",
            _wav2vec2,
        ),
        Architecture(
            "whisper_encoder",
            "Whisper encoder: Conv1d stem over log-mels, pre-norm (4 layers, width 256, 400 frames)",
            "transformers.WhisperModel (encoder)",
            _whisper_encoder,
        ),
        Architecture(
            "clip_vision",
            "CLIP image tower: QuickGELU, pre-LayerNorm (4 layers, width 256, 224x224, 32x32 patches)",
            "transformers.CLIPVisionModel",
            _clip_vision,
        ),
        Architecture(
            "segformer",
            "SegFormer-B0 encoder: overlapping patch merges, reduced-key attention, depthwise-conv MLP (224x224)",
            "transformers.SegformerModel",
            _segformer,
        ),
        Architecture(
            "mobilevit",
            "MobileViT-XXS: inverted residuals and transformers over unfolded patches (256x256)",
            "transformers.MobileViTModel",
            _mobilevit,
        ),
        Architecture(
            "albert",
            "ALBERT: factorized embeddings, one layer shared by all 4 (width 256, seq 128)",
            "transformers.AlbertModel",
            _albert,
        ),
        Architecture(
            "qwen2",
            "Qwen2 decoder: biased QKV, RMSNorm, rotary, grouped-query attention (4 layers, width 256, seq 64)",
            "transformers.Qwen2Model",
            _qwen2,
        ),
        Architecture(
            "opt",
            "OPT decoder: learned positions from the mask's cumulative sum, ReLU MLP (4 layers, width 256, seq 64)",
            "transformers.OPTModel",
            _opt,
        ),
        Architecture(
            "deberta_v2",
            "DeBERTa-v2 encoder: disentangled relative-position attention (4 layers, width 256, seq 128)",
            "transformers.DebertaV2Model",
            _deberta_v2,
        ),
        Architecture(
            "levit",
            "LeViT-128S: conv stem, HardSwish, attention with BatchNorm'd projections (224x224)",
            "transformers.LevitModel",
            _levit,
        ),
        Architecture(
            "convnextv2",
            "ConvNeXt V2: global response normalization (ReduceL2) in each block (depths 2-2-4-2, width 40, 224x224)",
            "transformers.ConvNextV2Model",
            _convnextv2,
        ),
        Architecture(
            "segformer_seg",
            "SegFormer-B0 with its all-MLP decode head, bilinear upsampling (256x256)",
            "transformers.SegformerForSemanticSegmentation",
            _segformer_seg,
        ),
        Architecture(
            "dpt",
            "DPT depth estimation: ViT backbone, transposed-conv reassembly, bilinear fusion (4 layers, 224x224)",
            "transformers.DPTForDepthEstimation",
            _dpt,
        ),
        Architecture(
            "swin2sr",
            "Swin2SR super-resolution x2: Swin V2 blocks, pixel-shuffle upsampler (64x64)",
            "transformers.Swin2SRForImageSuperResolution",
            _swin2sr,
        ),
        Architecture(
            "distilbert",
            "DistilBERT: no token types, 4 layers (width 256, seq 128)",
            "transformers.DistilBertModel",
            _distilbert,
        ),
        Architecture(
            "roberta", "RoBERTa encoder (4 layers, width 256, seq 128)", "transformers.RobertaModel", _roberta
        ),
        Architecture(
            "electra",
            "ELECTRA discriminator: 128-wide embeddings projected to 256 (4 layers, seq 128)",
            "transformers.ElectraModel",
            _electra,
        ),
        Architecture(
            "mpnet",
            "MPNet encoder: relative position buckets added to the scores (4 layers, width 256, seq 128)",
            "transformers.MPNetModel",
            _mpnet,
        ),
        Architecture(
            "mistral",
            "Mistral decoder: RMSNorm, rotary, grouped-query attention, SwiGLU (4 layers, width 256, seq 64)",
            "transformers.MistralModel",
            _mistral,
        ),
        Architecture(
            "phi",
            "Phi decoder: partial rotary, attention and MLP in parallel off one LayerNorm (4 layers, width 256)",
            "transformers.PhiModel",
            _phi,
        ),
        Architecture(
            "gpt_neox",
            "GPT-NeoX decoder: fused QKV projection, partial rotary, parallel residual (4 layers, width 256, seq 64)",
            "transformers.GPTNeoXModel",
            _gpt_neox,
        ),
        Architecture(
            "bloom",
            "BLOOM decoder: ALiBi position biases, embedding LayerNorm (4 layers, width 256, seq 64)",
            "transformers.BloomModel",
            _bloom,
        ),
        Architecture(
            "gemma",
            "Gemma decoder: RMSNorm with 1 + scale, GeGLU, scaled embeddings (4 layers, width 256, seq 64)",
            "transformers.GemmaModel",
            _gemma,
        ),
        Architecture(
            "deit",
            "DeiT: class and distillation tokens, default (SDPA) attention (4 layers, width 192, 224x224)",
            "transformers.DeiTModel",
            _deit,
        ),
        Architecture(
            "beit",
            "BEiT: relative position bias per layer, layer scale (4 layers, width 192, 224x224)",
            "transformers.BeitModel",
            _beit,
        ),
        Architecture(
            "dinov2",
            "DINOv2: layer scale, SDPA attention (4 layers, width 192, 224x224)",
            "transformers.Dinov2Model",
            _dinov2,
        ),
        Architecture(
            "yolos",
            "YOLOS backbone: ViT with 10 detection tokens, position embeddings resized (4 layers, width 192, 224x224)",
            "transformers.YolosModel",
            _yolos,
        ),
        Architecture(
            "swinv2",
            "Swin V2: cosine attention with a log-spaced continuous position bias MLP (depths 2-2-2-2, 224x224)",
            "transformers.Swinv2Model",
            _swinv2,
        ),
        Architecture(
            "poolformer",
            "PoolFormer: average pooling as the token mixer, GroupNorm (depths 1-1-2-1, 224x224)",
            "transformers.PoolFormerModel",
            _poolformer,
        ),
        Architecture(
            "regnet_y",
            "RegNetY: grouped convs with squeeze-excitation (depths 1-2-4-1, group width 16, 224x224)",
            "transformers.RegNetModel",
            _regnet_y,
        ),
        Architecture(
            "mobilenet_v1",
            "MobileNet V1 at width 0.5: depthwise-separable convs, ReLU6 (224x224)",
            "transformers.MobileNetV1Model",
            _mobilenet_v1,
        ),
        Architecture(
            "resnet18",
            "ResNet-18: basic blocks (depths 2-2-2-2, 224x224)",
            "transformers.ResNetModel",
            _resnet18,
        ),
        Architecture(
            "hubert",
            "HuBERT: conv feature encoder, grouped positional conv, SDPA attention (4 layers, width 192, 1 s)",
            "transformers.HubertModel",
            _hubert,
        ),
        Architecture(
            "mixtral",
            "Mixtral: 4 experts, top-2 routing by TopK, experts as batched products of gathered weights (4 layers)",
            "transformers.MixtralModel",
            _mixtral,
        ),
        Architecture(
            "falcon",
            "Falcon (new decoder architecture): grouped-query attention, parallel attention and MLP (4 layers)",
            "transformers.FalconModel",
            _falcon,
        ),
        Architecture(
            "bart",
            "BART encoder-decoder: 2 + 2 layers, cross-attention, learned positions (width 256, seq 64)",
            "transformers.BartModel",
            _bart,
        ),
        Architecture(
            "mobilebert",
            "MobileBERT: bottlenecks, NoNorm, four stacked feed-forwards a layer, SDPA (4 layers, seq 128)",
            "transformers.MobileBertModel",
            _mobilebert,
        ),
    ]
}

# Every architecture with the dynamo exporter at its default opset; ten also with TorchScript, opsets 13-17 twice.
_TORCHSCRIPT_OPSETS = {
    "bert": 13,
    "resnet50": 13,
    "t5_encoder": 14,
    "mobilenet_v2": 14,
    "gpt2": 15,
    "efficientnet_b0": 15,
    "vit": 16,
    "densenet": 16,
    "llama": 17,
    "convnext": 17,
}

# Exported again with symbolic dims, as serving exports are: the transformers with a symbolic batch (and a symbolic
# sequence for those that read tokens or a waveform), and three convolutional networks with a symbolic batch. Swin
# and SegFormer are exported by TorchScript (opset 17) instead: torch.export fixes their batch to the example's 1
# (onnxruntime then refuses batch 2). The DenseNet written here is left out: torch.export refuses its
# list-of-features forward with a symbolic batch.
_DYNAMIC = (
    "bert",
    "t5_encoder",
    "gpt2",
    "llama",
    "albert",
    "vit",
    "clip_vision",
    "mobilevit",
    "wav2vec2",
    "whisper_encoder",
    "resnet50",
    "mobilenet_v2",
    "efficientnet_b0",
)
# each input's symbolic dims, by input name (any other input: a batch only)
DYNAMIC_AXES: dict[str, dict[int, str]] = {
    "input_ids": {0: "batch", 1: "sequence"},
    "attention_mask": {0: "batch", 1: "sequence"},
    "input_values": {0: "batch", 1: "samples"},
}

ENTRIES: dict[str, Entry] = {
    **{key: Entry(key, arch, "dynamo", None) for key, arch in ARCHITECTURES.items()},
    **{
        f"{key}_ts{opset}": Entry(f"{key}_ts{opset}", ARCHITECTURES[key], "torchscript", opset)
        for key, opset in _TORCHSCRIPT_OPSETS.items()
    },
    **{f"{key}_dyn": Entry(f"{key}_dyn", ARCHITECTURES[key], "dynamo", None, dynamic=True) for key in _DYNAMIC},
    **{
        f"{key}_dyn": Entry(f"{key}_dyn", ARCHITECTURES[key], "torchscript", 17, dynamic=True)
        for key in ("swin", "segformer")
    },
}


def _axes(name: str) -> dict[int, str]:
    """The symbolic dims of input `name` in a dynamic export."""
    return DYNAMIC_AXES.get(name, {0: "batch"})


def _dynamic_shapes(built: Built) -> tuple[tuple[dict[int, Any], ...]]:
    """torch.export's dynamic_shapes for `built`'s inputs (passed as one varargs tuple), one `Dim` per name."""
    from torch.export import Dim  # bench extra, not a runtime dependency

    dims: dict[str, Any] = {}
    specs = []
    for name in built.input_names:
        spec = {}
        for axis, dim in _axes(name).items():
            if dim not in dims:
                dims[dim] = Dim(dim, min=1, max=4096) if dim == "batch" else Dim(dim, min=2, max=1 << 20)
            spec[axis] = dims[dim]
        specs.append(spec)
    return (tuple(specs),)


def _ort_check(path: Path, built: Built, expected: Sequence[np.ndarray]) -> tuple[float, float]:
    """Run the exported model in onnxruntime (CPU): its median latency in ms and its largest absolute difference
    from the PyTorch outputs."""
    sess = make_session(path, "cpu")
    feeds = {name: t.numpy() for name, t in zip(built.input_names, built.inputs)}
    outs = sess.run(None, feeds)
    diff = max(float(np.max(np.abs(o.astype(np.float64) - e.astype(np.float64)))) for o, e in zip(outs, expected))
    times = []
    for _ in range(10):
        start = time.perf_counter()
        sess.run(None, feeds)
        times.append(time.perf_counter() - start)
    return float(np.median(times)) * 1e3, diff


def _batch_check(path: Path, built: Built, expected: Sequence[np.ndarray]) -> float:
    """Run a dynamic export at batch 2 (each input twice over) in onnxruntime: its largest absolute difference from
    the PyTorch outputs at batch 1, for both rows. Raises where the model does not run at that batch."""
    sess = make_session(path, "cpu")
    feeds = {name: np.concatenate([t.numpy()] * 2) for name, t in zip(built.input_names, built.inputs)}
    outs = sess.run(None, feeds)
    return max(
        float(np.max(np.abs(o.astype(np.float64) - np.concatenate([e] * 2).astype(np.float64))))
        for o, e in zip(outs, expected)
    )


def export(entry: Entry, out_dir: Path) -> dict[str, Any]:
    """Build, export and check one corpus model; its manifest record."""
    import torch  # bench extra, not a runtime dependency

    built = entry.arch.build()
    with torch.no_grad():
        expected = [t.numpy() for t in built.module(*built.inputs)]
    path = out_dir / f"{entry.name}.onnx"
    start = time.perf_counter()
    with torch.no_grad():
        if entry.exporter == "dynamo":
            torch.onnx.export(
                built.module,
                built.inputs,
                str(path),
                dynamo=True,
                external_data=False,
                input_names=list(built.input_names),
                output_names=list(built.output_names),
                opset_version=entry.opset,
                dynamic_shapes=_dynamic_shapes(built) if entry.dynamic else None,
            )
        else:
            torch.onnx.export(
                built.module,
                built.inputs,
                str(path),
                dynamo=False,
                opset_version=entry.opset,
                input_names=list(built.input_names),
                output_names=list(built.output_names),
                dynamic_axes={name: _axes(name) for name in built.input_names} if entry.dynamic else None,
            )
    seconds = time.perf_counter() - start
    model = onnx.load(str(path))
    onnx.checker.check_model(model)
    opset = next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))
    latency_ms, diff = _ort_check(path, built, expected)
    if entry.dynamic:
        diff = max(diff, _batch_check(path, built, expected))
    return {
        "name": entry.name,
        "architecture": entry.arch.description,
        "source": entry.arch.source,
        "exporter": entry.exporter,
        "opset": opset,
        "symbolic_dims": {
            vi.name: [d.dim_param for d in vi.type.tensor_type.shape.dim if d.dim_param] for vi in model.graph.input
        },
        "inputs": [
            {"name": n, "shape": list(t.shape), "dtype": str(t.dtype).removeprefix("torch.")}
            for n, t in zip(built.input_names, built.inputs)
        ],
        "outputs": [{"name": n, "shape": list(e.shape)} for n, e in zip(built.output_names, expected)],
        "nodes": len(model.graph.node),
        "op_types": dict(sorted(Counter(n.op_type for n in model.graph.node).items())),
        "file_bytes": path.stat().st_size,
        "export_seconds": round(seconds, 2),
        "ort_ms": round(latency_ms, 2),
        "max_abs_diff_vs_torch": diff,
        "torch": torch.__version__,
    }


def _load_manifest(out_dir: Path) -> dict[str, dict[str, Any]]:
    path = out_dir / MANIFEST
    if not path.exists():
        return {}
    with open(path, encoding="utf-8") as f:
        return {m["name"]: m for m in json.load(f)["models"]}


def _save_manifest(out_dir: Path, records: dict[str, dict[str, Any]]) -> None:
    order = {name: i for i, name in enumerate(ENTRIES)}
    models = sorted(records.values(), key=lambda m: (order.get(m["name"], len(order)), m["name"]))
    tmp = out_dir / (MANIFEST + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump({"seed": SEED, "models": models}, f, indent=1)
        f.write("\n")
    tmp.replace(out_dir / MANIFEST)


def export_all(out_dir: Path, names: Sequence[str], force: bool) -> int:
    """Export ``names`` into ``out_dir`` (skipping those already there unless ``force``); the failure count."""
    import warnings

    out_dir.mkdir(parents=True, exist_ok=True)
    records = _load_manifest(out_dir)
    failures = 0
    for name in names:
        entry = ENTRIES[name]
        if not force and name in records and (out_dir / f"{name}.onnx").exists():
            print(f"{name}: already exported, skipped")
            continue
        start = time.perf_counter()
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                record = export(entry, out_dir)
        except Exception as exc:  # one model's export failing must not stop the corpus
            failures += 1
            message = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            print(f"{name}: FAILED ({type(exc).__name__}: {message})", file=sys.stderr)
            continue
        records[name] = record
        _save_manifest(out_dir, records)
        print(
            f"{name}: {record['exporter']} opset {record['opset']}, {record['nodes']} nodes, "
            f"{record['file_bytes'] / 1e6:.1f} MB, export {record['export_seconds']:.1f} s, "
            f"ort {record['ort_ms']:.1f} ms, max |diff| {record['max_abs_diff_vs_torch']:.1e} "
            f"({time.perf_counter() - start:.1f} s)",
            flush=True,
        )
    return failures


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: `export` the corpus or `list` its models."""
    parser = argparse.ArgumentParser(
        prog="python -m bench.real_models", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True)
    exp = sub.add_parser("export", help="export the corpus models as ONNX, with a manifest")
    exp.add_argument("--out", type=Path, default=DEFAULT_OUT, help="output directory (default bench/corpus/)")
    exp.add_argument("--only", help="comma-separated model names (default: all)")
    exp.add_argument("--force", action="store_true", help="re-export models already in the output directory")
    sub.add_parser("list", help="list the corpus models")
    args = parser.parse_args(argv)
    if args.command == "list":
        for entry in ENTRIES.values():
            opset = entry.opset if entry.opset is not None else "default"
            print(f"{entry.name:24} {entry.exporter:12} opset {opset:8} {entry.arch.source}")
        return 0
    names = list(ENTRIES) if not args.only else [n.strip() for n in args.only.split(",") if n.strip()]
    unknown = [n for n in names if n not in ENTRIES]
    if unknown:
        parser.error(f"unknown model(s) {', '.join(unknown)}; choose from {', '.join(ENTRIES)}")
    return 1 if export_all(args.out, names, args.force) else 0


if __name__ == "__main__":
    sys.exit(main())
