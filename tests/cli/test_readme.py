"""The README as a newcomer reads it: short, every tensat command in it one that tensat takes, its results table the
one the real-model report generates, and (slow) its command blocks run as written in a fresh folder."""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from bench.real_report import readme_table
from tensat.cli import build_parser
from tests.helpers import ROOT

README = ROOT / "README.md"


def _blocks(lang: str) -> list[str]:
    """The README's code blocks fenced as `lang`."""
    return re.findall(rf"```{lang}\n(.*?)```", README.read_text(), re.S)


def _commands(block: str) -> list[str]:
    """The shell commands of a block: comments dropped, `a && b` split."""
    out = []
    for line in block.splitlines():
        line = line.split(" # ", 1)[0].strip()
        out += [part.strip() for part in line.split("&&") if part.strip()]
    return out


def test_the_readme_is_short_and_its_lines_readable() -> None:
    lines = README.read_text().splitlines()
    assert len(lines) <= 220
    assert max(len(line) for line in lines) <= 200


def test_every_tensat_command_in_the_readme_is_one_tensat_takes() -> None:
    commands = [c for block in _blocks("sh") for c in _commands(block) if c.startswith("tensat ")]
    assert len(commands) >= 8
    for command in commands:
        try:
            build_parser().parse_args(shlex.split(command)[1:])
        except SystemExit as exc:  # --help and --version print and exit 0
            assert exc.code == 0, command


def test_the_readme_s_results_table_is_the_one_the_report_generates() -> None:
    records = json.loads((ROOT / "bench" / "results" / "real_models.json").read_text())["results"]
    assert readme_table(records) in README.read_text(), "paste bench.real_report.readme_table's output into README.md"


@pytest.mark.slow  # optimizes three models with measured costs and end-to-end checks
def test_the_readme_s_command_blocks_run_as_written(tmp_path: Path) -> None:
    """Every tensat command of the README's "Using it" blocks, then its Python block, in an empty folder."""
    tensat = shutil.which("tensat")
    assert tensat is not None, "install tensat (pip install -e .)"
    using = README.read_text().split("## Using it", 1)[1].split("\n## ", 1)[0]
    for block in re.findall(r"```sh\n(.*?)```", using, re.S):
        for command in _commands(block):
            done = subprocess.run([tensat, *shlex.split(command)[1:]], cwd=tmp_path, capture_output=True, text=True)
            assert done.returncode == 0, (command, done.stderr[-2000:])
    for code in re.findall(r"```python\n(.*?)```", using, re.S):
        done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr[-2000:]
    assert (tmp_path / "model.opt.onnx").is_file() and (tmp_path / "egraph.json").is_file()
