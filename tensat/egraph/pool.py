"""Running egglog programs, and the pool of registered e-graphs (declarations and rules run in them and nothing
else) that `TensorEGraph`s take turns to use."""

from __future__ import annotations

import weakref
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

from egglog import bindings


class Blank:
    """An egglog e-graph with declarations and rules registered and nothing else, kept for reuse: registering some
    150 rules costs egglog about 0.3 s, more than exploring a small graph. The registered state is saved with an
    egglog push; a new user pops back to it (dropping the previous user's e-nodes, snapshots and combined
    rulesets) and pushes it again. One user at a time: a kept e-graph is handed out only once its last user is
    gone. `depth` counts the snapshots the user pushed and has not popped."""

    def __init__(self, program: Sequence[str]) -> None:
        self.egraph = bindings.EGraph()
        for text in program:
            run_program(self.egraph, text)
        run_program(self.egraph, "(push)")
        self.depth = 0
        self.user: weakref.ref[Any] | None = None

    def reset(self) -> None:
        """Back to the registered state, the previous user's e-graph freed."""
        run_program(self.egraph, "(pop)\n" * (self.depth + 1) + "(push)")
        self.depth = 0


def run_program(egraph: bindings.EGraph, text: str) -> list[Any]:
    """Run an egglog program, command by command; the outputs of all commands. Each command is parsed from its own
    text: a command parsed out of a long program runs far slower (registering the shape rules of a model with
    symbolic dims took many times longer)."""
    out: list[Any] = []
    for form in top_level_forms(text):
        for command in egraph.parse_program(form):
            out.extend(egraph.run_program(command))
    return out


def top_level_forms(text: str) -> list[str]:
    """The top-level s-expressions of egglog program `text` (comments dropped, strings kept whole)."""
    forms: list[str] = []
    depth, start, i, n = 0, -1, 0, len(text)
    while i < n:
        c = text[i]
        if c == '"':
            i = text.index('"', i + 1)  # egglog strings hold no escaped quotes
        elif c == ";":
            end = text.find("\n", i)
            i = n if end < 0 else end
            continue
        elif c == "(":
            if depth == 0:
                start = i
            depth += 1
        elif c == ")":
            depth -= 1
            if depth == 0:
                forms.append(text[start : i + 1])
        i += 1
    if depth != 0:
        raise ValueError("unbalanced parentheses in an egglog program")
    return forms


_BLANKS: OrderedDict[str, Blank] = OrderedDict()
BLANKS_KEPT = 1  # registered e-graphs kept for reuse: egglog holds about 0.7 MB per registered rule


def _release(blank: Blank) -> None:
    """Its user is gone: back to the registered state now (freeing the user's e-graph), ready for the next user."""
    blank.reset()
    blank.user = None


def blank_egraph(program: Sequence[str], user: Any) -> Blank:
    """An egglog e-graph with `program` (declarations and rules) run in it and nothing else, for `user`."""
    key = "\n".join(program)
    blank = _BLANKS.get(key)
    if blank is not None and blank.user is None:  # released: already reset
        _BLANKS.move_to_end(key)
    else:
        blank = Blank(program)
        if key in _BLANKS:  # the kept one is in use: this one serves once
            return blank
        _BLANKS[key] = blank
        while len(_BLANKS) > BLANKS_KEPT:
            _BLANKS.popitem(last=False)
    blank.user = weakref.ref(user)
    weakref.finalize(user, _release, blank).atexit = False  # nothing to free at exit
    return blank
