"""Generated rules: what `tensat rules generate` finds and keeps, how long each step takes, how much of the
hand-written library the generated set derives, and what the search makes of each rule set.

    python -m bench.rules_generated                          # -> bench/results/rules_generated.md and .json
    python -m bench.rules_generated --runs 3:OPS 4:OPS ...   # which generations to run (max ops : op list)
    python -m bench.rules_generated --render                 # rewrite the markdown from the JSON

For each generation (`--runs`; by default the default ops at 3 operators, a run at 4 operators over a smaller op set,
and the library's three other sets: rank-3 transposes, rank-4 pools, and convs over bias vectors) it records the
terms enumerated per size, the candidates, and what each pruning step dropped, with the time of each step, and how
many of the hand-written single-pattern rules the run's rules derive. For the library's
generated set (`tensat.rewrites.generated_rules`), it then reports:

- coverage: each hand-written single-pattern rule instantiated at a binding the verifier samples, and whether the
  generated set proves its two sides equal by equality saturation (`tensat.egraph.derive.derived`);
- use: the built-in benchmark graphs (`tensat.models`, small sizes) optimized with each rule set (`--rules hand`,
  `generated`, `all`) under the analytic cost model with no end-to-end check, the cost reached and the search time.
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench import RESULTS_DIR
from bench.machine import header, machine_info
from tensat import rewrites
from tensat.api import optimize_with_details
from tensat.egraph.derive import Prover, derived
from tensat.files import atomic_write_json, atomic_write_text
from tensat.models import SMALL_SIZES, build_model, model_names
from tensat.options import RULE_SETS, positive_int
from tensat.rewrites.dsl import Rule
from tensat.rewrites.generate import Settings, default_jobs, default_ops, generate, term_size
from tensat.rewrites.verify import bindings

# the library's rank-4 set: the pools with the ops the hand-written rules move them across, and rank-4 transposes
RANK4_OPS = (
    "maxpool", "avgpool", "globalavgpool", "relu", "sigmoid", "tanh", "add", "mul", "concat", "slice", "transpose",
    "matmul",
)  # fmt: skip
# the library's conv set: a conv with the ops the hand-written conv rules move it across, over two bias vectors
CONV_OPS = ("conv2d", "relu", "sigmoid", "tanh", "add", "concat", "slice")
DEFAULT_RUNS = (
    "3:default",
    "4:add,mul,sub,neg,relu,matmul,transpose",
    "3:transpose,matmul:3:2,3",
    f"2:{','.join(RANK4_OPS)}:4:3,4",
    f"3:{','.join(CONV_OPS)}:4:3,4:2",
)


def _settings(run: str) -> Settings:
    """A run's settings from MAX_OPS:OPS[:RANK:SIZES[:VECTORS]] (OPS `default` for the default ops)."""
    max_ops, names, *rest = run.split(":") + ["", "", ""]
    ops = None if names in ("", "default") else tuple(names.split(","))
    if rest[0]:
        rank, sizes = int(rest[0]), tuple(int(n) for n in rest[1].split(","))
        return Settings(max_ops=int(max_ops), ops=ops, rank=rank, sizes=sizes, vectors=int(rest[2] or 0))
    return Settings(max_ops=int(max_ops), ops=ops)


def generation(run: str, jobs: int = 1) -> dict[str, Any]:
    """One generation's counts and times, its candidates verified in `jobs` processes."""
    settings = _settings(run)
    result = generate(settings, Prover(), lambda m: print(f"  {m}", file=sys.stderr, flush=True), jobs)
    hand = [r for r in rewrites.all_rules() if not r.multi]
    start = time.perf_counter()
    verdicts = derived(result.rules, hand, rank=settings.rank)
    covered = time.perf_counter() - start
    not_derived = {r.name: why_not(r, settings) for r in hand if verdicts.get(r.name) != "derived"}
    return {
        "run": run,
        "max_ops": settings.max_ops,
        "rank": settings.rank,
        "sizes": list(settings.sizes),
        "vectors": settings.vectors,
        "jobs": jobs,
        "ops": list(settings.ops) if settings.ops is not None else ["default", *default_ops(settings.rank)],
        "terms": result.terms,
        "classes": result.classes,
        "candidates": result.candidates,
        "constants": result.constants,
        "renamings": result.renamings,
        "common_subterms": result.common_subterms,
        "refuted": result.refuted,
        "derived": result.derived,
        "rejected": result.rejected,
        "unsound": result.unsound,
        "not_rewrites": result.not_rewrites,
        "equations": result.equations,
        "rules": len(result.rules),
        "guarded": result.guarded,
        "multi_candidates": result.multi_candidates,
        "multi": result.multi,
        "seconds": {**result.seconds, "coverage": covered},
        "hand_derived": sum(v == "derived" for v in verdicts.values()),
        "hand_rules": len(verdicts),
        "not_derived": not_derived,
    }


def why_not(rule: Rule, settings: Settings) -> str:
    """Why a generation run does not derive a hand-written rule: an op it does not enumerate, no instance at its
    rank, a side larger than its terms; else the prover's limits (or an attribute outside the domains)."""
    enumerated = set(settings.ops) if settings.ops is not None else set(default_ops(settings.rank))
    missing = (rule.ops() | rule.produced_ops()) - enumerated
    if missing:
        return "ops not enumerated: " + ", ".join(sorted(missing))
    found = bindings(rule, seed=settings.seed, rank=settings.rank)
    ranks = {settings.rank, 1} if settings.vectors else {settings.rank}
    if not found or not {len(shape) for shape in found[0][0].values()} <= ranks:
        return f"no instance at rank {settings.rank}"
    largest = max(term_size(rule.lhs[0]), term_size(rule.rhs[0]))
    if largest > settings.max_ops:
        return f"{largest} ops on a side"
    return "not derived within the prover's limits"


def coverage() -> dict[str, Any]:
    """Which hand-written single-pattern rules the library's generated set derives."""
    hand = [r for r in rewrites.all_rules() if not r.multi]
    start = time.perf_counter()
    verdicts = derived(rewrites.generated_rules(), hand, rank=Settings().rank)
    return {"verdicts": verdicts, "seconds": time.perf_counter() - start}


def use() -> list[dict[str, Any]]:
    """The benchmark graphs optimized with each rule set (analytic costs, no end-to-end check)."""
    rows = []
    for name in model_names():
        model = build_model(name, **SMALL_SIZES.get(name, {}))
        row: dict[str, Any] = {"model": name}
        for rule_set in RULE_SETS:
            t = time.perf_counter()
            result = optimize_with_details(model, rules=rule_set, cost="analytic", latency_check=0.0)
            row[rule_set] = {
                "cost_before": result.cost_before,
                "cost_after": result.cost_after,
                "seconds": time.perf_counter() - t,
            }
        print(f"  {name}: " + ", ".join(f"{k} {row[k]['cost_after']:.4g}" for k in RULE_SETS), file=sys.stderr)
        rows.append(row)
    return rows


def markdown(data: dict[str, Any]) -> str:
    """The report."""
    lines = ["# Generated rules", "", header(data["machine"]), ""]
    lines += [
        "## Generation",
        "",
        "| run | ops | terms by size | constants left out | candidates | renamings | shared subterm | refuted "
        "| derived | rejected | not rewrites "
        "| kept (equations / rules) | multi-pattern (kept / candidates) "
        "| enumerate / prune / refute / minimize / multi (s) | hand rules derived |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for g in data["generations"]:
        ops = "default" if g["ops"][0] == "default" else ", ".join(g["ops"])
        s = g["seconds"]
        lines.append(
            f"| {_run_name(g)} | {ops} | {', '.join(map(str, g['terms']))} | {g['constants']} | {g['candidates']} "
            f"| {g['renamings']} "
            f"| {g['common_subterms']} | {g['refuted']} | {g['derived']} | {g['rejected']} | {g['not_rewrites']} "
            f"| {g['equations']} / {g['rules'] - g['multi']} | {g['multi']} / {g['multi_candidates']} "
            f"| {s['enumerate']:.1f} / {s['prune']:.1f} / {s['refute']:.1f} / {s['minimize']:.1f} / {s['multi']:.1f} "
            f"| {g['hand_derived']} of {g['hand_rules']} |"
        )
    jobs = sorted({g.get("jobs", 1) for g in data["generations"]})
    lines += [
        "",
        f"Candidates verified in {' or '.join(map(str, jobs))} processes (`--jobs`; the rules do not depend on it).",
    ]
    for g in data["generations"]:
        reasons = collections.defaultdict(list)
        for name, why in g["not_derived"].items():
            reasons[why.split(":")[0]].append(name)
        lines += ["", f"Not derived by the run of {_run_name(g)} ({g['run']}), by reason:", ""]
        for why, names in sorted(reasons.items(), key=lambda kv: -len(kv[1])):
            shown = ", ".join(sorted(names)) if why != "ops not enumerated" else _ops_missing(g["not_derived"], names)
            lines.append(f"- {why}: {len(names)} ({shown})")
    cov = data.get("coverage")
    if cov:
        counts = collections.Counter(cov["verdicts"].values())
        total = len(cov["verdicts"])
        lines += [
            "",
            "## Coverage of the hand-written single-pattern rules",
            "",
            f"{counts['derived']} of {total} derived by the generated set ({100 * counts['derived'] / total:.0f}%); "
            f"{counts['not derived']} not derived; {counts['not instantiated']} not instantiated by the verifier "
            f"({cov['seconds']:.0f} s).",
            "",
            "Not derived: " + ", ".join(sorted(n for n, v in cov["verdicts"].items() if v != "derived")) + ".",
        ]
    rows = data.get("use")
    if rows:
        lines += [
            "",
            "## Use: the benchmark graphs (analytic cost, ms)",
            "",
            "| model | before | " + " | ".join(f"{k} (cost / s)" for k in RULE_SETS) + " |",
            "|---|---|" + "---|" * len(RULE_SETS),
        ]
        for r in rows:
            cells = [f"{r[k]['cost_after']:.4g} / {r[k]['seconds']:.1f}" for k in RULE_SETS]
            lines.append(f"| {r['model']} | {r['hand']['cost_before']:.4g} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _run_name(g: dict[str, Any]) -> str:
    """A generation's name in the report: its operators per term, and its leaves' rank and sizes where not the
    default, and its vectors where it has some."""
    default = Settings()
    if g.get("rank", default.rank) == default.rank:
        return f"{g['max_ops']} ops"
    vectors = f", {g['vectors']} vectors" if g.get("vectors") else ""
    return f"{g['max_ops']} ops, rank {g['rank']}, sizes {', '.join(map(str, g['sizes']))}{vectors}"


def _ops_missing(reasons: dict[str, str], names: list[str]) -> str:
    """The ops that keep `names` out of a run, each with how many rules it keeps out."""
    counts = collections.Counter(op for n in names for op in reasons[n].split(": ")[1].split(", "))
    return ", ".join(f"{op} {k}" for op, k in counts.most_common())


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.rules_generated", description=(__doc__ or "").split("\n\n")[0])
    p.add_argument(
        "--runs",
        nargs="*",
        default=list(DEFAULT_RUNS),
        help="generations as MAX_OPS:OPS[:RANK:SIZES[:VECTORS]] (default: %(default)s)",
    )
    p.add_argument(
        "--jobs",
        type=positive_int,
        default=default_jobs(),
        help="processes verifying a generation's candidates, as `tensat rules generate --jobs` (default: the cores)",
    )
    p.add_argument("--no-use", action="store_true", help="skip the benchmark graphs")
    p.add_argument("--out-dir", type=Path, default=RESULTS_DIR)
    p.add_argument("--render", action="store_true", help="rewrite the markdown from the JSON only")
    args = p.parse_args(argv)
    json_path, md_path = args.out_dir / "rules_generated.json", args.out_dir / "rules_generated.md"
    if args.render:
        atomic_write_text(md_path, markdown(json.loads(json_path.read_text(encoding="utf-8"))))
        return 0
    data: dict[str, Any] = {"machine": machine_info(), "generations": []}
    for run in args.runs:
        print(f"[generate {run}]", file=sys.stderr, flush=True)
        data["generations"].append(generation(run, args.jobs))
    if rewrites.generated_rules():
        print("[coverage]", file=sys.stderr, flush=True)
        data["coverage"] = coverage()
        if not args.no_use:
            print("[use]", file=sys.stderr, flush=True)
            data["use"] = use()
    atomic_write_json(json_path, data)
    atomic_write_text(md_path, markdown(data))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
