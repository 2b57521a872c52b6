"""The pre-pass study: would a peer's graph canonicalization, run before tensat, make real models faster?

    python -m bench.prepass                      # every corpus model -> bench/results/prepass.md and .json
    python -m bench.prepass --only vit,swin      # a subset
    python -m bench.prepass --render             # rewrite the markdown from the JSON

The real-model issue asks to measure a well-kept canonicalizer as a pre-pass before growing tensat's own importer.
For each corpus model (the corpus of `bench.real_report`), each pass below rewrites the input file:

- `onnxsim`: onnxsim's `simplify` (shape inference, onnxoptimizer's passes, constant folding, to a fixed point);
- `onnxslim`: onnxslim's `slim` (constant folding, dead-code removal, pattern fusions such as MatMul+Add to Gemm);
- `onnxscript`: the onnxscript optimizer (constant folding, inlining, dead-code removal);
- `onnxscript+ort`: the same, then onnxscript's onnxruntime fusions (`optimize_for_ort`: attention, multi-head
  attention, SkipLayerNorm, BiasGelu, RMSNorm, rotary embeddings into onnxruntime's contrib operators);
- `tensat`: `tensat optimize --pre-pass none` (it reads the model as given), otherwise with default settings, in a
  fresh process with an empty cost cache;
- `tensat+onnxslim`: the same with `--pre-pass onnxslim` (the default): tensat reads onnxslim's output, and prices
  and checks its result against the model as given (a cost cache of its own, empty too).

Each output is verified against the input in onnxruntime (`tensat.verify.compare_models`); an output that does not
load or computes something else is reported as invalid and not timed. The valid ones are timed end to end against
the input, all interleaved block by block, at one intra-op thread and at every core, as `bench.real_report` times
them. "Kept" is what tensat's end-to-end check would keep of a pass run before it: the pass's speedup where it is
measurably faster as `tensat.api.measurably_faster` rules, else 1.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import onnx

from bench.machine import header
from bench.real_report import _cell as speedup_cell
from bench.real_report import _run_tensat, _speedups, corpus_main, geomean
from tensat.api import measurably_faster
from tensat.errors import one_line
from tensat.verify import compare_models


def _onnxsim(model: onnx.ModelProto) -> onnx.ModelProto:
    import onnxsim  # bench extra: imported where it is used, as `bench.real_report` does

    result, ok = onnxsim.simplify(model)
    if not ok:
        raise RuntimeError("onnxsim's own check failed")
    return result


def _onnxslim(model: onnx.ModelProto) -> onnx.ModelProto:
    import onnxslim  # imported where it is used (it imports sympy)

    return onnxslim.slim(model)


def _onnxscript(model: onnx.ModelProto, ort_fusions: bool = False) -> onnx.ModelProto:
    import onnx_ir as ir  # bench extra (onnxscript's IR): imported where it is used
    import onnxscript.optimizer
    from onnxscript.rewriter.ort_fusions import optimize_for_ort

    graph = ir.serde.deserialize_model(model)
    onnxscript.optimizer.optimize_ir(graph)
    if ort_fusions:
        graph, _ = optimize_for_ort(graph)
    return ir.serde.serialize_model(graph)


PASSES: dict[str, Callable[[onnx.ModelProto], onnx.ModelProto]] = {
    "onnxsim": _onnxsim,
    "onnxslim": _onnxslim,
    "onnxscript": _onnxscript,
    "onnxscript+ort": lambda model: _onnxscript(model, ort_fusions=True),
}
TENSAT_RUNS: dict[str, tuple[str, ...]] = {
    "tensat": ("--pre-pass", "none"),
    "tensat+onnxslim": ("--pre-pass", "onnxslim"),
}  # each flag explicit: the columns do not move with the default
COLUMNS = (*PASSES, *TENSAT_RUNS)


def _apply(name: str, src: Path, out: Path) -> dict[str, Any]:
    """Run pass `name` on `src`, write its output to `out` and verify it against `src`."""
    model = onnx.load(str(src))
    t = time.perf_counter()
    try:
        result = PASSES[name](model)
    except Exception as exc:  # noqa: BLE001 - a pass failing is a result to report
        return {"ok": False, "seconds": time.perf_counter() - t, "error": one_line(exc, typed=True)[:300]}
    seconds = time.perf_counter() - t
    onnx.save(result, str(out))
    return {"seconds": seconds, "ops": len(result.graph.node), **_verified(src, out)}


def _verified(src: Path, out: Path) -> dict[str, Any]:
    try:
        report = compare_models(src, out)
    except Exception as exc:  # noqa: BLE001 - an output onnxruntime cannot run is a result to report
        return {"ok": False, "error": one_line(exc, typed=True)[:300]}
    return {"ok": report.ok} if report.ok else {"ok": False, "error": report.detail[:300]}


def run_model(name: str, src: Path, work: Path, seconds: float) -> dict[str, Any]:
    """Every pass on one model, verified, then the valid outputs timed against the input."""
    rec: dict[str, Any] = {"model": name, "ops_before": len(onnx.load(str(src), load_external_data=False).graph.node)}
    outputs: dict[str, Path] = {}
    for pass_name in PASSES:
        out = work / f"{name}.{pass_name}.onnx"
        rec[pass_name] = _apply(pass_name, src, out)
        if rec[pass_name]["ok"]:
            outputs[pass_name] = out
    for column, flags in TENSAT_RUNS.items():
        cache = work / f"{name}.{column}.cache"
        cache.mkdir()
        out = work / f"{name}.{column}.onnx"
        run = _run_tensat(src, out, cache, flags)
        rec[column] = {"ok": run["ok"], "seconds": run["seconds"]}
        if run["ok"]:
            rec[column].update(ops=len(onnx.load(str(out), load_external_data=False).graph.node), **_verified(src, out))
            rec[column]["returned_input"] = run["stats"]["returned_input"]
        else:
            rec[column]["error"] = run["error"]
        if rec[column]["ok"]:
            outputs[column] = out
    rec["latency"] = _speedups(src, outputs, seconds) if outputs else {}
    return rec


def kept(latency: dict[str, Any]) -> float:
    """What tensat's end-to-end check would keep of one pass's output: its speedup at one thread where it is
    measurably faster at every thread count, else 1 (the input)."""
    if measurably_faster([lat["interval"][0] for lat in latency.values()]):
        return float(latency["threads=1"]["speedup"])
    return 1.0


def summary(records: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Per pass: how many outputs were valid, their geometric-mean speedups, and what an end-to-end check keeps."""
    out: dict[str, Any] = {"models": len(records)}
    for who in COLUMNS:
        timed = [r["latency"][who] for r in records if who in r.get("latency", {})]
        row: dict[str, Any] = {"valid": sum(1 for r in records if r[who]["ok"]), "timed": len(timed)}
        for threads in sorted({k for lat in timed for k in lat}):
            values = [lat[threads]["speedup"] for lat in timed if threads in lat]
            row[threads] = {
                "geomean": geomean(values),
                "at_least_1.05": sum(1 for v in values if v >= 1.05),
                "measurably_slower": sum(1 for lat in timed if threads in lat and lat[threads]["interval"][1] < 1.0),
            }
        seconds = [r[who]["seconds"] for r in records]
        row["seconds_median"], row["seconds_max"] = statistics.median(seconds), max(seconds)
        kept_values = [kept(r["latency"][who]) if who in r.get("latency", {}) else 1.0 for r in records]
        row["kept_geomean"] = geomean(kept_values)
        row["kept_at_least_1.05"] = sum(1 for v in kept_values if v >= 1.05)
        out[who] = row
    return out


def _cell(rec: dict[str, Any], who: str, threads: str) -> str:
    if not rec[who]["ok"]:
        return "invalid" if "ops" in rec[who] else "failed"
    return speedup_cell(rec, who, threads)


def markdown(records: Sequence[dict[str, Any]], info: dict[str, Any]) -> str:
    """The study: the machine, one row per model and thread count, the failures, and the summary per pass."""
    threads = sorted({k for r in records for who in r.get("latency", {}) for k in r["latency"][who]})
    head = ["model", "threads", *COLUMNS]
    lines = [
        "# Peers as a pre-pass: what they change on real models",
        "",
        header(info),
        "",
        "Each pass rewrites the input model; its output is verified against the input in onnxruntime, then timed "
        "against it end to end (CPU, all graph optimizations on): median over pairs of interleaved blocks of "
        "input / output, with a 95% bootstrap interval. `tensat+onnxslim` is `tensat optimize --pre-pass "
        "onnxslim`; `1 (input)`: the model itself came back, not timed. See `bench/prepass.py`.",
        "",
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(head),
    ]
    for r in records:
        for t in threads:
            lines.append("| " + " | ".join([r["model"], t.split("=")[1], *(_cell(r, w, t) for w in COLUMNS)]) + " |")
    failures = [(r["model"], w, r[w]["error"]) for r in records for w in COLUMNS if not r[w]["ok"]]
    if failures:
        lines += ["", "## Failed or invalid outputs", ""]
        lines += [f"- {model}, {who}: {error}" for model, who, error in failures]
    s = summary(records)
    lines += [
        "",
        "## Summary",
        "",
        "| pass | valid | " + " | ".join(f"geomean {t} | >= 1.05 {t} | slower {t}" for t in threads) + " | "
        "kept by an end-to-end check: geomean threads=1 | kept >= 1.05 | seconds: median / max |",
        "|" + "---|" * (2 + 3 * len(threads) + 3),
    ]
    for who in COLUMNS:
        row = s[who]
        cells = [who, f"{row['valid']} / {s['models']}"]
        for t in threads:
            fig = row.get(t)
            cells += (
                [f"{fig['geomean']:.3f}", str(fig["at_least_1.05"]), str(fig["measurably_slower"])]
                if fig
                else ["—"] * 3
            )
        cells += [f"{row['kept_geomean']:.3f}", str(row["kept_at_least_1.05"])]
        cells.append(f"{row['seconds_median']:.1f} / {row['seconds_max']:.1f}")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    return corpus_main(
        argv,
        prog="python -m bench.prepass",
        doc=__doc__,
        stem="prepass",
        seconds=15.0,
        run=run_model,
        summarize=summary,
        render=markdown,
    )


if __name__ == "__main__":
    raise SystemExit(main())
