"""Lowering IR graphs into egglog, exploring with rewrite rules under limits, and getting selections back out.

Shapes live inside egglog (`shape-of`, no merge function, computed by the `shapes` ruleset saturated after every
rewrite step), so rules can be guarded by shapes and a union of two differently shaped tensors fails loudly. On the
way out every e-node's shape is recomputed with the Python shape function of its op; an e-node whose shape does not
check is never offered to the extractor.
"""

from __future__ import annotations

import time
import weakref
from collections import OrderedDict
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Sequence

from egglog import bindings

from tensat import rewrites
from tensat.extraction import EGraph as XGraph
from tensat.extraction import ENode, tree_costs
from tensat import ops
from tensat.cost import AnalyticCost
from tensat.ir import Graph, Node

MATCH_LIMIT = 1000  # egg's BackoffScheduler defaults
BAN_LENGTH = 5
GUIDED = "guided/"  # prefix of a multi-pattern rule's guided copy (matching only e-classes marked chosen)
UNCHOSEN_MS = 1e-9  # added to the cost of e-nodes the input graph does not use: a tie-break, not a price
PRICE_BATCH = 32  # e-nodes priced per prefetch call when pricing has a time limit
COMPETITIVE_SLACK_MS = 0.005  # an estimate this close to its e-class's cheapest is competitive whatever the ratio
FILL_MIN_SECONDS = 1.0  # the fill may always take this long (within the time limit), however fast exploration was

CostFn = Callable[[Node, Sequence[tuple[int, ...]], Sequence[bool]], float]


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

    def __repr__(self) -> str:
        return (f"<iteration {self.iteration}{' (multi-pattern)' if self.multi else ''}: {self.enodes:,} e-nodes, "
                f"{self.eclasses:,} e-classes, {sum(self.matches.values()):,} matches, {self.seconds:.3f} s"
                f"{', partial' if self.partial else ''}{f', {len(self.banned)} rules banned' if self.banned else ''}>")


@dataclass
class ExplorationStats:
    """The exploration run: growth per iteration and why it stopped."""

    initial_enodes: int = 0
    initial_eclasses: int = 0
    iterations: list[IterationStats] = field(default_factory=list)
    stop_reason: str = ""  # saturated | node_limit | iter_limit | time_limit | error
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
        return (f"<exploration: {self.initial_enodes:,} -> {self.enodes:,} e-nodes, {self.eclasses:,} e-classes in "
                f"{len(self.iterations)} iterations, {self.stop_reason.replace('_', ' ') or 'not run'}, "
                f"{self.seconds:.2f} s>")

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["enodes"], out["eclasses"] = self.enodes, self.eclasses
        return out


@dataclass
class DecodedNode:
    """An e-node read back from egglog: an IR op with attributes over child e-classes."""

    op: str
    attrs: dict[str, Any]
    children: tuple[int, ...]
    eclass: int


class _Blank:
    """An egglog e-graph with declarations and rules registered and nothing else, kept for reuse: registering some
    150 rules costs egglog about 0.3 s, more than exploring a small graph. The registered state is saved with an
    egglog push; a new user pops back to it (dropping the previous user's e-nodes, snapshots and combined
    rulesets) and pushes it again. One user at a time: a kept e-graph is handed out only once its last user is
    gone. `depth` counts the snapshots the user pushed and has not popped."""

    def __init__(self, program: Sequence[str]) -> None:
        self.egraph = bindings.EGraph()
        for text in program:
            _run(self.egraph, text)
        _run(self.egraph, "(push)")
        self.depth = 0
        self.user: weakref.ref[Any] | None = None

    def reset(self) -> None:
        """Back to the registered state, the previous user's e-graph freed."""
        _run(self.egraph, "(pop)\n" * (self.depth + 1) + "(push)")
        self.depth = 0


def _run(egraph: bindings.EGraph, text: str) -> list[Any]:
    """Run an egglog program, command by command; the outputs of all commands."""
    out: list[Any] = []
    for command in egraph.parse_program(text):
        out.extend(egraph.run_program(command))
    return out


_BLANKS: OrderedDict[str, _Blank] = OrderedDict()
BLANKS_KEPT = 1  # registered e-graphs kept for reuse: egglog holds about 0.7 MB per registered rule


def _release(blank: _Blank) -> None:
    """Its user is gone: back to the registered state now (freeing the user's e-graph), ready for the next user."""
    blank.reset()
    blank.user = None


def _blank_egraph(program: Sequence[str], user: Any) -> _Blank:
    """An egglog e-graph with `program` (declarations and rules) run in it and nothing else, for `user`."""
    key = "\n".join(program)
    blank = _BLANKS.get(key)
    if blank is not None and blank.user is None:  # released: already reset
        _BLANKS.move_to_end(key)
    else:
        blank = _Blank(program)
        if key in _BLANKS:  # the kept one is in use: this one serves once
            return blank
        _BLANKS[key] = blank
        while len(_BLANKS) > BLANKS_KEPT:
            _BLANKS.popitem(last=False)
    blank.user = weakref.ref(user)
    weakref.finalize(user, _release, blank).atexit = False  # nothing to free at exit
    return blank


class TensorEGraph:
    """An egglog e-graph holding one IR graph and the rules that rewrite it."""

    def __init__(self, graph: Graph, rules: Sequence[rewrites.Rule] | None = None) -> None:
        self.graph = graph
        present = {graph.nodes[i].op for i in graph.live()}
        self.rules = list(rules) if rules is not None else rewrites.select_rules(present)
        self._strings: list[str] = []
        self._string_ids: dict[str, int] = {}
        self._ruleset_of: dict[str, str] = {}
        program = [ops.egg_declarations(),
                   "(function node-of (i64) T :no-merge)\n(function chosen-of (i64) T :no-merge)\n(relation chosen (T))",
                   "\n".join(ops.egg_shape_rules(present.union(*(r.produced_ops() for r in self.rules))))]
        for k, rule in enumerate(self.rules):
            name = f"rule-{k}"
            self._ruleset_of[rule.name] = name
            program.append(f"(ruleset {name})\n{rewrites.to_egglog(rule, name)}")
            if rule.multi:  # the same rule, matching only pairs of e-classes a guided round marked as chosen
                guided = f"guided-{k}"
                self._ruleset_of[GUIDED + rule.name] = guided
                program.append(f"(ruleset {guided})\n{rewrites.to_egglog(rule, guided, 'chosen', GUIDED + rule.name)}")
        self._blank = _blank_egraph(program, self)
        self.egraph = self._blank.egraph
        self._chosen_base = 0
        self._checkpoints: list[tuple[int, dict[tuple[str, ...], str]]] = []
        self._backoff = Backoff()  # kept across explore calls: a guided round does not unban what the search banned
        self._clock = 0  # iterations run so far, the backoff's clock
        self._explored = 0.0  # seconds of the explore calls so far: a later call's fill may take as long
        self._rulesets: dict[tuple[str, ...], str] = {}
        self._single = [r.name for r in self.rules if not r.multi]
        self._single_set = set(self._single)
        self.live = graph.live()
        commands = [f"(set (node-of {i}) {self._lower(graph.nodes[i])})" for i in self.live]
        for k in range(0, len(commands), 256):
            self._run("\n".join(commands[k:k + 256]))
        self._run("(run-schedule (saturate shapes))")
        self._check_initial_shapes()

    # -- egglog plumbing ----------------------------------------------------------------------------------------

    def _run(self, text: str) -> list[Any]:
        return _run(self.egraph, text)

    def _string(self, s: str) -> str:
        if s not in self._string_ids:
            self._string_ids[s] = len(self._strings)
            self._strings.append(s)
        return f'"s{self._string_ids[s]}"'

    def _attr(self, kind: str, value: Any) -> str:
        if kind == "int":
            return str(int(value))
        if kind == "ints":
            return f"(vec-of {' '.join(str(int(v)) for v in value)})" if value else "(vec-empty)"
        if kind == "float":
            return repr(float(value))
        return self._string(str(value))

    def _lower(self, node: Node, table: str = "node-of", base: int = 0) -> str:
        d = ops.get(node.op)
        attrs = node.attr
        parts = [self._attr(kind, attrs[name]) for name, kind in d.attrs]
        children = [f"({table} {base + i})" for i in node.inputs]
        if d.inputs is None:
            vec = f"(vec-of {' '.join(children)})" if children else "(vec-empty)"
            parts.append(vec)
        else:
            parts = children + parts
        return f"({d.egg} {' '.join(parts)})"

    def _combine(self, name: str, rule_names: Sequence[str]) -> str:
        members = " ".join(self._ruleset_of[r] for r in rule_names)
        self._run(f"(unstable-combined-ruleset {name} {members})")
        return name

    def guide(self, graph: Graph) -> int:
        """Mark the e-classes of `graph` (a graph extracted from this e-graph) as chosen, for a guided round; returns
        the id offset under which its nodes are held in the `chosen-of` table (see `chosen_selection`).

        Its terms are e-nodes of the e-graph already, so lowering them adds nothing but the marks."""
        base = self._chosen_base
        self._chosen_base += len(graph.nodes)
        live = graph.live()
        commands = [f"(set (chosen-of {base + i}) {self._lower(graph.nodes[i], 'chosen-of', base)})" for i in live]
        commands += [f"(chosen (chosen-of {base + i}))" for i in live]
        for k in range(0, len(commands), 256):
            self._run("\n".join(commands[k:k + 256]))
        self._run("(run-schedule (saturate shapes))")
        return base

    @property
    def _depth(self) -> int:
        """egglog snapshots pushed and not popped."""
        return self._blank.depth

    def _push(self) -> None:
        self._run("(push)")
        self._blank.depth += 1

    def _pop(self) -> None:
        self._run("(pop)")
        self._blank.depth -= 1

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

    # -- sizes --------------------------------------------------------------------------------------------------

    def enode_count(self) -> int:
        """E-nodes of tensor constructors, from egglog's table sizes (cheap: no freeze)."""
        out = self._run("(print-size)")
        total = 0
        for line in str(out[-1]).replace("(", " ").replace(")", " ").split("\n"):
            parts = line.split()
            if len(parts) == 2 and parts[0] in ops.BY_EGG:
                total += int(parts[1])
        return total

    def size(self) -> tuple[int, int]:
        """(e-nodes, e-classes) of tensor constructors, not counting shape rows."""
        frozen = self.egraph.freeze()
        enodes, classes = 0, set()
        for name, fn in frozen.functions.items():
            if name in ops.BY_EGG:
                for row in fn.rows:
                    if not row.subsumed:
                        enodes += 1
                        classes.add(row.output)
        return enodes, len(classes)

    def _check_initial_shapes(self) -> None:
        frozen = self.egraph.freeze()
        node_of = {self.egraph.value_to_i64(r.inputs[0]): r.output for r in frozen.functions["node-of"].rows}
        shapes = {r.inputs[0]: r.output for r in frozen.functions["shape-of"].rows}
        for i in self.live:
            shape = shapes.get(node_of[i])
            got = None if shape is None else tuple(self.egraph.value_to_i64(v) for v in self.egraph.value_to_vec(shape))
            if got != self.graph.nodes[i].shape:
                raise RuntimeError(
                    f"egglog shape rules disagree with ops.py for node {i} ({self.graph.nodes[i].op}): "
                    f"{got} vs {self.graph.nodes[i].shape}"
                )

    # -- exploration --------------------------------------------------------------------------------------------

    def explore(
        self, *, node_limit: int = 50_000, iter_limit: int = 15, time_limit: float = 60.0, k_multi: int = 1,
        fill: bool = True, guided: bool = False, on_iteration: Callable[[IterationStats], None] | None = None,
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
        nodes). The time limit is checked between iterations (an egglog iteration cannot be interrupted).
        `on_iteration` is called with each iteration's statistics as it ends (for progress reports).

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
                    continue
                stats.stop_reason, stats.saturated = "saturated", True
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
                stats.error = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
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
                matches = self._fill([g for g in groups if g], node_limit, time.perf_counter() + budget,
                                     backoff, it == 0)
                partial = True
                if not matches:
                    break
            enodes, eclasses = self.size()
            unchanged = (enodes, eclasses) == (stats.enodes, stats.eclasses)
            seconds = time.perf_counter() - t0
            stats.iterations.append(
                IterationStats(it + 1, enodes, eclasses, seconds, multi, matches, partial, sorted(banned)))
            if on_iteration is not None:
                on_iteration(stats.iterations[-1])
            if partial:
                break
            if unchanged:
                if backoff.any_banned(now + 1):
                    backoff.unban_all(now + 1)
                    continue
                stats.stop_reason, stats.saturated = "saturated", True
                break
        if not stats.stop_reason:
            stats.stop_reason = "iter_limit"
        self._clock += iter_limit
        stats.seconds = time.perf_counter() - start
        self._explored += stats.seconds
        return stats

    def _schedule(self, names: Sequence[str], backoff: "Backoff", unthrottled_multi: bool) -> list[tuple[str, list[str], int | None]]:
        """Rule groups to run in one iteration: (ruleset, rule names, match limit or None for unthrottled)."""
        by_limit: dict[int | None, list[str]] = {}
        for name in names:
            limit = None if unthrottled_multi and name not in self._single_set else backoff.threshold(name)
            by_limit.setdefault(limit, []).append(name)
        return [(self._ruleset_for(group), group, limit) for limit, group in sorted(
            by_limit.items(), key=lambda kv: -1 if kv[0] is None else kv[0])]

    def _ruleset_for(self, names: Sequence[str]) -> str:
        key = tuple(names)
        if key not in self._rulesets:
            self._rulesets[key] = self._combine(f"group-{len(self._rulesets)}", key)
        return self._rulesets[key]

    def _apply(self, schedule: list[tuple[str, list[str], int | None]]) -> list[Any]:
        """One iteration (each group's rules matched against the e-graph as it stands), then shapes to a fixpoint."""
        lets, runs = [], []
        for k, (ruleset, _, limit) in enumerate(schedule):
            if limit is None:
                runs.append(f"(run {ruleset})")
            else:
                lets.append(f"(let-scheduler b{k} (back-off :match-limit {limit}))")
                runs.append(f"(run-with b{k} {ruleset})")
        return self._run(f"(run-schedule {' '.join(lets)} {' '.join(runs)} (saturate shapes))")

    def _matches(self, reports: list[Any]) -> dict[str, int]:
        matches: dict[str, int] = {}
        for out in reports:
            for name, count in out.report.num_matches_per_rule.items():
                if name in self._ruleset_of:
                    matches[name] = matches.get(name, 0) + int(count)
        return matches

    @staticmethod
    def _searched(reports: list[Any]) -> dict[str, int]:
        """Matches each rule's search found, applied or not (a banned rule's are found but not applied)."""
        found: dict[str, int] = {}
        for out in reports:
            for iteration in out.report.iterations:
                for name, rule_reports in iteration.rule_set_report.rule_reports.items():
                    found[name] = found.get(name, 0) + sum(int(r.num_matches) for r in rule_reports)
        return found

    def _fill(self, groups: list[list[str]], node_limit: int, deadline: float, backoff: "Backoff",
              unthrottled_multi: bool) -> dict[str, int]:
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
                queue += [group[: len(group) // 2], group[len(group) // 2:]]
        return matches


    # -- export and rebuild -------------------------------------------------------------------------------------

    def export(self, node_cost: CostFn, competitive: float | None = None, price_seconds: float | None = None,
               ) -> tuple[XGraph, dict[str, DecodedNode], set[str]]:
        """The e-graph for the extractor: costs from `node_cost`, roots the graph outputs.

        Returns the extraction e-graph, the decoded e-node behind every node id, and the ids of e-nodes that must
        not be chosen (their shape does not check, or a child has no shape). Every e-node the input graph does not
        use costs `UNCHOSEN_MS` more, so that of equal-cost graphs the extraction keeps the input's own operand
        order and layout (onnxruntime's fusions match operands in the order exporters write them).

        With `competitive` (for a cost model that measures, where every price takes time), only e-nodes that can
        appear in a competitive selection are priced by `node_cost`: those whose cheapest tree under the analytic
        estimate (the e-node and the work it needs below it) is at most `competitive` times the cheapest tree of
        their e-class (plus `COMPETITIVE_SLACK_MS`). The others (a depthwise convolution turned dense, a merge of
        its groups) are priced at their estimate times the largest ratio of price to estimate among the priced
        ones: dominated in their own e-class, never worth a measurement.
        With `price_seconds` as well, pricing (through `node_cost.prefetch`, in batches) stops once it has taken
        that long: the input graph's own e-nodes come first, then the others, costliest estimate first (where a
        wrong price would cost most); those left are priced like the dominated ones, so they are chosen only
        where they win by far.
        """
        eg = self.egraph
        frozen = eg.freeze()
        class_ids: dict[Any, int] = {}

        def cid(value: Any) -> int:
            return class_ids.setdefault(value, len(class_ids))

        shapes = {
            cid(r.inputs[0]): tuple(eg.value_to_i64(v) for v in eg.value_to_vec(r.output))
            for r in frozen.functions["shape-of"].rows
        }
        decoded: dict[str, DecodedNode] = {}
        for name, fn in frozen.functions.items():
            d = ops.BY_EGG.get(name)
            if d is None:
                continue
            for k, row in enumerate(fn.rows):
                if row.subsumed:
                    continue
                args = list(row.inputs)
                if d.inputs is None:
                    children = tuple(cid(v) for v in eg.value_to_vec(args[-1]))
                    attr_values = args[:-1]
                else:
                    children = tuple(cid(v) for v in args[: d.inputs])
                    attr_values = args[d.inputs:]
                attrs = {n: self._decode(kind, v) for (n, kind), v in zip(d.attrs, attr_values)}
                decoded[f"{name}#{k}"] = DecodedNode(d.name, attrs, children, cid(row.output))
        const = self._constant_classes(decoded)
        forbidden: set[str] = set()
        costs: dict[str, float] = {}
        to_price: dict[str, tuple[Node, list[tuple[int, ...]], list[bool]]] = {}
        for nid, dn in decoded.items():
            out_shape = shapes.get(dn.eclass)
            child_shapes = [shapes.get(c) for c in dn.children]
            ok = out_shape is not None and all(s is not None for s in child_shapes)
            if ok and ops.get(dn.op).inputs is not None:
                try:
                    ok = ops.shape_of(dn.op, child_shapes, dn.attrs) == out_shape  # type: ignore[arg-type]
                except ops.ShapeError:
                    ok = False
            if not ok:
                forbidden.add(nid)
                costs[nid] = 0.0
            elif dn.op in ("input", "weight") or (
                dn.op != "opaque" and dn.children and all(c in const for c in dn.children)
            ):
                costs[nid] = 0.0
            else:
                dtype = dn.attrs.get("dtype", "float32")
                node = Node(dn.op, (), tuple(dn.attrs.items()), out_shape, dtype)  # type: ignore[arg-type]
                to_price[nid] = (node, child_shapes, [c in const for c in dn.children])  # type: ignore[assignment]
        node_of = {eg.value_to_i64(r.inputs[0]): cid(r.output) for r in frozen.functions["node-of"].rows}
        self._node_of = node_of
        self._chosen_of = {eg.value_to_i64(r.inputs[0]): cid(r.output) for r in frozen.functions["chosen-of"].rows}
        estimate: dict[str, float] = {}
        dominated: set[str] = set()
        prefetch = getattr(node_cost, "prefetch", None)
        original = set(self.original_selection(decoded).values())
        if competitive:
            estimate, dominated, order = self._dominated(decoded, to_price, costs, forbidden, competitive, original)
            if prefetch is not None:
                dominated.update(self._prefetch(prefetch, order, to_price, price_seconds))
        elif prefetch is not None:
            prefetch(list(to_price.values()))
        scale = 1.0
        for nid, (node, child_shapes, flags) in to_price.items():
            if nid not in dominated:
                costs[nid] = float(node_cost(node, child_shapes, flags))
                if dominated and estimate[nid] > 0:
                    scale = max(scale, costs[nid] / estimate[nid])
        for nid in dominated:
            costs[nid] = estimate[nid] * scale
        nodes = {
            nid: ENode(ops.get(dn.op).egg, costs[nid] + (0.0 if nid in original else UNCHOSEN_MS), str(dn.eclass),
                       tuple(str(c) for c in dn.children))
            for nid, dn in decoded.items()
        }
        roots = list(dict.fromkeys(str(node_of[n]) for _, n in self.graph.outputs))
        return XGraph(nodes, roots), decoded, forbidden

    def _dominated(
        self, decoded: dict[str, DecodedNode], to_price: dict[str, tuple[Node, list[tuple[int, ...]], list[bool]]],
        costs: dict[str, float], forbidden: set[str], ratio: float, original: set[str],
    ) -> tuple[dict[str, float], set[str], list[str]]:
        """The analytic estimate of every e-node of `to_price`; those whose cheapest tree under it (the e-node with
        the work it needs below it) exceeds `ratio` times the cheapest tree of their e-class (never one of
        `original`, the input graph's own); and the others in pricing order (see `export`)."""
        analytic = AnalyticCost()
        estimate = {nid: float(analytic(*item)) for nid, item in to_price.items()}
        estimated = XGraph({nid: ENode(ops.get(dn.op).egg, estimate.get(nid, costs.get(nid, 0.0)),
                                       str(dn.eclass), tuple(str(c) for c in dn.children))
                            for nid, dn in decoded.items()},
                           [str(self._node_of[n]) for _, n in self.graph.outputs])
        tree = tree_costs(estimated, frozenset(forbidden))
        cheapest: dict[int, float] = {}
        for nid, dn in decoded.items():
            cheapest[dn.eclass] = min(cheapest.get(dn.eclass, tree[nid]), tree[nid])
        dominated = {nid for nid in estimate
                     if tree[nid] > ratio * cheapest[decoded[nid].eclass] + COMPETITIVE_SLACK_MS
                     and nid not in original}
        order = sorted((nid for nid in to_price if nid not in dominated),
                       key=lambda nid: (nid not in original, -estimate[nid]))
        return estimate, dominated, order

    @staticmethod
    def _prefetch(prefetch: Callable[[Any], None], order: Sequence[str],
                  to_price: dict[str, tuple[Node, list[tuple[int, ...]], list[bool]]],
                  seconds: float | None) -> list[str]:
        """Prefetch the prices of `order` in batches until `seconds` have passed; the ids left unpriced."""
        if seconds is None:
            prefetch([to_price[nid] for nid in order])
            return []
        start = time.perf_counter()
        for k in range(0, len(order), PRICE_BATCH):
            if k and time.perf_counter() - start > seconds:
                return list(order[k:])
            prefetch([to_price[nid] for nid in order[k:k + PRICE_BATCH]])
        return []

    @staticmethod
    def _constant_classes(decoded: dict[str, DecodedNode]) -> set[int]:
        """E-classes computable from weights alone (their e-nodes over them cost nothing: folded at export)."""
        const: set[int] = set()
        changed = True
        while changed:
            changed = False
            for dn in decoded.values():
                if dn.eclass in const:
                    continue
                if dn.op == "weight" or (
                    dn.op not in ("input", "opaque") and dn.children and all(c in const for c in dn.children)
                ):
                    const.add(dn.eclass)
                    changed = True
        return const

    def _decode(self, kind: str, value: Any) -> Any:
        eg = self.egraph
        if kind == "int":
            return eg.value_to_i64(value)
        if kind == "ints":
            return tuple(eg.value_to_i64(v) for v in eg.value_to_vec(value))
        if kind == "float":
            return eg.value_to_f64(value)
        return self._strings[int(eg.value_to_string(value)[1:])]

    def original_selection(self, decoded: dict[str, DecodedNode]) -> dict[str, str]:
        """The e-node chosen in each e-class by the input graph itself: a valid, acyclic selection.

        Where rewrites merged the classes of several input nodes (e.g. slice(concat(a, b)) and a), the earliest
        node in topological order is chosen; ids then strictly decrease along every chosen edge, so the selection
        cannot be cyclic.
        """
        return self._selection(decoded, self.graph, self.live, self._node_of)

    def chosen_selection(self, decoded: dict[str, DecodedNode], graph: Graph, base: int) -> dict[str, str]:
        """The selection of the last export that describes `graph`, marked by `guide` under offset `base`."""
        ids = {i: self._chosen_of[base + i] for i in graph.live()}
        return self._selection(decoded, graph, graph.live(), ids)

    @staticmethod
    def _selection(decoded: dict[str, DecodedNode], graph: Graph, live: Sequence[int],
                   class_of: dict[int, int]) -> dict[str, str]:
        """The e-node of each of `graph`'s nodes (in topological order; the first wins where classes merged)."""
        index: dict[tuple[Any, ...], str] = {}
        for nid, dn in decoded.items():
            index[(dn.op, dn.children, tuple(sorted(dn.attrs.items())))] = nid
        choices: dict[str, str] = {}
        for i in live:
            n = graph.nodes[i]
            key = (n.op, tuple(class_of[j] for j in n.inputs), tuple(sorted(n.attr.items())))
            choices.setdefault(str(class_of[i]), index[key])
        return choices

    def rebuild(self, choices: dict[str, str], decoded: dict[str, DecodedNode]) -> Graph:
        """The IR graph a selection (e-class -> e-node id) describes, with the original inputs and outputs."""
        src = self.graph
        out = Graph(opset_imports=dict(src.opset_imports), name=src.name)
        built: dict[int, int] = {}
        for i in src.input_ids:  # keep every graph input, in order
            n = src.nodes[i]
            built[self._node_of[i]] = out.input(n.attr["name"], n.shape, n.dtype)
        for _, root in src.outputs:
            stack = [self._node_of[root]]
            while stack:
                c = stack[-1]
                if c in built:
                    stack.pop()
                    continue
                dn = decoded[choices[str(c)]]
                pending = [ch for ch in dn.children if ch not in built]
                if pending:
                    stack.extend(pending)
                    continue
                stack.pop()
                built[c] = self._build_node(out, dn, [built[ch] for ch in dn.children])
        out.outputs = [(name, built[self._node_of[n]]) for name, n in src.outputs]
        return out

    def _build_node(self, out: Graph, dn: DecodedNode, inputs: list[int]) -> int:
        src = self.graph
        if dn.op == "input":
            node = next(src.nodes[i] for i in src.input_ids if src.nodes[i].attr["name"] == dn.attrs["name"])
            return out.input(dn.attrs["name"], node.shape, node.dtype)
        if dn.op == "weight":
            return out.weight(src.weights[dn.attrs["name"]], dn.attrs["name"])
        if dn.op == "opaque":
            out.opaque[dn.attrs["key"]] = src.opaque[dn.attrs["key"]]
        return out.add(dn.op, inputs, **dn.attrs)


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

    def record(self, schedule: list[tuple[str, list[str], int | None]], found: dict[str, int],
               iteration: int) -> set[str]:
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
