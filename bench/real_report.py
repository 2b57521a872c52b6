"""The real-model report: tensat against its input, onnxsim and onnxslim on every model of the corpus.

    python -m bench.real_report                     # every corpus model -> bench/results/real_models.md and .json
    python -m bench.real_report --only bert,gpt2    # a subset
    python -m bench.real_report --render            # rewrite the markdown from the JSON

The corpus is what `python -m bench.real_models export` wrote (PyTorch exports of transformers and torch models)
plus the hand-built model-zoo-style files of `bench.zoo_models`, saved beside them. For each model:

- tensat runs as a user runs it, `tensat optimize MODEL -o OUT` with default settings, in a fresh process: once
  with an empty cost cache (the first run on a machine) and once more with the cache the first run filled;
- onnxsim and onnxslim simplify the same file (what a user would pick instead);
- the input and the three results are then timed end to end in onnxruntime, interleaved block by block, at one
  intra-op thread and at every core: each speedup is the median over pairs of blocks of (input / result), with a
  95% bootstrap interval (`tensat.latency.compare_many`). Each model runs in `SESSIONS` sessions of its own,
  taking turns: sessions of one model run at speeds that differ with where their memory lies, by more at every
  core than at one thread, and a figure from one session of each model would partly be that draw. A result with
  the input's own nodes and weights (tensat returning the input) is 1.0 by construction and not timed: two sessions
  of one model differing is the resolution of every other figure;
- the model tensat returned is priced afresh and timed end to end under the same load (`same_load`), once in its
  row and again in rounds over every model after the last row (`SAME_LOAD_CHECKS`): its predicted cost over its
  time is the median of those checks.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import onnx

from bench import zoo_models
from bench.machine import header, machine_info
from bench.real_models import DEFAULT_OUT as CORPUS
from bench.real_models import MANIFEST
from tensat.api import check_threads
from tensat.cost_report import cost_report, load_graph
from tensat.errors import TensatError, one_line
from tensat.files import atomic_write_json, atomic_write_text, check_writable
from tensat.latency import compare_many
from tensat.measure import DEFAULT_OUTPUTS, default_clock, make_measured_cost
from tensat.onnx.fusions import check_kernels
from tensat.onnx_io import import_model
from tensat.session import make_session

RESULTS = Path(__file__).resolve().parent / "results"
PEERS = ("onnxsim", "onnxslim", "ort_transformers")
# onnxruntime's transformer optimizer (`onnxruntime.transformers.optimizer.optimize_model`) by its model type, for
# the corpus models of a family it supports (by the name's first part); the others it is not run on
TRANSFORMER_TYPES = {
    "bert": "bert",
    "albert": "bert",
    "gpt2": "gpt2",
    "vit": "vit",
    "t5": "t5",
    "swin": "swin",
    "clip": "clip",
    "bart": "bart",
}


def transformer_type(name: str) -> str | None:
    """The model type onnxruntime's transformer optimizer takes for corpus model `name`, or None."""
    return TRANSFORMER_TYPES.get(name.split("_")[0])


OPTIMIZE_TIMEOUT = 600.0


def corpus_models(corpus: Path) -> dict[str, Path]:
    """Every model file of the corpus: the PyTorch exports of the manifest, then the zoo-style files (written here
    from `bench.zoo_models` when missing)."""
    models: dict[str, Path] = {}
    manifest = corpus / MANIFEST
    if manifest.exists():
        for rec in json.loads(manifest.read_text(encoding="utf-8"))["models"]:
            path = corpus / f"{rec['name']}.onnx"
            if path.exists():
                models[rec["name"]] = path
    for name in zoo_models.zoo_names(whole=True):
        path = corpus / f"zoo_{name}.onnx"
        if not path.exists():
            onnx.save(zoo_models.build_zoo_model(name), str(path))
        models[f"zoo_{name}"] = path
    return models


def _run_tensat(
    src: Path,
    out: Path,
    cache_dir: Path,
    flags: Sequence[str] = (),
    tensat: Sequence[str] = (sys.executable, "-m", "tensat"),
) -> dict[str, Any]:
    """`tensat optimize SRC -o OUT --stats` (and `flags`) in a fresh process with `cache_dir` as the cost cache;
    `tensat` is the command that runs tensat (default: the installed package)."""
    stats = out.with_suffix(".stats.json")
    env = dict(os.environ, TENSAT_CACHE_DIR=str(cache_dir))
    t = time.perf_counter()
    proc = subprocess.run(
        [*tensat, "optimize", str(src), "-o", str(out), "--stats", str(stats), "-q", *flags],
        capture_output=True,
        text=True,
        env=env,
        timeout=OPTIMIZE_TIMEOUT,
    )
    seconds = time.perf_counter() - t
    if proc.returncode != 0:
        lines = [line for line in proc.stderr.splitlines() if line.strip()]
        return {"ok": False, "seconds": seconds, "error": lines[-1] if lines else f"exit {proc.returncode}"}
    data = json.loads(stats.read_text(encoding="utf-8"))
    measurement = data.get("measurement") or {}
    if measurement.get("cache"):  # a temporary directory of this machine: only the file's place in the cache dir
        measurement["cache"] = os.path.relpath(measurement["cache"], cache_dir)
    return {"ok": True, "seconds": seconds, "stats": data}


def _run_peer(peer: str, src: Path, out: Path) -> dict[str, Any]:
    """Simplify `src` with onnxsim or onnxslim as their Python APIs do by default, or optimize it with onnxruntime's
    transformer optimizer for its model type (`transformer_type`); the result is saved, and it fails unless
    onnxruntime loads it."""
    t = time.perf_counter()
    if peer == "ort_transformers" and transformer_type(src.stem) is None:
        return {"ok": False, "seconds": 0.0, "error": "not a model type it supports", "unsupported": True}
    try:
        _peer_output(peer, src, out)
        seconds = time.perf_counter() - t
        make_session(out, "cpu")
    except Exception as exc:  # noqa: BLE001 - a peer failing, or writing what onnxruntime refuses, is a result
        return {"ok": False, "seconds": time.perf_counter() - t, "error": f"{type(exc).__name__}: {exc}"[:300]}
    return {"ok": True, "seconds": seconds, "ops": len(onnx.load(str(out), load_external_data=False).graph.node)}


def _peer_output(peer: str, src: Path, out: Path) -> None:
    """Write `peer`'s result for `src` to `out`."""
    if peer == "ort_transformers":
        from onnxruntime.transformers.optimizer import optimize_model

        optimize_model(str(src), model_type=transformer_type(src.stem)).save_model_to_file(str(out))
        return
    model = onnx.load(str(src))
    if peer == "onnxsim":
        import onnxsim

        result, ok = onnxsim.simplify(model)
        if not ok:
            raise RuntimeError("onnxsim's own check failed")
    else:
        import onnxslim

        result = onnxslim.slim(model)
    onnx.save(result, str(out))


def same_computation(a: Path, b: Path) -> bool:
    """Whether two model files hold the same nodes and weights (the input returned as it was given): timing them
    against each other measures only how two sessions of one model differ."""
    ma, mb = (onnx.load(str(p)) for p in (a, b))
    nodes = [[n.SerializeToString() for n in m.graph.node] for m in (ma, mb)]
    weights = [{t.name: t.SerializeToString() for t in m.graph.initializer} for m in (ma, mb)]
    return nodes[0] == nodes[1] and weights[0] == weights[1]


SESSIONS = 3  # sessions of each model timed in turns (`tensat.latency.Interleaved`)
# timing windows of each unit in the same-load check: a 2 ms transformer's check lasts seconds, and with three windows
# its ratio moved from one check to the next by more than its end-to-end interval
SAME_LOAD_WINDOWS = 5
# same-load checks of each model: one in its row, the others in rounds over every model after the last row, so that a
# model's checks lie many minutes apart; a check lasts seconds, and the load of a shared machine moves the two
# figures unequally (three checks of Llama's graph within an hour gave 0.999x, 1.112x and 1.084x): a model's ratio is
# the median of its checks, shown with their range
SAME_LOAD_CHECKS = 3


def _speedups(src: Path, results: dict[str, Path], seconds: float) -> dict[str, dict[str, Any]]:
    """Each result timed against the input at one thread and at every core (see the module docstring); a result
    that is the input itself is reported as 1.0 without timing."""
    threads_all = check_threads()
    out: dict[str, dict[str, Any]] = {name: {} for name in results}
    for name in [n for n, path in results.items() if same_computation(src, path)]:
        for threads in threads_all:
            out[name][f"threads={threads}"] = {"speedup": 1.0, "interval": [1.0, 1.0], "same_model": True}
    names = [n for n in results if not out[n]]
    for threads in threads_all if names else []:
        comparisons = compare_many(
            src,
            [results[n] for n in names],
            threads=threads,
            clock=default_clock("cpu", threads),
            max_seconds=seconds,
            pairs=60,
            copies=SESSIONS,
        )
        for name, c in zip(names, comparisons):
            out[name][f"threads={threads}"] = {
                "speedup": c.speedup,
                "interval": list(c.interval),
                "baseline_ms": c.baseline_ms,
                "ms": c.candidate_ms,
                "pairs": c.pairs,
            }
    return out


def run_model(name: str, src: Path, work: Path, seconds: float) -> dict[str, Any]:
    """Every figure of one model's row."""
    rec: dict[str, Any] = {"model": name, "ops_before": len(onnx.load(str(src), load_external_data=False).graph.node)}
    try:
        import_model(str(src))
        rec["import"] = "ok"
    except TensatError as exc:
        rec["import"] = str(exc)
    cache = work / f"{name}.cache"
    cache.mkdir()
    out = tensat_output(work, name)
    rec["tensat_first"] = _run_tensat(src, out, cache)
    rec["tensat_warm"] = _run_tensat(src, work / f"{name}.tensat2.onnx", cache)
    results: dict[str, Path] = {}
    if rec["tensat_first"]["ok"]:
        stats = rec["tensat_first"]["stats"]
        rec["ops_after"] = len(onnx.load(str(out), load_external_data=False).graph.node)
        rec["predicted"] = stats["speedup"]
        rec["warnings"] = stats["warnings"]
        if not stats.get("returned_input"):  # the kernels of the graph tensat wrote (the input's are not its choice)
            rec["kernels"] = check_kernels(onnx.load(str(out))).to_dict()
        results["tensat"] = out
        rec["same_load"] = same_load_checks([same_load(out)])
    for peer in PEERS:
        path = work / f"{name}.{peer}.onnx"
        rec[peer] = _run_peer(peer, src, path)
        if rec[peer]["ok"]:
            results[peer] = path
    rec["latency"] = _speedups(src, results, seconds) if results else {}
    return rec


def same_load(path: Path, outputs: str = DEFAULT_OUTPUTS) -> dict[str, Any]:
    """The model's kernels priced afresh on an empty cost cache, between its end-to-end runs at one thread
    (`tensat.cost_report.cost_report`, reading the model as `tensat optimize` reads its input; each unit in
    `SAME_LOAD_WINDOWS` windows; the model in `SESSIONS` sessions, as its speedups are timed): the predicted cost
    and the end-to-end time taken under the same load. The prediction of the optimizing process and a time taken
    minutes later in another process differ by the shared machine's drift as well; this is the cost model's own
    error. A model it cannot price gets the error instead. `outputs`: where the units without weights find
    their output buffers (`MeasuredCost.outputs`)."""
    try:
        with tempfile.TemporaryDirectory(prefix="tensat-same-load-") as cache:
            cost = make_measured_cost("cpu", Path(cache) / "costs.sqlite3", progress=False, threads=1, outputs=outputs)
            report = cost_report(
                load_graph(path), cost, name=path.stem, per_node=False, sessions=SESSIONS, windows=SAME_LOAD_WINDOWS
            )
            row = report.rows[0]
    except Exception as exc:  # noqa: BLE001 - one model's failure is its row's, not the report's
        return {"error": one_line(exc, typed=True)}
    return {"predicted_ms": row.summed_ms, "run_ms": row.e2e_ms, "ratio": row.summed_ms / row.e2e_ms}


def tensat_output(work: Path, name: str) -> Path:
    """Where a report's run writes the model tensat returned for corpus model `name`."""
    return work / f"{name}.tensat.onnx"


def same_load_checks(checks: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """A model's same-load figures from its checks (`same_load`): the medians of the predicted cost, of the time
    and of their ratio over the checks that measured, and every check; the last error where none did."""
    done = [c for c in checks if "ratio" in c]
    if not done:
        return {"error": checks[-1]["error"], "checks": list(checks)}
    med = {key: statistics.median(c[key] for c in done) for key in ("predicted_ms", "run_ms", "ratio")}
    return {**med, "checks": list(checks)}


def more_same_load_checks(records: list[dict[str, Any]], work: Path) -> None:
    """The rounds of same-load checks after the last row (`SAME_LOAD_CHECKS`): each model returned by tensat
    checked once more a round, in the order of the rows."""
    for k in range(SAME_LOAD_CHECKS - 1):
        print(f"[same-load checks, round {k + 2} of {SAME_LOAD_CHECKS}]", file=sys.stderr, flush=True)
        for rec in records:
            out = tensat_output(work, rec["model"])
            if "same_load" in rec and out.exists():
                rec["same_load"] = same_load_checks([*rec["same_load"]["checks"], same_load(out)])


def kept_input(rec: dict[str, Any]) -> bool:
    """Whether tensat returned the input model itself (its end-to-end check or verification kept it)."""
    return any(lat.get("same_model") for lat in rec.get("latency", {}).get("tensat", {}).values())


def changes(rec: dict[str, Any]) -> str:
    """What tensat did to one model, in words: whether its optimized graph was returned, the rules behind the
    extracted graph's changes (read back from the e-graph, each with how many changes it explains), and the
    pre-pass's own changes, counted in ONNX nodes (the rules' changes are read against the graph the pre-pass
    wrote). A graph with none is the input as tensat reads and writes it (an exporter's shape arithmetic folded,
    Dropout and Identity gone)."""
    first = rec["tensat_first"]
    if not first["ok"]:
        return f"{rec['model']}: not optimized ({first['error'][:80]})"
    stats = first["stats"]
    rules = ", ".join(f"{name} x{n}" for name, n in stats.get("rules", {}).items())
    parts = [f"rules {rules}"] if rules else []
    if stats.get("pre_passed") and stats["onnx_nodes_read"] != stats["onnx_nodes_before"]:
        parts.append(
            f"the {stats['options']['pre_pass']} pre-pass ({stats['onnx_nodes_before']} -> "
            f"{stats['onnx_nodes_read']} ONNX nodes read)"
        )
    found = "; ".join(parts) or "no rule's change: the input as tensat writes it"
    merged = stats.get("with_merges")
    if merged and not stats.get("returned_input"):
        merges = ", ".join(f"{name} x{n}" for name, n in merged["rules"].items())
        found += f"; searched again without multi-pattern rules, a first graph with {merges} not timed faster"
    if kept_input(rec) or stats.get("returned_input"):
        return f"{rec['model']}: the input returned ({stats.get('returned_input')}); the extracted graph: {found}"
    return f"{rec['model']}: the optimized graph returned; {found}"


def explained(rec: dict[str, Any]) -> str:
    """Whether the rules explain the change of a model returned changed: "yes" where every change of the graph
    returned is a rule's (the onnxslim pre-pass's canonical form aside), "no" where one is not, "—" for a model
    returned as given."""
    first = rec["tensat_first"]
    if not first["ok"] or kept_input(rec) or first["stats"].get("returned_input"):
        return "—"
    rules = first["stats"].get("rules", {})
    if not rules:
        return "pre-pass only" if first["stats"].get("pre_passed") else "no"
    return "no" if "(unexplained)" in rules else "yes"


def predicted_ratio(rec: dict[str, Any]) -> float | None:
    """The returned model's price under the measured cost model (the sum of its kernels' measured costs) over its
    end-to-end time at one thread, both taken under the same load (`same_load`; the median of its checks), or None
    where either is unknown."""
    return rec.get("same_load", {}).get("ratio")


def check_ratios(rec: dict[str, Any]) -> list[float]:
    """The ratio of each same-load check of a model (`same_load_checks`), in the order taken."""
    return [c["ratio"] for c in rec.get("same_load", {}).get("checks", []) if "ratio" in c]


def _same_load_cell(rec: dict[str, Any]) -> str:
    ratio, each = predicted_ratio(rec), check_ratios(rec)
    if ratio is None:
        return "—"
    return f"{ratio:.2f} ({min(each):.2f}-{max(each):.2f})" if len(each) > 1 else f"{ratio:.2f}"


def optimize_ratio(rec: dict[str, Any]) -> float | None:
    """The returned model's price as the optimizing process measured it over its end-to-end time at one thread as
    the report timed it later, or None where either is unknown."""
    first = rec["tensat_first"]
    lat = rec.get("latency", {}).get("tensat", {}).get("threads=1")
    if not first["ok"] or lat is None:
        return None
    run_ms = lat.get("ms")
    if lat.get("same_model"):  # the input itself: its time as the peers' timings measured it
        timed = [v["threads=1"] for v in rec.get("latency", {}).values() if "baseline_ms" in v.get("threads=1", {})]
        run_ms = timed[0]["baseline_ms"] if timed else None
    price = first["stats"].get("cost_after")
    return price / run_ms if price and run_ms else None


def geomean(values: Sequence[float]) -> float:
    """The geometric mean (nan for none)."""
    return math.exp(statistics.fmean(math.log(v) for v in values)) if values else float("nan")


def _cell(rec: dict[str, Any], who: str, threads: str) -> str:
    lat = rec.get("latency", {}).get(who, {}).get(threads)
    if lat is None:
        return "—"
    if lat.get("same_model"):
        return "1 (input)"
    low, high = lat["interval"]
    return f"{lat['speedup']:.3f} ({low:.3f}-{high:.3f})"


def readme_table(records: Sequence[dict[str, Any]]) -> str:
    """The README's results table, from the report's records: each tool's end-to-end speedup at one thread (the
    median; its interval is in the report), tensat's at two, and tensat's time."""
    names = {"tensat": "tensat", "onnxsim": "onnxsim", "onnxslim": "onnxslim", "ort_transformers": "ort transformers"}
    head = ["model", *(names[who] for who in ("tensat", *PEERS)), "tensat 2 threads", "tensat first / warm (s)"]
    lines = ["| " + " | ".join(head) + " |", "|---" + "|---:" * (len(head) - 1) + "|"]

    def speedup(r: dict[str, Any], who: str, threads: str) -> str:
        cell = _cell(r, who, threads)
        if cell == "—":
            return "n/a" if who == "tensat" or r[who].get("unsupported") or r[who]["ok"] else "failed"
        return cell if cell.startswith("1 (input)") else cell.split(" (")[0]

    for r in records:
        first, warm = r["tensat_first"], r["tensat_warm"]
        row = [r["model"], *(speedup(r, who, "threads=1") for who in ("tensat", *PEERS))]
        row += [speedup(r, "tensat", "threads=2"), f"{first['seconds']:.1f} / {warm['seconds']:.1f}"]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def summary(records: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The targets' figures over the corpus."""
    out: dict[str, Any] = {"models": len(records), "optimized": sum(1 for r in records if r["tensat_first"]["ok"])}
    for who in ("tensat", *PEERS):
        for threads in sorted({k for r in records for k in r.get("latency", {}).get(who, {})}):
            values = [r["latency"][who][threads]["speedup"] for r in records if threads in r["latency"].get(who, {})]
            slower = [
                r["model"]
                for r in records
                if threads in r["latency"].get(who, {}) and r["latency"][who][threads]["interval"][1] < 1.0
            ]
            out[f"{who} {threads}"] = {
                "geomean": geomean(values),
                "measurably_slower": slower,
                "at_least_1.05": sum(1 for v in values if v >= 1.05),
            }
    modelled = [r["tensat_first"]["stats"]["modelled"] for r in records if r["tensat_first"]["ok"]]
    out["modelled_min"] = min(modelled, default=float("nan"))
    out["changed_unexplained"] = [r["model"] for r in records if explained(r) == "no"]
    out["kernels_not_run_as_chosen"] = [r["model"] for r in records if not r.get("kernels", {}).get("match", True)]
    for key, ratio in (("predicted", predicted_ratio), ("at_optimize", optimize_ratio)):
        ratios = {r["model"]: v for r in records if (v := ratio(r)) is not None}
        out[f"{key}_over_run_outside_10pct"] = sorted(m for m, v in ratios.items() if abs(v - 1) > 0.1)
    out["predicted_over_run_a_check_outside_10pct"] = sorted(
        r["model"] for r in records if any(abs(v - 1) > 0.1 for v in check_ratios(r))
    )
    out["same_load_missing"] = [r["model"] for r in records if predicted_ratio(r) is None]
    firsts = [r["tensat_first"]["seconds"] for r in records if r["tensat_first"]["ok"]]
    warms = [r["tensat_warm"]["seconds"] for r in records if r["tensat_warm"]["ok"]]
    out["first_run_max_s"] = max(firsts, default=float("nan"))
    out["warm_run_max_s"] = max(warms, default=float("nan"))
    checked = [r for r in records if r["tensat_warm"]["ok"] and (r["tensat_warm"]["stats"] or {}).get("latency_check")]
    out["warm_checks_read"] = sum(bool(r["tensat_warm"]["stats"]["latency_check"].get("reused")) for r in checked)
    out["warm_checks"] = len(checked)
    return out


def _checks_taken(records: Sequence[dict[str, Any]]) -> str:
    """How many same-load checks each model had, in words: the report's last rounds may have been cut short."""
    counts = {len(r["same_load"].get("checks", ())) or 1 for r in records if r.get("same_load")}
    if counts in (set(), {SAME_LOAD_CHECKS}):
        return f"the median of {SAME_LOAD_CHECKS} such checks minutes apart, with their range"
    if counts == {1}:
        return "one such check (the rounds after the last row were not run)"
    return f"the median of {min(counts)}-{max(counts)} such checks minutes apart, with their range"


def markdown(records: Sequence[dict[str, Any]], info: dict[str, Any]) -> str:
    """The report: the machine, one row per model, and the summary against the targets."""
    threads = sorted({k for r in records for who in r.get("latency", {}) for k in r["latency"][who]})
    head = ["model", "import", "ops before -> after", "modelled", "predicted", "predicted / run", "at optimize / run"]
    head += ["kernels run = chosen", "rules explain the change", "tensat first / warm (s)", "kept input"]
    for t in threads:
        head += [f"{who} {t}" for who in ("tensat", *PEERS)]
    head += [" / ".join(PEERS) + " (s)"]
    lines = [
        "# tensat on real models",
        "",
        header(info),
        "",
        "Default settings (`tensat optimize MODEL -o OUT`, measured costs, end-to-end check). Speedups are end to "
        "end in onnxruntime (CPU, all graph optimizations on) over the input model: median over pairs of "
        f"interleaved blocks, each model in {SESSIONS} sessions taking turns, with a 95% bootstrap interval; "
        "`threads=N` is the intra-op thread count. First: a fresh process with an empty cost cache; warm: a second "
        "process with the cache the first filled (its measured costs, and its end-to-end verdict for a second run "
        "whose candidate is the first's). Predicted: the speedup the optimizing process priced. "
        "Predicted / run: the returned model's kernels priced afresh on an empty cost cache over its end-to-end time "
        f"at one thread (in {SESSIONS} sessions, each unit in {SAME_LOAD_WINDOWS} windows), both taken in turns in one "
        f"process (the cost model's error), {_checks_taken(records)}; at optimize / run: the price the optimizing "
        "process measured over the time the report took later (the machine's drift between the two as well).",
        "",
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(head),
    ]
    for r in records:
        first, warm = r["tensat_first"], r["tensat_warm"]
        status = "ok" if r["import"] == "ok" else r["import"][:60]
        if not first["ok"]:
            status += f"; optimize failed: {first['error'][:80]}"
        ops = f"{r['ops_before']} -> {r.get('ops_after', '—')}"
        predicted = f"{r['predicted']:.3f}" if "predicted" in r else "—"
        modelled = f"{100 * first['stats']['modelled']:.1f}%" if first["ok"] else "—"
        ratios = [_same_load_cell(r), f"{v:.2f}" if (v := optimize_ratio(r)) else "—"]
        kernels = r.get("kernels")
        if kernels is None:
            run = "—"
        else:
            chosen = ", ".join(f"{k} {v}" for k, v in kernels["written"].items()) or "none"
            run = f"yes ({chosen})" if kernels["match"] else f"no ({chosen}; runs {kernels['run']})"
        times = f"{first['seconds']:.1f} / {warm['seconds']:.1f}"
        row = [r["model"], status, ops, modelled, predicted, *ratios, run, explained(r)]
        row += [times, "yes" if kept_input(r) else "no"]
        for t in threads:
            row += [_cell(r, who, t) for who in ("tensat", *PEERS)]
        peers = " / ".join(
            f"{r[p]['seconds']:.1f}" if r[p]["ok"] else ("n/a" if r[p].get("unsupported") else "failed") for p in PEERS
        )
        row.append(peers)
        lines.append("| " + " | ".join(row) + " |")
    lines += ["", "## What tensat changed", "", *(f"- {changes(r)}" for r in records)]
    lines += ["", "## The README's table", "", "The speedups at one thread, as the README shows them:", ""]
    lines += [readme_table(records)]
    s = summary(records)
    lines += [
        "",
        "## Summary",
        "",
        f"- {s['optimized']} of {s['models']} models optimized and verified.",
        f"- Nodes modelled: at least {100 * s['modelled_min']:.1f}% of every model's.",
        f"- Models returned changed where a change is no rule's: {', '.join(s['changed_unexplained']) or 'none'}.",
        f"- Models onnxruntime runs with other kernels than the extraction chose: "
        f"{', '.join(s['kernels_not_run_as_chosen']) or 'none'}.",
        f"- Predicted cost more than 10% from the end-to-end time at one thread, under the same load: "
        f"{', '.join(s['predicted_over_run_outside_10pct']) or 'none'}"
        + (f" (not measured: {', '.join(s['same_load_missing'])})" if s["same_load_missing"] else "")
        + f" (in a check: {', '.join(s['predicted_over_run_a_check_outside_10pct']) or 'none'})"
        + "; as the optimizing process priced it: "
        f"{', '.join(s['at_optimize_over_run_outside_10pct']) or 'none'}.",
        f"- Longest default run: {s['first_run_max_s']:.1f} s the first time, {s['warm_run_max_s']:.1f} s "
        f"with a warm cost cache; {s['warm_checks_read']} of the {s['warm_checks']} warm runs that reached the "
        "end-to-end check read the first run's verdict (their candidate was the first run's).",
    ]
    for key, value in s.items():
        if isinstance(value, dict):
            slower = ", ".join(value["measurably_slower"]) or "none"
            lines.append(
                f"- {key}: geometric-mean speedup {value['geomean']:.3f}x; {value['at_least_1.05']} "
                f"model(s) at 1.05x or more; measurably slower: {slower}."
            )
    return "\n".join(lines) + "\n"


def corpus_main(
    argv: Sequence[str] | None,
    *,
    prog: str,
    doc: str,
    stem: str,
    seconds: float,
    run: Callable[[str, Path, Path, float], dict[str, Any]],
    summarize: Callable[[Sequence[dict[str, Any]]], dict[str, Any]],
    render: Callable[[Sequence[dict[str, Any]], dict[str, Any]], str],
    finish: Callable[[list[dict[str, Any]], Path], None] | None = None,
) -> int:
    """The command line of a report over the corpus: `run(name, path, work_dir, seconds)` gives each model's record,
    and `finish(records, work_dir)`, after the last, adds to them; the records, the machine and `summarize(records)`
    go to `<stem>.json` (rewritten after every model), and `render(records, machine)` to `<stem>.md`."""
    p = argparse.ArgumentParser(prog=prog, description=doc.split("\n\n")[0])
    p.add_argument("--corpus", type=Path, default=CORPUS, help="the corpus directory (default bench/corpus)")
    p.add_argument("--out-dir", type=Path, default=RESULTS, help=f"where to write {stem}.md/.json")
    p.add_argument("--only", help="comma-separated model names")
    p.add_argument(
        "--seconds",
        type=float,
        default=seconds,
        help=f"end-to-end timing per model and thread count, at most (default {seconds:g})",
    )
    p.add_argument("--render", action="store_true", help="rewrite the markdown from the JSON only")
    args = p.parse_args(argv)
    json_path, md_path = args.out_dir / f"{stem}.json", args.out_dir / f"{stem}.md"
    if args.render:
        data = json.loads(json_path.read_text(encoding="utf-8"))
        atomic_write_text(md_path, render(data["results"], data["machine"]))
        return 0
    try:  # before any model runs, not after the first one's minutes
        for path in (json_path, md_path):
            check_writable(path)
    except TensatError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    models = corpus_models(args.corpus)
    if args.only:
        wanted = args.only.split(",")
        missing = [n for n in wanted if n not in models]
        if missing:
            print(f"error: not in the corpus: {', '.join(missing)}", file=sys.stderr)
            return 1
        models = {n: models[n] for n in wanted}
    else:  # the exports with symbolic dims have their own report (`bench.dynamic_report`)
        models = {n: path for n, path in models.items() if not n.endswith("_dyn")}
    info = machine_info()
    records = []
    with tempfile.TemporaryDirectory(prefix=f"tensat-{stem}-") as tmp:
        for name, path in models.items():
            print(f"[{name}]", file=sys.stderr, flush=True)
            records.append(run(name, path, Path(tmp), args.seconds))
            atomic_write_json(json_path, {"machine": info, "summary": summarize(records), "results": records})
        if finish is not None:
            finish(records, Path(tmp))
            atomic_write_json(json_path, {"machine": info, "summary": summarize(records), "results": records})
    atomic_write_text(md_path, render(records, info))
    print(json.dumps(summarize(records), indent=1))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return corpus_main(
        argv,
        prog="python -m bench.real_report",
        doc=__doc__,
        stem="real_models",
        seconds=30.0,
        run=run_model,
        summarize=summary,
        render=markdown,
        finish=more_same_load_checks,
    )


if __name__ == "__main__":
    raise SystemExit(main())
