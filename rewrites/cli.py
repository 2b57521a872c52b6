"""`tensat rules`: list the rule library with counts."""

from __future__ import annotations

import argparse

import rewrites


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of `tensat rules`."""
    del parser  # no flags yet


def run(args: argparse.Namespace) -> int:
    """List every rule, single- and multi-pattern, with the operators each needs."""
    rules = rewrites.all_rules()
    single = [r for r in rules if not r.multi]
    multi = [r for r in rules if r.multi]
    for title, group in (("single-pattern", single), ("multi-pattern", multi)):
        print(f"{title} rules: {len(group)}")
        for r in group:
            print(f"  {r.name:40s} ops: {', '.join(sorted(r.ops()))}")
    print(f"total: {len(rules)} ({len(single)} single-pattern, {len(multi)} multi-pattern)")
    return 0
