"""The rule language: parsing, checking, egglog compilation, and numeric agreement of both sides."""

from __future__ import annotations

import numpy as np
import pytest

from tensat import ops, rewrites
from tensat.rewrites.dsl import Evaluation, RuleError, evaluate_sides, instantiate, parse_rules

RNG = np.random.default_rng(2)


def rand(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape)


def rule(name: str) -> rewrites.Rule:
    return next(r for r in rewrites.all_rules() if r.name == name)


CONV_ATTRS = {"s": (1, 1), "p": (1, 1, 1, 1), "d": (1, 1), "g": 1}

CASES = [
    ("matmul-assoc-left", {"x": rand(3, 4), "y": rand(4, 5), "z": rand(5, 2)}, {}),
    ("matmul-assoc-right", {"x": rand(2, 3, 4), "y": rand(2, 4, 5), "z": rand(1, 5, 2)}, {}),
    ("conv-relu-fuse", {"x": rand(1, 2, 5, 5), "w": rand(3, 2, 3, 3), "b": rand(3)}, CONV_ATTRS),
    ("conv-sigmoid-fuse", {"x": rand(1, 2, 5, 5), "w": rand(3, 2, 3, 3), "b": rand(3)}, CONV_ATTRS),
    ("conv-tanh-fuse", {"x": rand(1, 4, 5, 5), "w": rand(4, 2, 3, 3), "b": rand(4)}, dict(CONV_ATTRS, g=2)),
    ("slice-concat-left", {"a": rand(2, 3), "b": rand(2, 4)}, {"ax": 1, "n": 3}),
    ("slice-concat-right", {"a": rand(2, 3), "b": rand(5, 3)}, {"ax": 0, "st": 2, "n": 5}),
    ("matmul-merge-shared-input", {"x": rand(6, 4), "w1": rand(4, 3), "w2": rand(4, 5)}, {}),
    ("matmul-merge-shared-input", {"x": rand(2, 6, 4), "w1": rand(2, 4, 3), "w2": rand(2, 4, 2)}, {}),
    (
        "conv-merge-shared-input",
        {"x": rand(1, 3, 6, 6), "w1": rand(4, 3, 3, 3), "b1": rand(4), "w2": rand(2, 3, 3, 3), "b2": rand(2)},
        {"s": (2, 1), "p": (1, 0, 1, 0), "d": (1, 1), "a": 2},
    ),
]


@pytest.mark.parametrize("name,tensors,attrs", CASES, ids=[c[0] for c in CASES])
def test_both_sides_agree(name, tensors, attrs):
    pairs = evaluate_sides(rule(name), tensors, attrs)
    assert pairs is not None, "guards rejected a valid binding"
    for left, right in pairs:
        assert left.shape == right.shape
        np.testing.assert_allclose(left, right, rtol=1e-10, atol=1e-10)


def test_guards_reject_bindings_that_do_not_apply():
    assert evaluate_sides(rule("slice-concat-left"), {"a": rand(2, 3), "b": rand(2, 4)}, {"ax": 1, "n": 2}) is None
    bad = {"x": rand(2, 6, 4), "w1": rand(1, 4, 3), "w2": rand(2, 4, 2)}
    assert evaluate_sides(rule("matmul-merge-shared-input"), bad, {}) is None


def test_a_wrong_rule_is_caught_numerically():
    wrong = parse_rules("""
        (multi merge-on-wrong-axis
          ((matmul ?x ?w1) (matmul ?x ?w2))
          ((slice ?m :axis 0 :start 0 :size (dim ?x 0))
           (slice ?m :axis 0 :start (dim ?x 0) :size (dim ?x 0)))
          :let ((?m (matmul (concat ?x ?x :axis 0) ?w1))))
    """)[0]
    pairs = evaluate_sides(wrong, {"x": rand(3, 4), "w1": rand(4, 2), "w2": rand(4, 2)}, {})
    assert pairs is not None
    assert not all(np.allclose(a, b) for a, b in pairs)


@pytest.mark.parametrize(
    "text,message",
    [
        ("(rule r (frob ?x) ?x)", "unknown operator"),
        ("(rule r (relu ?x) ?y)", "not bound"),
        ("(rule r (matmul ?x) ?x)", "takes 2 tensor arguments"),
        ("(rule r (relu ?x) (relu ?x) :when ((dim ?x 0)))", "not a comparison"),
        ("(rule r (relu ?x) (relu ?x)", "unbalanced"),
        ("(rule r (conv2d ?x ?w ?b) (conv2d ?x ?w ?b))", "needs attribute"),
        ("(rule r (slice ?x :color 1) ?x)", "no attribute"),
    ],
)
def test_bad_rules_are_rejected(text, message):
    with pytest.raises(RuleError, match=message):
        rules = parse_rules(text)
        for r in rules:
            rewrites.to_egglog(r, "rw")


def test_library_rules_compile_and_are_unique():
    rules = rewrites.all_rules()
    assert len({r.name for r in rules}) == len(rules)
    for r in rules:
        text = rewrites.to_egglog(r, "multi" if r.multi else "rw")
        assert text.startswith("(rule (") and f':name "{r.name}"' in text
    assert {r.name for r in rules if r.multi} >= {"matmul-merge-shared-input", "conv-merge-shared-input"}


def test_an_evaluation_gives_instantiates_values_evaluating_a_shared_subterm_once(monkeypatch):
    """The verifier evaluates both sides of a rule at each binding on several draws: compiled once per rule, bound
    once per binding (attributes and shapes), each subterm the sides share evaluated once per draw."""
    (r,) = parse_rules(
        "(rule r (add (relu (matmul (transpose ?x :perm (vec 1 0)) ?y)) ?z) "
        "(add (matmul (transpose ?x :perm (vec 1 0)) ?y) ?z))"
    )
    evaluation = Evaluation([*r.lhs, *r.rhs], {"x", "y", "z"})
    rng = np.random.default_rng(0)
    shapes = {"x": (3, 2), "y": (3, 4), "z": (2, 4)}
    values, out = evaluation.bind(shapes, {})
    assert out == [(2, 4), (2, 4)]
    tensors = {k: rng.standard_normal(s) for k, s in shapes.items()}
    calls: list[str] = []
    evaluate = ops.evaluate
    monkeypatch.setattr(ops, "evaluate", lambda op, args, attrs: calls.append(op) or evaluate(op, args, attrs))
    left, right = values(tensors)
    assert sorted(calls) == ["add", "add", "matmul", "relu", "transpose"]
    monkeypatch.setattr(ops, "evaluate", evaluate)
    assert np.array_equal(left, instantiate(r.lhs[0], tensors, {}))
    assert np.array_equal(right, instantiate(r.rhs[0], tensors, {}))
    with pytest.raises(ops.ShapeError):
        evaluation.bind({"x": (3, 2), "y": (2, 4), "z": (2, 4)}, {})
