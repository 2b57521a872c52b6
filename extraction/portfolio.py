"""The extraction portfolio: greedy, the cycle filter, local search from every start and two ILP passes.

`extract_best` runs them in turn on one e-graph and returns the cheapest valid selection found, never costlier than
the selection it was given to fall back on. Each extractor has its weakness: greedy settles each e-class alone and
cannot see a merge (which pays only when several e-classes switch to it at once); the local search finds merges but
stops at a local optimum; the ILP is optimal but its relaxation is weak on e-graphs full of merge alternatives, so
within a time limit it often stops far from the optimum unless it starts from a good selection. The local search
gives the ILP that start.

A failing extractor never fails the extraction: it is skipped with a warning through the caller's `warn`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import replace

from .cycles import filter_cycles
from .egraph import EGraph, ExtractionResult, one_line
from .greedy import greedy_dag
from .ilp import ilp_extract
from .local import local_search

Say = Callable[[str], None]

BUG = "a bug in tensat; please report it with the model"  # the package ships with tensat and is fixed there

ILP_STALL_SECONDS = 0.5  # the ILP stops when its incumbent has not improved for this long (it starts from the
# local search's selection, which the solver seldom improves on: a search that has not paid by then rarely does)
ILP_STALL_SHARE = 0.05  # or for this share of the extraction's time limit, if longer: a larger budget buys the ILP
# time to build the model of a larger e-graph and to search it

LOCAL_SEARCH_SHARE = 0.2  # of the ILP time limit, for each start of the local search
LOCAL_SEARCH_MIN_SECONDS = 3.0  # it stops by itself when no move improves: only searches that pay take this long
POLISH_SHARE = 0.5  # of the time left, at most, for the local search from one start: the ILP keeps some
POLISH_RATIO = 1.25  # a start costlier than the best selection so far by more than this factor is not searched
# from: more than any one local search has been seen to save, and a search from a costly start takes longest
POLISH_MIN_SECONDS = 0.05  # a local search is not started with less time than this
ILP_MIN_SECONDS = 0.2  # the ILP is not started with less time left than this (building its model takes longer)


def _quiet(message: str) -> None:
    """The default `warn` and `say`: nothing."""


def local_search_seconds(time_limit: float) -> float:
    """The local search's time limit for one start, given the ILP's: a share of it, but at least enough for a few
    passes over a NasRNN-size e-graph on a loaded machine (a tighter limit makes the result depend on the load)."""
    return max(LOCAL_SEARCH_MIN_SECONDS, LOCAL_SEARCH_SHARE * time_limit)


def extract_best(
    eg: EGraph,
    initial: ExtractionResult,
    starts: Sequence[ExtractionResult] = (),
    *,
    forbidden: frozenset[str] = frozenset(),
    blacklist: Collection[str] | None = None,
    method: str = "ilp",
    solver: str = "highs",
    time_limit: float = 60.0,
    warn: Say = _quiet,
    say: Say = _quiet,
) -> ExtractionResult:
    """The cheapest selection the portfolio finds; never costlier than greedy's or `initial`'s.

    `initial` is a valid acyclic selection to fall back on (a tensor graph's own); `starts` are further valid
    selections for the local search to start from. Greedy runs first: it fails only through a bug, and then
    `initial` is returned. With `method` "greedy" the cheaper of greedy and `initial` is returned. With "ilp",
    `time_limit` seconds (counted from then on) go to the local search from `initial`, greedy and every start, then
    to the cycle filter (`filter_cycles`, sparing `initial`'s e-nodes and preferring to spare greedy's), which
    computes the `blacklist` unless one is given, and to the ILP (`solver`); neither runs when less than
    `ILP_MIN_SECONDS` is left after the search. The ILP first solves the cycle-filtered e-graph
    (`blacklist` removed: no cycle cuts needed, usually fast), then the whole e-graph, warm-started from the best
    selection so far, since filtering can remove e-nodes the best graph needs and lazy cycle cuts cannot. The
    second pass gets as long as the first took (at least a second, at most what is left), and does not run when the
    first ended without a cheaper graph for its stall window: it rarely improves on the first, and its lazy cuts
    can run for the whole limit without closing the gap.

    `warn(message)` receives one-line warnings (a failed extractor, a time limit reached before a proof), and
    `say(detail)` progress. The result's `info["ilp_stop"]` says why the ILP stopped, in words (method "ilp");
    `info["cycle_filter"]` gives the blacklist's size and the filter's seconds; `info["trajectory"]` lists
    `(seconds, cost)` each time the best selection so far got cheaper, seconds counted from this call: when the
    portfolio reached a given cost.
    """
    trajectory = _Trajectory(initial.cost)
    say("greedy")
    try:
        greedy: ExtractionResult | None = greedy_dag(eg, forbidden=forbidden)
    except Exception as exc:  # noqa: BLE001 - any extractor failure keeps the input's own selection
        warn(f"greedy extraction failed ({one_line(exc, typed=True)}); kept the input graph: {BUG}")
        greedy = None
    if greedy is not None:
        trajectory.offer(greedy.cost)
    filtered = {"blacklisted": 0 if blacklist is None else len(blacklist), "seconds": 0.0}
    if greedy is None:
        best = initial
    elif method == "greedy":
        best = greedy if greedy.cost <= initial.cost else initial
    else:
        spared = greedy.choices.values()

        def cycle_filter() -> frozenset[str]:
            """The given blacklist, or one computed now (timed into `filtered`). The greedy selection is acyclic
            too: sparing its e-nodes keeps a good graph in the filtered e-graph."""
            if blacklist is not None:
                return frozenset(blacklist)
            t = time.perf_counter()
            found = filter_cycles(eg, initial.choices.values(), forbidden, preferred=spared)
            filtered.update(blacklisted=len(found), seconds=time.perf_counter() - t)
            return frozenset(found)

        best = _ilp_passes(
            eg, initial, greedy, starts, forbidden, cycle_filter, solver, time_limit, warn, say, trajectory
        )
    best.info["cycle_filter"] = filtered
    trajectory.offer(best.cost)
    best.info["trajectory"] = trajectory.points
    return best


class _Trajectory:
    """When the best selection so far got cheaper: `(seconds since the start, cost)` points."""

    def __init__(self, cost: float) -> None:
        self.start = time.perf_counter()
        self.points: list[tuple[float, float]] = [(0.0, cost)]

    def offer(self, cost: float, at: float | None = None) -> None:
        """Record `cost` if it beats the last point (`at`: seconds since the start, default now)."""
        if cost < self.points[-1][1] - 1e-12:
            seconds = time.perf_counter() - self.start if at is None else at
            self.points.append((max(seconds, self.points[-1][0]), cost))


def _ilp_passes(
    eg: EGraph,
    initial: ExtractionResult,
    greedy: ExtractionResult,
    starts: Sequence[ExtractionResult],
    forbidden: frozenset[str],
    cycle_filter: Callable[[], frozenset[str]],
    solver: str,
    time_limit: float,
    warn: Say,
    say: Say,
    trajectory: _Trajectory,
) -> ExtractionResult:
    """The local search from every start, then the ILP on the cycle-filtered and on the whole e-graph (the cycle
    filter runs only if time is left for the ILP)."""
    best = greedy if greedy.cost <= initial.cost else initial
    deadline = time.perf_counter() + time_limit
    seconds = local_search_seconds(time_limit)
    # the cheapest start first: where time runs short, the search that is most likely to end cheapest has run
    ordered = sorted([initial, greedy, *starts], key=lambda start: start.cost)
    best = polished = _polish(eg, ordered, best, forbidden, seconds, deadline, warn, say, trajectory)
    stall = max(ILP_STALL_SECONDS, ILP_STALL_SHARE * time_limit)
    if deadline - time.perf_counter() < ILP_MIN_SECONDS:
        best.info["ilp_stop"] = _ilp_stop(False, "no time", stall)
        return best
    blacklist = cycle_filter()
    passes = [(forbidden | blacklist, "cycle-filtered"), (forbidden, "whole")] if blacklist else [(forbidden, "whole")]
    proven = False
    first_pass = 0.0
    stop = ""
    for banned, label in passes:
        now = time.perf_counter()
        remaining = deadline - now
        if label == "whole" and blacklist:
            remaining = min(remaining, max(1.0, first_pass))
        if remaining < ILP_MIN_SECONDS:
            stop = stop or "no time"
            break
        if label == "whole" and blacklist and stop == "stall":
            break  # the filtered pass found nothing cheaper in its stall window: the whole e-graph's lazy cuts won't
        start = best if not blacklist & set(best.choices.values()) or label == "whole" else initial
        say(f"ILP on the {label} e-graph (at most {remaining:.0f} s)")
        try:
            ilp = ilp_extract(
                eg,
                solver=solver,
                time_limit=remaining,
                forbidden=frozenset(banned),
                initial=start,
                stall_seconds=stall,
            )
        except Exception as exc:  # noqa: BLE001 - a solver crash or a missing solver binary
            warn(
                f"the ILP solver failed on the {label} e-graph ({one_line(exc, typed=True)}); used the best graph "
                f"found without it (try solver='cbc' / --solver cbc)"
            )
            continue
        first_pass = time.perf_counter() - now
        stop = ilp.info.get("stop", "")
        offset = now - trajectory.start
        for found_at, cost, *_ in ilp.info.get("incumbents", []):  # when the solver found each cheaper selection
            trajectory.offer(cost, offset + found_at)
        if ilp.status != "fallback" and ilp.cost <= best.cost + 1e-12:
            # a cycle-filtered pass proves nothing about the whole e-graph: its bound is the sub-problem's
            best = ilp if label == "whole" else replace(ilp, bound=None, status="feasible")
        elif ilp.bound is not None and label == "whole":  # the ILP's proven bound holds for the search's result too
            best.bound = max(best.bound or 0.0, min(ilp.bound, best.cost))
        proven = label == "whole" and ilp.status == "optimal"
    if not proven and best.cost < polished.cost - 1e-12:  # the ILP improved on the search: polish its result too
        best = _polish(eg, [best], best, forbidden, seconds, deadline, warn, say, trajectory)
    if not proven and stop == "time" and time.perf_counter() >= deadline - 0.05:
        gap = best.gap()
        warn(
            f"extraction reached its ILP time limit ({time_limit:g} s) before proving its graph optimal"
            f"{'' if gap is None else f' (within {100 * gap:.2g}% of the bound)'}; a longer ilp_time_limit "
            f"(--ilp-time-limit) may find a cheaper graph"
        )
    best.info["ilp_stop"] = _ilp_stop(proven, stop, stall)
    return best


def _ilp_stop(proven: bool, stop: str, stall: float) -> str:
    """Why the ILP stopped, in the user's words."""
    if proven:
        return "proven optimal"
    return "not proven optimal: " + {
        "gap": "optimal only on the cycle-filtered e-graph",
        "stall": f"no cheaper graph found for {stall:.2g} s",
        "time": "time limit",
        "no new cuts": "no cycle cut left",
        "no solution": "the solver found no solution",
        "no time": "no time was left for it",
    }.get(stop, "the ILP did not run")


def _polish(
    eg: EGraph,
    starts: Sequence[ExtractionResult],
    best: ExtractionResult,
    forbidden: frozenset[str],
    seconds: float,
    deadline: float,
    warn: Say,
    say: Say,
    trajectory: _Trajectory,
) -> ExtractionResult:
    """The cheapest of `best`, the starts and the local search's improvements of each start: `seconds` each, and at
    most `POLISH_SHARE` of the time left before `deadline` (a search that runs out returns its best so far).

    The input's selection is a start as well as greedy's: greedy settles each class alone and so picks small local
    gains (a gate's two matmuls merged) that block larger ones (one weight read for all time steps) which the
    search finds from the input. A start more than `POLISH_RATIO` costlier than the best so far is skipped."""
    for start in starts:
        if start.cost > POLISH_RATIO * best.cost:
            continue
        limit = min(seconds, POLISH_SHARE * max(0.0, deadline - time.perf_counter()))
        if limit < POLISH_MIN_SECONDS:
            break  # setting up a search over a large e-graph takes longer than this alone
        say(f"local search from the {start.method} graph")
        try:
            found = local_search(eg, start, forbidden=forbidden, time_limit=limit)
        except Exception as exc:  # noqa: BLE001 - a failed polish keeps the selection it started from
            warn(f"the local search over the extraction failed ({one_line(exc, typed=True)}): {BUG}")
            found = start
        if found.cost < best.cost - 1e-12:
            best = found
            trajectory.offer(found.cost)
    return best
