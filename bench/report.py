"""`python -m bench`: the benchmark report of tensat on the paper's graphs.

For each chosen benchmark graph it runs the Table-1-style comparison of a TASO-style sequential search against
tensat (`tensat.compare`) and the e-graph growth at k_multi 0, 1 and 2 through the full pipeline
(`bench.explore`), then writes to bench/results (or --out-dir):

- report.md: the machine (CPU model, cores, GPUs), the versions of tensat, egglog, onnxruntime, PuLP and HiGHS,
  the Table-1-style table, the k_multi table and the growth figures;
- growth.png (e-nodes per iteration, one panel per graph) and growth_<graph>.png (e-nodes and e-classes);
- report.json (everything above as data), and the detailed compare.md/.json and exploration.md/.json.

Bad input (an unknown graph, an output directory that cannot be written) is reported before anything runs, and
nothing is written until every run has finished; each file is written atomically.
"""

from __future__ import annotations

import argparse
import io
import os
import sys
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench import RESULTS_DIR
from bench.explore import markdown as explore_markdown
from bench.explore import run_one
from bench.explore import table as explore_table
from bench.machine import header, machine_info
from tensat import compare
from tensat.cli_args import Parser
from tensat.compare import Settings, summary, table
from tensat.errors import TensatError, one_line
from tensat.files import WriteError, atomic_write_bytes, atomic_write_json, atomic_write_text
from tensat.models import SMALL_SIZES, build_model, model_names
from tensat.options import Options

K_MULTI = (0, 1, 2)
EXPLORE_OPTIONS: dict[str, Any] = {
    name: getattr(Options, name)  # tensat's defaults, recorded with the runs
    for name in ("node_limit", "time_limit", "ilp_time_limit")
}
QUICK_TENSAT: dict[str, Any] = {"time_limit": 20.0, "ilp_time_limit": 10.0}
QUICK_BUDGET = 20

Progress = Callable[[str], None]


@dataclass(frozen=True)
class Plan:
    """What one `python -m bench` run does."""

    models: list[str]
    out_dir: Path
    small: bool = False
    quick: bool = False
    progress: Progress | None = field(default=None, compare=False)

    def command(self) -> str:
        """The command line that reproduces this run (output directory left out)."""
        parts = ["python -m bench"]
        if self.models != model_names():
            parts.append(f"--models {','.join(self.models)}")
        if self.small:
            parts.append("--small")
        if self.quick:
            parts.append("--quick")
        return " ".join(parts)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of `python -m bench`."""
    parser.add_argument(
        "--models",
        metavar="A,B,...",
        default=None,
        help="comma-separated benchmark graphs (default: all; see `tensat models`)",
    )
    parser.add_argument(
        "--out-dir",
        metavar="DIR",
        default=None,
        help="where report.md, the PNGs and the JSON go (default bench/results)",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help=f"a quick look: no latency timing, sequential budget {QUICK_BUDGET} expansions, "
        f"tensat exploration {QUICK_TENSAT['time_limit']:g} s and ILP "
        f"{QUICK_TENSAT['ilp_time_limit']:g} s",
    )
    parser.add_argument(
        "--small", action="store_true", help="small versions of the graphs (same structure, the sizes the tests use)"
    )
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress messages")


def parse_models(text: str | None) -> list[str]:
    """The graphs named in a comma-separated list (all of them for None); TensatError on an unknown name."""
    if text is None:
        return model_names()
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names:
        raise TensatError("--models names no graph; valid names: " + ", ".join(model_names()))
    for name in names:
        if name not in model_names():
            raise TensatError(f"unknown model {name!r}; valid names: {', '.join(model_names())}")
    return list(dict.fromkeys(names))


def check_out_dir(path: str | os.PathLike[str]) -> Path:
    """`path` if it is, or can be made, a writable directory; TensatError otherwise (nothing is created)."""
    out = Path(path).expanduser()
    probe = out
    while not probe.exists():
        if probe.parent == probe:
            break
        probe = probe.parent
    if not probe.is_dir():
        what = "is not a directory" if probe == out else f"cannot be created: {probe} is not a directory"
        raise TensatError(f"output directory {out} {what}")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise TensatError(f"output directory {out} is not writable (permission denied on {probe})")
    return out


def compare_settings(quick: bool) -> Any:
    """The comparison's settings: `tensat compare`'s defaults, or the quick ones."""
    if quick:
        return Settings(budget=QUICK_BUDGET, tensat=dict(QUICK_TENSAT), latency=False)
    return Settings()


def explore_options(quick: bool) -> dict[str, Any]:
    """The options of the k_multi runs (limits of `bench.explore`, shorter when quick)."""
    return {**EXPLORE_OPTIONS, **(QUICK_TENSAT if quick else {})}


def growth_series(record: Mapping[str, Any]) -> tuple[list[int], list[int], list[int]]:
    """Iterations (0 = the input graph), e-nodes and e-classes after each, from a `bench.explore.run_one` record."""
    initial = record.get("initial")
    points = ([tuple(initial)] if initial else []) + [tuple(g[:2]) for g in record["growth"]]
    start = 0 if initial else 1
    return (list(range(start, start + len(points))), [int(p[0]) for p in points], [int(p[1]) for p in points])


def _png(fig: Any) -> bytes:
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    buf = io.BytesIO()
    FigureCanvasAgg(fig).print_png(buf)
    return buf.getvalue()


def _plot_growth(ax: Any, records: Sequence[Mapping[str, Any]], column: int, node_limit: int | None) -> None:
    for rec in records:
        series = growth_series(rec)
        ax.plot(series[0], series[column], marker="o", markersize=3, label=f"k_multi={rec['k_multi']}")
    if node_limit is not None:
        ax.axhline(node_limit, color="grey", ls="--", lw=1)
    ax.set_yscale("log")
    ax.set_xlabel("iteration")
    ax.grid(alpha=0.3)


def growth_figure(name: str, records: Sequence[Mapping[str, Any]], node_limit: int | None = None) -> bytes:
    """PNG: e-nodes and e-classes per iteration of one graph, a line per k_multi."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(10, 3.6))
    axes = fig.subplots(1, 2)
    _plot_growth(axes[0], records, 1, node_limit)
    _plot_growth(axes[1], records, 2, None)
    axes[0].set_ylabel("e-nodes")
    axes[1].set_ylabel("e-classes")
    axes[0].legend(fontsize=8)
    fig.suptitle(f"{name}: e-graph growth")
    fig.tight_layout()
    return _png(fig)


def overview_figure(by_graph: Mapping[str, Sequence[Mapping[str, Any]]], node_limit: int | None = None) -> bytes:
    """PNG: e-nodes per iteration for every graph (a panel each), a line per k_multi."""
    from matplotlib.figure import Figure

    cols = min(4, max(1, len(by_graph)))
    rows = -(-len(by_graph) // cols)
    fig = Figure(figsize=(3.4 * cols, 2.9 * rows))
    axes = fig.subplots(rows, cols, squeeze=False)
    for ax, (name, records) in zip(axes.flat, by_graph.items()):
        _plot_growth(ax, records, 1, node_limit)
        ax.set_title(name, fontsize=10)
        ax.set_ylabel("e-nodes")
    for ax in list(axes.flat)[len(by_graph) :]:
        ax.set_visible(False)
    axes.flat[0].legend(fontsize=7)
    fig.suptitle("E-graph growth: e-nodes per iteration (dashed: node limit)")
    fig.tight_layout()
    return _png(fig)


def versions_line(machine: Mapping[str, Any]) -> str:
    """tensat, egglog, onnxruntime, PuLP and HiGHS versions, one line."""
    v = machine["versions"]
    ort = (
        f"onnxruntime-gpu {v['onnxruntime-gpu']}"
        if "onnxruntime-gpu" in v
        else f"onnxruntime {v.get('onnxruntime', 'not installed')}"
    )
    return (
        f"Versions: tensat {v.get('tensat', '?')}, egglog {v.get('egglog', '?')}, {ort}, "
        f"PuLP {v.get('pulp', '?')}, HiGHS {machine.get('highs', '?')} (highspy {v.get('highspy', '?')})."
    )


def _ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.3g}"


def report_markdown(
    plan: Plan,
    rows: Sequence[Any],
    records: Sequence[Mapping[str, Any]],
    settings: Any,
    options: Mapping[str, Any],
    machine: Mapping[str, Any],
    figures: Mapping[str, str],
) -> str:
    """report.md: machine and versions, the Table-1-style table, the k_multi table and the growth figures."""
    s = summary(rows)
    tensat_opts = ", ".join(f"{k}={v}" for k, v in sorted(settings.tensat.items())) or "tensat's defaults"
    latency = (
        f"median of up to {settings.latency_runs} interleaved runs in onnxruntime (CPU, 1 thread; "
        "speedup = original / optimized)"
        if settings.latency
        else "not measured (--quick)"
    )
    sizes = "small versions, --small" if plan.small else "full size"
    out = [
        "# tensat benchmark report",
        "",
        header(dict(machine)),
        "",
        versions_line(machine),
        "",
        f"Command: `{plan.command()}`. Graphs: {', '.join(plan.models)} ({sizes}).",
        "",
        "## Sequential search vs equality saturation (Table 1 of the paper)",
        "",
        f"Analytic cost model (summed per-operator cost in ms); the same rule set on both sides. Sequential: "
        f"TASO-style best-first search, alpha {settings.alpha:g}, budget {settings.budget} expansions. tensat: "
        f"{tensat_opts}. Search time: the whole sequential loop against tensat's exploration + cycle filtering + "
        f"extraction. Time to a cost: when a search's best graph first cost at most the other search's final "
        f"graph (search costs: the summed cost each search minimizes; tensat's from the extraction's improvements "
        f"after exploration). Latency: {latency}. Details per graph: [compare.md](compare.md).",
        "",
        table(rows),
        "",
        f"- tensat cost <= sequential cost on {s['tensat_at_most_sequential']} of {s['graphs']} graphs"
        + (f" (not on: {', '.join(s['worse_on'])})" if s["worse_on"] else "")
        + ".",
        f"- Geometric-mean search-time ratio (sequential / tensat): {_ratio(s['geomean_time_ratio'])} (paper: "
        f"{s['paper_time_ratio']:g}); including e-graph building and pricing: "
        f"{_ratio(s['geomean_time_ratio_with_overhead'])}.",
        f"- Both optimized graphs verified in onnxruntime on {s['verified']} of {s['graphs']} graphs.",
        "",
        "## E-graph growth with k_multi = 0, 1, 2",
        "",
        f"The full pipeline (exploration, cycle filtering, ILP extraction, verification) once per k_multi, the "
        f"number of first iterations in which multi-pattern rules run; "
        f"{', '.join(f'{k}={v}' for k, v in options.items())}. Details: [exploration.md](exploration.md); "
        "all data: [report.json](report.json).",
        "",
        f"![e-nodes per iteration, every graph]({figures['overview']})",
        "",
        explore_table(list(records)),
        "",
    ]
    for name in plan.models:
        out += [f"![{name}: e-nodes and e-classes per iteration]({figures[name]})", ""]
    return "\n".join(out)


def _say(progress: Progress | None, message: str) -> None:
    if progress is not None:
        progress(message)


def run_plan(plan: Plan) -> dict[str, Any]:
    """Run the comparison and the k_multi runs for every graph of `plan` and write the outputs; returns the
    report's data (as in report.json)."""
    settings = compare_settings(plan.quick)
    options = explore_options(plan.quick)
    rows, records = [], []
    for i, name in enumerate(plan.models, 1):
        _say(plan.progress, f"[{name}] graph {i} of {len(plan.models)}")
        model = build_model(name, **(SMALL_SIZES[name] if plan.small else {}))
        rows.append(compare.compare_model(model, name, settings, plan.progress))
        for k in K_MULTI:
            _say(plan.progress, f"[{name}] k_multi={k}: exploring, extracting, verifying")
            rec = {"graph": name, **run_one(model, k, **options)}
            records.append(rec)
            _say(
                plan.progress,
                f"[{name}] k_multi={k}: {rec['enodes']} e-nodes, {rec['eclasses']} e-classes after "
                f"{rec['iterations']} iterations ({rec['stop_reason']}); cost {rec['cost_before']:.3f}"
                f" -> {rec['cost_after']:.3f} ms; {rec['total_s']:.1f} s",
            )
    machine = machine_info()
    by_graph = {n: [r for r in records if r["graph"] == n] for n in plan.models}
    figures = {"overview": "growth.png", **{n: f"growth_{n}.png" for n in plan.models}}
    pngs = {figures["overview"]: overview_figure(by_graph, options["node_limit"])}
    pngs.update({figures[n]: growth_figure(n, by_graph[n], options["node_limit"]) for n in plan.models})
    compare_doc = compare.report(rows, settings, machine)
    exploration_doc = {"machine": machine, "options": options, "results": records}
    doc = {
        "machine": machine,
        "command": plan.command(),
        "models": plan.models,
        "small": plan.small,
        "quick": plan.quick,
        "k_multi": list(K_MULTI),
        "compare": compare_doc,
        "exploration": exploration_doc,
        "figures": figures,
    }
    texts = {
        "compare.md": compare.markdown(rows, settings, machine),
        "exploration.md": explore_markdown(records, machine, options),
        "report.md": report_markdown(plan, rows, records, settings, options, machine, figures),
    }
    _write_outputs(
        plan.out_dir,
        pngs,
        {"compare.json": compare_doc, "exploration.json": exploration_doc, "report.json": doc},
        texts,
    )
    _say(plan.progress, f"wrote {plan.out_dir / 'report.md'}, {len(pngs)} PNGs and the JSON data")
    doc["table"] = compare.table(rows)
    doc["verified"] = all(r.verified for r in rows) and all(r["verified"] for r in records)
    return doc


def _write_outputs(out_dir: Path, pngs: Mapping[str, bytes], docs: Mapping[str, Any], texts: Mapping[str, str]) -> None:
    """Every output file, each atomically; report.md last, so it only exists once what it links to does."""
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise WriteError(f"cannot create {out_dir}: {exc.strerror or exc}") from None
    for name, data in pngs.items():
        atomic_write_bytes(out_dir / name, data)
    for name, doc in docs.items():
        atomic_write_json(out_dir / name, doc)
    for name in sorted(texts, key=lambda n: n == "report.md"):
        atomic_write_text(out_dir / name, texts[name] if texts[name].endswith("\n") else texts[name] + "\n")


def run(args: argparse.Namespace) -> int:
    """Run the report of `args`: 0 when every optimized graph verified, else 1 (the report is written either way)."""
    models = parse_models(args.models)
    out_dir = check_out_dir(args.out_dir if args.out_dir else RESULTS_DIR)

    def say(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    plan = Plan(models, out_dir, small=args.small, quick=args.quick, progress=None if args.quiet else say)
    doc = run_plan(plan)
    print(doc["table"])
    if not doc["verified"]:
        print("tensat: error: some optimized graphs failed verification; see report.md", file=sys.stderr)
        return 1
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m bench`: 0 when every optimized graph verified, 1 on a failure or bad input (one line on stderr), 2 on
    bad usage; in the error style of the `tensat` command."""
    parser = Parser(
        prog="python -m bench",
        description="Run the sequential-search comparison and the e-graph growth "
        "at k_multi 0, 1, 2 on the benchmark graphs; write report.md, PNG plots and JSON to bench/results.",
    )
    add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            return run(args)
    except TensatError as exc:
        print(f"tensat: error: {one_line(exc)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("tensat: interrupted", file=sys.stderr)
        return 130
