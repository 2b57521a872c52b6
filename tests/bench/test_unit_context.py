"""The unit-context bench: onnxruntime's profile read per kernel, and the report's ratios."""

from __future__ import annotations

import math

import numpy as np
import onnx
import onnx.numpy_helper

from bench.unit_context import Ran, cold_buffer, kernel_times, match_kernels, render, simulate_arena


def _event(name: str, op: str, dur: float, *shapes: list[int]) -> dict[str, object]:
    args: dict[str, object] = {"op_name": op}
    if shapes:
        args["input_type_shape"] = [{"float": s} for s in shapes]
    return {"cat": "Node", "name": f"{name}_kernel_time", "dur": dur, "args": args}


def test_kernel_times_are_medians_in_the_order_the_first_run_ran_them() -> None:
    events = [
        {"cat": "Session", "name": "model_run", "dur": 99},
        _event("b", "Relu", 50.0),
        _event("a", "Conv", 900.0, [1, 3, 8, 8], [4, 3, 3, 3], [4]),
        _event("b", "Relu", 2.0),
        _event("a", "Conv", 10.0),
        _event("b", "Relu", 4.0),
        _event("a", "Conv", 30.0),
        {"cat": "Node", "name": "a_fence_before", "dur": 1, "args": {"op_name": "Conv"}},
    ]
    assert kernel_times(events, skip=1) == [Ran("b", "Relu", 3.0), Ran("a", "Conv", 20.0, (4, 3, 3, 3))]


def test_the_report_sets_each_sum_against_the_kernels_in_the_graph() -> None:
    info = {"cpu": "cpu", "cores": 2, "memory_gib": 1, "gpus": [], "python": "3", "versions": {}, "highs": "1"}
    info["date"] = "today"
    kernel = {
        "kernel": "conv2d",
        "shapes": [],
        "price_us": 80.0,
        "first_copy_us": 110.0,
        "later_copies_us": 70.0,
        "cold_outputs_us": 90.0,
        "all_cold_us": 120.0,
    }
    matched = {
        "model": "m",
        "matched": True,
        "working_set_mib": 12.0,
        "kernels": [
            {**kernel, "ran_as": "Conv", "in_graph_us": 100.0},
            {**kernel, "first_copy_us": math.nan, "ran_as": "Conv", "in_graph_us": 5.0},
            {**kernel, "kernel": "transpose", "price_us": 10.0, "cold_outputs_us": 20.0, "all_cold_us": 35.0}
            | {"ran_as": "Transpose", "first_copy_us": 11.0, "later_copies_us": 10.0, "in_graph_us": 25.0},
        ],
        "price_ms": 0.17,
        "in_graph_ms": 0.13,
        "reorders_ms": 0.0,
    }
    other = {**matched, "model": "n", "matched": False, "kernels": [kernel]}
    table = render([matched, other], info)
    assert "| m | 12 | 3 | 0.17 | 0.13 | 0.00 | 0.72 | 0.97 | 0.64 | 0.88 | 1.24 |" in table
    assert "| n | 12 | 1 (0 matched) |" in table and "| — | — | — | — | — |" in table
    # per op type, over the matched model's timed kernels only, the dearest first
    assert table.index("| Conv | 1 | 0.10 | 0.80 | 0.70 | 0.90 | 1.20 |") < table.index(
        "| Transpose | 1 | 0.03 | 0.40 | 0.40 | 0.80 | 1.40 |"
    )
    # the kernels timed longer in the graph than priced, the widest gap first; the one priced above it left out
    gaps = table[table.index("exceeds their price the most") :]
    assert gaps.index("| m | conv2d |  | 80 | 100 | 70 | 90 | 120 |") < gaps.index("| m | transpose |  | 10 | 25 |")
    assert "| 5 |" not in gaps


def test_kernels_are_matched_in_order_within_each_kind_of_op() -> None:
    rows = [{"kernel": k} for k in ("matmul+add", "transpose", "reshape", "matmul+add", "layernorm", "softmax")]
    ran = [
        Ran("t", "Transpose", 5.0),
        Ran("r", "Reshape", 1.0),
        Ran("g1", "Gemm", 60.0),
        Ran("r2", "Reshape", 1.0),
        Ran("g2", "Gemm", 70.0),
        Ran("ln", "LayerNormalization", 9.0),
        Ran("s1", "Softmax", 8.0),
        Ran("s2", "Softmax", 8.0),
    ]
    assert not match_kernels(rows, ran)  # two Softmaxes ran, one was priced
    assert [r.get("in_graph_us") for r in rows] == [60.0, 5.0, None, 70.0, 9.0, None]
    assert rows[0]["ran_as"] == "Gemm" and "ran_as" not in rows[2]
    assert match_kernels(rows, ran[:-1])


def test_a_shortcut_convolution_run_first_keeps_its_own_time() -> None:
    """onnxruntime may run a residual block's shortcut convolution before the block's main one: kernels of one op
    type are paired by their weight's shape where both sides have the same ones, in order among equal shapes, and
    in order where onnxruntime's shapes differ (its blocked weights padded to whole blocks)."""
    main, shortcut, after = (
        ([1, 64, 56, 56], [128, 64, 3, 3]),
        ([1, 64, 56, 56], [128, 64, 1, 1]),
        ([1, 128], [128, 128, 3, 3]),
    )
    rows = [{"kernel": "conv2d", "shapes": [list(x), list(w)]} for x, w in (main, shortcut, after, after)]
    ran = [
        Ran("shortcut", "Conv", 30.0, tuple(shortcut[1])),
        Ran("main", "Conv", 90.0, tuple(main[1])),
        Ran("after1", "Conv", 100.0, tuple(after[1])),
        Ran("after2", "Conv", 110.0, tuple(after[1])),
    ]
    assert match_kernels(rows, ran)
    assert [r["in_graph_us"] for r in rows] == [90.0, 30.0, 100.0, 110.0]
    padded = [k._replace(weight=(k.weight[0], 80, *k.weight[2:])) if k.weight else k for k in ran]
    assert match_kernels(rows, padded)
    assert [r["in_graph_us"] for r in rows] == [30.0, 90.0, 100.0, 110.0]


def _arena_graph() -> tuple[onnx.GraphProto, list[Ran]]:
    """a = x + w; b = relu(a); c = b * w; d = reshape(c); e = d + w; out = e * w, every tensor 1x256 floats."""
    row = [1, 256]
    w = onnx.numpy_helper.from_array(np.ones(row, np.float32), "w")
    to = onnx.numpy_helper.from_array(np.array(row, np.int64), "to")
    steps = [("a", "Add", ["x", "w"]), ("b", "Relu", ["a"]), ("c", "Mul", ["b", "w"])]
    steps += [("d", "Reshape", ["c", "to"]), ("e", "Add", ["d", "w"]), ("out", "Mul", ["e", "w"])]
    nodes = [onnx.helper.make_node(op, ins, [name], name=f"n_{name}") for name, op, ins in steps]
    value = onnx.helper.make_tensor_value_info
    graph = onnx.helper.make_graph(
        nodes, "g", [value("x", onnx.TensorProto.FLOAT, row)], [value("out", onnx.TensorProto.FLOAT, row)], [w, to]
    )
    return graph, [Ran(f"n_{name}", op, 1.0, None, ((1, 256),)) for name, op, _ in steps]


def test_the_arena_places_outputs_as_onnxruntimes_planner_does() -> None:
    graph, ran = _arena_graph()
    placed = simulate_arena(graph, ran)
    assert {name: kind for name, (kind, _) in placed.items()} == {
        "n_a": "fresh",
        "n_b": "in place",
        "n_c": "fresh",
        "n_d": "alias",
        "n_e": "reused",
        "n_out": "graph output",
    }
    # e takes a's buffer, freed after c read b (a's, in place): then c's weight and output, d's reads and output
    assert placed["n_e"][1] == 4 * 1024 + 16
    # a buffer of its own was last touched the run before: a's, when `out` read e
    assert placed["n_a"][1] == 2 * 1024
    assert placed["n_c"][1] == 4 * 1024 + 5 * 1024
    assert placed["n_out"][1] is None


def test_a_kernel_is_priced_cold_where_its_arena_buffer_is_out_of_the_cache() -> None:
    assert cold_buffer({"buffer": "fresh", "reuse_mib": 1.0}, 32.0)
    assert cold_buffer({"buffer": "graph output", "reuse_mib": None}, 32.0)
    assert cold_buffer({"buffer": "reused", "reuse_mib": 40.0}, 32.0)
    assert not cold_buffer({"buffer": "reused", "reuse_mib": 3.0}, 32.0)
    assert not cold_buffer({"buffer": "in place", "reuse_mib": 0.0}, 32.0)
    assert not cold_buffer({}, 32.0)


def test_the_report_prices_outputs_cold_where_the_arena_buffer_is() -> None:
    info = {"cpu": "cpu", "cores": 2, "memory_gib": 1, "gpus": [], "python": "3", "versions": {}, "highs": "1"}
    info["date"] = "today"
    times = {"first_copy_us": 1.0, "later_copies_us": 1.0, "all_cold_us": 1.0, "shapes": []}
    far = {"kernel": "add", "ran_as": "Add", "price_us": 80.0, "cold_outputs_us": 90.0, "in_graph_us": 100.0}
    near = {"kernel": "mul", "ran_as": "Mul", "price_us": 10.0, "cold_outputs_us": 20.0, "in_graph_us": 25.0}
    record = {
        "model": "m",
        "matched": True,
        "working_set_mib": 12.0,
        "last_level_cache_mib": 32.0,
        "kernels": [
            {**times, **far, "buffer": "fresh", "reuse_mib": 50.0},
            {**times, **near, "buffer": "reused", "reuse_mib": 3.0},
        ],
        "price_ms": 0.09,
        "in_graph_ms": 0.125,
        "reorders_ms": 0.0,
    }
    table = render([record], info)
    assert "| 0.72 | 0.02 | 0.02 | 0.88 | 0.02 | 0.80 |" in table
    assert "| fresh | 1 | 0.10 | 0.80 | 0.90 |" in table
    assert "| reused, within the cache | 1 | 0.03 | 0.40 | 0.80 |" in table
