"""What onnxruntime fuses, before and after tensat: does the graph tensat would return run the kernels it chose, and
keep the runtime's other fusions?

    python -m bench.fusion_report                   # every corpus model -> bench/results/fusions.md and .json
    python -m bench.fusion_report --only gpt2,swin  # a subset

For each corpus model, tensat optimizes it with default settings except the end-to-end check (`latency_check=0`):
the graph returned is then the one the extraction chose, whether or not it runs faster. The input and that graph
are each optimized by onnxruntime's CPU session at the extended level (its fusions, not the CPU's blocked layout),
and their kernels counted by op type. The kernels tensat models (`tensat.ops.KERNELS`) that its graph writes are
the ones the extraction chose; the report checks that onnxruntime runs exactly those (`tensat.onnx.fusions.
check_kernels`). Of the other fused kinds (one onnxruntime made from the input, a kind the input file does not
contain, or a Gemm), it lists those whose count fell: what tensat's graph lost.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import onnx

import tensat
from bench.machine import header
from bench.real_report import corpus_main
from tensat import ops
from tensat.onnx.fusions import check_kernels
from tensat.session import runtime_graph

ALWAYS_FUSED = frozenset({"Gemm", "FusedGemm", "FusedConv", "FusedMatMul"})


def runtime_kernels(model: onnx.ModelProto | str) -> collections.Counter[str]:
    """Kernels of `model` by op type, as onnxruntime's CPU session runs it at the extended level."""
    return collections.Counter(n.op_type for n in runtime_graph(model).graph.node)


def run_model(name: str, src: Path, work: Path, seconds: float) -> dict[str, Any]:
    """The record of one model: tensat's outcome without the end-to-end check, and the kernels before and after."""
    del work, seconds  # nothing is timed end to end, and the models stay in memory
    start = time.perf_counter()
    result = tensat.optimize_with_details(str(src), latency_check=0)
    elapsed = time.perf_counter() - start
    written = set(n.op_type for n in onnx.load(str(src), load_external_data=False).graph.node)
    before, after = runtime_kernels(str(src)), runtime_kernels(result.output)
    catalogued = {t for types in ops.KERNELS.values() for t in types}
    fused = ({k for k in before if k not in written} | ALWAYS_FUSED) - catalogued
    lost = {k: n for k in sorted(fused) if (n := before[k] - after[k]) > 0}
    changed = {k: [before[k], after[k]] for k in sorted(set(before) | set(after)) if before[k] != after[k]}
    return {
        "model": name,
        "returned_input": result.returned_input is not None,
        "rules": result.rules,
        "seconds": elapsed,
        "kernels": [sum(before.values()), sum(after.values())],
        # the kernels of the graph tensat wrote (none where it returned the input: nothing of it is tensat's choice)
        "chosen": None if result.returned_input else check_kernels(result.output).to_dict(),
        "fused": {k: [before[k], after[k]] for k in sorted(fused) if before[k] or after[k]},
        "lost": lost,
        "changed": changed,
    }


def summary(records: Sequence[dict[str, Any]]) -> dict[str, Any]:
    return {
        "models": len(records),
        "optimized": sum(not r["returned_input"] for r in records),
        "losing_a_fusion": [r["model"] for r in records if r["lost"]],
        "kernels_not_run_as_chosen": [r["model"] for r in records if r["chosen"] and not r["chosen"]["match"]],
    }


def _counts(pairs: dict[str, list[int]]) -> str:
    return ", ".join(f"{k} {a} -> {b}" for k, (a, b) in pairs.items()) or "none"


def markdown(records: Sequence[dict[str, Any]], info: dict[str, Any]) -> str:
    s = summary(records)
    lines = [
        "# What onnxruntime fuses, before and after tensat",
        "",
        header(info),
        "",
        "Each model optimized with default settings but no end-to-end check (`latency_check=0`): the graph the cost"
        " model chose. Kernels are counted in onnxruntime's CPU session at the extended level. See"
        " `bench/fusion_report.py`.",
        "",
        "| model | returned | kernels before -> after | kernels chosen | kernels run = chosen | other fused kernels |"
        " fused kinds lost | other changes | rules |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in records:
        other = {k: v for k, v in r["changed"].items() if k not in r["fused"]}
        rules = ", ".join(f"{k} x{v}" for k, v in r["rules"].items()) or "none"
        chosen = r["chosen"]
        if chosen is None:
            written, run = "the input's", "—"
        else:
            written = ", ".join(f"{k} {v}" for k, v in chosen["written"].items()) or "none"
            ran = ", ".join(f"{k} {v}" for k, v in chosen["run"].items()) or "none"
            run = "yes" if chosen["match"] else f"no: runs {ran}"
        lines.append(
            f"| {r['model']} | {'input' if r['returned_input'] else 'optimized'} | {r['kernels'][0]} -> "
            f"{r['kernels'][1]} | {written} | {run} | {_counts(r['fused'])} | "
            f"{', '.join(f'{k} -{v}' for k, v in r['lost'].items()) or 'none'} | {_counts(other)} | {rules} |"
        )
    lines += [
        "",
        f"- {s['models']} models; tensat returned an optimized graph for {s['optimized']} of them.",
        f"- Models onnxruntime runs with other kernels than the extraction chose: "
        f"{', '.join(s['kernels_not_run_as_chosen']) or 'none'}.",
        f"- Models whose graph lost another fused kernel: {', '.join(s['losing_a_fusion']) or 'none'}.",
        "",
    ]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    return corpus_main(
        argv,
        prog="python -m bench.fusion_report",
        doc=__doc__,
        stem="fusions",
        seconds=0.0,
        run=run_model,
        summarize=summary,
        render=markdown,
    )


if __name__ == "__main__":
    raise SystemExit(main())
