"""The rule library: every rewrite tensat knows, written once in `rules/*.rules`.

The parsed rules serve the egglog explorer (`to_egglog`), the sequential search and the verifier (`instantiate`,
`evaluate_sides`, `rewrites.verify`).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from functools import cache, lru_cache
from pathlib import Path

from tensat.options import RULE_SETS

from .dsl import Rule, RuleError, canonical_form, instantiate, load_rule_files, parse_rules, to_egglog

RULES_DIR = Path(__file__).parent / "rules"
GENERATED_DIR = RULES_DIR / "generated"  # what `tensat rules generate` writes (`rewrites.generate`)

# The rule counts of Tensat (MLSys 2021): 120 generated + 4 hand-written single-pattern rules, 13 + 2 multi-pattern.
TENSAT_SINGLE, TENSAT_MULTI = 124, 15

__all__ = [
    "Rule",
    "RuleError",
    "instantiate",
    "parse_rules",
    "to_egglog",
    "all_rules",
    "select_rules",
    "distinct",
    "rule_counts",
    "RULES_DIR",
    "GENERATED_DIR",
    "generated_rules",
    "rule_set",
    "TENSAT_SINGLE",
    "TENSAT_MULTI",
]


@lru_cache(maxsize=1)
def all_rules() -> tuple[Rule, ...]:
    """Every rule in the library, in file and definition order."""
    return tuple(load_rule_files(sorted(str(p) for p in RULES_DIR.glob("*.rules"))))


@lru_cache(maxsize=1)
def generated_rules() -> tuple[Rule, ...]:
    """The generated rules (`tensat rules generate`), in file and definition order."""
    return tuple(load_rule_files(sorted(str(p) for p in GENERATED_DIR.glob("*.rules"))))


@cache
def rule_set(name: str) -> tuple[Rule, ...]:
    """The rules of set `name` (one of `RULE_SETS`): the hand-written library, the generated one, or both, each rule
    once (`distinct`: the generated sets overlap, and a rule the hand-written library has is its); RuleError for an
    empty generated set. Registering a rule in egglog takes a while, and so does every iteration for each rule."""
    if name not in RULE_SETS:
        raise RuleError(f"unknown rule set {name!r}: one of {', '.join(RULE_SETS)}")
    if name == "hand":
        return all_rules()
    generated = generated_rules()
    if not generated:
        raise RuleError(f"no generated rules in {GENERATED_DIR.name}/: run `tensat rules generate`")
    return tuple(distinct(generated if name == "generated" else all_rules() + generated))


def select_rules(present_ops: set[str], rules: tuple[Rule, ...] | None = None) -> list[Rule]:
    """The rules that can match in a graph using `present_ops`: those whose left sides use only operators present,
    where the operators another selected rule's right side builds count as present (a merge introduces concat and
    slice, which the concat/slice identities then simplify). Rules over operators that can never appear are left out.
    """
    pool = rules if rules is not None else all_rules()
    present = set(present_ops)
    while True:
        chosen = [r for r in pool if r.ops() <= present]
        grown = present.union(*(r.produced_ops() for r in chosen)) if chosen else present
        if grown == present:
            return chosen
        present = grown


def matchable(present_ops: set[str], rules: Sequence[Rule], registered: Collection[str] = ()) -> list[Rule]:
    """The rules of `rules` not named in `registered` whose left sides use only operators of `present_ops` (those
    an e-graph holds now): the only ones that can match it. The generated sets are large, registering a rule in
    egglog takes a while, and most of their rules are over operators a given model never comes to hold, so a search
    registers them as its e-graph comes to hold their operators, not by what rules could build (`select_rules`)."""
    taken = set(registered)
    return [r for r in rules if r.name not in taken and r.ops() <= present_ops]


def distinct(rules: tuple[Rule, ...] | list[Rule]) -> list[Rule]:
    """`rules` without duplicates up to variable renaming (the first of each kept)."""
    seen: set[str] = set()
    out = []
    for r in rules:
        key = canonical_form(r)
        if key not in seen:
            seen.add(key)
            out.append(r)
    return out


def rule_counts(rules: tuple[Rule, ...] | list[Rule] | None = None) -> dict[str, int]:
    """Single- and multi-pattern rule counts, total and distinct up to variable renaming."""
    rules = list(rules if rules is not None else all_rules())
    unique = distinct(rules)
    return {
        "single": sum(not r.multi for r in rules),
        "multi": sum(r.multi for r in rules),
        "single_distinct": sum(not r.multi for r in unique),
        "multi_distinct": sum(r.multi for r in unique),
    }
