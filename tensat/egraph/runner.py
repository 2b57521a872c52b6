"""Exploration, after egg's `Runner` and `BackoffScheduler`: rules applied one iteration at a time under node,
iteration and time limits, rules with too many matches banned for a while, the iteration that overshoots the node
limit rolled back and its rules re-applied in groups that fit (the fill), and why the run stopped."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from tensat import rewrites
from tensat.egraph.lower import GUIDED, LoweredGraph, rule_of_report
from tensat.egraph.pool import run_program
from tensat.errors import one_line
from tensat.ir import Graph
from tensat.options import Options

MATCH_LIMIT = 1000  # egg's BackoffScheduler defaults
BAN_LENGTH = 5
FILL_MIN_SECONDS = 1.0  # the fill may always take this long (within the time limit), however fast exploration was


@dataclass
class IterationStats:
    """What one exploration iteration did."""

    iteration: int
    enodes: int
    eclasses: int
    seconds: float
    multi: bool
    matches: dict[str, int] = field(default_factory=dict)
    partial: bool = False  # the full iteration overshot the node limit; only the rules that fit were applied
    banned: list[str] = field(default_factory=list)  # rules over their match threshold, not applied
    unbanned: bool = False  # the back-off lifted every ban before this iteration: nothing else was left to match

    def __repr__(self) -> str:
        return (
            f"<iteration {self.iteration}{' (multi-pattern)' if self.multi else ''}: {self.enodes:,} e-nodes, "
            f"{self.eclasses:,} e-classes, {sum(self.matches.values()):,} matches, {self.seconds:.3f} s"
            f"{', partial' if self.partial else ''}{f', {len(self.banned)} rules banned' if self.banned else ''}>"
        )


@dataclass
class ExplorationStats:
    """The exploration run: growth per iteration and why it stopped."""

    initial_enodes: int = 0
    initial_eclasses: int = 0
    iterations: list[IterationStats] = field(default_factory=list)
    stop_reason: str = ""  # saturated | converged | node_limit | iter_limit | time_limit | time_budget | error
    saturated: bool = False
    seconds: float = 0.0
    error: str = ""
    rules: list[str] = field(default_factory=list)
    blacklisted: int = 0  # e-nodes removed by cycle filtering before extraction
    guided_rounds: int = 0  # rounds kept after the exploration, each extending the merges the extracted graph uses

    @property
    def enodes(self) -> int:
        return self.iterations[-1].enodes if self.iterations else self.initial_enodes

    @property
    def eclasses(self) -> int:
        return self.iterations[-1].eclasses if self.iterations else self.initial_eclasses

    def __repr__(self) -> str:
        return (
            f"<exploration: {self.initial_enodes:,} -> {self.enodes:,} e-nodes, {self.eclasses:,} e-classes in "
            f"{len(self.iterations)} iterations, {self.stop_reason.replace('_', ' ') or 'not run'}, "
            f"{self.seconds:.2f} s>"
        )

    def followed_by(self, later: ExplorationStats) -> ExplorationStats:
        """This exploration and a `later` one on the e-graph it left, as one: the later's iterations numbered on,
        and its stop."""
        offset = len(self.iterations)
        iterations = [replace(it, iteration=it.iteration + offset) for it in later.iterations]
        return replace(
            later,
            initial_enodes=self.initial_enodes,
            initial_eclasses=self.initial_eclasses,
            iterations=self.iterations + iterations,
            seconds=self.seconds + later.seconds,
            rules=list(dict.fromkeys(self.rules + later.rules)),
        )

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["enodes"], out["eclasses"] = self.enodes, self.eclasses
        return out


class Backoff:
    """egg's BackoffScheduler state across iterations: per-rule match thresholds and bans."""

    def __init__(self, match_limit: int = MATCH_LIMIT, ban_length: int = BAN_LENGTH) -> None:
        self.match_limit = match_limit
        self.ban_length = ban_length
        self.times_banned: dict[str, int] = {}
        self.banned_until: dict[str, int] = {}

    def threshold(self, name: str) -> int:
        return self.match_limit << self.times_banned.get(name, 0)

    def active(self, names: Sequence[str], iteration: int) -> list[str]:
        return [n for n in names if self.banned_until.get(n, 0) <= iteration]

    def any_banned(self, iteration: int) -> bool:
        return any(until > iteration for until in self.banned_until.values())

    def unban_all(self, iteration: int) -> None:
        for name in self.banned_until:
            self.banned_until[name] = min(self.banned_until[name], iteration)

    def record(
        self, schedule: list[tuple[str, list[str], int | None]], found: dict[str, int], iteration: int
    ) -> set[str]:
        """Ban the throttled rules whose search found more matches than their threshold; return them."""
        banned = set()
        for _, names, limit in schedule:
            if limit is None:
                continue
            for name in names:
                if found.get(name, 0) > limit:
                    k = self.times_banned.get(name, 0)
                    self.banned_until[name] = iteration + 1 + (self.ban_length << k)
                    self.times_banned[name] = k + 1
                    banned.add(name)
        return banned


class Exploration(LoweredGraph):
    """Exploring a lowered graph: `explore` (limits, back-off, fill) and `checkpoint`/`rollback`. The back-off state
    and the combined rulesets are kept across explore calls."""

    def __init__(self, graph: Graph, rules: Sequence[rewrites.Rule] | None = None) -> None:
        super().__init__(graph, rules)
        self._checkpoints: list[tuple[int, dict[tuple[str, ...], str]]] = []
        self._backoff = Backoff()  # kept across explore calls: a guided round does not unban what the search banned
        self._clock = 0  # iterations run so far, the backoff's clock
        self._explored = 0.0  # seconds of the explore calls so far: a later call's fill may take as long
        self._pace: float | None = None  # seconds per e-node and rule of the last full single-pattern iteration
        self._rulesets: dict[tuple[str, ...], str] = {}
        self._single = [r.name for r in self.rules if not r.multi]
        self._single_set = set(self._single)

    def add_rules(self, rules: Sequence[rewrites.Rule]) -> None:
        """Register `rules` too, with no checkpoint taken: a rollback to one would drop them."""
        if self._checkpoints:
            raise RuntimeError("rules are registered with a checkpoint to roll back to")
        super().add_rules(rules)
        self._single = [r.name for r in self.rules if not r.multi]
        self._single_set = set(self._single)

    # -- checkpoints --------------------------------------------------------------------------------------------

    def checkpoint(self) -> None:
        """Mark the e-graph's state (egglog push), for `rollback`."""
        self._checkpoints.append((self._depth, dict(self._rulesets)))
        self._push()

    def rollback(self) -> None:
        """Return to the last `checkpoint`: e-nodes added since are gone (every snapshot pushed since is popped,
        including those of the iterations explore kept), and so are the combined rulesets egglog created since (pop
        drops them), so they are forgotten here too."""
        depth, rulesets = self._checkpoints.pop()
        while self._depth > depth:
            self._pop()
        self._rulesets = rulesets

    # -- exploration --------------------------------------------------------------------------------------------

    def explore(
        self,
        *,
        node_limit: int = Options.node_limit,
        iter_limit: int = Options.iter_limit,
        time_limit: float = Options.time_limit,
        k_multi: int = Options.k_multi,
        fill: bool = True,
        guided: bool = False,
        on_iteration: Callable[[IterationStats], None] | None = None,
        converged: Callable[[IterationStats], bool] | None = None,
    ) -> ExplorationStats:
        """Apply the rules to saturation or a limit, one iteration at a time.

        Guarantee: the e-graph left behind never has more than `node_limit` e-nodes (unless the input graph alone
        does, in which case nothing is applied). Each iteration runs on a pushed snapshot; one that overshoots is
        rolled back with egglog's pop. With `fill`, the rules of the overshooting iteration are then re-applied in
        groups (single-pattern rules first, then bisecting), keeping each group that fits, so the e-graph fills
        up to the limit instead of stopping one whole iteration short; the fill spends at most as long as the
        exploration had so far, earlier calls included (at least FILL_MIN_SECONDS), within the time limit.

        Work per iteration is bounded the way egg's BackoffScheduler (which Tensat ran on) bounds it: a rule with
        more matches than its threshold (MATCH_LIMIT, doubled at each ban) is not applied and is banned for
        BAN_LENGTH (doubled) iterations; when nothing else changes, bans are lifted. Multi-pattern rules run only
        in the first `k_multi` iterations, unthrottled in the first (their matches there are pairs of input
        nodes). The time limit is checked between iterations (an egglog iteration cannot be interrupted), and a
        single-pattern iteration that would end past it, at the pace of the last (seconds per e-node and rule, kept
        across calls), is not started.
        `on_iteration` is called with each iteration's statistics as it ends (for progress reports). `converged`,
        called after each iteration that grew the e-graph, stops the exploration ("converged") when it returns True:
        the caller's judgement that more iterations would not pay (see `tensat.api`'s sampled cost).

        With `guided` (a guided round, after `guide`), the first iteration runs only the multi-pattern rules, and
        only on pairs of e-classes marked chosen; the single-pattern rules follow. This extends the merges the
        extracted graph uses (a merge of two products sharing a weight with a third) without the all-pairs growth of
        another multi-pattern iteration. Rules banned by an earlier call stay banned.
        """
        stats = ExplorationStats(rules=[r.name for r in self.rules])
        stats.initial_enodes, stats.initial_eclasses = self.size()
        backoff = self._backoff
        start = time.perf_counter()
        if stats.initial_enodes > node_limit:
            stats.stop_reason = "node_limit"
        lifted = False  # the bans were lifted since the last iteration that ran
        for it in range(iter_limit):
            if stats.stop_reason:
                break
            if time.perf_counter() - start > time_limit:
                stats.stop_reason = "time_limit"
                break
            multi = (it == 0 if guided else it < k_multi) and any(r.multi for r in self.rules)
            every = [GUIDED + r.name for r in self.rules if r.multi] if guided else [r.name for r in self.rules]
            now = self._clock + it
            names = backoff.active(every if multi else self._single, now)
            if not names:
                if backoff.any_banned(now):
                    backoff.unban_all(now + 1)
                    lifted = True
                    continue
                stats.stop_reason, stats.saturated = "saturated", True
                break
            if not multi and self._overruns(len(names), stats.enodes, time_limit - (time.perf_counter() - start)):
                stats.stop_reason = "time_limit"
                break
            t0 = time.perf_counter()
            schedule = self._schedule(names, backoff, unthrottled_multi=(it == 0))  # before push: pop drops rulesets
            self._push()
            try:
                reports = self._apply(schedule)
            except KeyboardInterrupt:
                raise
            except BaseException as exc:  # egglog's errors, and its Rust panics (a failed union of unequal shapes)
                self._pop()
                stats.stop_reason = "error"
                stats.error = one_line(exc, limit=None)
                break
            matches = self._matches(reports)
            banned = backoff.record(schedule, self._searched(reports), now)
            partial = False
            if self.enode_count() > node_limit:
                self._pop()
                stats.stop_reason = "node_limit"
                if not fill:
                    break
                elapsed = time.perf_counter() - start
                budget = min(max(self._explored + elapsed, FILL_MIN_SECONDS), time_limit - elapsed)
                applied = [n for n in names if n not in banned]
                groups = [[n for n in applied if n in self._single], [n for n in applied if n not in self._single]]
                matches = self._fill(
                    [g for g in groups if g], node_limit, time.perf_counter() + budget, backoff, it == 0
                )
                partial = True
                if not matches:
                    break
            enodes, eclasses = self.size()
            unchanged = (enodes, eclasses) == (stats.enodes, stats.eclasses)
            seconds = time.perf_counter() - t0
            if not multi and not partial:
                self._pace = seconds / max(1, len(names) * stats.enodes)
            stats.iterations.append(
                IterationStats(it + 1, enodes, eclasses, seconds, multi, matches, partial, sorted(banned), lifted)
            )
            lifted = False
            if on_iteration is not None:
                on_iteration(stats.iterations[-1])
            if partial:
                break
            if not unchanged and converged is not None and converged(stats.iterations[-1]):
                stats.stop_reason = "converged"
                break
            if unchanged:
                if backoff.any_banned(now + 1):
                    backoff.unban_all(now + 1)
                    lifted = True
                    continue
                stats.stop_reason, stats.saturated = "saturated", True
                break
        if not stats.stop_reason:
            stats.stop_reason = "iter_limit"
        self._clock += iter_limit
        stats.seconds = time.perf_counter() - start
        self._explored += stats.seconds
        return stats

    def _overruns(self, rules: int, enodes: int, left: float) -> bool:
        """Whether a single-pattern iteration of `rules` rules over `enodes` e-nodes would end past the `left`
        seconds of the time limit, at the pace of the last one (egglog cannot stop an iteration once started: one
        over a large e-graph can take many times the limit). Unknown before the first has run."""
        return self._pace is not None and self._pace * rules * enodes > left

    def _schedule(
        self, names: Sequence[str], backoff: Backoff, unthrottled_multi: bool
    ) -> list[tuple[str, list[str], int | None]]:
        """Rule groups to run in one iteration: (ruleset, rule names, match limit or None for unthrottled)."""
        by_limit: dict[int | None, list[str]] = {}
        for name in names:
            limit = None if unthrottled_multi and name not in self._single_set else backoff.threshold(name)
            by_limit.setdefault(limit, []).append(name)
        return [
            (self._ruleset_for(group), group, limit)
            for limit, group in sorted(by_limit.items(), key=lambda kv: -1 if kv[0] is None else kv[0])
        ]

    def _ruleset_for(self, names: Sequence[str]) -> str:
        key = tuple(names)
        if key not in self._rulesets:
            self._rulesets[key] = self._combine(f"group-{len(self._rulesets)}", key)
        return self._rulesets[key]

    def _combine(self, name: str, rule_names: Sequence[str]) -> str:
        members = " ".join(self._ruleset_of[r] for r in rule_names)
        run_program(self.egraph, f"(unstable-combined-ruleset {name} {members})")  # rules, not content: same version
        return name

    def _apply(self, schedule: list[tuple[str, list[str], int | None]]) -> list[Any]:
        """One iteration (each group's rules matched against the e-graph as it stands), then shapes to a fixpoint."""
        lets, runs = [], []
        for k, (ruleset, _, limit) in enumerate(schedule):
            if limit is None:
                runs.append(f"(run {ruleset})")
            else:
                lets.append(f"(let-scheduler b{k} (back-off :match-limit {limit}))")
                runs.append(f"(run-with b{k} {ruleset})")
        version = self.version
        reports = self._run(f"(run-schedule {' '.join(lets)} {' '.join(runs)} (saturate shapes))")
        if not any(getattr(getattr(out, "report", None), "updated", True) for out in reports):
            self.version = version  # egglog reports that no rule changed anything
        return reports

    def _matches(self, reports: list[Any]) -> dict[str, int]:
        matches: dict[str, int] = {}
        for out in reports:
            for egg_name, count in out.report.num_matches_per_rule.items():
                name = rule_of_report(egg_name)
                if name in self._ruleset_of:
                    matches[name] = matches.get(name, 0) + int(count)
        return matches

    @staticmethod
    def _searched(reports: list[Any]) -> dict[str, int]:
        """Matches each rule's search found, applied or not (a banned rule's are found but not applied)."""
        found: dict[str, int] = {}
        for out in reports:
            for iteration in out.report.iterations:
                for egg_name, rule_reports in iteration.rule_set_report.rule_reports.items():
                    name = rule_of_report(egg_name)
                    found[name] = found.get(name, 0) + sum(int(r.num_matches) for r in rule_reports)
        return found

    def _fill(
        self, groups: list[list[str]], node_limit: int, deadline: float, backoff: Backoff, unthrottled_multi: bool
    ) -> dict[str, int]:
        """Apply the rule groups that keep the e-graph within the limit, bisecting groups that do not.

        Single-pattern rules come as the first group, so an explosion of multi-pattern merges cannot use up the
        fill's time before the cheap rules are in.
        """
        matches: dict[str, int] = {}
        queue = list(groups)
        while queue and time.perf_counter() < deadline:
            group = queue.pop(0)
            schedule = self._schedule(group, backoff, unthrottled_multi)  # before push: pop drops rulesets
            self._push()
            try:
                reports = self._apply(schedule)
            except KeyboardInterrupt:
                raise
            except BaseException:  # a failing group is dropped like an overshooting one
                reports = None
            if reports is not None and self.enode_count() <= node_limit:
                for name, count in self._matches(reports).items():
                    matches[name] = matches.get(name, 0) + count
                continue
            self._pop()
            if len(group) > 1:
                queue += [group[: len(group) // 2], group[len(group) // 2 :]]
        return matches
