"""The e-graph growth notebook runs top to bottom, headless, and draws its plots (on SqueezeNet, the smallest
benchmark graph: its NasRNN default takes minutes)."""

from __future__ import annotations

import nbformat
import pytest
from nbclient import NotebookClient

from tests.helpers import ROOT

NOTEBOOK = ROOT / "notebooks" / "egraph_growth.ipynb"


@pytest.mark.slow  # runs every cell
def test_egraph_growth_notebook_runs_headless():
    nb = nbformat.read(NOTEBOOK, as_version=4)
    setup = nb.cells[next(k for k, c in enumerate(nb.cells) if 'MODEL = "nasrnn"' in c.source)]
    setup.source = setup.source.replace('MODEL = "nasrnn"', 'MODEL = "squeezenet"')  # the smallest graph: a quick run
    client = NotebookClient(
        nb, timeout=400, kernel_name="python3", resources={"metadata": {"path": str(NOTEBOOK.parents[1])}}
    )
    client.execute()
    outputs = [o for cell in nb.cells if cell.cell_type == "code" for o in cell.get("outputs", [])]
    assert not [o for o in outputs if o.get("output_type") == "error"]
    images = [o for o in outputs if "image/png" in o.get("data", {})]
    assert len(images) >= 4, "expected the growth, rules, cost and time plots"
