"""The options of one optimization run, each written once: its default, its help text and its command-line flag.

`Options` is what `tensat.optimize` takes. Every command that passes options on (`tensat optimize`, `compare`,
`profile`, `cost-report`, the benchmarks) builds its flags with `add_option_flags` from the fields, so a default or a
help text cannot differ between the API and a command, or between two commands.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tensat.errors import TensatError

EXTRACTORS = ("ilp", "greedy")
SOLVERS = ("highs", "cbc")
COSTS = ("analytic", "measured")
DEVICES = ("auto", "cpu", "cuda")
PRE_PASSES = ("none", "onnxslim")
RULE_SETS = ("hand", "generated", "all")  # the rule library's sets (`tensat.rewrites.rule_set`)


def parse_input_shape(text: str) -> tuple[str, list[int]]:
    """Parse NAME=d1,d2,... into (name, dims)."""
    name, sep, dims = text.rpartition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"expected NAME=d1,d2,..., got {text!r}")
    try:
        shape = [int(d) for d in dims.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"dimensions must be integers in {text!r}") from None
    if any(d < 1 for d in shape):
        raise argparse.ArgumentTypeError(f"dimensions must be positive in {text!r}")
    return name, shape


def positive_int(text: str) -> int:
    """Parse a positive integer flag value."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}")
    return value


def _float_flag(text: str, zero_ok: bool) -> float:
    """Parse a number flag value that must be positive (or, with `zero_ok`, may also be 0)."""
    want = "a number >= 0" if zero_ok else "a positive number"
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be {want}, got {text!r}") from None
    if not (value >= 0 if zero_ok else value > 0):
        raise argparse.ArgumentTypeError(f"must be {want}, got {text}")
    return value


def positive_float(text: str) -> float:
    """Parse a positive number flag value."""
    return _float_flag(text, zero_ok=False)


def non_negative_float(text: str) -> float:
    """Parse a number flag value that may be 0."""
    return _float_flag(text, zero_ok=True)


class _InputShapes(argparse.Action):
    """`--input-shape NAME=D1,D2,...`, repeatable: collects the shapes into one {name: dims} dict."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        name, dims = values
        setattr(namespace, self.dest, {**(getattr(namespace, self.dest) or {}), name: dims})


def _option(default: Any, help: str, **flag: Any) -> Any:
    """An `Options` field: its default, its help text (`{default}` marks where the default is stated) and the
    `add_argument` keywords of its flag (`name` replaces the flag's name, --field-name by default)."""
    return field(default=default, metadata={"help": help, "flag": flag})


@dataclass(frozen=True)
class Options:
    """Every knob of one optimization run. Each field's `metadata["help"]` says what it does, as the command-line
    flag of the same name (`--node-limit` for `node_limit`) shows it in `tensat optimize --help`."""

    time_budget: float = _option(
        10.0,
        "seconds for the whole search: building the e-graph, exploration, guided rounds, pricing and extraction "
        "(default {default}), not counting the time spent measuring op costs not yet cached; each phase also stops "
        "at its own limit below, and when the budget runs out the cheapest graph found so far is returned",
        type=positive_float,
    )
    node_limit: int = _option(
        50_000, "stop exploring before the e-graph exceeds this many e-nodes (default {default})", type=positive_int
    )
    iter_limit: int = _option(15, "maximum exploration iterations (default {default})", type=int)
    patience: int = _option(
        3,
        "stop exploring after this many iterations in a row that did not lower the cost of a graph extracted "
        "from the e-graph by a quick sample (greedy and a short local search) (default {default}; 0 explores "
        "to saturation or a limit)",
        type=int,
    )
    time_limit: float = _option(
        60.0, "exploration time limit in seconds, checked between iterations (default {default})", type=positive_float
    )
    k_multi: int = _option(
        1,
        "number of first iterations in which multi-pattern rules run (default {default})",
        type=int,
        choices=(0, 1, 2),
    )
    guided_rounds: int = _option(
        4,
        "rounds after exploration that run the multi-pattern rules on pairs of the "
        "extracted graph's e-classes, extending its merges (default {default}; 0 disables)",
        type=int,
    )
    rules: str = _option(
        "hand",
        "rule set: the hand-written library, the generated one (`tensat rules generate`), or all of both, the "
        "hand-written rules explored first and the generated ones from the e-graph they reached (default {default})",
        choices=RULE_SETS,
    )
    extractor: str = _option(
        "ilp", "extraction method: optimal ILP or greedy DAG (default {default})", choices=EXTRACTORS
    )
    solver: str = _option("highs", "ILP solver (default {default})", choices=SOLVERS)
    ilp_time_limit: float = _option(60.0, "ILP solver time limit in seconds (default {default})", type=positive_float)
    cost: str = _option(
        "measured",
        "cost model: measured (per-op latency measured in onnxruntime on the target "
        "device, cached) or analytic (the roofline estimate: quick and reproducible) "
        "(default {default})",
        choices=COSTS,
    )
    device: str = _option(
        "auto",
        "device whose latency the measured cost model uses and the end-to-end check times "
        "on (default {default}: CUDA where it loads and a GPU exists, else CPU)",
        choices=DEVICES,
    )
    pre_pass: str = _option(
        "onnxslim",
        "canonicalize an ONNX model before tensat reads it: onnxslim (constant folding, dead-code removal, "
        "MatMul+Add into Gemm on N-D inputs) or none (tensat reads the model as given). The input is priced as "
        "given; the result, what the pre-pass changed included, is verified and timed against it, and the input is "
        "returned unless the result is faster (default {default})",
        choices=PRE_PASSES,
    )
    latency_check: float = _option(
        20.0,
        "time the optimized model against the input end to end, at one thread and "
        "at every core, for up to this long, and keep the input unless the optimized "
        "one runs faster (default {default}; 0 skips)",
        type=non_negative_float,
        metavar="SECONDS",
    )
    verify: bool = _option(
        True,
        "skip the numerical check of the optimized model against the input in onnxruntime",
        name="--no-verify",
        action="store_false",
    )
    standard_onnx: bool = _option(
        False,
        "write only ops of the ONNX standard at the model's opset, for runtimes other than onnxruntime: every "
        "onnxruntime kernel the search can choose (SkipLayerNormalization, FusedMatMul, ...) is written as the ops "
        "it computes",
        action="store_true",
    )
    seed: int = _option(0, "seed of the random verification inputs (default {default})", type=int)
    input_shapes: Mapping[str, Sequence[int]] | None = _option(
        None,
        "the shape to optimize an input with symbolic dims at (repeat for several inputs; default: 1 for a batch "
        "dim, the size another input gives a dim of the same name, else 128); the model written keeps the symbolic "
        "dims",
        name="--input-shape",
        metavar="NAME=D1,D2,...",
        type=parse_input_shape,
        action=_InputShapes,
    )

    def check(self) -> None:
        """Reject out-of-range options with a one-line error."""
        if self.node_limit < 1:
            raise TensatError(f"node_limit must be positive, got {self.node_limit}")
        if self.iter_limit < 0:
            raise TensatError(f"iter_limit must be >= 0, got {self.iter_limit}")
        if self.time_limit <= 0 or self.ilp_time_limit <= 0 or not self.time_budget > 0:
            raise TensatError("time limits must be positive")
        if not self.latency_check >= 0:
            raise TensatError(f"latency_check must be >= 0 seconds, got {self.latency_check}")
        if self.k_multi not in (0, 1, 2):
            raise TensatError(f"k_multi must be 0, 1 or 2, got {self.k_multi}")
        if self.patience < 0:
            raise TensatError(f"patience must be >= 0, got {self.patience}")
        if self.guided_rounds < 0:
            raise TensatError(f"guided_rounds must be >= 0, got {self.guided_rounds}")
        if self.extractor not in EXTRACTORS:
            raise TensatError(f"unknown extractor {self.extractor!r}; choose from {', '.join(EXTRACTORS)}")
        if self.solver not in SOLVERS:
            raise TensatError(f"unknown solver {self.solver!r}; choose from {', '.join(SOLVERS)}")
        if self.cost not in COSTS:
            raise TensatError(f"unknown cost model {self.cost!r}; choose from {', '.join(COSTS)}")
        if self.device not in DEVICES:
            raise TensatError(f"unknown device {self.device!r}; choose from {', '.join(DEVICES)}")
        if self.pre_pass not in PRE_PASSES:
            raise TensatError(f"unknown pre-pass {self.pre_pass!r}; choose from {', '.join(PRE_PASSES)}")


OPTION_NAMES = tuple(f.name for f in dataclasses.fields(Options))


def option_help(name: str) -> str:
    """The help text of the `Options` field `name`, stating its default."""
    f = Options.__dataclass_fields__[name]
    default = f"{f.default:g}" if isinstance(f.default, float) else str(f.default)
    return f.metadata["help"].replace("{default}", default)


def add_option_flags(parser: Any, names: Iterable[str], *, unset: bool = False) -> None:
    """Add the flags of the named `Options` fields to `parser` (a parser or an argument group): each parses into the
    field's name, with the field's default and help text. With `unset`, a flag left out parses as None, so that the
    caller passes on only the flags given and `Options` supplies the rest; the help still states the default."""
    for name in names:
        f = Options.__dataclass_fields__[name]
        flag = dict(f.metadata["flag"])
        option = flag.pop("name", "--" + name.replace("_", "-"))
        parser.add_argument(option, dest=name, default=None if unset else f.default, help=option_help(name), **flag)


def options_from_args(args: argparse.Namespace, names: Iterable[str] = OPTION_NAMES) -> dict[str, Any]:
    """The named options as parsed by flags from `add_option_flags`, leaving out those left unset (None)."""
    return {name: getattr(args, name) for name in names if getattr(args, name, None) is not None}
