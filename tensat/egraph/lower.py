"""Lowering an IR graph into egglog: the declarations, shape rules and one ruleset per rewrite rule (a guided copy
for each multi-pattern rule) registered in a pooled e-graph, the graph's nodes as terms of the `node-of` table, and
the egglog plumbing the exploration and the export share (running commands, snapshots, sizes, attribute values)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from tensat import ops, rewrites
from tensat.egraph.pool import blank_egraph, run_program
from tensat.ir import Graph, Node

GUIDED = "guided/"  # prefix of a multi-pattern rule's guided copy (matching only e-classes marked chosen)
TWIN = "#"  # a guided copy is two egglog rules, named `GUIDED + name` and `GUIDED + name + TWIN + "1"` (see guide)


def rule_of_report(name: str) -> str:
    """The rule (or guided copy) an egglog report's rule name belongs to."""
    return name.split(TWIN, 1)[0]


def constructor_sizes(egraph: Any) -> dict[str, int]:
    """Rows of each tensor constructor's table in an egglog e-graph, by op name (cheap: no freeze)."""
    out = run_program(egraph, "(print-size)")
    sizes: dict[str, int] = {}
    for line in str(out[-1]).replace("(", " ").replace(")", " ").split("\n"):
        parts = line.split()
        if len(parts) == 2 and parts[0] in ops.BY_EGG:
            sizes[ops.BY_EGG[parts[0]].name] = int(parts[1])
    return sizes


def enode_count(egraph: Any) -> int:
    """E-nodes of tensor constructors in an egglog e-graph, from its table sizes (cheap: no freeze)."""
    return sum(constructor_sizes(egraph).values())


def egg_value(kind: str, value: Any) -> str:
    """An attribute value of kind `kind` (`ops.EGG_SORT`) as an egglog literal."""
    if kind == "int":
        return str(int(value))
    if kind == "ints":
        return f"(vec-of {' '.join(str(int(v)) for v in value)})" if value else "(vec-empty)"
    if kind == "float":
        return repr(float(value))
    return '"' + str(value).replace('"', "") + '"'


class LoweredGraph:
    """An IR graph lowered into an egglog e-graph with the rules that rewrite it registered; its shapes are computed
    in egglog and checked against ops.py."""

    def __init__(self, graph: Graph, rules: Sequence[rewrites.Rule] | None = None) -> None:
        self.graph = graph
        present = {graph.nodes[i].op for i in graph.live()}
        self.rules: list[rewrites.Rule] = []
        self._used: set[str] = set()  # the ops whose shape rules are registered
        self._symbolic = bool(graph.symbolic)  # guards hold at every size of the symbolic dims (`ir.Graph.symbolic`)
        self._strings: list[str] = []
        self._string_ids: dict[str, int] = {}
        self._ruleset_of: dict[str, str] = {}
        program = [
            ops.egg_declarations(),
            "(function node-of (i64) T :no-merge)\n(function chosen-of (i64) T :no-merge)\n(relation chosen (T))\n"
            "(relation fresh (T))\n(relation settled (T))\n(ruleset stale)\n"
            "(rule ((fresh x) (chosen x)) ((delete (fresh x))) :ruleset stale)\n"
            "(rule ((chosen x)) ((settled x)) :ruleset stale)",
        ]
        program += self._registered(list(rules) if rules is not None else rewrites.select_rules(present), present)
        self._blank = blank_egraph(program, self)
        self.egraph = self._blank.egraph
        self.version = 0  # bumped whenever the e-graph's content may have changed: an export is reused until then
        self._chosen_base = 0
        self.live = graph.live()
        self._run_batched([f"(set (node-of {i}) {self._lower(graph.nodes[i])})" for i in self.live])
        live = set(self.live)
        self._run_batched(
            [
                f"(set (sym-shape-of (node-of {i})) {self._attr('ints', dims)})"
                for i, dims in graph.symbolic.items()
                if i in live
            ]
        )
        self._run("(run-schedule (saturate shapes))")
        self._check_initial_shapes()

    def _registered(self, rules: Sequence[rewrites.Rule], present: Iterable[str] = ()) -> list[str]:
        """The egglog program that registers `rules`, with the shape rules of the ops of `present` and those the
        rules build, where not registered yet; the rules join `self.rules`."""
        program = []
        for rule in rules:
            k = len(self.rules)
            self.rules.append(rule)
            name = f"rule-{k}"
            self._ruleset_of[rule.name] = name
            program.append(f"(ruleset {name})\n{rewrites.to_egglog(rule, name, symbolic=self._symbolic)}")
            if rule.multi:  # the same rule, matching only pairs of chosen e-classes with a fresh one (see `guide`):
                guided = f"guided-{k}"  # the first fresh, or the first chosen in an earlier round and the second fresh
                self._ruleset_of[GUIDED + rule.name] = guided
                program.append(f"(ruleset {guided})")
                for name, roots_in in (("", [("fresh", 0)]), (f"{TWIN}1", [("settled", 0), ("fresh", 1)])):
                    program.append(
                        rewrites.to_egglog(rule, guided, "chosen", GUIDED + rule.name + name, roots_in, self._symbolic)
                    )
        new = set(present).union(*(r.produced_ops() for r in rules)) - self._used
        self._used |= new
        program.append(
            "\n".join(ops.egg_shape_rules(new) + (ops.egg_symbolic_shape_rules(new) if self._symbolic else []))
        )
        return program

    def add_rules(self, rules: Sequence[rewrites.Rule]) -> None:
        """Register `rules` too (those not registered yet), in the current snapshot: a pop below it would drop them,
        as a kept blank e-graph (`pool.Blank`) does when its user is gone."""
        fresh = [r for r in rules if r.name not in self._ruleset_of]
        if fresh:
            self._run("\n".join(self._registered(fresh)))

    # -- egglog plumbing ----------------------------------------------------------------------------------------

    def _run(self, text: str) -> list[Any]:
        """Run egglog commands that may change the e-graph (its `version` moves on)."""
        self.version += 1
        return run_program(self.egraph, text)

    @property
    def _depth(self) -> int:
        """egglog snapshots pushed and not popped."""
        return self._blank.depth

    def _push(self) -> None:
        run_program(self.egraph, "(push)")  # a snapshot: the content stays as it is
        self._blank.depth += 1

    def _pop(self) -> None:
        self._run("(pop)")
        self._blank.depth -= 1

    # -- sizes --------------------------------------------------------------------------------------------------

    def enode_count(self) -> int:
        """E-nodes of tensor constructors, from egglog's table sizes (cheap: no freeze)."""
        return enode_count(self.egraph)  # a read: the version stays

    def ops_present(self) -> set[str]:
        """The ops at least one e-node of the e-graph has (the left sides of rules over other ops cannot match)."""
        return {op for op, rows in constructor_sizes(self.egraph).items() if rows}

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

    # -- lowering and attribute values --------------------------------------------------------------------------

    def _string(self, s: str) -> str:
        if s not in self._string_ids:
            self._string_ids[s] = len(self._strings)
            self._strings.append(s)
        return f'"s{self._string_ids[s]}"'

    def _attr(self, kind: str, value: Any) -> str:
        return self._string(str(value)) if kind == "str" else egg_value(kind, value)

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

    def guide(self, graph: Graph) -> int:
        """Mark the e-classes of `graph` (a graph extracted from this e-graph) as chosen, for a guided round; returns
        the id offset under which its nodes are held in the `chosen-of` table (see `chosen_selection`).

        Those not chosen by an earlier round are also marked fresh, and the earlier rounds' ones settled: a guided
        rule matches only pairs with a fresh e-class, as pairs of settled ones were merged in the rounds that chose
        them (semi-naive evaluation). Its terms are e-nodes of the e-graph already, so
        lowering them adds nothing but the marks."""
        base = self._chosen_base
        self._chosen_base += len(graph.nodes)
        live = graph.live()
        commands = [f"(set (chosen-of {base + i}) {self._lower(graph.nodes[i], 'chosen-of', base)})" for i in live]
        commands += [f"(fresh (chosen-of {base + i}))" for i in live]
        self._run_batched(commands)
        self._run("(run-schedule (saturate shapes) (run stale))")
        self._run_batched([f"(chosen (chosen-of {base + i}))" for i in live])
        return base

    def _run_batched(self, commands: Sequence[str], batch: int = 256) -> None:
        for k in range(0, len(commands), batch):
            self._run("\n".join(commands[k : k + batch]))

    def _check_initial_shapes(self) -> None:
        frozen = self.egraph.freeze()
        node_of = {self.egraph.value_to_i64(r.inputs[0]): r.output for r in frozen.functions["node-of"].rows}
        shapes = {r.inputs[0]: r.output for r in frozen.functions["shape-of"].rows}
        for i in self.live:
            shape = shapes.get(node_of[i])
            got = None if shape is None else tuple(self.egraph.value_to_i64(v) for v in self.egraph.value_to_vec(shape))
            if got != self.graph.nodes[i].shape:
                raise RuntimeError(
                    f"egglog shape rules disagree with tensat.ops for node {i} ({self.graph.nodes[i].op}): "
                    f"{got} vs {self.graph.nodes[i].shape}"
                )
