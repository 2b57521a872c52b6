"""The generated-rules bench (`bench.rules_generated`): why a run does not derive a hand-written rule."""

from __future__ import annotations

from bench.rules_generated import _run_name, _settings, why_not
from tensat.rewrites import all_rules
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


def test_a_run_s_settings_and_name_give_its_rank_and_sizes() -> None:
    pools = _settings("2:maxpool,relu:4:3,4")
    assert pools == Settings(max_ops=2, ops=("maxpool", "relu"), rank=4, sizes=(3, 4))
    assert _settings("3:default") == Settings(max_ops=3)
    assert _run_name({"max_ops": 2, "rank": 4, "sizes": [3, 4]}) == "2 ops, rank 4, sizes 3, 4"
    assert _run_name({"max_ops": 3}) == "3 ops"  # a record from before runs had a rank
