"""The rule generator (`tensat rules generate`): enumeration, fingerprints, pruning, minimization by equality
saturation, verification, and the rule file it writes."""

from __future__ import annotations

import argparse
import shlex
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from tensat import cli, ops
from tensat.egraph.derive import UnsoundRules, derived, proved
from tensat.generate_cli import add_arguments, settings_of
from tensat.rewrites import GENERATED_DIR, RuleError, all_rules, distinct, generated_rules, rule_set
from tensat.rewrites import generate as generate_mod
from tensat.rewrites.dsl import (
    Call,
    Pattern,
    Rule,
    Term,
    Var,
    canonical_form,
    format_pattern,
    format_rule,
    literal,
    parse_rules,
)
from tensat.rewrites.generate import (
    Settings,
    constant_leaf,
    default_ops,
    enumerate_terms,
    equation_key,
    generalized,
    generate,
    instance_of,
    minimize,
    multi_rule,
    orientations,
    prune,
    refuted,
    rule_prefix,
    rules_text,
    shape_sound,
    verified,
    why_not_enumerable,
)
from tensat.rewrites.verify import verify_rule
from tensat.rewrites.workers import Workers

SMALL = Settings(max_ops=2, ops=("relu", "add", "mul", "transpose", "matmul"))
T = (("perm", literal((1, 0))),)


def _x(name: str) -> Var:
    return Var(name)


def _t(p: Term | Var) -> Term:
    return Term("transpose", (p,), T)


def _keys(rules: list[Rule]) -> set[str]:
    return {canonical_form(r) for r in rules}


def _rule(text: str) -> Rule:
    return parse_rules(text)[0]


@pytest.fixture(scope="module")
def small() -> object:
    return generate(SMALL, proved)


@pytest.fixture(scope="module")
def small_slices() -> object:
    return generate(Settings(max_ops=2, ops=("relu", "slice")), proved)


def test_a_pool_is_enumerated_at_the_ranks_it_takes_only() -> None:
    """Pools take 4-D and 5-D tensors: a generation over rank-4 leaves enumerates them, one over rank 3 does not
    (each of its terms would fail the shape check)."""
    for pool in ("avgpool", "maxpool"):
        assert why_not_enumerable(pool, 4) is None
        assert why_not_enumerable(pool, 3) is not None
    assert "avgpool" in default_ops(4) and "avgpool" not in default_ops(3)


def test_format_rule_reads_back_as_the_same_rule() -> None:
    """Every rule of the library, written by `format_rule`, parses back to the same rule."""
    for rule in all_rules():
        again = parse_rules(format_rule(rule))[0]
        assert (again.lhs, again.rhs, again.lets, again.guards, again.tolerance) == (
            rule.lhs,
            rule.rhs,
            rule.lets,
            rule.guards,
            rule.tolerance,
        ), rule.name


def test_small_registry_finds_the_known_identities(small: object) -> None:
    kept = _keys(small.rules)  # type: ignore[attr-defined]
    for text in (
        "(rule a (add ?y ?x) (add ?x ?y))",
        "(rule a (relu (relu ?x)) (relu ?x))",
        # every perm of rank 2 is its own inverse; a perm is a rank's, so the rule is guarded to it
        "(rule a (transpose (transpose ?x :perm ?perm) :perm ?perm) ?x :when ((= (rank ?x) 2)))",
        "(rule a (matmul (matmul ?x ?y) ?z) (matmul ?x (matmul ?y ?z)))",
        "(rule a (transpose (relu ?x) :perm ?perm) (relu (transpose ?x :perm ?perm)))",  # at every perm
    ):
        assert canonical_form(_rule(text)) in kept, text


def test_minimization_drops_what_the_kept_rules_derive(small: object) -> None:
    """Instances of associativity with a repeated variable are derived, not kept; a rule that only wraps its left
    side is never written."""
    kept = _keys(small.rules)  # type: ignore[attr-defined]
    assert canonical_form(_rule("(rule a (matmul (matmul ?x ?x) ?y) (matmul ?x (matmul ?x ?y)))")) not in kept
    assert canonical_form(_rule("(rule a (relu ?x) (relu (relu ?x)))")) not in kept
    assert small.derived > 0  # type: ignore[attr-defined]
    # and the e-graph proves the instance from the kept rules
    assert proved(
        small.rules,
        [
            (
                _rule("(rule a (matmul (matmul ?x ?x) ?y) ?y)").lhs[0],  # type: ignore[attr-defined]
                Term("matmul", (_x("x"), Term("matmul", (_x("x"), _x("y")), ())), ()),
            )
        ],
        (3, 3),
    ) == [True]


def test_every_generated_rule_verifies_with_another_seed(small: object) -> None:
    for rule in small.rules:  # type: ignore[attr-defined]
        assert verify_rule(rule, seed=7).ok, format_rule(rule)


def test_an_equality_at_one_shape_only_is_a_candidate_and_is_rejected() -> None:
    """Fingerprinted at 1x1 leaves alone, a transpose equals its input: the enumeration pairs them, the float draw at
    another size refutes the candidate, and the verifier (at shapes of its own) rejects it too. At sizes 2 and 3 it
    is not even a candidate."""
    one = Settings(max_ops=1, ops=("transpose",), sizes=(1,))
    wrong = (_t(_x("x")), _x("x"))
    assert equation_key(*wrong) in {equation_key(a, b) for a, b in enumerate_terms(one).candidates}
    result = generate(one, proved)
    assert result.refuted >= 1
    assert canonical_form(Rule("w", (wrong[0],), (wrong[1],))) not in _keys(result.rules)
    assert verified(Rule("w", (wrong[0],), (wrong[1],)), seed=0, rank=2) is None
    two = Settings(max_ops=1, ops=("transpose",))
    assert equation_key(*wrong) not in {equation_key(a, b) for a, b in enumerate_terms(two).candidates}


def test_a_coincidence_on_integer_leaves_is_refuted_on_float_leaves() -> None:
    """sign(x + sigmoid(y)) = sign(x) wherever x is a nonzero integer, as the fingerprints draw it; floats refute it.
    True equations are not refuted, a logarithm's argument is drawn positive, and a position where a side is not
    finite decides nothing."""
    rng = np.random.default_rng(0)

    def pair(text: str) -> tuple[Pattern, Pattern]:
        rule = _rule(f"(rule a {text})")
        return rule.lhs[0], rule.rhs[0]

    assert refuted(pair("(sign (add ?x (sigmoid ?y))) (sign ?x)"), (4, 4), rng)
    assert refuted(pair("(sqrt (mul ?x ?x)) ?x"), (4, 4), rng)
    for true in (
        "(mul ?x ?y) (mul ?y ?x)",
        "(exp (log ?x)) ?x",
        "(sqrt (mul ?x ?x)) (abs ?x)",
        "(div ?x (sqrt ?y)) (mul ?x (rsqrt ?y :epsilon 0.0))",
    ):
        assert not refuted(pair(true), (4, 4), rng), true
    nowhere_finite = Term("log", (Term("neg", (Term("abs", (_x("x"),), ()),), ()),), ())
    assert not refuted(
        (nowhere_finite, Term("log", (Term("neg", (Term("abs", (_x("y"),), ()),), ()),), ())), (4, 4), rng
    )


@pytest.mark.slow  # a generation with multi-pattern candidates
def test_multi_pattern_rules_are_tensat_s_matmul_merges() -> None:
    """Over matmul and concat at 3 ops, the pairs of terms that share an input and concatenate to one term give
    Tensat's two merges of matmuls (a shared input, a shared weight), verified; their instances with a repeated
    variable are not kept, and the file reads back."""
    result = generate(Settings(max_ops=3, ops=("matmul", "concat")), proved)
    multi = [r for r in result.rules if r.multi]
    assert result.multi == len(multi) >= 2 and result.multi_candidates >= len(multi)
    shared_input = (
        "(multi a ((matmul ?x ?y) (matmul ?x ?z))"
        " ((slice ?m :axis 1 :start 0 :size (dim ?y 1)) (slice ?m :axis 1 :start (dim ?y 1) :size (dim ?z 1)))"
        " :let ((?m (matmul ?x (concat ?y ?z :axis 1)))) :when ((= (rank ?y) 2) (= (rank ?z) 2)))"
    )
    shared_weight = (
        "(multi a ((matmul ?x ?y) (matmul ?z ?y))"
        " ((slice ?m :axis 0 :start 0 :size (dim ?x 0)) (slice ?m :axis 0 :start (dim ?x 0) :size (dim ?z 0)))"
        " :let ((?m (matmul (concat ?x ?z :axis 0) ?y))) :when ((= (rank ?x) 2) (= (rank ?z) 2)))"
    )
    kept = _keys(multi)
    assert canonical_form(_rule(shared_input)) in kept and canonical_form(_rule(shared_weight)) in kept
    assert not any(r.lhs[0] == Term("matmul", (_x("x"), _x("x")), ()) for r in multi)
    for rule in multi:
        assert verify_rule(rule, seed=5).ok, format_rule(rule)
    assert len(parse_rules(rules_text(result, "cmd", "v"))) == len(result.rules)


@pytest.mark.slow
def test_two_convs_of_one_input_merge_through_their_weights_as_tensat_s() -> None:
    """The candidate `concat(conv(x, y, b), conv(x, z, c), axis 1) = conv(x, concat(y, z), concat(b, c))` found at the
    enumeration's stride and pads becomes Tensat's merge of two convs: of every stride, pad, dilation and activation,
    of one group only (a grouped conv's weights do not concatenate), with weights of one shape but their output
    channels (not the input's shape, which the enumeration's leaves shared)."""
    conv = ops.get("conv2d").generated
    at = tuple((k, literal(v[0])) for k, v in conv.items()) + (("act", literal(0)),)
    x, y, z, b, c = (_x(n) for n in "xyzbc")
    axis0 = (("axis", literal(0)),)
    merged = Term("conv2d", (x, Term("concat", (y, z), axis0), Term("concat", (b, c), axis0)), at)
    found = multi_rule(Term("conv2d", (x, y, b), at), Term("conv2d", (x, z, c), at), 1, merged, "a", 4, 0)
    assert found is not None
    attrs = ":strides ?s :pads ?p :dilations ?d :group 1 :act ?a"
    tensat = (
        f"(multi a ((conv2d ?x ?y ?b {attrs}) (conv2d ?x ?z ?c {attrs}))"
        " ((slice ?m :axis 1 :start 0 :size (dim ?b 0)) (slice ?m :axis 1 :start (dim ?b 0) :size (dim ?c 0)))"
        f" :let ((?m (conv2d ?x (concat ?y ?z :axis 0) (concat ?b ?c :axis 0) {attrs})))"
        " :when ((= (rank ?b) 1) (= (rank ?c) 1) (same-except ?y ?z 0)))"
    )
    assert canonical_form(found) == canonical_form(_rule(tensat))
    assert verify_rule(found, seed=5).ok


def test_a_rule_wrong_under_broadcasting_is_caught_by_its_shapes_and_named_by_the_prover() -> None:
    """x / y / x = 1 / y holds wherever x and y have one shape, and the verifier's sampled broadcasts can miss where
    it does not. The shape check at the probe shapes rejects it (and passes it guarded); the e-graph, which merges
    two terms of different shapes with it, names it among sound rules by bisection."""
    wrong = _rule("(rule wrong (div (div ?x ?y) ?x) (reciprocal ?y))")
    assert not shape_sound(wrong, 2)
    assert shape_sound(_rule("(rule w (div (div ?x ?y) ?x) (reciprocal ?y) :when ((same-shape ?x ?y)))"), 2)
    sound = [r for r in generated_rules() if not r.multi][:8]
    pair = (wrong.lhs[0], wrong.rhs[0])
    with pytest.raises(UnsoundRules) as caught:
        proved([*sound[:4], wrong, *sound[4:]], [pair], (), shapes={"x": (3, 3), "y": (1, 3)})
    assert caught.value.names == ["wrong"]


def test_a_rule_wrong_only_where_a_leaf_broadcasts_is_caught_at_the_probe_shapes() -> None:
    """Both sides of one shape, different values only where x broadcasts against y: the verifier's samples rarely
    broadcast (the library shipped this rule), the probe shapes always do."""
    wrong = _rule(
        "(rule w (globalavgpool (concat (add ?x ?y) ?z :axis 2)) (globalavgpool (concat ?x (add ?y ?z) :axis 2))"
        " :when ((= (rank ?x) 4) (= (rank ?y) 4) (= (rank ?z) 4) (same-shape ?x ?z)))"
    )
    assert not shape_sound(wrong, 4)
    assert shape_sound(replace(wrong, guards=(*wrong.guards, Call("same-shape", (Var("x"), Var("y"))))), 4)


@pytest.mark.slow  # two generations, one in worker processes
def test_generation_is_deterministic_for_a_seed_whatever_the_processes_verifying() -> None:
    settings = Settings(max_ops=2, ops=("relu", "add", "neg", "transpose"))
    a, b = generate(settings, proved), generate(settings, proved, jobs=2)
    assert len(a.rules) >= 8
    assert rules_text(a, "cmd", "v") == rules_text(b, "cmd", "v")


def test_pruning_renamings_and_shared_subterms() -> None:
    x, y, z = _x("x"), _x("y"), _x("z")
    comm = (Term("add", (x, y), ()), Term("add", (y, x), ()))
    renamed = (Term("add", (x, z), ()), Term("add", (z, x), ()))
    shared = (Term("add", (Term("relu", (x,), ()), y), ()), Term("add", (y, Term("relu", (x,), ())), ()))
    kept, renamings, common = prune([comm, renamed, shared])
    assert kept == [comm] and renamings == 1 and common == 1


def test_orientations_and_instances() -> None:
    x, y = _x("x"), _x("y")
    relu = Term("relu", (x,), ())
    assert [r.name for r in orientations(Term("relu", (relu,), ()), relu, "g")] == ["g"]  # not relu -> relu(relu)
    assert [r.name for r in orientations(Term("add", (y, x), ()), Term("add", (x, y), ()), "g")] == ["g"]
    assert orientations(Term("sub", (x, x), ()), Term("sub", (y, y), ()), "g") == []  # each side has its own
    z = _x("z")
    assoc = orientations(
        Term("matmul", (Term("matmul", (x, y), ()), z), ()), Term("matmul", (x, Term("matmul", (y, z), ())), ()), "g"
    )
    square = (Term("matmul", (Term("matmul", (x, x), ()), y), ()), Term("matmul", (x, Term("matmul", (x, y), ())), ()))
    assert instance_of(square, assoc)
    assert not instance_of(square, [])
    assert not instance_of((Term("matmul", (x, y), ()), Term("matmul", (y, x), ())), assoc)


def test_an_attribute_a_rule_holds_at_every_value_of_becomes_a_variable() -> None:
    """Found at one axis, a rule that holds at every axis is kept as the rule of `?axis`, and a slice's start and
    size (solved with the shapes) likewise; a value the rule needs stays (a double transpose is the identity only
    for a perm that is its own inverse, a slice of a concat at start 0 takes the first operand only), and so does
    one whose domain is a sample (a clip's bound)."""
    cases = {
        "(rule a (relu (concat ?x ?y :axis 0)) (concat (relu ?x) (relu ?y) :axis 0))": (
            "(rule a (relu (concat ?x ?y :axis ?axis)) (concat (relu ?x) (relu ?y) :axis ?axis))"
        ),
        "(rule a (slice (relu ?x) :axis 1 :start 1 :size 1) (relu (slice ?x :axis 1 :start 1 :size 1)))": (
            "(rule a (slice (relu ?x) :axis ?axis :start ?start :size ?size)"
            " (relu (slice ?x :axis ?axis :start ?start :size ?size)))"
        ),
        "(rule a (transpose (transpose ?x :perm (vec 1 0)) :perm (vec 1 0)) ?x)": None,
        "(rule a (slice (concat ?x ?y :axis 0) :axis 0 :start 0 :size 1) (slice ?x :axis 0 :start 0 :size 1))": (
            "(rule a (slice (concat ?x ?y :axis ?axis) :axis ?axis :start 0 :size 1)"
            " (slice ?x :axis ?axis :start 0 :size 1))"
        ),
        "(rule a (clip (relu ?x) :min -1.0 :max 6.0) (clip ?x :min 0.0 :max 6.0))": None,
    }
    for text, general in cases.items():
        found = generalized(_rule(text), seed=0, rank=2)
        assert canonical_form(found) == canonical_form(_rule(general or text)), text
        assert verify_rule(found, seed=3).ok


def test_a_rule_refined_on_screened_variants_is_checked_in_full_or_refined_again(monkeypatch) -> None:
    """The variants on the way to a kept rule are screened at one seed; the rule kept passes the full check, and
    where it does not, the variant it came from is refined again with full checks, as without the screen."""
    rule = _rule(
        "(rule a (slice (matmul ?x ?y) :axis 1 :start 0 :size 1) (matmul ?x (slice ?y :axis 1 :start 0 :size 1)))"
    )
    kept = verified(rule, seed=0, rank=2)
    assert kept is not None and generate_mod._holds(kept, seed=0, rank=2)
    real = generate_mod._refuting
    failed: list[Rule] = []

    def refuting(r: Rule, seed: int, seeds: range = range(generate_mod.VERIFY_SEEDS), library: bool = True) -> dict:
        if seeds == generate_mod.CONFIRM_SEEDS and not failed:  # the refined rule's full check fails
            failed.append(r)
            return {}
        return real(r, seed, seeds, library)

    monkeypatch.setattr(generate_mod, "_refuting", refuting)
    again = verified(rule, seed=0, rank=2)
    assert failed == [kept] and again is not None and canonical_form(again) == canonical_form(kept)


def test_the_largest_terms_evaluated_by_workers_pair_as_in_one_process() -> None:
    """The enumeration's last size is shared between worker processes, every other term to each: the candidates,
    in their order, and the counts are those of one process."""
    alone = enumerate_terms(SMALL)
    with Workers(2) as workers:
        shared = enumerate_terms(SMALL, workers=workers)
    assert shared.candidates == alone.candidates and len(alone.candidates) > 100
    assert (shared.terms, shared.classes, shared.constants) == (alone.terms, alone.classes, alone.constants)


def test_a_rule_true_below_a_bound_only_is_not_kept_under_any_guard() -> None:
    """A clip to [0, 6] of a relu is the relu up to 6: the verifier's widest spread crosses the bound at every seed,
    and a guarded retry is refuted by the binding that refuted the rule where its guards hold there."""
    for text in (
        "(rule a (clip (relu ?x) :min 0.0 :max 6.0) (relu ?x))",
        "(rule a (clip (abs ?x) :min 0.0 :max 6.0) (abs ?x))",
    ):
        for seed in range(6):
            assert verified(_rule(text), seed=seed, rank=2) is None, (text, seed)


def test_a_rule_true_at_the_leaves_rank_only_is_guarded_to_it() -> None:
    """Axis 1 is a matrix's columns at rank 2 only: the rule that slices a product's columns as its right operand's
    fails the verifier at other ranks, and is kept with rank guards (its start and size made variables)."""
    rule = _rule(
        "(rule a (slice (matmul ?x ?y) :axis 1 :start 0 :size 1) (matmul ?x (slice ?y :axis 1 :start 0 :size 1)))"
    )
    assert not verify_rule(rule).ok
    kept = verified(rule, seed=0, rank=2)
    assert kept is not None
    general = _rule(
        "(rule a (slice (matmul ?x ?y) :axis 1 :start ?start :size ?size)"
        " (matmul ?x (slice ?y :axis 1 :start ?start :size ?size)) :when ((= (rank ?x) 2) (= (rank ?y) 2)))"
    )
    assert canonical_form(kept) == canonical_form(general)


def test_a_rule_keeps_only_the_equal_shapes_it_needs() -> None:
    """The enumeration's leaves are all of one shape: a rule refuted without guards is kept with each pair of its
    leaves of one shape, then without each guard it holds without, and with a guard of equal shapes but on one axis
    where that holds. Equal shapes are transitive, so one of the three here is redundant, and the operands
    concatenated need one shape only but on the axis of the concat."""
    text = "(rule a (concat (add ?x ?y) (add ?x ?z) :axis 0) (add (concat ?x ?x :axis 0) (concat ?y ?z :axis 0)))"
    kept = verified(_rule(text), seed=0, rank=2)
    assert kept is not None
    same = [g for g in kept.guards if g.fn in ("same-shape", "same-except")]  # type: ignore[union-attr]
    assert len(same) == 2 and any(g.fn == "same-except" for g in same)  # type: ignore[union-attr]
    assert verify_rule(kept, seed=5).ok
    for guard in same:
        assert not shape_sound(replace(kept, guards=tuple(g for g in kept.guards if g != guard)), rank=2)


@pytest.mark.slow  # a generation over slices at every start and size their op declares
def test_slices_are_enumerated_and_their_rules_are_general(small_slices: object) -> None:
    """A slice is enumerated at the starts and sizes its op declares for the generator (valid at every leaf size);
    the rules found are of every start and size, and derive the hand-written commutations of a slice."""
    kept = _keys(small_slices.rules)  # type: ignore[attr-defined]
    general = "(rule a (slice (relu ?x) :axis ?a :start ?s :size ?n) (relu (slice ?x :axis ?a :start ?s :size ?n)))"
    assert canonical_form(_rule(general)) in kept
    hand = {r.name: r for r in all_rules()}
    report = derived(small_slices.rules, [hand["slice-relu-commute"], hand["relu-slice-commute"]])  # type: ignore[attr-defined]
    assert report == {"slice-relu-commute": "derived", "relu-slice-commute": "derived"}


def test_a_reshape_is_enumerated_at_targets_computed_from_its_input_and_its_rules_are_general() -> None:
    """A reshape's target fits one size of input only: the generator computes it from the input's shape wherever
    the op is applied (`ops.Sized`: all elements along the last axis, or the first), and the rules it keeps have a
    variable in its place. They derive the hand-written moves of a reshape through an activation and of two
    reshapes in a row, at the verifier's shapes (not the flat ones enumerated)."""
    assert "reshape" not in default_ops(2)
    found = generate(Settings(max_ops=2, ops=("reshape", "relu")), proved)
    kept = _keys(found.rules)
    assert canonical_form(_rule("(rule a (relu (reshape ?x :shape ?s)) (reshape (relu ?x) :shape ?s))")) in kept
    assert canonical_form(_rule("(rule a (reshape (reshape ?x :shape ?t) :shape ?s) (reshape ?x :shape ?s))")) in kept
    assert all(verify_rule(r, seed=1).ok for r in found.rules)
    hand = {r.name: r for r in all_rules()}
    targets = [hand[n] for n in ("relu-reshape-commute", "reshape-relu-commute", "reshape-reshape")]
    assert derived(found.rules, targets, rank=2) == {t.name: "derived" for t in targets}


def _slice(p: Pattern, start: object, size: object, axis: int = 0) -> Term:
    return Term("slice", (p,), (("axis", literal(axis)), ("start", literal(start)), ("size", literal(size))))


def _kept_as_written(found: dict[str, tuple[Pattern, Pattern]], expected: dict[str, str]) -> None:
    """Each candidate of `found` (named after the hand-written rule it should give), verified from its first
    orientation at leaves of 3 x 3, is the rule of `expected`, and the rules kept derive the hand-written ones."""
    kept = []
    for name, (left, right) in found.items():
        rule = verified(orientations(left, right, name, (3, 3))[0], seed=0, rank=2)
        assert rule is not None and canonical_form(rule) == canonical_form(_rule(expected[name])), name
        kept.append(rule)
    hand = {r.name: r for r in all_rules()}
    assert derived(kept, [hand[n] for n in found], rank=2) == {n: "derived" for n in found}


def test_slice_starts_and_sizes_are_related_by_arithmetic() -> None:
    """The enumeration finds slices at a few starts and sizes; a rule whose right side's start or size is a sum of
    its left side's, or whose left side's are related, is kept with those values as variables, the sums written
    out, and the relations as guards (`arithmetic`), and guarded to stay inside its input where its right side
    slices a leaf. The rules kept are the hand-written ones, and derive them at the verifier's bindings."""
    x, y = Var("x"), Var("y")
    concat = Term("concat", (x, y), (("axis", literal(0)),))
    found = {
        "slice-slice": (_slice(_slice(x, 1, 1), 0, 1), _slice(x, 1, 1)),
        "concat-adjacent-slices": (
            Term("concat", (_slice(x, 0, 1), _slice(x, 1, 1)), (("axis", literal(0)),)),
            _slice(x, 0, 2),
        ),
        "slice-within-concat-left": (_slice(concat, 1, 1), _slice(x, 1, 1)),
    }
    expected = {
        "slice-slice": "(rule a (slice (slice ?x :axis ?a :start ?s1 :size ?n1) :axis ?a :start ?s :size ?n)"
        " (slice ?x :axis ?a :start (+ ?s ?s1) :size ?n) :when ((= (rank ?x) 2)))",
        "concat-adjacent-slices": "(rule a (concat (slice ?x :axis ?a :start ?s :size ?n)"
        " (slice ?x :axis ?a :start ?s1 :size ?n1) :axis ?a) (slice ?x :axis ?a :start ?s :size (+ ?n ?n1))"
        " :when ((= (rank ?x) 2) (= ?s1 (+ ?s ?n))))",
        "slice-within-concat-left": "(rule a (slice (concat ?x ?y :axis ?a) :axis ?a :start ?s :size ?n)"
        " (slice ?x :axis ?a :start ?s :size ?n) :when ((<= (+ ?s ?n) (dim ?x ?a))))",
    }
    _kept_as_written(found, expected)


def test_a_rule_over_four_tensors_keeps_only_the_equal_dims_it_needs() -> None:
    """The enumeration's four leaves are of one shape: a product of two concats split into a sum of products is
    kept guarded by x's columns equal to z's rows alone (each dim set free where the rule holds without it), and the
    sum of products merged into one by the rows of the two left operands equal and the columns of the right ones
    (two blocks of equal dims). They derive the hand-written rules, whose tensors are of four shapes."""
    split = _rule("(rule a (matmul (concat ?w ?x :axis 1) (concat ?y ?z :axis 0)) (add (matmul ?x ?z) (matmul ?w ?y)))")
    merge = _rule("(rule a (add (matmul ?x ?z) (matmul ?w ?y)) (matmul (concat ?w ?x :axis 1) (concat ?y ?z :axis 0)))")
    ranks = "(= (rank ?w) 2) (= (rank ?x) 2) (= (rank ?y) 2) (= (rank ?z) 2)"
    expected = [
        _rule(
            f"(rule a {format_pattern(split.lhs[0])} {format_pattern(split.rhs[0])}"
            f" :when ({ranks} (= (dim ?z 0) (dim ?x 1))))"
        ),
        _rule(
            f"(rule b {format_pattern(merge.lhs[0])} {format_pattern(merge.rhs[0])}"
            f" :when ({ranks} (= (dim ?y 1) (dim ?z 1)) (= (dim ?x 0) (dim ?w 0))))"
        ),
    ]
    kept = [verified(r, seed=0, rank=2) for r in (split, merge)]
    assert [canonical_form(r) for r in kept if r] == [canonical_form(r) for r in expected]
    hand = {r.name: r for r in all_rules()}
    targets = [hand["matmul-concat-inner-split"], hand["add-matmul-concat-inner"]]
    assert derived([*expected, hand["add-comm"]], targets, rank=2) == {t.name: "derived" for t in targets}


@pytest.mark.slow  # two generations
def test_a_per_channel_leaf_gives_the_rules_of_a_row_scale() -> None:
    """A leaf 1 in every dim but its second (`--channels 1`: a row at rank 2) scales a product's columns: the rule
    kept moves it onto the right operand, guarded by its one row, and derives the hand-written fold of a scale into
    a weight. Without the leaf, the leaves of one shape find no such rule."""
    found = generate(Settings(max_ops=2, ops=("matmul", "mul"), leaves=2, channels=1), proved)
    moved = "(rule a (mul ?r (matmul ?x ?y)) (matmul ?x (mul ?y ?r))"
    moved += " :when ((= (rank ?r) 2) (= (rank ?x) 2) (= (rank ?y) 2) (= (dim ?r 0) 1)))"
    assert canonical_form(_rule(moved)) in _keys(found.rules)
    hand = {r.name: r for r in all_rules()}
    target = hand["matmul-scale-mul-fold"]
    assert derived([*found.rules, hand["mul-comm"]], [target], rank=2) == {target.name: "derived"}
    plain = generate(Settings(max_ops=2, ops=("matmul", "mul"), leaves=2), proved)
    assert derived([*plain.rules, hand["mul-comm"]], [target], rank=2) == {target.name: "not derived"}


def test_a_value_computed_from_shapes_is_guarded_by_the_dim_it_equals() -> None:
    """A slice of half a concat of two leaves (`--domain slice.size=half`), of a whole leaf, and a reshape to its
    input's shape (`reshape.shape=same`) are enumerated as values computed from the shapes (`ops.Sized`); the rule
    kept ties each to the leaf's dim or shape it equals (`_sized_guards`, `_fewer_sized`): the hand-written rules
    of a concat sliced to one of its halves, of a slice of everything, and of a reshape to the same shape."""
    x, y = Var("x"), Var("y")
    half, whole = ops.get("slice").sized_values["size"]
    same = ops.get("reshape").sized_values["shape"][0]
    concat = Term("concat", (x, y), (("axis", literal(0)),))
    found = {
        "slice-concat-left": (_slice(concat, 0, half), x),
        "slice-concat-right": (_slice(concat, half, half), y),
        "slice-full": (_slice(x, 0, whole), x),
        "reshape-identity": (Term("reshape", (x,), (("shape", literal(same)),)), x),
    }
    expected = {
        "slice-concat-left": "(rule a (slice (concat ?x ?y :axis ?a) :axis ?a :start 0 :size ?n) ?x"
        " :when ((= (rank ?x) 2) (= (rank ?y) 2) (= ?n (dim ?x ?a))))",
        "slice-concat-right": "(rule a (slice (concat ?x ?y :axis ?a) :axis ?a :start ?s :size ?n) ?y"
        " :when ((= ?s (dim ?x ?a)) (= ?n (dim ?y ?a))))",
        "slice-full": "(rule a (slice ?x :axis ?a :start ?s :size ?n) ?x :when ((= ?n (dim ?x ?a))))",
        "reshape-identity": "(rule a (reshape ?x :shape ?s) ?x :when ((= ?s (shape ?x))))",
    }
    _kept_as_written(found, expected)
    unguarded = orientations(*found["slice-concat-right"], "u")[0]  # without the leaves' shape: no tie, refuted
    assert verified(unguarded, seed=0, rank=2) is None


def test_two_candidates_generalized_into_one_rule_keep_it_once() -> None:
    """c * (x * y) = x * (y * c) at c = 0.5 and at c = 2, verified in one batch, are each lifted to any constant:
    the second is the first rule again (not an instance of its pair, whose constant is written for one rank),
    counted as derived, not kept twice."""
    x, y = Var("x"), Var("y")

    def mul(a: Pattern, b: Pattern) -> Term:
        return Term("mul", (a, b), ())

    def relu(a: Pattern) -> Term:
        return Term("relu", (a,), ())

    pairs = [(relu(relu(x)), relu(x))]  # first, alone in its batch
    pairs += [(mul(c, mul(x, y)), mul(x, mul(y, c))) for c in (constant_leaf(0.5, 2), constant_leaf(2.0, 2))]
    rules, counts = minimize(pairs, proved, (2, 2))
    forms = [canonical_form(r) for r in rules]
    assert len(forms) == len(set(forms)) and counts["derived"] == 1
    general = "(rule a (mul (fill :value ?v :shape ?s :dtype ?t) (mul ?x ?y)) "
    general += "(mul ?x (mul ?y (fill :value ?v :shape (ones (rank ?x)) :dtype 1))) :when ((= ?s (ones (rank ?x)))))"
    assert canonical_form(_rule(general)) in forms


@pytest.mark.slow  # a generation over constants at two ranks
def test_constant_leaves_give_the_rules_of_a_scalar_operand_at_every_rank() -> None:
    """Constants are leaves too (TASO's): with 0.25, 0.5 and 1 among them, and positive leaves where sqrt is
    defined, the generator finds a power of a half as a square root, of a quarter as two, and one over y as its
    reciprocal. Each is kept as the hand-written rule writes it, its constant of any rank (a variable shape that
    ones(rank) guards), without a rank guard, and derives the hand-written forms. On signed leaves, sqrt(x) has no
    fingerprint, and the power of a half is no candidate."""
    settings = Settings(max_ops=2, ops=("pow", "sqrt", "div", "reciprocal"), constants=(0.25, 0.5, 1.0), positive=True)
    found = generate(settings, proved)
    kept = _keys(found.rules)
    half = "(rule a (pow ?x (fill :value 0.5 :shape ?s :dtype ?t)) (sqrt ?x) :when ((= ?s (ones (rank ?x)))))"
    assert canonical_form(_rule(half)) in kept
    assert not any(g.fn == "=" and g.args[0] == Call("rank", (Var("x"),)) for r in found.rules for g in r.guards)
    assert all(verify_rule(r, seed=1).ok for r in found.rules)
    hand = {r.name: r for r in all_rules()}
    targets = [hand[n] for n in ("pow-half-as-sqrt", "pow-quarter-as-sqrt", "one-over-as-reciprocal")]
    assert derived(found.rules, targets, rank=2) == {t.name: "derived" for t in targets}
    sqrt_x = Term("sqrt", (Var("x"),), ())
    assert any(sqrt_x in pair for pair in enumerate_terms(replace(settings, max_ops=1)).candidates)
    assert not any(sqrt_x in pair for pair in enumerate_terms(replace(settings, max_ops=1, positive=False)).candidates)


@pytest.mark.slow
def test_a_conv_is_enumerated_over_a_bias_vector_and_its_rules_hold_at_every_stride_and_pad() -> None:
    """A conv takes a rank-1 bias: with vector leaves, it is enumerated (at the one stride, pads and group its op
    declares for the generator), and the rules found are lifted to every stride, pad, dilation and group the verifier
    samples, as a hand-written rule's `?s ?p ?d ?g`: they derive the hand-written fusions of an activation, at
    the verifier's own binding (pads other than the enumeration's)."""
    with pytest.raises(ValueError, match="cannot enumerate conv2d: .*rank"):
        generate(Settings(max_ops=1, ops=("conv2d",), rank=4, sizes=(3, 4)), proved)
    found = generate(Settings(max_ops=2, ops=("conv2d", "relu"), rank=4, sizes=(3, 4), vectors=1), proved)
    assert all(r.name.startswith("gen-r4v1-") for r in found.rules)
    fused = _rule(
        "(rule a (relu (conv2d ?x ?y ?b :strides ?s :pads ?p :dilations ?d :group ?g :act 0))"
        " (conv2d ?x ?y ?b :strides ?s :pads ?p :dilations ?d :group ?g :act 2))"
    )
    general = [replace(r, guards=()) for r in found.rules if r.lhs[0].op == "relu"]
    assert canonical_form(fused) in _keys(general)
    hand = {r.name: r for r in all_rules()}
    names = ["conv-relu-fuse", "conv-relu-unfuse", "relu-conv-relu"]
    assert derived(found.rules, [hand[n] for n in names]) == dict.fromkeys(names, "derived")


def test_an_instance_binds_attribute_variables() -> None:
    x, y = _x("x"), _x("y")
    general = _rule("(rule a (relu (concat ?x ?y :axis ?axis)) (concat (relu ?x) (relu ?y) :axis ?axis))")
    at = (("axis", literal(1)),)
    pair = (
        Term("relu", (Term("concat", (x, y), at),), ()),
        Term("concat", (Term("relu", (x,), ()), Term("relu", (y,), ())), at),
    )
    assert instance_of(pair, [general])
    other = (pair[0], Term("concat", (Term("relu", (x,), ()), Term("relu", (y,), ())), (("axis", literal(0)),)))
    assert not instance_of(other, [general])


def test_derived_reports_which_hand_rules_the_generated_set_proves(small: object) -> None:
    hand = {r.name: r for r in all_rules()}
    report = derived(small.rules, [hand["matmul-assoc-left"], hand["conv-relu-fuse"]])  # type: ignore[attr-defined]
    assert report == {"matmul-assoc-left": "derived", "conv-relu-fuse": "not derived"}


def test_the_prover_can_run_the_rules_over_the_ops_other_rules_build_as_the_search_selects_them() -> None:
    """`-x / y = -(x / y)` through a product: the rule over a division builds a product and a reciprocal, and the
    rules over those finish the proof. The search registers such rules for a graph of divisions and negations
    (`rewrites.select_rules`), and the coverage check runs them too (`Prover(produced=True)`)."""
    rules = parse_rules(
        """
        (rule as-product (div ?x ?y) (mul ?x (reciprocal ?y)))
        (rule neg-out (mul (neg ?x) ?z) (neg (mul ?x ?z)))
        (rule as-quotient (mul ?x (reciprocal ?y)) (div ?x ?y))"""
    )
    target = _rule("(rule t (div (neg ?x) ?y) (neg (div ?x ?y)))")
    pair = (target.lhs[0], target.rhs[0])
    assert proved(rules, [pair], (3, 3)) == [False]
    assert proved(rules, [pair], (3, 3), produced=True) == [True]
    assert derived(rules, [target], rank=2) == {"t": "derived"}


def test_cli_writes_a_rule_file_that_verifies(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "g.rules"
    assert cli.main(["rules", "generate", "--max-ops", "2", "--ops", "relu,neg,add", "-q", "-o", str(out)]) == 0
    text = out.read_text(encoding="utf-8")
    assert text.startswith("; Generated by `tensat rules generate --max-ops 2 --ops relu,neg,add")
    assert "kept" in capsys.readouterr().out
    names = [r.name for r in parse_rules(text)]
    assert names
    assert cli.main(["rules", "--verify", "--file", str(out), *(f"--only={n}" for n in names)]) == 0


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--ops", "nope"], "unknown op nope in --ops"),
        (["--ops", "conv2d"], "cannot enumerate conv2d: it takes tensors of other ranks"),
        (["--name", "My Set"], "a set's name is lower-case letters and digits, got 'My Set'"),
        (["--constants", "0.5,x"], "expected comma-separated numbers, got '0.5,x'"),
        (["--constants", "1,1.0"], "constants must be distinct finite numbers, got '1,1.0'"),
        (["--domain", "slice.size"], "--domain: expected OP.ATTR=V,V... of an op's attribute, got 'slice.size'"),
        (["--domain", "slice.step=1"], "expected OP.ATTR=V,V... of an op's attribute, got 'slice.step=1'"),
        (["--domain", "slice.size=1,third"], "slice.size has no value 'third' (an integer, or one of: half, whole)"),
    ],
)
def test_cli_bad_flags_one_line_and_nothing_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flags: list[str], message: str
) -> None:
    out = tmp_path / "g.rules"
    assert cli.main(["rules", "generate", *flags, "-o", str(out)]) == 1
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1
    assert not out.exists()


def test_the_verifier_crosses_a_clip_bound() -> None:
    """A clip to [0, 6] agrees with a relu on small values: the verifier draws some bindings at a larger spread, so
    the pair the fingerprints of small integers would pair is rejected."""
    assert not verify_rule(_rule("(rule c (clip ?x :min 0.0 :max 6.0) (relu ?x))")).ok
    assert verify_rule(_rule("(rule c (clip (relu ?x) :min -1.0 :max 6.0) (clip ?x :min 0.0 :max 6.0))")).ok


def test_rule_sets() -> None:
    assert rule_set("hand") == all_rules()
    generated = generated_rules()
    if generated:
        assert rule_set("generated") == tuple(distinct(generated)) and set(rule_set("generated")) <= set(generated)
        assert rule_set("all") == tuple(distinct(all_rules() + generated))
        assert rule_set("all")[: len(all_rules())] == all_rules()  # a rule both have is the hand-written one
        forms = [canonical_form(r) for r in rule_set("all")]
        assert len(forms) == len(set(forms)) and set(forms) == {canonical_form(r) for r in all_rules() + generated}
    else:
        with pytest.raises(RuleError, match="no generated rules"):
            rule_set("generated")
    with pytest.raises(RuleError, match="unknown rule set"):
        rule_set("mine")


SAMPLE = 48  # the default run verifies one in this many of the library's generated rules ...
CONV_SAMPLE = 96  # ... and of those over a conv, whose verification evaluates numpy convolutions at many bindings


def _library_rules_to_verify(every: int, every_conv: int) -> list[Rule]:
    """The library's generated rules: one in `every`, and of those over a conv one in `every_conv` (the sets have
    thousands)."""
    rules = list(generated_rules())
    conv = [r for r in rules if "conv2d" in r.ops()]
    return [r for r in rules if r not in conv][::every] + conv[::every_conv]


def test_an_op_added_to_the_registry_gets_its_rules_by_generation() -> None:
    """Softplus joined the registry as one line, its numpy semantics (`tensat.ops.elementwise.SOFTPLUS`), and no
    hand-written rule mentions it. The library's set generated over it and a few ops (`generated_softplus.rules`)
    derives its identities: its odd part, the sigmoid as its exponential, and its moves through concat and
    transpose."""
    assert not any("softplus" in r.ops() | r.produced_ops() for r in all_rules())
    made = [r for r in generated_rules() if r.name.startswith("gen-softplus-")]
    assert made and any("softplus" in r.ops() for r in made)
    targets = [
        _rule("(rule odd (sub (softplus ?x) (softplus (neg ?x))) ?x)"),
        _rule("(rule sigmoid (sigmoid ?x) (exp (neg (softplus (neg ?x)))))"),
        _rule("(rule concat (softplus (concat ?x ?y :axis ?axis)) (concat (softplus ?x) (softplus ?y) :axis ?axis))"),
        _rule("(rule transpose (transpose (softplus ?x) :perm ?p) (softplus (transpose ?x :perm ?p)))"),
    ]
    assert all(verify_rule(t).ok for t in targets)
    assert derived(made, targets, rank=2) == {t.name: "derived" for t in targets}


def test_the_library_s_generated_rules_say_how_they_were_made_and_verify() -> None:
    """The generated set shipped in the library (`tensat rules generate` wrote it): its header names the command
    that makes it again, and its rules pass the verifier as `tensat rules --rules generated --verify` runs it (a
    sample of them; all of them in the slow run: `test_every_generated_rule_verifies`)."""
    files = sorted(GENERATED_DIR.glob("*.rules"))
    assert files
    for path in files:
        assert path.read_text(encoding="utf-8").startswith("; Generated by `tensat rules generate")
    failed = [r.name for r in _library_rules_to_verify(SAMPLE, CONV_SAMPLE) if not verify_rule(r).ok]
    assert failed == []


SHAPE_SAMPLE = 180  # the default run checks one in this many of the library's generated rules at the probe shapes


def _leaf_rank(rule: Rule) -> int:
    """The rank of the leaves of the library's set that made `rule`: its file's header's `--rank`, found by the
    prefix of the rule's name (`rule_prefix`)."""
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    ranks = {}
    for path in GENERATED_DIR.glob("*.rules"):
        command = path.read_text(encoding="utf-8").partition("\n")[0].split("`")[1]
        settings = settings_of(parser.parse_args(shlex.split(command)[3:]))
        ranks[rule_prefix(settings) + "-"] = settings.rank
    return ranks[max((p for p in ranks if rule.name.startswith(p)), key=len)]


@pytest.mark.parametrize("every", [pytest.param(SHAPE_SAMPLE, id="sample"), pytest.param(1, marks=pytest.mark.slow)])
def test_the_library_s_generated_rules_are_sound_at_the_probe_shapes(every: int) -> None:
    """Every generated rule of the library keeps its left side's shape, and agrees with it on one draw, at each leaf
    shape of the probe set, broadcasts among them (`shape_sound`): the sets were made with that check, and with the
    verifier's forced broadcasts, which catch the rules true only where nothing broadcasts."""
    rules = list(generated_rules())[::every]
    assert [r.name for r in rules if not shape_sound(r, _leaf_rank(r))] == []


@pytest.mark.slow
def test_every_generated_rule_verifies() -> None:
    failed = [r.name for r in _library_rules_to_verify(1, 1) if not verify_rule(r).ok]
    assert failed == []


@pytest.mark.slow
def test_a_fourth_leaf_gives_the_rules_over_four_tensors() -> None:
    """A sum of two concats is a concat of two sums only over four tensors: a fourth leaf (`--leaves 4`) finds it,
    and the set is named as asked (`--name`)."""
    settings = Settings(max_ops=3, ops=("add", "concat"), rank=1, leaves=4, name="sums")
    result = generate(settings, proved)
    distribute = _rule(
        "(rule a (add (concat ?x ?y :axis ?axis) (concat ?z ?w :axis ?axis))"
        " (concat (add ?x ?z) (add ?y ?w) :axis ?axis) :when ((same-shape ?x ?z) (same-shape ?y ?w)))"
    )
    assert result.rules and all(r.name.startswith("gen-sums-") for r in result.rules)
    assert any(len(r.tensor_vars()) == 4 for r in result.rules)
    assert derived(result.rules, [distribute], rank=1) == {"a": "derived"}


@pytest.mark.slow  # generations over the ops a default run leaves out
def test_the_ops_read_for_common_exports_are_enumerated_where_named() -> None:
    """A default run leaves out the ops read for the coverage of common exports (`OpDef.enumerated_by_default`), so
    that three operators over the default ops stay a run of minutes; named with `--ops`, they are enumerated, and
    their rules found and verified: a max's idempotence, and a Relu's absorption of the LeakyRelu it reads."""
    assert not {"max", "leakyrelu", "hardswish", "reducemax"} & set(default_ops(2))
    assert "globalmaxpool" not in default_ops(4) and "globalavgpool" in default_ops(4)
    found = generate(Settings(max_ops=2, ops=("relu", "max", "leakyrelu")), proved)
    kept = _keys(found.rules)
    assert canonical_form(_rule("(rule a (max ?x ?x) ?x)")) in kept
    assert canonical_form(_rule("(rule a (relu (leakyrelu ?x :alpha 0.01)) (relu ?x))")) in kept
    assert all(verify_rule(r, seed=1).ok for r in found.rules)
