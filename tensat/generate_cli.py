"""`tensat rules generate`: generate rules over the operator registry (`tensat.rewrites.generate`), minimized by
equality saturation (`tensat.egraph.derive`), verified, and written as a rule file."""

from __future__ import annotations

import argparse
import math
import shlex
import sys
import time
from pathlib import Path
from typing import Any

from tensat import ops
from tensat._version import __version__
from tensat.egraph.derive import Prover
from tensat.errors import TensatError
from tensat.files import atomic_write_text
from tensat.options import positive_int
from tensat.rewrites import GENERATED_DIR
from tensat.rewrites.dsl import parse_rules
from tensat.rewrites.generate import (
    CHANNELS,
    LEAVES,
    VECTORS,
    Generated,
    Settings,
    default_ops,
    enumerable,
    generate,
    rule_prefix,
    rules_text,
    why_not_enumerable,
)
from tensat.rewrites.workers import default_jobs


def library_file(settings: Settings) -> Path:
    """The library's generated set of a generation: `generated_NAME.rules` for a named set, else by its leaves:
    `generated.rules` over the default ones, `generated_r4.rules` over leaves of rank 4, `generated_r4v2.rules` with
    two vectors besides (the file is named as the rules are, `rule_prefix`; the search and the coverage read every
    file of the folder)."""
    return GENERATED_DIR / f"{rule_prefix(settings).replace('gen', 'generated', 1).replace('-', '_')}.rules"


def _sizes(text: str) -> tuple[int, ...]:
    try:
        sizes = tuple(int(s) for s in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated sizes, got {text!r}") from None
    if not sizes or min(sizes) < 1:
        raise argparse.ArgumentTypeError(f"sizes must be positive, got {text!r}")
    return sizes


def _constants(text: str | None) -> tuple[float, ...]:
    """The values of `--constants`; TensatError (one line) for text that is not distinct finite numbers."""
    if text is None:
        return ()
    try:
        values = tuple(float(v) for v in text.split(","))
    except ValueError:
        raise TensatError(f"--constants: expected comma-separated numbers, got {text!r}") from None
    if len(set(values)) != len(values) or not all(math.isfinite(v) for v in values):
        raise TensatError(f"--constants: constants must be distinct finite numbers, got {text!r}")
    return values


def _domain(text: str) -> tuple[str, str, tuple[Any, ...]]:
    """`--domain OP.ATTR=V,V...`: (op, attribute, values), each an integer or the name of a value computed from the
    shapes that the op declares for the attribute (`OpDef.generated` or `OpDef.sized_values`: a slice's `half`, a
    reshape's `flat` and `same`)."""
    target, _, values = text.partition("=")
    op, _, attr = target.partition(".")
    d = ops.registry.REGISTRY.get(op)
    if d is None or attr not in d.attr_names or not values:
        raise TensatError(f"--domain: expected OP.ATTR=V,V... of an op's attribute, got {text!r}")
    generated = d.generated.get(attr, ())
    listed = [v for v in (generated if isinstance(generated, (list, tuple)) else ()) if isinstance(v, ops.Sized)]
    named = {s.name: s for s in (*listed, *d.sized_values.get(attr, ()))}
    parsed: list[Any] = []
    for v in values.split(","):
        if v in named:
            parsed.append(named[v])
            continue
        try:
            parsed.append(int(v))
        except ValueError:
            known = ", ".join(named) or "none"
            raise TensatError(f"--domain: {op}.{attr} has no value {v!r} (an integer, or one of: {known})") from None
    return op, attr, tuple(parsed)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of `tensat rules generate`."""
    parser.add_argument(
        "--max-ops", type=positive_int, default=3, help="operators per term, at most (default 3; 4 is a longer run)"
    )
    parser.add_argument(
        "--ops",
        metavar="OP,OP...",
        help="the ops to enumerate, or `all` for every op that enumerates over the leaves (default: the ONNX "
        "standard ops of at most two inputs with a float output)",
    )
    parser.add_argument("--rank", type=positive_int, default=2, help="rank of the leaf tensors (default 2)")
    parser.add_argument(
        "--leaves",
        type=int,
        choices=range(1, len(LEAVES) + 1),
        default=Settings.leaves,
        help=f"leaf tensors (default {Settings.leaves}; 4 for a rule over four, such as a sum of two concats)",
    )
    parser.add_argument(
        "--sizes",
        type=_sizes,
        default=(2, 3),
        metavar="N,N...",
        help="every dim of the leaves, one fingerprint per size (default 2,3)",
    )
    parser.add_argument(
        "--vectors",
        type=int,
        choices=range(len(VECTORS) + 1),
        default=0,
        help="rank-1 leaves besides the tensors, for an op that takes one, such as a conv's bias (default 0)",
    )
    parser.add_argument(
        "--channels",
        type=int,
        choices=range(len(CHANNELS) + 1),
        default=0,
        help="leaves besides of the tensors' rank that are 1 in every dim but the second: a per-channel scale of an "
        "NCHW tensor, a row at rank 2 (default 0)",
    )
    parser.add_argument(
        "--constants",
        metavar="V,V...",
        help="constant leaves besides, each a float32 scalar that broadcasts against the tensors (such as 0.5,1 for "
        "a power's exponent or a scale; default none); the rules write them for any rank",
    )
    parser.add_argument(
        "--domain",
        action="append",
        default=[],
        metavar="OP.ATTR=V,V...",
        help="an attribute's values in place of the registry's, such as slice.size=1,2 for slices that concatenate "
        "to one (repeatable)",
    )
    parser.add_argument(
        "--leaf-values",
        choices=("signed", "positive"),
        default="signed",
        help="the leaf tensors' elements in the fingerprints: small nonzero integers of either sign, or positive ones "
        "for ops defined on positive inputs alone, such as sqrt and a fractional power (default signed)",
    )
    parser.add_argument("--seed", type=int, default=0, help="random seed of the fingerprints and the verifier")
    parser.add_argument(
        "--name",
        default="",
        help="the set's name: its rules are named gen-NAME-* and its library file generated_NAME.rules (default: "
        "named by the leaves' rank and vectors)",
    )
    parser.add_argument(
        "-o",
        "--output",
        type=Path,
        help="the rule file to write (default: the library's, rewrites/rules/generated/generated_NAME.rules for a "
        "named set, else generated.rules at rank 2, generated_rN.rules at rank N, generated_rNvK.rules with K vectors)",
    )
    parser.add_argument(
        "--jobs",
        type=positive_int,
        default=default_jobs(),
        help="processes that evaluate the largest terms and verify candidates (default: one per core this process "
        "may use); the rules do not depend on it",
    )
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress lines")


def settings_of(args: argparse.Namespace) -> Settings:
    """The generation's settings from the flags; TensatError (one line) for an op that is unknown or cannot be
    enumerated."""
    names: tuple[str, ...] | None = None
    if args.ops == "all":
        names = tuple(enumerable(args.rank, args.vectors))
    elif args.ops is not None:
        names = tuple(n.strip() for n in args.ops.split(",") if n.strip())
        unknown = [n for n in names if n not in ops.registry.REGISTRY]
        if unknown or not names:
            raise TensatError(f"unknown op {', '.join(unknown) or repr(args.ops)} in --ops")
        for name in names:
            why = why_not_enumerable(name, args.rank, args.vectors)
            if why is not None:
                raise TensatError(f"--ops: cannot enumerate {name}: {why}")
    elif not default_ops(args.rank):
        raise TensatError(f"no op enumerates over leaves of rank {args.rank} by default: give --ops")
    try:
        return Settings(
            max_ops=args.max_ops,
            ops=names,
            rank=args.rank,
            leaves=args.leaves,
            sizes=args.sizes,
            seed=args.seed,
            vectors=args.vectors,
            channels=args.channels,
            name=args.name,
            constants=_constants(args.constants),
            positive=args.leaf_values == "positive",
            domains=tuple(_domain(text) for text in args.domain),
        )
    except ValueError as exc:
        raise TensatError(str(exc)) from None


def _value_text(value: Any) -> str:
    """A `--domain` value as the flag writes it."""
    return value.name if isinstance(value, ops.Sized) else str(value)


def command_of(settings: Settings) -> str:
    """The command that makes a generation's rules again, as a rule file's header gives it."""
    default = Settings()
    return "tensat rules generate" + "".join(
        f" {flag} {shlex.quote(str(value))}"
        for flag, value in (
            ("--max-ops", settings.max_ops),
            ("--ops", ",".join(settings.ops) if settings.ops is not None else None),
            ("--rank", settings.rank),
            ("--leaves", settings.leaves if settings.leaves != default.leaves else None),
            ("--sizes", ",".join(map(str, settings.sizes))),
            ("--vectors", settings.vectors or None),
            ("--channels", settings.channels or None),
            ("--constants", ",".join(map(repr, settings.constants)) or None),
            *(
                ("--domain", f"{op}.{attr}={','.join(map(_value_text, values))}")
                for op, attr, values in settings.domains
            ),
            ("--leaf-values", "positive" if settings.positive else None),
            ("--seed", settings.seed),
            ("--name", settings.name or None),
        )
        if value is not None
    )


def write_rules(result: Generated, settings: Settings, output: Path) -> None:
    """Write a generation's rule file, its header the command that makes it again; what is written must read back."""
    text = rules_text(result, command_of(settings), __version__)
    parse_rules(text)
    atomic_write_text(output, text)


def run(args: argparse.Namespace) -> int:
    """Generate, write the rule file, and print what each step found and took."""
    settings = settings_of(args)
    start = time.perf_counter()

    def progress(message: str) -> None:
        if not args.quiet:
            print(f"[{time.perf_counter() - start:6.1f} s] {message}", file=sys.stderr, flush=True)

    result = generate(settings, Prover(), progress, args.jobs)
    output = args.output if args.output is not None else library_file(settings)
    write_rules(result, settings, output)
    seconds = ", ".join(f"{step} {s:.1f} s" for step, s in result.seconds.items())
    print(
        f"terms {sum(result.terms)} ({', '.join(map(str, result.terms))} by size; {result.constants} constant ones "
        f"left out); candidates {result.candidates}; "
        f"pruned {result.renamings} renamings and {result.common_subterms} with a shared subterm; "
        f"{result.refuted} refuted on float leaves; {result.derived} derived by the rules kept; "
        f"{result.rejected} rejected by the verifier; "
        f"{result.not_rewrites} not rewrites; {result.unsound} caught by the e-graph merging terms of different shapes"
    )
    print(
        f"kept {result.equations} equations as {len(result.rules) - result.multi} rules ({result.guarded} guarded), "
        f"and {result.multi} multi-pattern rules of {result.multi_candidates} candidates"
    )
    print(f"time {seconds}")
    print(f"wrote {output}")
    return 0
