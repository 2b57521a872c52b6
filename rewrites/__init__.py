"""The rule library: every rewrite tensat knows, written once in `rules/*.rules`.

The parsed rules serve the egglog explorer (`to_egglog`), the sequential search and the verifier (`instantiate`).
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from rewrites.dsl import Rule, RuleError, instantiate, load_rule_files, parse_rules, to_egglog

RULES_DIR = Path(__file__).parent / "rules"

__all__ = ["Rule", "RuleError", "instantiate", "parse_rules", "to_egglog", "all_rules", "select_rules", "RULES_DIR"]


@lru_cache(maxsize=1)
def all_rules() -> tuple[Rule, ...]:
    """Every rule in the library, in file and definition order."""
    return tuple(load_rule_files(sorted(str(p) for p in RULES_DIR.glob("*.rules"))))


def select_rules(present_ops: set[str], rules: tuple[Rule, ...] | None = None) -> list[Rule]:
    """The rules whose left sides use only operators present in the graph (the others can never match)."""
    return [r for r in (rules if rules is not None else all_rules()) if r.ops() <= present_ops]
