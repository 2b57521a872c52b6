"""`python -m bench`: the benchmark report, its plots and data, its errors, and the README showing the latest table."""

from __future__ import annotations

import json
import os
import re
import struct
import subprocess
import sys
from importlib import metadata

import pytest

from bench.machine import cpu_model
from bench.report import check_out_dir, growth_series, main, parse_models
from tensat.cli import main as tensat_main
from tensat.errors import TensatError
from tests.helpers import ROOT

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
TABLE_HEADER = "| graph | ONNX nodes (original / sequential / tensat) | original cost (ms) |"


@pytest.fixture(scope="module")
def bench_run(tmp_path_factory):
    """One small, quick `python -m bench` run on ResNet-50 (the fastest graph to saturate)."""
    out = tmp_path_factory.mktemp("bench") / "results"
    rc = main(["--models", "resnet50", "--small", "--quick", "--out-dir", str(out), "-q"])
    return rc, out


@pytest.mark.slow  # a whole `python -m bench` run
def test_bench_writes_report_plots_and_data(bench_run):
    rc, out = bench_run
    assert rc == 0
    assert sorted(p.name for p in out.iterdir()) == sorted(
        [
            "report.md",
            "report.json",
            "compare.md",
            "compare.json",
            "exploration.md",
            "exploration.json",
            "growth.png",
            "growth_resnet50.png",
        ]
    )
    assert not [p for p in out.iterdir() if p.name.startswith(".")], "temporary files left behind"


@pytest.mark.slow  # a whole `python -m bench` run
def test_report_names_machine_table_and_figures(bench_run):
    _, out = bench_run
    text = (out / "report.md").read_text()
    assert text.startswith("# tensat benchmark report\n")
    assert cpu_model() in text
    assert f"{os.cpu_count()} cores" in text
    assert "Command: `python -m bench --models resnet50 --small --quick`" in text
    assert TABLE_HEADER in text
    assert re.search(r"^\| resnet50 \| \d+ \| [\d.]+ \| [\d.]+ \|", text, re.M)
    for k in (0, 1, 2):
        assert re.search(rf"^\| resnet50 \| {k} \| \d+ \| \d+ \|", text, re.M), f"no k_multi={k} row"
    assert "![e-nodes per iteration, every graph](growth.png)" in text
    assert "(growth_resnet50.png)" in text
    for linked in re.findall(r"\]\(([^)]+)\)", text):
        assert (out / linked).is_file(), f"report.md links a missing {linked}"


@pytest.mark.slow  # a whole `python -m bench` run
def test_report_states_the_versions(bench_run):
    _, out = bench_run
    line = next(ln for ln in (out / "report.md").read_text().splitlines() if ln.startswith("Versions:"))
    import highspy

    ort = "onnxruntime-gpu" if _installed("onnxruntime-gpu") else "onnxruntime"
    assert line == (
        f"Versions: tensat {metadata.version('tensat')}, egglog {metadata.version('egglog')}, "
        f"{ort} {metadata.version(ort)}, PuLP {metadata.version('pulp')}, "
        f"HiGHS {highspy.Highs().version()} (highspy {metadata.version('highspy')})."
    )


def _installed(package: str) -> bool:
    try:
        metadata.version(package)
    except metadata.PackageNotFoundError:
        return False
    return True


@pytest.mark.slow  # a whole `python -m bench` run
@pytest.mark.parametrize("name", ["growth.png", "growth_resnet50.png"])
def test_growth_plots_are_real_pngs(bench_run, name):
    _, out = bench_run
    data = (out / name).read_bytes()
    assert data.startswith(PNG_SIGNATURE)
    assert data[12:16] == b"IHDR"
    width, height = struct.unpack(">II", data[16:24])
    assert width >= 300 and height >= 200
    assert len(data) > 10_000, "a plot with lines on it is larger than this"


@pytest.mark.slow  # a whole `python -m bench` run
def test_report_json_holds_the_data(bench_run):
    _, out = bench_run
    doc = json.loads((out / "report.json").read_text())
    assert doc["models"] == ["resnet50"] and doc["small"] and doc["quick"]
    assert doc["machine"]["cores"] == os.cpu_count()
    assert {"tensat", "egglog", "pulp", "highspy"} <= set(doc["machine"]["versions"])
    [row] = doc["compare"]["rows"]
    assert row["name"] == "resnet50" and row["verified"]
    records = doc["exploration"]["results"]
    assert [r["k_multi"] for r in records] == [0, 1, 2]
    for r in records:
        iterations, enodes, eclasses = growth_series(r)
        assert iterations[0] == 0 and len(iterations) == r["iterations"] + 1
        assert enodes[-1] == r["enodes"] and eclasses[-1] == r["eclasses"]
    assert json.loads((out / "compare.json").read_text())["rows"] == doc["compare"]["rows"]


@pytest.mark.parametrize(
    "models, message",
    [
        ("resnet50,nope", "unknown model 'nope'"),
        (",", "--models names no graph"),
    ],
)
def test_bad_model_is_a_one_line_error(tmp_path, capsys, models, message):
    out = tmp_path / "results"
    assert main(["--models", models, "--out-dir", str(out)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("tensat: error: ") and message in err[0]
    assert not out.exists()


def test_out_dir_under_a_file_is_a_one_line_error(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    assert main(["--models", "resnet50", "--out-dir", str(blocker / "results")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "is not a directory" in err[0]
    assert main(["--models", "resnet50", "--out-dir", str(blocker)]) == 1
    assert "is not a directory" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]


@pytest.mark.skipif(os.name != "posix" or os.geteuid() == 0, reason="root writes anywhere")
def test_unwritable_out_dir_is_an_error(tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        with pytest.raises(TensatError, match="not writable"):
            check_out_dir(locked / "results")
    finally:
        locked.chmod(0o700)


def test_check_out_dir_creates_nothing(tmp_path):
    target = tmp_path / "a" / "b"
    assert check_out_dir(target) == target
    assert not (tmp_path / "a").exists()


def test_parse_models_keeps_order_and_drops_repeats():
    assert parse_models("vgg19, bert,vgg19") == ["vgg19", "bert"]
    assert parse_models(None)[0] == "bert"


def test_python_dash_m_bench_reports_errors_in_tensat_style(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "bench", "--models", "nope", "--out-dir", str(tmp_path / "r")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 1
    assert proc.stderr.strip() == (
        "tensat: error: unknown model 'nope'; valid names: bert, resnext50, nasnet_a, "
        "nasrnn, inception_v3, squeezenet, vgg19, resnet50"
    )


def test_usage_errors_are_one_line_and_tensat_has_no_bench_command(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--bogus"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("tensat: error: ") and err.count("\n") == 1 and "python -m bench --help" in err, err
    with pytest.raises(SystemExit) as exc:  # the benchmarks are not installed with tensat
        tensat_main(["bench"])
    assert exc.value.code == 2 and "invalid choice: 'bench'" in capsys.readouterr().err


def _table(text: str) -> list[str]:
    lines = text.splitlines()
    start = lines.index(next(ln for ln in lines if ln.startswith(TABLE_HEADER)))
    end = start
    while end < len(lines) and lines[end].startswith("|"):
        end += 1
    return lines[start:end]


def test_the_results_page_links_notebook_and_report_and_shows_the_latest_table():
    assert "(notebooks/egraph_growth.ipynb)" in (ROOT / "README.md").read_text()
    results = (ROOT / "docs" / "results.md").read_text()
    assert "(../notebooks/egraph_growth.ipynb)" in results
    assert "(../bench/results/report.md)" in results
    assert (ROOT / "notebooks" / "egraph_growth.ipynb").is_file()
    report = ROOT / "bench" / "results" / "report.md"
    assert report.is_file(), "run `python -m bench` to write bench/results/report.md"
    assert _table(results) == _table(report.read_text()), (
        "paste the table of bench/results/report.md into docs/results.md"
    )
    for png in re.findall(r"\(\.\./(bench/results/[^)]+\.png)\)", results):
        assert (ROOT / png).is_file()
