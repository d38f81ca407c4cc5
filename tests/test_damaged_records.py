"""Damaged records (runtime/records.py): a truncated or non-JSON results.json, config.json,
data_files.json, metrics.jsonl, grid file or checkpoint array is one `error:` line naming the file and
what to do, exit 1, in every command that reads it; the damaged file is neither deleted nor rewritten."""

import hashlib
import json
import math
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from stackft_jax.config import config_cli
from stackft_jax.experiments import grid_report
from stackft_jax.runtime import cli_errors, records
from stackft_jax.trained import inference
from stackft_jax.training import checkpointing
from stackft_jax.training.run_report import RunReport
from tests.test_train import _assert_same_run

REPO = Path(__file__).resolve().parent.parent
DEV = REPO / "tests" / "fixtures" / "qqp" / "dev.tsv"
TRUNCATED = r"truncated: .+ at line \d+ column \d+"  # json.JSONDecodeError, wherever the cut falls


def _cli(command: str, *args: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", f"stackft_jax.{command}", *args]
    return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600)


def _predict(run: Path, tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    return _cli("predict", f"--workdir={run}", f"--input={DEV}", f"--output={tmp_path / 'out.jsonl'}", *args)


def _snapshot(folder: Path) -> dict[str, str]:
    """Every file's sha256 (a run's lock files aside: a command holds the lock while it reads)."""
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and "locks" not in p.parts
    }


def _copy(run: Path, tmp_path: Path, name: str = "run") -> Path:
    copy = tmp_path / name
    shutil.copytree(run, copy, ignore=shutil.ignore_patterns("locks"))
    return copy


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _error_lines(proc: subprocess.CompletedProcess) -> list[str]:
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    return [line for line in proc.stderr.splitlines() if line.startswith("error:")]


def _assert_one_line(proc: subprocess.CompletedProcess, code: int, pattern: str) -> None:
    (line,) = _error_lines(proc)
    assert proc.returncode == code, proc.stderr[-3000:]
    assert re.fullmatch(pattern, line), line


def _rerun_hint(workdir: Path) -> str:
    return re.escape(records.RERUN_RESULTS.format(workdir=workdir))


def _escaped(text: str) -> str:
    return re.escape(text)


# -- the reader itself ---------------------------------------------------------------------------------


def test_the_reader_names_the_file_the_damage_and_the_remedy(tmp_path):
    path = tmp_path / "results.json"
    path.write_text('{"final": {"dev": {"accuracy": 0.5')
    with pytest.raises(records.DamagedRecord) as damaged:
        records.read_json(path, "do this")
    assert str(damaged.value) == (
        f"{path} is damaged (truncated: Expecting ',' delimiter at line 1 column 35); do this "
        "(the file is left as it is)"
    )
    assert cli_errors.exit_code_of(damaged.value) == 1
    path.write_text("not json at all\n")
    with pytest.raises(records.DamagedRecord, match=r"is damaged \(not JSON: Expecting value at line 1"):
        records.read_json(path, "do this")
    path.write_text('["a", "list"]')
    with pytest.raises(records.DamagedRecord, match=r"\(a JSON list where an object is expected\)"):
        records.read_json(path, "do this", keys=("final",))
    path.write_bytes(b'{"a": "\xff"}')
    with pytest.raises(records.DamagedRecord, match=r"\(not text: the byte at offset 7 is no UTF-8\)"):
        records.read_json(path, "do this")
    assert path.read_bytes() == b'{"a": "\xff"}'  # left as it is


def test_a_cut_last_line_is_what_a_kill_leaves_and_any_other_bad_line_is_damage(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1}\n{"step": 2}\n{"ste')
    assert records.read_jsonl(path, "fix it") == ([{"step": 1}, {"step": 2}], True)
    path.write_text('{"step": 1}\n{"step": 2}\n')
    assert records.read_jsonl(path, "fix it") == ([{"step": 1}, {"step": 2}], False)
    path.write_text('{"step": 1}\n{"ste\n{"step": 3}\n')
    with pytest.raises(records.DamagedRecord) as damaged:
        records.read_jsonl(path, "fix it")
    assert str(damaged.value) == (
        f"{path}:2 is damaged (truncated: Unterminated string starting at); fix it "
        "(the file is left as it is)"
    )
    path.write_text('{"step": 1}\n{"ste\n')  # cut, then a newline: written after, so not the kill's
    with pytest.raises(records.DamagedRecord, match=rf"^{path}:2 is damaged"):
        records.read_jsonl(path, "fix it")


# -- results.json in every command that reads it -----------------------------------------------------


@pytest.mark.slow
def test_a_truncated_results_json_in_predict_export_and_ensemble(uninterrupted, tmp_path):
    run = _copy(uninterrupted, tmp_path)
    _truncate(run / "results.json")
    before = _snapshot(run)
    expected = (
        rf"error: {run}/results.json is damaged \({TRUNCATED}\); {_rerun_hint(run)} "
        r"\(the file is left as it is\)"
    )
    _assert_one_line(
        _predict(run, tmp_path),
        1,
        expected,
    )
    _assert_one_line(_cli("export", f"--workdir={run}", f"--out={tmp_path / 'export'}"), 1, expected)
    _assert_one_line(
        _cli("ensemble", f"--workdirs={uninterrupted},{run}", f"--out={tmp_path / 'ensemble'}"), 1, expected
    )
    assert _snapshot(run) == before
    assert not any((tmp_path / name).exists() for name in ("out.jsonl", "export", "ensemble"))


def test_a_truncated_results_json_in_the_grid_report(tmp_path):
    grid_dir = tmp_path / "grid"
    shutil.copytree(
        REPO / "docs" / "grids" / "pilot_conll", grid_dir, ignore=shutil.ignore_patterns("report.*")
    )
    run = sorted((grid_dir / "runs").iterdir())[0]
    _truncate(run / "results.json")
    before = _snapshot(grid_dir)
    grid = config_cli.load("configs/experiments/pilot.py:conll", [], kind="grid")
    with pytest.raises(records.DamagedRecord) as damaged:
        grid_report.write_report(grid, grid_dir)
    assert cli_errors.exit_code_of(damaged.value) == 1
    assert re.fullmatch(
        rf"{run}/results.json is damaged \({TRUNCATED}\); {_rerun_hint(run)} \(the file is left as it is\)",
        str(damaged.value),
    )
    assert _snapshot(grid_dir) == before


# -- a run's binding records in main, and its config in predict ----------------------------------------


@pytest.mark.slow
def test_a_truncated_config_json_in_main_and_predict(uninterrupted, tmp_path, run_cli):
    run = _copy(uninterrupted, tmp_path)
    _truncate(run / "config.json")
    before = _snapshot(run)
    remedy = _escaped(records.RESTORE_CONFIG)
    expected = rf"error: {run}/config.json is damaged \({TRUNCATED}\); {remedy} \(the file is left as it is\)"
    _assert_one_line(run_cli(run), 1, expected)
    _assert_one_line(
        _predict(run, tmp_path),
        1,
        expected,
    )
    assert _snapshot(run) == before


@pytest.mark.slow  # reads a run trained end to end (the session fixture)
def test_a_non_json_data_files_json_in_main(uninterrupted, tmp_path, run_cli):
    run = _copy(uninterrupted, tmp_path)
    (run / "data_files.json").write_text("data.train_file: tests/fixtures/qqp/train.tsv\n")
    before = _snapshot(run)
    remedy = _escaped(records.RESTORE_DATA_FILES)
    _assert_one_line(
        run_cli(run),
        1,
        rf"error: {run}/data_files.json is damaged \(not JSON: Expecting value at line 1 column 1\); "
        rf"{remedy} \(the file is left as it is\)",
    )
    assert _snapshot(run) == before


@pytest.mark.slow
def test_metrics_jsonl_damaged_before_its_last_line_in_main(uninterrupted, tmp_path, run_cli):
    run = _copy(uninterrupted, tmp_path)
    lines = (run / "metrics.jsonl").read_text().splitlines(keepends=True)
    lines[1] = lines[1][: len(lines[1]) // 2] + "\n"  # a line cut in the middle of the file
    (run / "metrics.jsonl").write_text("".join(lines))
    before = _snapshot(run)
    remedy = _escaped(records.FIX_METRICS)
    _assert_one_line(
        run_cli(run),
        1,
        rf"error: {run}/metrics.jsonl:2 is damaged \(truncated: [^)]*\); {remedy} "
        r"\(the file is left as it is\)",
    )
    assert _snapshot(run) == before


# -- checkpoint arrays ----------------------------------------------------------------------------------


def _largest_file(folder: Path) -> Path:
    return max((p for p in folder.rglob("*") if p.is_file()), key=lambda p: p.stat().st_size)


@pytest.mark.slow
def test_a_truncated_checkpoint_array_in_predict_and_export(uninterrupted, tmp_path):
    run = _copy(uninterrupted, tmp_path)
    boundary = checkpointing.phase_end_path(run, "phase2")
    _truncate(_largest_file(boundary / "params"))
    before = _snapshot(run)
    remedy = _escaped(records.RESUME_CHECKPOINT)
    expected = rf"error: {boundary} is damaged \([A-Za-z]+: [^\n]*\); {remedy} \(the file is left as it is\)"
    _assert_one_line(
        _predict(run, tmp_path),
        1,
        expected,
    )
    _assert_one_line(_cli("export", f"--workdir={run}", f"--out={tmp_path / 'export'}"), 1, expected)
    assert _snapshot(run) == before  # nothing moved aside: only main does that
    assert not (tmp_path / "out.jsonl").exists() and not (tmp_path / "export").exists()


@pytest.mark.slow
def test_flipped_bytes_of_the_right_size_in_a_best_checkpoint_in_predict(uninterrupted, tmp_path):
    run = _copy(uninterrupted, tmp_path)
    (best,) = (run / "checkpoints" / "best").glob("[0-9]*")
    largest = _largest_file(best / "params")
    data = bytearray(largest.read_bytes())
    middle = len(data) // 2
    data[middle : middle + 8] = bytes(b ^ 0xFF for b in data[middle : middle + 8])
    largest.write_bytes(bytes(data))
    proc = _predict(run, tmp_path, "--params=best")
    _assert_one_line(
        proc,
        1,
        rf"error: {best} is damaged \(ChecksumMismatch: its arrays differ from the checksum written when it "
        rf"was saved \(bytes changed on disk since\)\); {_escaped(records.RESUME_CHECKPOINT)} "
        r"\(the file is left as it is\)",
    )
    assert not (tmp_path / "out.jsonl").exists()


@pytest.mark.slow
def test_flipped_checkpoint_bytes_and_a_cut_metrics_line_resume_from_the_previous_checkpoint(
    uninterrupted, tmp_path, run_cli
):
    """A kill leaves metrics.jsonl's last line cut, and the newest checkpoint's array bytes changed on
    disk (same size, orbax reads them): the rerun sets that checkpoint aside with a warning, resumes
    from the previous one, leaves the cut line out, and ends as the uninterrupted run."""
    assert run_cli(tmp_path, kill_at="phase2:5").returncode == -signal.SIGKILL
    newest = tmp_path / "checkpoints" / "phase2" / "4" / "state"
    largest = _largest_file(newest)
    data = bytearray(largest.read_bytes())
    middle = len(data) // 2
    data[middle : middle + 8] = bytes(b ^ 0xFF for b in data[middle : middle + 8])
    largest.write_bytes(bytes(data))
    with (tmp_path / "metrics.jsonl").open("a") as f:
        f.write('{"phase": "phase2", "step": 6, "glob')
    proc = run_cli(tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "differ from the checksum written when it was saved" in proc.stderr
    assert "resumed phase2 at step 2" in proc.stderr and "its last line was cut mid-write" in proc.stderr
    (moved,) = checkpointing.unreadable_dir(tmp_path).glob("phase2-4-*")
    assert (moved / "state").is_dir()
    _assert_same_run(uninterrupted, tmp_path)


@pytest.mark.slow
def test_allow_config_change_over_a_damaged_config_json_starts_over_and_keeps_it(
    uninterrupted, tmp_path, run_cli
):
    run = _copy(uninterrupted, tmp_path)
    _truncate(run / "config.json")
    damaged = (run / "config.json").read_bytes()
    proc = run_cli(run, "--allow_config_change")
    assert proc.returncode == 0, proc.stderr[-3000:]
    (aside,) = run.glob("replaced-*")
    assert (aside / "config.json").read_bytes() == damaged and (aside / "checkpoints").is_dir()
    _assert_same_run(uninterrupted, run)


# -- results that are no results ------------------------------------------------------------------------


def test_a_non_finite_final_loss_is_no_result(tmp_path):
    report = RunReport(tmp_path)
    with pytest.raises(FloatingPointError) as stopped:
        report.results({"final": {"dev": {"accuracy": 0.5, "loss": math.nan}}})
    assert cli_errors.exit_code_of(stopped.value) == 1
    assert str(stopped.value).startswith(f"{tmp_path}: the final dev loss is nan: the scored parameters")
    assert not (tmp_path / "results.json").exists()
    report.results({"final": {"dev": {"accuracy": 0.5, "loss": 0.25}}})
    assert json.loads((tmp_path / "results.json").read_text())["final"]["dev"]["loss"] == 0.25


# -- what predict and export take from the tokenizer ----------------------------------------------------


@pytest.mark.slow
def test_predict_and_export_refuse_tokenizer_files_changed_since_the_run(uninterrupted, tmp_path):
    from stackft_jax.models import bert

    model = tmp_path / "model"
    shutil.copytree(bert.resolve_model_dir("embedded:minilm"), model)
    run = _copy(uninterrupted, tmp_path)
    config = json.loads((run / "config.json").read_text())
    config["config"]["model"]["name_or_path"] = str(model)  # the run's model folder, now one we may edit
    (run / "config.json").write_text(json.dumps(config))
    with (model / "vocab.txt").open("a") as f:
        f.write("zzyzx\n")
    before = _snapshot(run)
    expected = (
        rf"error: {run}: the tokenizer files of {model} \(vocab.txt\) changed since this "
        r"workdir's run tokenized its data; its parameters expect the ids of the files it recorded "
        r"\(data_files.json\): restore them"
    )
    _assert_one_line(
        _predict(run, tmp_path),
        1,
        expected,
    )
    _assert_one_line(_cli("export", f"--workdir={run}", f"--out={tmp_path / 'export'}"), 1, expected)
    assert _snapshot(run) == before


def test_ids_beyond_the_embedding_table_are_refused_with_the_example_and_the_id(tmp_path):
    class Example:
        def __init__(self, key: str):
            self.key = key

    import numpy as np

    examples = [Example("line1-a"), Example("line3-b")]
    arrays = {"input_ids": np.array([[101, 7, 102, 0], [101, 400, 102, 0]])}
    inference.check_ids_fit(arrays, examples, 401, tmp_path)
    with pytest.raises(cli_errors.DataError) as refused:
        inference.check_ids_fit(arrays, examples, 400, tmp_path)
    assert str(refused.value) == (
        f"--input example 2 (line3-b): token id 400 is beyond the encoder's embedding table (400 rows, "
        f"vocab_size in {tmp_path}/config.json): the tokenizer files and the weights come from different "
        "models"
    )
    # Word tagging: windows of one sentence name the sentence.
    windows = {**arrays, "sentence_index": np.array([0, 0])}
    with pytest.raises(cli_errors.DataError, match=r"^--input example 1 \(line1-a\): token id 400"):
        inference.check_ids_fit(windows, examples, 400, tmp_path)


@pytest.mark.slow  # reads a run trained end to end (the session fixture)
def test_a_cut_prediction_file_in_an_ensemble_and_a_broken_gzip_one(uninterrupted, tmp_path):
    from stackft_jax.experiments import ensembling
    from stackft_jax.training import prediction_files

    run = _copy(uninterrupted, tmp_path)
    dev = prediction_files.path(run, "dev")
    _truncate(dev)
    before = _snapshot(run)
    with pytest.raises(records.DamagedRecord) as damaged:
        ensembling.load_member(run)
    assert cli_errors.exit_code_of(damaged.value) == 1
    assert re.fullmatch(
        rf"{dev}:\d+ is damaged \({TRUNCATED}\); {_rerun_hint(run)} \(the file is left as it is\)",
        str(damaged.value),
    )
    assert _snapshot(run) == before
    packed = dev.with_name("dev.jsonl.gz")  # older grids keep their runs' predictions gzipped
    plain = prediction_files.read(uninterrupted / "predictions" / "dev.jsonl")
    prediction_files.write(packed, plain.values())
    _truncate(packed)
    with pytest.raises(records.DamagedRecord, match=rf"^{packed} is damaged \(EOFError: "):
        prediction_files.read(packed)
