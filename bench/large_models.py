"""Large models: peak memory and the time of each stage as tensat optimizes decoders of growing size.

    python -m bench.large_models                    # export (if missing) and optimize every size
    python -m bench.large_models --only small,medium
    python -m bench.large_models --render           # rewrite the markdown from the JSON

Each size is a Llama-style decoder (transformers' LlamaModel, seeded random weights, eval mode) at batch 1 and 64
tokens, exported by torch.onnx's dynamo exporter with its weights in an external data file, as large models are
shipped. tensat then runs on it as a user runs it, `tensat optimize MODEL -o OUT --stats STATS`, in a fresh process,
once with default settings and once with `--latency-check 0`; the benchmark reads that process's peak resident set
from the kernel (`os.wait4`), and the stage times and the end-to-end check from the stats. The slope of the peak
against the weights' size says whether memory grows linearly with the model.

Results go to bench/results/large_models.{json,md}; the models to bench/corpus/large/ (not committed).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import onnx

from bench.machine import header, machine_info

CORPUS = Path(__file__).resolve().parent / "corpus" / "large"
RESULTS = Path(__file__).resolve().parent / "results"
SEQ = 64
VOCAB = 32000
SEED = 0


@dataclass(frozen=True)
class Size:
    """One decoder's dimensions."""

    name: str
    hidden: int
    layers: int
    intermediate: int
    heads: int


SIZES = {
    s.name: s
    for s in (
        Size("small", 1024, 4, 2816, 8),
        Size("medium", 1536, 6, 4096, 12),
        Size("large", 2048, 8, 5632, 16),
        Size("xlarge", 2048, 10, 5632, 16),  # over 2 GiB of weights: protobuf's limit
    )
}

RUNS = {"default": [], "no-latency-check": ["--latency-check", "0"]}  # the settings each size is optimized with


def export(size: Size, out_dir: Path) -> Path:
    """Export `size` as `out_dir/llama_<name>.onnx` with its weights in `llama_<name>.onnx.data`; the model's path."""
    import torch  # bench extra, not a runtime dependency
    from transformers import LlamaConfig, LlamaModel

    path = out_dir / f"llama_{size.name}.onnx"
    if path.exists():
        return path
    out_dir.mkdir(parents=True, exist_ok=True)
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=size.hidden,
        intermediate_size=size.intermediate,
        num_hidden_layers=size.layers,
        num_attention_heads=size.heads,
        num_key_value_heads=size.heads,
        max_position_embeddings=2 * SEQ,
        attn_implementation="eager",
    )
    torch.manual_seed(SEED)
    model = LlamaModel(config).eval()

    class Decoder(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
            return self.model(input_ids=input_ids, use_cache=False, return_dict=True).last_hidden_state

    ids = torch.randint(0, VOCAB, (1, SEQ), generator=torch.Generator().manual_seed(SEED))
    tmp = out_dir / f".{path.name}.partial"
    tmp.mkdir(exist_ok=True)
    with torch.no_grad():
        torch.onnx.export(
            Decoder().eval(),
            (ids,),
            str(tmp / path.name),
            dynamo=True,
            external_data=True,
            input_names=["input_ids"],
            output_names=["last_hidden_state"],
        )
    for part in tmp.iterdir():  # the model and its data file, moved in once both are whole
        part.replace(out_dir / part.name)
    tmp.rmdir()
    return path


def weight_bytes(path: Path) -> int:
    """The bytes of `path`'s weights: its external data files and the initializers it holds inline."""
    model = onnx.load(str(path), load_external_data=False)
    total, files = 0, set()
    for t in model.graph.initializer:
        if t.data_location == onnx.TensorProto.EXTERNAL:
            files.add(next(e.value for e in t.external_data if e.key == "location"))
        else:
            total += len(t.raw_data)
    return total + sum((path.parent / f).stat().st_size for f in files)


def optimize(path: Path, flags: Sequence[str]) -> dict[str, Any]:
    """`tensat optimize path` with `flags` in a fresh process: its exit code, wall time, peak resident set (bytes),
    and its stats (stage times, end-to-end check) where it wrote them."""
    with tempfile.TemporaryDirectory(prefix="tensat-large-") as tmp:
        out, stats = Path(tmp) / "out.onnx", Path(tmp) / "stats.json"
        cmd = [sys.executable, "-m", "tensat", "optimize", str(path), "-o", str(out), "--stats", str(stats), *flags]
        start = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        assert proc.stderr is not None
        err = proc.stderr.read()
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        seconds = time.perf_counter() - start
        record: dict[str, Any] = {
            "flags": list(flags),
            "exit": proc.returncode,
            "seconds": round(seconds, 1),
            "peak_rss_bytes": usage.ru_maxrss * 1024,  # kilobytes on Linux
            "stderr": err.strip().splitlines()[-1] if err.strip() else "",
        }
        if stats.exists():
            data = json.loads(stats.read_text())
            record["times"] = {k: round(v, 2) for k, v in data.get("times", {}).items()}
            record["returned_input"] = data.get("returned_input")
            record["cost_speedup"] = data.get("speedup")
            record["latency_check"] = data.get("latency_check")
        record["output_bytes"] = sum(p.stat().st_size for p in Path(tmp).iterdir() if p.name.startswith("out.onnx"))
        return record


def slope(points: Sequence[tuple[float, float]]) -> float | None:
    """The least-squares slope of y over x (peak memory over the weights' size)."""
    if len(points) < 2:
        return None
    mx = sum(x for x, _ in points) / len(points)
    my = sum(y for _, y in points) / len(points)
    den = sum((x - mx) ** 2 for x, _ in points)
    return sum((x - mx) * (y - my) for x, y in points) / den if den else None


def render(data: dict[str, Any]) -> str:
    """The markdown report of `data` (as `main` writes it to JSON)."""
    lines = [
        "# Large models: peak memory and stage times",
        "",
        header(data["machine"]),
        "",
        "Llama-style decoders with random weights (batch 1, 64 tokens), weights in external data; `tensat optimize`",
        "in a fresh process, peak resident set read from the kernel. Regenerate: `python -m bench.large_models`.",
        "The end-to-end column is the check's timing of the optimized graph against the input (`latency_check`,",
        "20 s by default, shared by two thread counts): with runs of half a second and more, it gets few pairs.",
        "",
        "| model | params | weights | settings | exit | time | peak RSS | peak / weights | stages (s) "
        "| cost ratio of the model returned | end to end, 1 thread | outcome |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, m in data["models"].items():
        for run_name, r in m["runs"].items():
            stages = ", ".join(f"{k} {v:g}" for k, v in r.get("times", {}).items() if v >= 0.05)
            check = (r.get("latency_check") or {}).get("threads=1")
            timed = (
                f"{check['speedup']:.3f}x ({check['interval'][0]:.3f}-{check['interval'][1]:.3f}, "
                f"{check['pairs']} pairs)"
                if check
                else "not timed"
            )
            if r["exit"] != 0:
                outcome = r.get("stderr", "")
            else:
                outcome = "optimized" if r.get("returned_input") is None else f"input returned: {r['returned_input']}"
            predicted = f"{r['cost_speedup']:.3f}x" if r.get("cost_speedup") else ""
            lines.append(
                f"| {name} | {m['params'] / 1e6:.0f}M | {m['weight_bytes'] / 2**30:.2f} GiB | {run_name} | {r['exit']} "
                f"| {r['seconds']:.0f} s | {r['peak_rss_bytes'] / 2**30:.2f} GiB "
                f"| {r['peak_rss_bytes'] / m['weight_bytes']:.2f}x | {stages} | {predicted} | {timed} | {outcome} |"
            )
    lines.append("")
    for run_name in RUNS:
        s = data.get("slopes", {}).get(run_name)
        if s is not None:
            lines.append(f"- Peak memory over weights, least-squares slope ({run_name}): {s:.2f} bytes per byte.")
    lines.append("")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.large_models", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--only", help=f"comma-separated sizes (default: {','.join(SIZES)})")
    parser.add_argument("--render", action="store_true", help="rewrite the markdown from the JSON")
    parser.add_argument("--runs", help=f"comma-separated settings (default: {','.join(RUNS)})")
    args = parser.parse_args(argv)
    json_path, md_path = RESULTS / "large_models.json", RESULTS / "large_models.md"
    if args.render:
        md_path.write_text(render(json.loads(json_path.read_text())))
        return 0
    names = list(SIZES) if not args.only else [n.strip() for n in args.only.split(",")]
    runs = list(RUNS) if not args.runs else [n.strip() for n in args.runs.split(",")]
    unknown = [n for n in names if n not in SIZES] + [r for r in runs if r not in RUNS]
    if unknown:
        parser.error(f"unknown size or settings: {', '.join(unknown)}")
    data: dict[str, Any] = json.loads(json_path.read_text()) if json_path.exists() else {"models": {}}
    data["machine"] = machine_info()
    for name in names:
        path = export(SIZES[name], CORPUS)
        params = sum(math.prod(t.dims) for t in onnx.load(str(path), load_external_data=False).graph.initializer)
        record = data["models"].setdefault(name, {"runs": {}})
        record.update(params=params, weight_bytes=weight_bytes(path))
        for run_name in runs:
            r = optimize(path, RUNS[run_name])
            record["runs"][run_name] = r
            print(
                f"{name} {run_name}: exit {r['exit']}, {r['seconds']:.0f} s, peak {r['peak_rss_bytes'] / 2**30:.2f} "
                f"GiB ({r['peak_rss_bytes'] / record['weight_bytes']:.2f}x weights) {r.get('times', {})}",
                flush=True,
            )
    data["slopes"] = {
        run_name: slope(
            [
                (m["weight_bytes"], m["runs"][run_name]["peak_rss_bytes"])
                for m in data["models"].values()
                if run_name in m["runs"]
            ]
        )
        for run_name in RUNS
    }
    RESULTS.mkdir(exist_ok=True)
    json_path.write_text(json.dumps(data, indent=1) + "\n")
    md_path.write_text(render(data))
    return 0


if __name__ == "__main__":
    sys.exit(main())
