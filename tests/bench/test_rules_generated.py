"""The generated-rules bench (`bench.rules_generated`): why a run does not derive a hand-written rule."""

from __future__ import annotations

from bench.rules_generated import _run_name, _settings, library_runs, why_not
from tensat import ops
from tensat.generate_cli import command_of, library_file
from tensat.rewrites import GENERATED_DIR, all_rules
from tensat.rewrites.generate import Settings


def test_why_a_hand_rule_is_not_derived() -> None:
    """Each reason from what the run enumerated: its ops, its rank, its term size; else the prover's limits."""
    hand = {r.name: r for r in all_rules()}
    two, three = Settings(max_ops=2), Settings(max_ops=3)
    assert why_not(hand["conv-relu-fuse"], three) == "ops not enumerated: conv2d"
    assert why_not(hand["transpose-compose-3"], three) == "no instance at rank 2"
    assert why_not(hand["mul-add-distribute-right"], two) == "3 ops on a side"
    assert why_not(hand["mul-add-distribute-right"], three) == "not derived within the prover's limits"
    assert why_not(hand["relu-idempotent"], Settings(max_ops=2, ops=("add", "mul"))) == "ops not enumerated: relu"
    assert why_not(hand["add-concat-distribute"], three) == "4 tensors, more than the leaves"


def test_a_run_s_settings_and_name_are_its_flags() -> None:
    pools = _settings("--max-ops 2 --ops maxpool,relu --rank 4 --sizes 3,4")
    assert pools == Settings(max_ops=2, ops=("maxpool", "relu"), rank=4, sizes=(3, 4))
    assert _settings("--max-ops 3") == Settings(max_ops=3)
    named = "--max-ops 3 --ops add,concat --rank 2 --leaves 4 --sizes 2,3 --seed 0 --name sums"
    assert _settings(named) == Settings(max_ops=3, ops=("add", "concat"), leaves=4, name="sums")
    assert _run_name({"run": named}) == "`--max-ops 3 --ops add,concat --rank 2 --leaves 4 --name sums`"
    sliced = "--max-ops 3 --ops slice,concat --rank 2 --sizes 2,3 --domain slice.size=1,half --seed 0 --name cuts"
    settings = _settings(sliced)
    assert settings.domains == (("slice", "size", (1, ops.get("slice").sized_values["size"][0])),)
    assert command_of(settings) == f"tensat rules generate {sliced}"


def test_the_bench_makes_each_library_set_again_with_the_flags_its_header_gives() -> None:
    runs = library_runs()
    assert len(runs) == len(list(GENERATED_DIR.glob("*.rules")))
    for run in runs:
        settings = _settings(run)
        assert library_file(settings).name in {p.name for p in GENERATED_DIR.glob("*.rules")}
        assert command_of(settings) == f"tensat rules generate {run}"  # what the bench writes reads back the same
