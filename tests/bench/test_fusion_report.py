"""The fusion report (`bench.fusion_report`) counts what onnxruntime fuses in a model and in tensat's graph."""

from __future__ import annotations

import onnx

from bench import fusion_report
from bench.machine import machine_info
from tensat import api
from tensat.cost import AnalyticCost
from tests.onnx.test_fusions import gpt2_mlp


def test_a_models_record_counts_the_runtimes_fused_kernels_before_and_after(monkeypatch, tmp_path) -> None:
    monkeypatch.setattr(api, "make_cost_model", lambda name, device="auto", progress=False: AnalyticCost())
    path = tmp_path / "mlp.onnx"
    onnx.save(gpt2_mlp(), path)
    rec = fusion_report.run_model("mlp", path, tmp_path, 0.0)
    assert rec["fused"]["Gemm"][0] == 2
    assert rec["lost"] == {} and rec["kernels"][0] < len(gpt2_mlp().graph.node)
    text = fusion_report.markdown([rec], machine_info())
    if rec["returned_input"]:
        assert rec["chosen"] is None and "| the input's | — |" in text
    else:
        assert rec["chosen"] == {"written": {"FastGelu": 1}, "run": {"FastGelu": 1}, "match": True}
        assert "| FastGelu 1 | yes |" in text
    assert "Models whose graph lost another fused kernel: none." in text


def test_the_kernels_the_extraction_chose_are_the_kernels_run(monkeypatch, tmp_path) -> None:
    from tensat.measure import MeasuredCost
    from tests.costs.test_kernels import _post_norm

    cost = MeasuredCost("cpu", cache_path=tmp_path / "costs.sqlite3", progress=False, max_seconds=0.3)
    monkeypatch.setattr(api, "make_cost_model", lambda name, device="auto", progress=False: cost)
    path = tmp_path / "post_norm.onnx"
    onnx.save(_post_norm(True), path)
    rec = fusion_report.run_model("post_norm", path, tmp_path, 0.0)
    unfused = rec["rules"].get("skip-layernorm-unfuse") == 1
    chosen = rec["chosen"]
    assert chosen["match"] and rec["lost"] == {}
    assert chosen["written"] == ({"LayerNormalization": 1} if unfused else {"SkipLayerNormalization": 1})
    text = fusion_report.markdown([rec], machine_info())
    assert "| post_norm |" in text and "onnxruntime runs with other kernels than the extraction chose: none" in text
