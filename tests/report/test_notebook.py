"""reports/notebooks/tour.ipynb runs from top to bottom (nbclient), with its
charts inline and its results as HTML tables, so that it never rots."""
import os
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOK = ROOT / "reports" / "notebooks" / "tour.ipynb"


def test_the_tour_notebook_runs_and_shows_its_charts(tmp_path, monkeypatch):
    # the kernel imports this checkout's distsim, and writes into tmp_path
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        [str(ROOT)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
    nb = nbformat.read(NOTEBOOK, as_version=4)
    assert all(not cell.get("outputs") for cell in nb.cells if cell.cell_type == "code")
    nbclient.NotebookClient(nb, timeout=300, kernel_name="python3",
                            resources={"metadata": {"path": str(tmp_path)}}).execute()
    outputs = [o for cell in nb.cells if cell.cell_type == "code" for o in cell.outputs]
    assert not [o for o in outputs if o.get("output_type") == "error"]
    pngs = [o for o in outputs if "image/png" in o.get("data", {})]
    tables = [o for o in outputs if "<table" in o.get("data", {}).get("text/html", "")]
    assert len(pngs) >= 5          # pipeline, memory, links, sweep heatmap, comparison
    assert len(tables) >= 3        # the result, the sweep's DataFrame, the comparison
    result_view = outputs[0]["data"]["text/html"]
    assert "data:image/png;base64," in result_view     # the Gantt chart inline
    assert (tmp_path / "distsim-out" / "report.html").is_file()
