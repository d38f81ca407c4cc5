"""The Colab notebook, executed end to end on a local Jupyter kernel (nbclient) with the tiny test config,
parameters injected after its `parameters` cell as papermill does; executed twice, the second run
resumes the finished one instead of training again."""

import json
import re
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

REPO = Path(__file__).resolve().parent.parent
NOTEBOOK = REPO / "launch" / "colab_tpu.ipynb"


def _with_parameters(parameters: dict) -> nbformat.NotebookNode:
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    (index,) = [i for i, c in enumerate(notebook.cells) if "parameters" in c.metadata.get("tags", [])]
    assignments = "\n".join(f"{name} = {value!r}" for name, value in parameters.items())
    injected = nbformat.v4.new_code_cell(assignments, metadata={"tags": ["injected-parameters"]})
    notebook.cells.insert(index + 1, injected)
    return notebook


def _execute(notebook: nbformat.NotebookNode) -> str:
    NotebookClient(
        notebook, timeout=900, kernel_name="python3", resources={"metadata": {"path": REPO}}
    ).execute()
    return "\n".join(
        output.get("text", "")
        for cell in notebook.cells
        if cell.cell_type == "code"
        for output in cell.outputs
        if output.output_type == "stream"
    )


@pytest.mark.slow
def test_notebook_runs_end_to_end_and_resumes(tmp_path):
    workdir = tmp_path / "run"
    parameters = {
        "REPO_DIR": str(REPO),
        "UPDATE_REPO": False,
        "CONFIG": "configs/tiny.py:phase1.num_steps=4,phase2.num_steps=4",
        "WORKDIR": str(workdir),
    }
    out = _execute(_with_parameters(parameters))
    assert f"WORKDIR: {workdir}" in out
    assert "JAX" in out and "on cpu" in out  # the devices cell
    results = json.loads((workdir / "results.json").read_text())
    assert [p["steps"] for p in results["phases"]] == [4, 4]
    assert f"dev accuracy {results['final']['dev']['accuracy']:.4f}" in out
    assert re.search(r"^phase +global_step +split +accuracy", out, flags=re.MULTILINE)  # metrics table
    assert "pip install tensorboard" in out or "tensorboard" not in out.lower()

    boundary = workdir / "checkpoints" / "phase2_end"
    written = boundary.stat().st_mtime_ns
    again = _execute(_with_parameters(parameters))
    assert f"dev accuracy {results['final']['dev']['accuracy']:.4f}" in again
    assert boundary.stat().st_mtime_ns == written  # resumed the finished run: nothing trained again
