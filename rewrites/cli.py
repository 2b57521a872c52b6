"""`tensat rules`: list the rule library with counts, and verify it numerically."""

from __future__ import annotations

import argparse
import time

from tensat.options import RULE_SETS, Options, positive_int

from . import TENSAT_MULTI, TENSAT_SINGLE, rule_counts, rule_set
from .dsl import Rule, RuleError, load_rule_files
from .verify import verify_each
from .workers import default_jobs


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of `tensat rules`."""
    parser.add_argument(
        "--verify",
        action="store_true",
        help="evaluate both sides of every rule on random tensors (float64 and int64) of random valid "
        "shapes and every admitted attribute combination; exit 1 if any rule fails",
    )
    parser.add_argument("--trials", type=int, default=3, help="random bindings per attribute combination (default 3)")
    parser.add_argument("--seed", type=int, default=0, help="random seed of the verifier (default 0)")
    parser.add_argument(
        "--jobs",
        type=positive_int,
        default=default_jobs(),
        help="processes that verify the rules (default: one per core this process may use)",
    )
    parser.add_argument(
        "--rules",
        choices=RULE_SETS,
        default=Options.rules,
        help="the rule set: the hand-written library, the generated one (`tensat rules generate`), or all of both "
        f"(default {Options.rules})",
    )
    parser.add_argument("--only", action="append", default=[], metavar="NAME", help="only the rule NAME (repeatable)")
    parser.add_argument(
        "--file",
        action="append",
        default=[],
        metavar="PATH",
        help="also read rules from PATH (repeatable), e.g. to check new rules before adding them",
    )


def _from_files(paths: list[str]) -> list[Rule]:
    """The rules of the --file paths; RuleError (one line, naming the file) when one cannot be read or parsed."""
    rules: list[Rule] = []
    for path in paths:
        try:
            loaded = load_rule_files([path])
        except OSError as exc:
            raise RuleError(f"cannot read {path}: {exc.strerror or exc}") from None
        except UnicodeDecodeError:
            raise RuleError(f"{path}: not a UTF-8 text file") from None
        except RuleError as exc:
            message = " ".join(str(exc).split())
            raise RuleError(message if path in message else f"{path}: {message}") from None
        seen = {r.name for r in rules}
        for r in loaded:
            if r.name in seen:
                raise RuleError(f"duplicate rule name {r.name!r} in {path}")
        rules += loaded
    return rules


def _selected(args: argparse.Namespace) -> list[Rule]:
    rules = list(rule_set(args.rules))
    if args.file:
        rules += _from_files(args.file)
    if args.only:
        names = set(args.only)
        missing = names - {r.name for r in rules}
        if missing:
            raise RuleError(f"no rule named {', '.join(sorted(missing))}")
        rules = [r for r in rules if r.name in names]
    return rules


def run(args: argparse.Namespace) -> int:
    """List the rules (or verify them) and report single/multi counts, distinct up to variable renaming; 1 when a
    rule fails verification, else 0.

    Raises RuleError (one line) for a --file that cannot be read or parsed and for an --only name not found."""
    rules = _selected(args)
    counts = rule_counts(rules)
    failures = 0
    if args.verify:
        start = time.perf_counter()
        for result in verify_each(rules, trials=args.trials, seed=args.seed, jobs=args.jobs):
            failures += not result.ok
            print(result.line(), flush=True)
        print(
            f"verified {len(rules) - failures}/{len(rules)} rules in {time.perf_counter() - start:.1f} s"
            + (f"; {failures} FAILED" if failures else "")
        )
    else:
        for title, group in (
            ("single-pattern", [r for r in rules if not r.multi]),
            ("multi-pattern", [r for r in rules if r.multi]),
        ):
            print(f"{title} rules: {len(group)}")
            for r in group:
                print(f"  {r.name:40s} ops: {', '.join(sorted(r.ops()))}")
    print(
        f"single-pattern: {counts['single']} ({counts['single_distinct']} distinct up to variable renaming; "
        f"Tensat {TENSAT_SINGLE})"
    )
    print(
        f"multi-pattern:  {counts['multi']} ({counts['multi_distinct']} distinct up to variable renaming; "
        f"Tensat {TENSAT_MULTI})"
    )
    print(f"total: {len(rules)} ({counts['single']} single-pattern, {counts['multi']} multi-pattern)")
    return 1 if failures else 0
