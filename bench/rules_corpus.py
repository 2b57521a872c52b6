"""The rule sets on real models: the corpus optimized with the hand-written rules, the generated ones, and both.

    python -m bench.rules_corpus                   # every corpus model -> bench/results/rules_corpus.md and .json
    python -m bench.rules_corpus --only bert,gpt2  # a subset
    python -m bench.rules_corpus --render          # rewrite the markdown from the JSON

The rule-generation issue asks that the generated set (or all rules) leave the real-model corpus at least as fast
end to end as the hand set, with the search within its time budget. For each corpus model (`bench.real_report`'s
corpus), `tensat optimize --rules R` runs once per rule set R, each in a fresh process with an empty cost cache of
its own (a first run on a machine), otherwise with default settings. The outputs are then timed end to end against
the input, all interleaved block by block, at one intra-op thread and at every core, as `bench.real_report` times
them; an output that is the input itself is 1 by construction and not timed.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import onnx

from bench.machine import header
from bench.real_report import _cell, _run_tensat, _speedups, corpus_main, geomean
from tensat.options import RULE_SETS


def run_model(name: str, src: Path, work: Path, seconds: float) -> dict[str, Any]:
    """One model optimized with each rule set, then the outputs timed against the input."""
    rec: dict[str, Any] = {"model": name, "ops_before": len(onnx.load(str(src), load_external_data=False).graph.node)}
    outputs: dict[str, Path] = {}
    for rule_set in RULE_SETS:
        cache = work / f"{name}.{rule_set}.cache"
        cache.mkdir()
        out = work / f"{name}.{rule_set}.onnx"
        run = _run_tensat(src, out, cache, ("--rules", rule_set))
        rec[rule_set] = {"ok": run["ok"], "seconds": run["seconds"]}
        if run["ok"]:
            stats = run["stats"]
            rec[rule_set].update(
                ops=len(onnx.load(str(out), load_external_data=False).graph.node),
                returned_input=stats["returned_input"],
                rules=stats.get("rules", {}),
                cost_before=stats.get("cost_before"),
                cost_after=stats.get("cost_after"),
            )
            outputs[rule_set] = out
        else:
            rec[rule_set]["error"] = run["error"]
    rec["latency"] = _speedups(src, outputs, seconds) if outputs else {}
    return rec


def summary(records: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Per rule set: models optimized and returned changed, the geometric-mean speedup and the models measurably
    slower per thread count, and the longest run."""
    out: dict[str, Any] = {"models": len(records)}
    for rule_set in RULE_SETS:
        row: dict[str, Any] = {"optimized": sum(1 for r in records if r[rule_set]["ok"])}
        timed = [r["latency"][rule_set] for r in records if rule_set in r.get("latency", {})]
        for threads in sorted({k for lat in timed for k in lat}):
            values = [lat[threads]["speedup"] for lat in timed if threads in lat]
            row[threads] = {
                "geomean": geomean(values),
                "measurably_slower": sum(1 for lat in timed if threads in lat and lat[threads]["interval"][1] < 1.0),
            }
        row["seconds_max"] = max((r[rule_set]["seconds"] for r in records if r[rule_set]["ok"]), default=float("nan"))
        row["changed"] = sum(1 for r in records if r[rule_set]["ok"] and not r[rule_set]["returned_input"])
        out[rule_set] = row
    return out


def markdown(records: Sequence[dict[str, Any]], info: dict[str, Any]) -> str:
    """The report: one row per model (speedup at each thread count and time, per rule set), then the summary."""
    threads = sorted({k for r in records for who in r.get("latency", {}) for k in r["latency"][who]})
    lines = [
        "# Rule sets on real models: hand-written, generated, both",
        "",
        header(info),
        "",
        "`tensat optimize --rules R` on each corpus model, each run on a cold cost cache; the outputs are timed "
        "against the input end to end (CPU), interleaved: median over pairs of blocks of input / output, with a 95% "
        "bootstrap interval. `1 (input)`: tensat returned the model itself, not timed. See `bench/rules_corpus.py`.",
        "",
    ]
    head = ["model", *(f"{rs} {t}" for t in threads for rs in RULE_SETS), *(f"{rs} (s)" for rs in RULE_SETS)]
    lines += ["| " + " | ".join(head) + " |", "|---" + "|---:" * (len(head) - 1) + "|"]
    for r in records:
        cells = [r["model"]]
        for t in threads:
            cells += [_cell(r, rs, t) if r[rs]["ok"] else "failed" for rs in RULE_SETS]
        cells += [f"{r[rs]['seconds']:.1f}" for rs in RULE_SETS]
        lines.append("| " + " | ".join(cells) + " |")
    failures = [(r["model"], rs, r[rs]["error"]) for r in records for rs in RULE_SETS if not r[rs]["ok"]]
    if failures:
        lines += ["", "## Failed", ""]
        lines += [f"- {model}, --rules {rs}: {error}" for model, rs, error in failures]
    s = summary(records)
    head = ["rule set", "optimized", "returned changed"]
    head += [f"{what} {t}" for t in threads for what in ("geomean", "slower")]
    head += ["longest run (s)"]
    lines += ["", "## Summary", "", "| " + " | ".join(head) + " |", "|---" + "|---:" * (len(head) - 1) + "|"]
    for rs in RULE_SETS:
        row = s[rs]
        cells = [rs, f"{row['optimized']} / {s['models']}", str(row["changed"])]
        for t in threads:
            fig = row.get(t)
            cells += [f"{fig['geomean']:.3f}", str(fig["measurably_slower"])] if fig else ["—", "—"]
        cells.append(f"{row['seconds_max']:.1f}")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    return corpus_main(
        argv,
        prog="python -m bench.rules_corpus",
        doc=__doc__,
        stem="rules_corpus",
        seconds=15.0,
        run=run_model,
        summarize=summary,
        render=markdown,
    )


if __name__ == "__main__":
    raise SystemExit(main())
