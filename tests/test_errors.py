"""Issue 24's reproductions: every mistake one line with its exit status, nothing overwritten that the
command did not create, no run counted twice (a grid or run workdir bound to its config and data)."""

import errno
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from configs import tiny
from stackft_jax.config import config_cli
from stackft_jax.experiments import grid
from stackft_jax.runtime import cli_errors
from stackft_jax.runtime.cli_errors import ConfigError
from stackft_jax.training import train, workdirs
from tests.test_ensemble import _write_run
from tests.test_experiment import _grid
from tests.test_train import _assert_same_run

REPO = Path(__file__).resolve().parent.parent
SHORT = "phase1.num_steps=2,phase2.num_steps=2,eval_every_steps=2"


def _cli(module: str, *args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", module, *args], cwd=REPO, capture_output=True, text=True, timeout=timeout
    )


def _one_error_line(proc: subprocess.CompletedProcess, code: int) -> str:
    """The refusal: status `code`, no traceback, and exactly one `error:` line, the last one."""
    assert proc.returncode == code, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and proc.stderr.strip().splitlines()[-1] == errors[0], proc.stderr
    return errors[0]


# --- the boundary itself -------------------------------------------------------------------------


def _exit_of(error: BaseException, capsys) -> tuple[int, str]:
    def failing():
        raise error

    with pytest.raises(SystemExit) as stopped:
        cli_errors.guarded(failing)()
    return stopped.value.code, capsys.readouterr().err


def test_boundary_maps_mistakes_to_documented_statuses(capsys):
    assert _exit_of(ConfigError("config.seed=-1: no"), capsys) == (
        2,
        "error: config.seed=-1: no\n",
    )
    assert _exit_of(cli_errors.DataError("a.tsv:3: bad label"), capsys) == (1, "error: a.tsv:3: bad label\n")
    code, err = _exit_of(KeyboardInterrupt(), capsys)
    assert code == 130 and err.strip() == f"error: interrupted (Ctrl-C); {cli_errors.RESUME_HINT}"
    code, err = _exit_of(OSError(errno.ENOSPC, "No space left on device", "/w/metrics.jsonl"), capsys)
    assert code == 1 and err.splitlines() == [
        f"error: the disk is full writing /w/metrics.jsonl; free space, then {cli_errors.RESUME_HINT}"
    ]


def test_a_folder_without_permission_is_one_line_naming_it(capsys):
    denied = PermissionError(errno.EACCES, "Permission denied", "/w/run/locks")
    assert _exit_of(denied, capsys) == (
        1,
        "error: /w/run/locks: Permission denied (check its permissions, or choose another path)\n",
    )
    read_only = OSError(errno.EROFS, "Read-only file system", "/w/out")
    assert _exit_of(read_only, capsys)[0] == 1


def test_a_workdir_that_is_a_file_is_a_usage_error(tmp_path):
    workdir = tmp_path / "notes.txt"
    workdir.write_text("mine")
    with pytest.raises(
        cli_errors.UsageError, match=rf"^--workdir={workdir} is a file: a workdir is a folder"
    ):
        train.run(tiny.get_config(), workdir)
    assert workdir.read_text() == "mine"


def test_a_closed_output_pipe_is_no_bug(capsys):
    """`python -m stackft_jax.experiment --status | head -1`: the reader left; no traceback, no message."""
    assert _exit_of(BrokenPipeError(errno.EPIPE, "Broken pipe"), capsys) == (1, "")


def test_a_full_disk_under_orbax_is_one_line(capsys):
    # What tensorstore raises when a checkpoint write meets a full disk (as measured on a 3 MB tmpfs).
    full = ValueError(
        'RESOURCE_EXHAUSTED: Error writing "head/bias" in OCDBT database at local file "/w/ckpt/": Failed '
        'writing: "/w/ckpt/d/4a65": Failed to write 358175 bytes to file 18: No space left on device '
        "[os_error_code='28']"
    )
    code, err = _exit_of(full, capsys)
    assert code == 1
    assert (
        err == f"error: the disk is full writing /w/ckpt/d/4a65; free space, then {cli_errors.RESUME_HINT}\n"
    )


def test_orbax_logs_of_a_full_disk_are_left_to_the_one_line(tmp_path):
    """Under async checkpointing a full disk (measured on a 3 MB tmpfs) made orbax log two ERROR lines
    with tensorstore's traceback (225 lines) before the boundary's one line; those logs are dropped."""
    import logging

    from stackft_jax.runtime import logs

    full = ValueError('RESOURCE_EXHAUSTED: Failed writing: "/w/ckpt/d/4a65": No space left on device')
    orbax = "/site-packages/orbax/checkpoint/_src/checkpointers/async_checkpointer.py"

    def record(error: BaseException | None, path: str = orbax) -> logging.LogRecord:
        exc_info = (type(error), error, None) if error else None
        return logging.LogRecord(
            "absl", logging.ERROR, path, 264, "Failed to run 4 Handler Commit", (), exc_info
        )

    assert not logs._not_a_relayed_orbax_error(record(full))
    assert logs._not_a_relayed_orbax_error(record(RuntimeError("other")))  # any other error still shows
    assert logs._not_a_relayed_orbax_error(record(full, path="/x/stackft_jax/training/loop.py"))


def test_a_bug_prints_its_traceback_and_says_so(capsys):
    code, err = _exit_of(ZeroDivisionError("division by zero"), capsys)
    assert code == cli_errors.EXIT_BUG
    assert "Traceback" in err and "ZeroDivisionError" in err
    assert err.strip().splitlines()[-1].startswith("error: a bug in stackft_jax (ZeroDivisionError")


def test_a_missing_flag_is_one_line_with_status_2(tmp_path):
    line = _one_error_line(_cli("stackft_jax.main", f"--workdir={tmp_path}"), 2)
    assert line == "error: --config=FILE.py is required (--help lists the flags)"


@pytest.mark.parametrize("module", ["stackft_jax.main", "stackft_jax.predict", "stackft_jax.export"])
def test_a_mistyped_flag_is_one_line_with_status_2(module, tmp_path):
    line = _one_error_line(_cli(module, f"--wokdir={tmp_path}"), 2)
    assert line.startswith("error: Unknown command line flag 'wokdir'") and line.endswith(
        "(--help lists the flags)"
    )


# --- config keys ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("item", "message"),
    [
        ("keep_checkpoints=0", "config.keep_checkpoints=0: keep at least 1"),
        ("seed=-1", "config.seed=-1: choose a seed of 0 or more"),
        ("max_seq_length=4", "config.max_seq_length=4: at least 8 tokens"),
        ("head.name=esmi", "config.head.name='esmi' is not a registered head; did you mean 'esim'?"),
        ("head.name=bilstm_crf", "config.head.name='bilstm_crf' is a word tagging head, and data.task='qqp'"),
        ("max_grad_norm=-1", r"config.max_grad_norm=-1.0: a norm of 0 or more \(0 turns clipping off\)"),
        ("model.dropout_rate=1.5", "config.model.dropout_rate=1.5: a dropout rate is at least 0 and below 1"),
        ("head.dropout_rate=1.0", "config.head.dropout_rate=1.0: a dropout rate is at least 0 and below 1"),
        (
            "data.classes=health+sports",
            r"config.data.classes='health\+sports': data.task='qqp' does not read it",
        ),
        ("data.truncation=head_tail", "config.data.truncation='head_tail': data.task='qqp' does not read it"),
    ],
)
def test_bad_run_keys_are_named_before_any_work(item, message, tmp_path):
    with pytest.raises(ConfigError, match=message):
        train.run(tiny.get_config(item), tmp_path)
    assert not list(tmp_path.iterdir())


def test_a_comma_inside_a_value_is_named_not_blamed_on_a_preset():
    with pytest.raises(ConfigError) as refused:
        config_cli.load("configs/yahoo.py:data.classes=sports,health")
    assert "'data.classes=sports,health': a config value cannot contain a comma" in str(refused.value)
    assert "('data.classes=sports+health')" in str(refused.value) and "unknown preset" not in str(
        refused.value
    )


@pytest.mark.slow
def test_run_and_grid_configs_swapped_between_commands_name_the_command(tmp_path):
    grid_file = tmp_path / "grid.py"
    grid_file.write_text(
        "import ml_collections\n\n\ndef get_config(arg=None):\n"
        "    return ml_collections.ConfigDict({'base': 'configs/tiny.py', 'num_seeds': 1,\n"
        "        'axes': 'strategy=finetune_only|stack_only', 'baseline': 'strategy=finetune_only',\n"
        "        'metric': 'accuracy', 'ensembles': ''})\n"
    )
    line = _one_error_line(
        _cli("stackft_jax.main", f"--config={grid_file}", f"--workdir={tmp_path / 'w'}"), 2
    )
    assert "is a grid config, and this command runs a run config" in line
    assert "python -m stackft_jax.experiment" in line
    line = _one_error_line(
        _cli("stackft_jax.experiment", "--config=configs/tiny.py", f"--workdir={tmp_path / 'g'}"), 2
    )
    assert "is a run config, and this command runs a grid config" in line and "stackft_jax.main" in line
    assert not (tmp_path / "w").exists() and not (tmp_path / "g").exists()


# --- data ----------------------------------------------------------------------------------------


def _yahoo_file(path: Path, topics: list[str]) -> Path:
    path.write_text("".join(f'"text number {i} about {t}",{t}\n' for i, t in enumerate(topics * 4)))
    return path


def test_yahoo_classes_absent_from_the_files_are_named(tmp_path):
    train_file = _yahoo_file(tmp_path / "train.csv", ["society_culture", "science_mathematics"])
    dev_file = _yahoo_file(tmp_path / "dev.csv", ["society_culture", "science_mathematics"])
    files = f"data.train_file={train_file},data.dev_file={dev_file}"
    base = f"configs/yahoo.py:model.name_or_path=embedded:minilm,{files}"
    one_absent = config_cli.load(f"{base},data.classes=society_culture+sports")
    with pytest.raises(
        cli_errors.DataError, match=r"topic\(s\) \['sports'\] have no example in data.train_file"
    ):
        train.run(one_absent, tmp_path / "one")
    both_absent = config_cli.load(f"{base},data.classes=health+sports")
    with pytest.raises(cli_errors.DataError) as refused:
        train.run(both_absent, tmp_path / "both")
    assert "['health', 'sports']" in str(refused.value) and "header only" not in str(refused.value)


def _copied_fixture(tmp_path: Path) -> tuple[Path, Path]:
    data = tmp_path / "data"
    shutil.copytree(tiny.FIXTURES / "qqp", data)
    return data / "train.tsv", data / "dev.tsv"


@pytest.mark.slow
def test_a_data_file_changed_after_a_run_is_refused_naming_it(tmp_path):
    train_file, dev_file = _copied_fixture(tmp_path)
    config = tiny.get_config(f"{SHORT},data.train_file={train_file},data.dev_file={dev_file}")
    workdir = tmp_path / "run"
    train.run(config, workdir)
    recorded = json.loads((workdir / workdirs.DATA_FILE).read_text())
    assert set(recorded) == {"data.train_file", "data.dev_file", workdirs.TOKENIZER_KEY}
    results = (workdir / "results.json").read_text()
    lines = dev_file.read_text().splitlines(keepends=True)
    dev_file.write_text("".join(lines[:-1]))  # one example fewer, edited in place
    with pytest.raises(workdirs.ConfigMismatch) as refused:
        train.run(config, workdir)
    assert str(refused.value).startswith(f"config.data.dev_file = '{dev_file}' changed since this workdir's")
    assert (workdir / "results.json").read_text() == results  # nothing rewritten
    # On purpose: the new content is recorded, and the old run's progress is set aside (not mixed).
    train.run(config, workdir, allow_config_change=True)
    assert (
        json.loads((workdir / workdirs.DATA_FILE).read_text())["data.dev_file"]["bytes"]
        == dev_file.stat().st_size
    )
    (aside,) = workdir.glob("replaced-*")
    assert (aside / "results.json").read_text() == results
    history = [json.loads(line) for line in (workdir / workdirs.HISTORY_FILE).read_text().splitlines()]
    assert history[-1][workdirs.DATA_FILE] == recorded
    records = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    assert len([r for r in records if r.get("split") == "dev"]) == len(
        [
            r
            for r in (json.loads(line) for line in (aside / "metrics.jsonl").read_text().splitlines())
            if r.get("split") == "dev"
        ]
    )  # the new run's own evaluations only


@pytest.mark.slow
def test_tokenizer_files_changed_after_a_run_are_refused_naming_them(tmp_path):
    from stackft_jax.models import bert

    model_dir = tmp_path / "model"
    shutil.copytree(bert.resolve_model_dir("embedded:minilm"), model_dir)
    config = tiny.get_config(f"{SHORT},model.name_or_path={model_dir}")
    workdir = tmp_path / "run"
    train.run(config, workdir)
    # A run recorded before tokenizer fingerprints existed still resumes, and records one.
    recorded = json.loads((workdir / workdirs.DATA_FILE).read_text())
    tokenizer = recorded.pop(workdirs.TOKENIZER_KEY)
    (workdir / workdirs.DATA_FILE).write_text(json.dumps(recorded))
    train.run(config, workdir)
    assert json.loads((workdir / workdirs.DATA_FILE).read_text())[workdirs.TOKENIZER_KEY] == tokenizer
    results = (workdir / "results.json").read_text()
    vocab = (model_dir / "vocab.txt").read_text().splitlines(keepends=True)
    vocab[1000], vocab[1001] = vocab[1001], vocab[1000]  # two ids swapped
    (model_dir / "vocab.txt").write_text("".join(vocab))
    predictions = (workdir / "predictions" / "dev.jsonl").read_bytes()
    with pytest.raises(workdirs.ConfigMismatch) as refused:
        train.run(config, workdir)
    assert str(refused.value).startswith(
        f"the tokenizer files of {model_dir} (vocab.txt) changed since this workdir's run tokenized its data"
    )
    assert (workdir / "results.json").read_text() == results
    assert (workdir / "predictions" / "dev.jsonl").read_bytes() == predictions


@pytest.mark.slow
def test_another_strategy_on_purpose_starts_over_and_sets_the_old_run_aside(tmp_path, caplog):
    workdir = tmp_path / "run"
    train.run(tiny.get_config(f"{SHORT},final_params=best"), workdir)
    old_best = sorted(p.name for p in (workdir / "checkpoints" / "best").iterdir())
    assert old_best
    results = train.run(
        tiny.get_config(f"{SHORT},final_params=best,strategy=finetune_only"),
        workdir,
        allow_config_change=True,
    )
    (aside,) = workdir.glob("replaced-*")
    assert sorted(p.name for p in (aside / "checkpoints" / "best").iterdir()) == old_best
    # The warning names what the user changed, not the alphabetically first phase key it implies.
    assert any("--allow_config_change changed config.strategy;" in r.getMessage() for r in caplog.records)
    assert [p["phase"] for p in results["phases"]] == ["finetune"]
    # Its best is its own: a global step of the new single phase, never the old run's phase 2.
    assert results["best"]["global_step"] <= results["train_steps"]
    records = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    assert {r["phase"] for r in records if "phase" in r} == {"finetune"}


# --- grids ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"metric": "f2"}, "config key 'metric' = 'f2': grid run strategy=finetune_only-seed0"),
        ({"axes": "strategy=finetune_only|stack_only; head.name=cls_mlp|esmi"}, "'esmi' is not a registered"),
        ({"num_seeds": 0}, "config key 'num_seeds' = 0: run at least 1 seed"),
        # Report-only numbers: a bad one used to pass until the report, after every run had trained.
        ({"equivalence_margin": -0.01}, "config key 'equivalence_margin' = -0.01: TOST's margin"),
        ({"equivalence_margin": 0.0}, "config key 'equivalence_margin' = 0.0: TOST's margin"),
        ({"bootstrap_samples": 10}, "config key 'bootstrap_samples' = 10: the two-level bootstrap's"),
        ({"axes": "strategy=finetune_only|stack_only; seed=0|1"}, "axis seed sets seed, which the grid sets"),
        (
            {"axes": "strategy=finetune_only|stack_only; lr=a:seed=1,phase1.learning_rate=0.1|b:seed=2"},
            "axis lr sets seed",
        ),
    ],
)
def test_grid_mistakes_fail_before_any_cell_trains(tmp_path, changes, message):
    g = _grid(axes="strategy=finetune_only|stack_only", num_seeds=1)
    g.update(changes)
    with pytest.raises(ConfigError, match=message):
        grid.run_grid(g, tmp_path)
    assert not (tmp_path / "runs").exists() and not (tmp_path / "grid_config.json").exists()


def test_grid_metric_mistake_is_one_line_on_the_command_line(tmp_path):
    line = _one_error_line(
        _cli(
            "stackft_jax.experiment",
            "--config=configs/experiments/tiny.py",
            "--config.metric=f2",
            f"--workdir={tmp_path}",
        ),
        2,
    )
    assert "config key 'metric' = 'f2'" in line
    assert not (tmp_path / "runs").exists()


def test_a_grid_workdir_is_bound_to_its_grid_config(tmp_path):
    g = _grid(axes="strategy=finetune_only|stack_only", num_seeds=1)
    grid.plan_grid(g, tmp_path)  # checked and bound; no cell trained yet
    assert json.loads((tmp_path / "grid_config.json").read_text())["grid"]["base"] == "configs/tiny.py"
    (tmp_path / "runs" / "strategy=finetune_only-seed0").mkdir(parents=True)  # a cell began
    (tmp_path / "ensembles").mkdir()
    other = _grid(base="configs/tiny.py:phase1.num_steps=2", axes=g.axes, num_seeds=1)
    with pytest.raises(workdirs.ConfigMismatch) as refused:
        grid.run_grid(other, tmp_path)
    assert f"{tmp_path} belongs to a grid with another config" in str(refused.value)
    # The base is compared as the run config it resolves to: the key that differs is named.
    assert "grid.base.phase1.num_steps: 6 recorded, 2 now" in str(refused.value)
    # Written otherwise, the same values bind alike (a preset moved, a key spelled out).
    grid.plan_grid(_grid(base="configs/tiny.py:phase1.num_steps=6", axes=g.axes, num_seeds=1), tmp_path)
    grid.plan_grid(other, tmp_path, allow_config_change=True)  # on purpose: recorded, history kept
    history = (tmp_path / "grid_config_history.jsonl").read_text().splitlines()
    assert json.loads(history[0])["record"]["grid"]["base"] == "configs/tiny.py"
    assert not (tmp_path / "ensembles").exists()  # the old grid's ensembles go; the report rebuilds them
    grid.plan_grid(other, tmp_path)  # now the recorded one
    # The paper's numbers and the report's comparisons only shape the report: they may change.
    grid.plan_grid(
        _grid(
            base=other.base,
            axes=g.axes,
            num_seeds=1,
            paper_results="strategy=stack_only: 1.0",
            comparisons="strategy=finetune_only vs strategy=stack_only",
        ),
        tmp_path,
    )


# --- ensembles -----------------------------------------------------------------------------------


@pytest.mark.slow
def test_ensemble_out_refuses_what_it_did_not_write(tmp_path):
    a, b, c = (_write_run(tmp_path / name, key) for name, key in (("a", "a"), ("b", "b"), ("c", "a")))
    before = {p: p.read_bytes() for p in c.rglob("*") if p.is_file()}
    line = _one_error_line(_cli("stackft_jax.ensemble", f"--workdirs={a},{b}", f"--out={c}"), 2)
    assert f"--out={c} exists and holds a run's results" in line
    assert {p: p.read_bytes() for p in c.rglob("*") if p.is_file()} == before  # untouched

    other = tmp_path / "notes"
    other.mkdir()
    (other / "todo.txt").write_text("mine")
    line = _one_error_line(_cli("stackft_jax.ensemble", f"--workdirs={a},{b}", f"--out={other}"), 2)
    assert "exists and holds 1 entries" in line

    line = _one_error_line(_cli("stackft_jax.ensemble", f"--workdirs={a},{a}", f"--out={tmp_path / 'e'}"), 2)
    assert f"--workdirs names {a} twice" in line and not (tmp_path / "e").exists()

    out = tmp_path / "ens"
    assert _cli("stackft_jax.ensemble", f"--workdirs={a},{b}", f"--out={out}").returncode == 0
    # Its own earlier output it writes again; another ensemble's it refuses.
    proc = _cli("stackft_jax.ensemble", f"--workdirs={a},{b}", f"--out={out}", "--weights=dev")
    assert proc.returncode == 0, proc.stderr
    line = _one_error_line(_cli("stackft_jax.ensemble", f"--workdirs={a},{c}", f"--out={out}"), 2)
    assert "holds another ensemble's output" in line


# --- signals -------------------------------------------------------------------------------------


@pytest.mark.slow
def test_ctrl_c_saves_and_says_how_to_resume(uninterrupted, tmp_path, run_cli):
    # The run sends itself SIGINT after phase 1's step 2 (tests/kill_after.py): the step it stops at
    # does not depend on how loaded the machine is.
    proc = run_cli(tmp_path, kill_at="phase1:2:SIGINT")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 130, out[-3000:]
    assert "Traceback" not in out
    assert out.strip().splitlines()[-1].startswith("Ctrl-C: checkpoint saved at phase")
    assert out.strip().endswith("rerun the same command to resume")
    proc = run_cli(tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    _assert_same_run(uninterrupted, tmp_path)


# --- output --------------------------------------------------------------------------------------


def test_only_abandoned_checkpoint_reads_are_dropped_from_the_output(monkeypatch):
    """An unreadable checkpoint's other reads fail after orbax gave up on them: their coroutines' errors
    and tensorstore's callbacks into the closed loop (~230 tracebacks for MiniLM) are dropped; any other
    unraisable exception still reaches the hook before."""
    import asyncio
    import types

    from stackft_jax.runtime import logs

    seen = []
    monkeypatch.setattr(sys, "unraisablehook", seen.append)
    logs._install_orphan_filters()

    namespace = {}
    exec(
        compile("async def _read_array_index_and_device_put(): pass", "/x/orbax/checkpoint/s.py", "exec"),
        namespace,
    )
    orbax_read = namespace["_read_array_index_and_device_put"]()
    loop = asyncio.new_event_loop()
    loop.close()
    try:
        loop.call_soon_threadsafe(print)
    except RuntimeError as error:
        closed = error
    args = types.SimpleNamespace
    sys.unraisablehook(
        args(exc_type=Exception, exc_value=Exception("read"), exc_traceback=None, object=orbax_read)
    )
    sys.unraisablehook(
        args(exc_type=RuntimeError, exc_value=closed, exc_traceback=closed.__traceback__, object=None)
    )
    own = args(
        exc_type=RuntimeError, exc_value=RuntimeError("Event loop is closed"), exc_traceback=None, object=None
    )
    sys.unraisablehook(own)
    assert seen == [own]
    orbax_read.close()


# --- outputs -------------------------------------------------------------------------------------


def test_an_output_that_holds_something_is_refused_unless_overwrite(tmp_path):
    empty_file, empty_folder = tmp_path / "empty.jsonl", tmp_path / "empty"
    empty_file.touch()
    empty_folder.mkdir()
    for free in (tmp_path / "new.jsonl", empty_file, empty_folder):
        cli_errors.refuse_to_replace("out", free, overwrite=False)
    full_file, full_folder = tmp_path / "full.jsonl", tmp_path / "full"
    full_file.write_text("{}\n")
    (full_folder / "sub").mkdir(parents=True)
    for taken in (full_file, full_folder):
        with pytest.raises(
            cli_errors.UsageError, match=rf"^--out={taken} exists and is not empty: pass --overwrite"
        ):
            cli_errors.refuse_to_replace("out", taken, overwrite=False)
        cli_errors.refuse_to_replace("out", taken, overwrite=True)


def test_a_grid_base_that_no_longer_resolves_is_compared_as_written(tmp_path):
    g = _grid(axes="strategy=finetune_only", num_seeds=1)
    grid.plan_grid(g, tmp_path)
    (tmp_path / "runs" / "strategy=finetune_only-seed0").mkdir(parents=True)
    recorded = json.loads((tmp_path / "grid_config.json").read_text())
    recorded["grid"]["base"] = "configs/tiny.py:a_preset_since_removed"
    (tmp_path / "grid_config.json").write_text(json.dumps(recorded))
    with pytest.raises(workdirs.ConfigMismatch, match="grid.base: 'configs/tiny.py:a_preset_since_removed'"):
        grid.plan_grid(g, tmp_path)
