"""Folders this tool did not make: `main` and `experiment` take a workdir that is new, empty, or their own
kind's (a run's, a grid's, by its marker files) and refuse any other, another tool's, an export, a model
folder, each other's, before writing anything; `export --overwrite` replaces only the files an earlier
export wrote (its manifest), never what was added to the folder since."""

import hashlib
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from stackft_jax.runtime.cli_errors import UsageError
from stackft_jax.trained import hf_export, opening
from stackft_jax.training import workdirs

REPO = Path(__file__).resolve().parent.parent
DEV = REPO / "tests" / "fixtures" / "qqp" / "dev.tsv"


def _cli(command: str, *args: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", f"stackft_jax.{command}", *args]
    return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600)


def _snapshot(folder: Path) -> dict[str, str]:
    """Every entry under `folder` (locks/ included: a refused command must not even lock the folder)."""
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "folder"
        for p in sorted(folder.rglob("*"))
    }


def _assert_refused(proc: subprocess.CompletedProcess, expected: str) -> None:
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert (proc.returncode, errors) == (2, [f"error: {expected}"]), proc.stderr[-3000:]


def _run_refusal(folder: Path, what: str) -> str:
    return (
        f"--workdir={folder} {what}; a run's workdir is a new or empty folder or a run's own: choose a new "
        "--workdir (nothing was written)"
    )


@pytest.fixture(scope="module")
def exported(uninterrupted, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("exports") / "tiny"
    proc = _cli("export", f"--workdir={uninterrupted}", f"--out={out}")
    assert proc.returncode == 0, proc.stderr
    return out


def test_the_kinds_a_workdir_may_be(uninterrupted, tmp_path):
    (tmp_path / "empty").mkdir()
    (tmp_path / "refused" / "locks").mkdir(parents=True)  # a run refused before it bound the folder
    for folder in (tmp_path / "new", tmp_path / "empty", tmp_path / "refused"):
        workdirs.refuse_foreign(folder, workdirs.RUN)
        workdirs.refuse_foreign(folder, workdirs.GRID)
    workdirs.refuse_foreign(uninterrupted, workdirs.RUN)
    with pytest.raises(UsageError, match=r"is a run's workdir \(config.json, data_files.json\); python -m"):
        workdirs.refuse_foreign(uninterrupted, workdirs.GRID)
    grid = REPO / "docs" / "grids" / "pilot_conll"
    workdirs.refuse_foreign(grid, workdirs.GRID)
    workdirs.refuse_foreign(
        grid / "runs" / sorted(p.name for p in (grid / "runs").iterdir())[0], workdirs.RUN
    )
    with pytest.raises(UsageError, match=r"is a grid's workdir \(grid_config.json, runs/\)"):
        workdirs.refuse_foreign(grid, workdirs.RUN)
    listed = r"holds files this tool did not write \(strategy=finetune_only-name="
    with pytest.raises(UsageError, match=listed):
        workdirs.refuse_foreign(grid / "runs", workdirs.RUN)  # the folder of a grid's runs is none
    runs_only = tmp_path / "runs_only"  # a grid's runs copied without its grid_config.json
    shutil.copytree(grid / "runs", runs_only / "runs")
    workdirs.refuse_foreign(runs_only, workdirs.GRID)
    with pytest.raises(UsageError, match=r"is a grid's workdir"):
        workdirs.refuse_foreign(runs_only, workdirs.RUN)


def test_main_refuses_another_tools_results_before_writing_anything(tmp_path, run_cli):
    folder = tmp_path / "theirs"
    (folder / "predictions").mkdir(parents=True)
    (folder / "results.json").write_text(json.dumps({"accuracy": 0.91}))
    (folder / "predictions" / "dev.jsonl").write_text('{"id": 1, "label": 0}\n')
    before = _snapshot(folder)
    proc = run_cli(folder)
    _assert_refused(
        proc, _run_refusal(folder, "holds files this tool did not write (predictions, results.json)")
    )
    assert _snapshot(folder) == before


@pytest.mark.slow
def test_main_refuses_an_export_a_model_folder_and_a_grid(exported, tmp_path, run_cli):
    from stackft_jax.models import bert

    model = tmp_path / "model"
    shutil.copytree(bert.resolve_model_dir("embedded:minilm"), model)
    grid = tmp_path / "grid"
    shutil.copytree(REPO / "docs" / "grids" / "pilot_conll", grid)
    export = tmp_path / "export"
    shutil.copytree(exported, export)
    for folder, what in (
        (export, "is an export folder (head_config.json); predict reads it with --model"),
        (
            model,
            "is a model folder (config.json and weights); a run reads it with --config.model.name_or_path",
        ),
        (
            grid,
            "is a grid's workdir (grid_config.json, runs/); python -m stackft_jax.experiment continues it",
        ),
    ):
        before = _snapshot(folder)
        _assert_refused(run_cli(folder), _run_refusal(folder, what))
        assert _snapshot(folder) == before and not (folder / "locks").exists()


def test_experiment_refuses_a_runs_workdir_before_writing_anything(uninterrupted, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(uninterrupted, run, ignore=shutil.ignore_patterns("locks"))
    before = _snapshot(run)
    proc = _cli("experiment", "--config=configs/experiments/tiny.py", f"--workdir={run}")
    _assert_refused(
        proc,
        f"--workdir={run} is a run's workdir (config.json, data_files.json); python -m stackft_jax.main "
        "continues it; a grid's workdir is a new or empty folder or a grid's own: choose a new --workdir "
        "(nothing was written)",
    )
    assert _snapshot(run) == before


@pytest.mark.slow
def test_export_overwrite_replaces_its_own_files_and_keeps_what_was_added(exported, uninterrupted, tmp_path):
    out = tmp_path / "export"
    shutil.copytree(exported, out)
    manifest = json.loads((out / hf_export.MANIFEST).read_text())
    assert manifest["format"] == hf_export.MANIFEST_FORMAT
    assert {"config.json", "model.safetensors", "head.safetensors", opening.HEAD_CONFIG} <= set(
        manifest["files"]
    )
    (out / "notes.txt").write_text("what I tried\n")
    shutil.copytree(uninterrupted, out / "the_run", ignore=shutil.ignore_patterns("locks"))
    added = {
        name: digest
        for name, digest in _snapshot(out).items()
        if name.split("/")[0] in ("notes.txt", "the_run")
    }
    encoder = (out / "model.safetensors").read_bytes()

    proc = _cli("export", f"--workdir={uninterrupted}", f"--out={out}", "--phase=phase1", "--overwrite")
    assert proc.returncode == 0, proc.stderr[-3000:]
    after = _snapshot(out)
    assert {name: after[name] for name in added} == added  # the user's files, byte for byte
    assert (out / "model.safetensors").read_bytes() != encoder  # phase 1 left the encoder untrained
    record = json.loads((out / opening.HEAD_CONFIG).read_text())
    assert record["params"] == "phase1 (end)"
    assert not list(tmp_path.glob(".export.*"))  # no temporary folder left
    assert set(json.loads((out / hf_export.MANIFEST).read_text())["files"]) == set(manifest["files"])


def test_predict_refuses_an_export_whose_tokenizer_files_changed(exported, tmp_path):
    export = tmp_path / "export"
    shutil.copytree(exported, export)
    with (export / "vocab.txt").open("a") as f:
        f.write("zzyzx\n")
    proc = _cli("predict", f"--model={export}", f"--input={DEV}", f"--output={tmp_path / 'out.jsonl'}")
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert proc.returncode == 1 and errors == [
        f"error: {export}: its tokenizer files (vocab.txt) changed since the export wrote them "
        "(head_config.json `tokenizer_files`); the model expects their ids: export the run again"
    ], proc.stderr[-3000:]
    assert not (tmp_path / "out.jsonl").exists()
    assert re.search(r"tokenizer_files", (exported / opening.HEAD_CONFIG).read_text())
