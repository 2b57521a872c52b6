"""Predicted over run with the units without weights timed with their outputs warm, in the last-level cache, or cold.

    python -m bench.cold_outputs                           # nine models of the corpus
    python -m bench.cold_outputs --only hubert --out-dir DIR

Units without weights were timed with their output buffers warm ("today" here, until this report made cold the
default, `DEFAULT_OUTPUTS`), while inside a graph onnxruntime's arena hands a kernel a buffer last touched long
before (`bench.unit_context`: memory-bound kernels run slower in the graph than priced). For each
input model: same-load checks (`bench.real_report.same_load`: the kernels priced afresh on an empty cost cache,
between end-to-end runs at one thread), `ROUNDS` rounds of the pricings in turns, one per place of the outputs
(`MeasuredCost.outputs`, `VARIANTS`); the predicted cost over the end-to-end time of each, and their medians.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.machine import header
from bench.real_models import per_model_parser, per_model_report
from bench.real_report import same_load, same_load_checks

MODELS = (
    "swinv2",
    "hubert",
    "efficientnet_b0_ts15",
    "segformer_seg",
    "mobilevit",
    "resnet50",
    "bert",
    "convnext",
    "mobilenet_v2",
)
ROUNDS = 2
VARIANTS = {"today": "warm", "outputs in LLC": "llc", "cold outputs": "cold"}


def model_record(path: Path) -> dict[str, Any]:
    """One model's same-load checks, the pricings in turns for `ROUNDS` rounds."""
    checks: dict[str, list[dict[str, Any]]] = {name: [] for name in VARIANTS}
    for _ in range(ROUNDS):
        for name, outputs in VARIANTS.items():
            checks[name].append(same_load(path, outputs=outputs))
    return {"model": path.stem, "checks": checks}


def median_ratio(checks: Sequence[dict[str, Any]]) -> float | None:
    """The median predicted-over-run ratio of the checks that measured (None where none did)."""
    return same_load_checks(checks).get("ratio")


def _cell(checks: Sequence[dict[str, Any]]) -> str:
    summary = same_load_checks(checks)
    if "ratio" not in summary:
        return summary["error"]
    each = ", ".join(f"{c['ratio']:.3f}" for c in checks if "ratio" in c)
    return f"{summary['ratio']:.3f} ({each}); {summary['predicted_ms']:.2f} ms"


def render(records: Sequence[dict[str, Any]], info: dict[str, Any]) -> str:
    """The markdown report: per model, each pricing's predicted over run."""
    lines = [
        "# Predicted over run, with units' outputs warm (today), in the last-level cache, and cold",
        "",
        header(info),
        "",
        "One intra-op thread, CPU, input models of the corpus. Each cell: the median predicted cost over the "
        f"end-to-end time of {ROUNDS} same-load checks (each check's own), the checks, and the median predicted "
        "cost; the pricings taken in turns. `outputs in LLC`: every unit without weights timed with its output "
        "buffers pushed out of the core's level-2 cache into the last-level one; `cold outputs`: out of every cache "
        "(`MeasuredCost.outputs`). See `bench/cold_outputs.py`.",
        "",
        f"| model | {' | '.join(VARIANTS)} |",
        "|---" * (len(VARIANTS) + 1) + "|",
    ]
    for r in records:
        lines.append(f"| {r['model']} | {' | '.join(_cell(r['checks'][name]) for name in VARIANTS)} |")
    within = {
        name: sum(1 for r in records if (m := median_ratio(r["checks"][name])) is not None and abs(m - 1) <= 0.1)
        for name in VARIANTS
    }
    lines += ["", "Within 10%: " + ", ".join(f"{name} {n} of {len(records)}" for name, n in within.items()) + "."]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    return per_model_report(per_model_parser("cold_outputs", __doc__, MODELS).parse_args(argv), model_record, render)


if __name__ == "__main__":
    sys.exit(main())
