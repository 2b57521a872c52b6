"""Dynamic shapes: tensat on the corpus models exported with symbolic dims, speed per shape, and against the same
model exported at fixed shapes.

    python -m bench.dynamic_report                   # every `_dyn` corpus model -> results/dynamic_models.md, .json
    python -m bench.dynamic_report --only bert_dyn   # a subset
    python -m bench.dynamic_report --render          # rewrite the markdown from the JSON

The models are the `<name>_dyn` exports of `bench.real_models` (a symbolic batch; a symbolic sequence too for token
and waveform inputs). For each:

- tensat runs as a user runs it, `tensat optimize MODEL -o OUT` with default settings and no `--input-shape`, in a
  fresh process (`bench.real_report`'s runner); the summary's shapes are read from its `--stats`;
- the model written must declare the same symbolic dims on its inputs and outputs as the input does;
- the input and the result are timed end to end in onnxruntime at one thread, interleaved block by block, at three
  shapes (`timing_shapes`): the one tensat optimized at, every batch dim at 4, and every other symbolic dim at
  twice its size (a batch of 2 for a model whose only symbolic dim is its batch). Each speedup is the median over
  pairs of blocks of (input / result), with a 95% bootstrap interval;
- the static export of the same architecture (`<name>`) is optimized and timed the same way at its one shape: the
  speedups at the representative shape should be within noise of it.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import onnx

from bench.machine import header, machine_info
from bench.real_models import DEFAULT_OUT as CORPUS
from bench.real_report import RESULTS, _run_tensat, corpus_models, same_computation
from tensat.errors import one_line
from tensat.files import atomic_write_json, atomic_write_text
from tensat.latency import compare_latency
from tensat.measure import default_clock
from tensat.onnx.symbolic import input_dims, is_batch

SUFFIX = "_dyn"
SECONDS = 12.0  # timing per shape and model
PAIRS = 40


def symbolic_io(model: onnx.ModelProto) -> dict[str, list[int | str]]:
    """Every graph input's and output's dims, symbolic ones by name."""
    weights = {t.name for t in model.graph.initializer}
    return {
        vi.name: [d.dim_param if d.dim_param else d.dim_value for d in vi.type.tensor_type.shape.dim]
        for vi in [*model.graph.input, *model.graph.output]
        if vi.name not in weights
    }


def timing_shapes(model: onnx.ModelProto, representative: dict[str, list[int]]) -> list[dict[str, list[int]]]:
    """The shapes a dynamic model is timed at: `representative`, every batch dim at 4, and every other symbolic dim
    at twice its size there (where there is none, a batch of 2; twice, not half: a waveform may be too short)."""
    dims = input_dims(model)
    others = any(isinstance(d, str) and not is_batch(d, k) for shape in dims.values() for k, d in enumerate(shape))

    def instance(batch: int | None, scale: float | None) -> dict[str, list[int]]:
        out = {}
        for name, shape in dims.items():
            sizes = list(representative[name])
            for axis, d in enumerate(shape):
                if not isinstance(d, str):
                    continue
                if is_batch(d, axis) and batch is not None:
                    sizes[axis] = batch
                elif not is_batch(d, axis) and scale is not None:
                    sizes[axis] = int(sizes[axis] * scale)
            out[name] = sizes
        return out

    return [representative, instance(4, None), instance(None, 2.0) if others else instance(2, None)]


def _timed(src: Path, out: Path, shapes: dict[str, list[int]] | None, seconds: float) -> dict[str, Any]:
    """`out` against `src` at one thread (at `shapes`): speedup, interval, both latencies; 1.0 untimed where `out`
    is `src` itself."""
    if same_computation(src, out):
        return {"speedup": 1.0, "interval": [1.0, 1.0], "same_model": True}
    try:
        clock = default_clock("cpu", 1)
        c = compare_latency(src, out, threads=1, clock=clock, max_seconds=seconds, pairs=PAIRS, copies=2, shapes=shapes)
    except Exception as exc:  # noqa: BLE001 - a shape the input does not run at either (a waveform too short)
        return {"error": one_line(exc, typed=True)}
    return {
        "speedup": c.speedup,
        "interval": list(c.interval),
        "baseline_ms": c.baseline_ms,
        "ms": c.candidate_ms,
        "pairs": c.pairs,
    }


def run_model(name: str, src: Path, static: Path | None, work: Path, seconds: float) -> dict[str, Any]:
    """One dynamic model's row: tensat's run, the dims it wrote, the speedup per shape, and the static export's."""
    rec: dict[str, Any] = {"model": name}
    given = onnx.load(str(src), load_external_data=False)
    cache = work / f"{name}.cache"
    cache.mkdir()
    out = work / f"{name}.tensat.onnx"
    rec["tensat"] = run = _run_tensat(src, out, cache)
    if not run["ok"]:
        return rec
    stats = run["stats"]
    written = onnx.load(str(out), load_external_data=False)
    rec["dims_in"], rec["dims_out"] = symbolic_io(given), symbolic_io(written)
    rec["dims_kept"] = rec["dims_in"] == rec["dims_out"]
    rec["returned_input"] = stats.get("returned_input")
    rec["shapes_verified"] = stats.get("shapes_verified") or []
    representative = stats["shapes_optimized"]
    rec["per_shape"] = [
        {"shapes": shapes, **_timed(src, out, shapes, seconds)} for shapes in timing_shapes(given, representative)
    ]
    if static is not None:
        static_out = work / f"{name}.static.onnx"
        rec["static_tensat"] = run_static = _run_tensat(static, static_out, cache)
        if run_static["ok"]:
            rec["static"] = _timed(static, static_out, None, seconds)
    return rec


def _ratio(timing: dict[str, Any] | None) -> str:
    if not timing:
        return "-"
    if "error" in timing:
        return "does not run"
    low, high = timing["interval"]
    if timing.get("same_model"):
        return "1.00 (input)"
    return f"{timing['speedup']:.3f} ({low:.2f}-{high:.2f})"


def _shape(shapes: dict[str, list[int]]) -> str:
    first = next(iter(shapes.values()))
    return "x".join(str(d) for d in first)


def markdown(records: Sequence[dict[str, Any]], info: dict[str, Any]) -> str:
    """The report's markdown."""
    lines = [
        "# Dynamic shapes: tensat on models exported with symbolic dims",
        "",
        header(info),
        "",
        "`python -m bench.dynamic_report`. Each model is optimized with `tensat optimize MODEL -o OUT` and no",
        "`--input-shape`; speedups are input / result at one thread, median over pairs of interleaved blocks, with a",
        "95% interval. The shapes are the first input's: the one optimized at, a batch of 4, and the other symbolic",
        "dims at twice the size (a batch of 2 where the batch is the only one). *static* is the same architecture",
        "exported at fixed shapes, optimized and timed at its one shape (a waveform of 16000 samples for wav2vec2).",
        "",
        "*modelled*: the share of the ONNX nodes read that tensat models (the others, a shape computation that only",
        "the model's Shape nodes can say for every size among them, are kept as written, opaque to the rules).",
        "",
        "| model | symbolic dims kept | modelled | verified at | at shape 1 | at shape 2 | at shape 3 | static | "
        "tensat (s) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for rec in records:
        run = rec.get("tensat", {})
        if not run.get("ok"):
            lines.append(f"| {rec['model']} | failed: {run.get('error', '?')} | | | | | | | |")
            continue
        cells = [f"{_shape(p['shapes'])}: {_ratio(p)}" for p in rec.get("per_shape", [])]
        cells += ["-"] * (3 - len(cells))
        verified = "; ".join(_shape(s) for s in rec.get("shapes_verified", [])) or "(input returned)"
        kept = "yes" if rec.get("dims_kept") else f"no: {rec.get('dims_out')}"
        modelled = run.get("stats", {}).get("modelled")
        share = f"{100 * modelled:.1f}%" if modelled is not None else "-"
        lines.append(
            f"| {rec['model']} | {kept} | {share} | {verified} | {' | '.join(cells)} | {_ratio(rec.get('static'))} | "
            f"{run['seconds']:.0f} |"
        )
    lines += ["", "Why a model came back unchanged:", ""]
    for rec in records:
        if rec.get("returned_input"):
            lines.append(f"- {rec['model']}: {rec['returned_input']}")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: run the dynamic models (or `--render` the JSON again)."""
    parser = argparse.ArgumentParser(
        prog="python -m bench.dynamic_report", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--only", help="comma-separated `_dyn` model names (default: every one in the corpus)")
    parser.add_argument("--seconds", type=float, default=SECONDS, help="timing per shape and model")
    parser.add_argument("--render", action="store_true", help="rewrite the markdown from the JSON")
    parser.add_argument("--out", type=Path, default=RESULTS, help="results directory")
    args = parser.parse_args(argv)
    json_path, md_path = args.out / "dynamic_models.json", args.out / "dynamic_models.md"
    if args.render:
        data = json.loads(json_path.read_text(encoding="utf-8"))
        atomic_write_text(md_path, markdown(data["models"], data["machine"]))
        return 0
    corpus = corpus_models(CORPUS)
    names = [n for n in corpus if n.endswith(SUFFIX)]
    if args.only:
        names = [n.strip() for n in args.only.split(",") if n.strip()]
        missing = [n for n in names if n not in corpus]
        if missing:
            parser.error(f"not in the corpus: {', '.join(missing)} (export them with python -m bench.real_models)")
    if not names:
        parser.error("no dynamic models in the corpus: python -m bench.real_models export --only bert_dyn,...")
    info = machine_info()
    records: list[dict[str, Any]] = []
    if args.only and json_path.exists():  # a subset run replaces those rows of the last full one
        records = [r for r in json.loads(json_path.read_text(encoding="utf-8"))["models"] if r["model"] not in names]
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            rec = run_model(name, corpus[name], corpus.get(name.removesuffix(SUFFIX)), Path(tmp), args.seconds)
            records.append(rec)
            shapes = ", ".join(f"{_shape(p['shapes'])} {_ratio(p)}" for p in rec.get("per_shape", []))
            print(f"{name}: kept dims {rec.get('dims_kept')}, {shapes}; static {_ratio(rec.get('static'))}", flush=True)
            atomic_write_json(json_path, {"machine": info, "models": records})
    atomic_write_text(md_path, markdown(records, info))
    return 0


if __name__ == "__main__":
    sys.exit(main())
