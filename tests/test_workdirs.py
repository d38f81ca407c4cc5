"""A workdir belongs to one config and one live run: reruns with other results-relevant keys are
refused, a second live process is refused, a killed process's lock does not block its rerun."""

import json
import signal
import subprocess
import sys
import textwrap

import pytest

from configs import tiny
from stackft_jax.runtime.cli_errors import ConfigError
from stackft_jax.training import train, workdirs


def test_config_differences_list_changed_added_and_removed_keys():
    recorded = {
        "config": {"seed": 0, "phase1": {"learning_rate": 1e-3, "num_steps": 6}, "log_every_steps": 2}
    }
    current = {"config": {"seed": 1, "phase1": {"learning_rate": 1e-3}, "log_every_steps": 50}, "new": True}
    assert workdirs.config_differences(recorded, current) == {
        "config.phase1.num_steps": (6, "<absent>"),
        "config.seed": (0, 1),
        "new": ("<absent>", True),
    }
    # A written schedule is compared phase by phase; where a phase keeps its feature cache is not a result.
    phase = {"name": "head", "num_steps": 4, "feature_cache_dir": ""}
    recorded = {"config": {"phases": [phase, {**phase, "name": "all"}]}}
    current = {
        "config": {
            "phases": [{**phase, "feature_cache_dir": "/shared"}, {**phase, "name": "all", "num_steps": 5}]
        }
    }
    assert workdirs.config_differences(recorded, current) == {"config.phases.1.num_steps": (4, 5)}


def test_bind_config_records_refuses_and_allows_on_purpose(tmp_path):
    first = {"config": {"seed": 0, "log_every_steps": 2}, "global_batch_size": 8}
    workdirs.bind_config(tmp_path, first, allow_change=False)
    assert json.loads((tmp_path / "config.json").read_text()) == first
    workdirs.bind_config(tmp_path, {**first, "config": {"seed": 0, "log_every_steps": 9}}, allow_change=False)

    other = {"config": {"seed": 1, "log_every_steps": 2}, "global_batch_size": 16}
    (tmp_path / "metrics.jsonl").write_text("")  # the first run has done some work
    with pytest.raises(workdirs.ConfigMismatch) as refused:
        workdirs.bind_config(tmp_path, other, allow_change=False)
    message = str(refused.value)
    assert "config.seed: 0 recorded, 1 now" in message
    assert "global_batch_size: 8 recorded, 16 now" in message
    assert "--allow_config_change" in message and "log_every_steps" not in message

    workdirs.bind_config(tmp_path, other, allow_change=True)
    assert json.loads((tmp_path / "config.json").read_text()) == other
    (history,) = (tmp_path / "config_history.jsonl").read_text().splitlines()
    assert json.loads(history)["record"] == first


@pytest.mark.slow
def test_a_run_refused_before_any_work_does_not_bind_its_workdir(tmp_path):
    """A schedule whose rule labels no parameter fails after the workdir is bound but before anything is
    written: the corrected config then runs there without --allow_config_change."""
    bad = tiny.get_config("three_phases,phases.1.num_steps=2")
    bad.phases[1].rules = [("backbone/layers/7/.*", "top"), *bad.phases[1].rules[1:]]
    with pytest.raises(ConfigError, match="matches no parameter"):
        train.run(bad, tmp_path)
    assert not workdirs.holds_progress(tmp_path)
    results = train.run(
        tiny.get_config("three_phases,phases.0.num_steps=2,phases.1.num_steps=2,phases.2.num_steps=2"),
        tmp_path,
    )
    assert [p["phase"] for p in results["phases"]] == ["head", "top", "all"]
    assert len((tmp_path / "config_history.jsonl").read_text().splitlines()) == 1


@pytest.mark.slow
def test_rerun_with_another_seed_is_refused_before_any_work(tmp_path):
    train.run(tiny.get_config("phase1.num_steps=2,phase2.num_steps=2"), tmp_path)
    results_before = (tmp_path / "results.json").read_text()
    with pytest.raises(workdirs.ConfigMismatch, match="config.seed: 0 recorded, 1 now"):
        train.run(tiny.get_config("phase1.num_steps=2,phase2.num_steps=2,seed=1"), tmp_path)
    assert (tmp_path / "results.json").read_text() == results_before
    # Logging cadence and eval batch size do not change results: the rerun goes on.
    train.run(
        tiny.get_config(
            "phase1.num_steps=2,phase2.num_steps=2,log_every_steps=1,eval_per_device_batch_size=4"
        ),
        tmp_path,
    )


def _edit_record(workdir, edit) -> None:
    path = workdir / workdirs.CONFIG_FILE
    record = json.loads(path.read_text())
    edit(record["config"])
    path.write_text(json.dumps(record))


@pytest.mark.slow
def test_an_older_record_resumes_when_only_unused_or_newer_keys_differ(tmp_path):
    """Binding compares what the run uses: a record written before a head or a key with a default
    existed (no `head.bimpm` block, no `boundary_train_examples`), with a key removed since, still
    resumes, and so does a change to another head's or an unused alias block's keys; the seed binds."""
    args = "phase1.num_steps=2,phase2.num_steps=2"
    first = train.run(tiny.get_config(args), tmp_path)

    def predate(config):
        del config["head"]["bimpm"], config["boundary_train_examples"]
        del config["phase1"]["feature_cache_dtype"]
        config["a_key_removed_since"] = 3

    _edit_record(tmp_path, predate)
    later = tiny.get_config(f"{args},head.esim.mlp_hidden_dim=7,unfreezing.layers_per_phase=2")
    again = train.run(later, tmp_path)
    assert [p["steps"] for p in again["phases"]] == [p["steps"] for p in first["phases"]]
    assert again["final"] == first["final"]
    assert not (tmp_path / workdirs.HISTORY_FILE).exists()  # resumed, not re-bound
    with pytest.raises(workdirs.ConfigMismatch, match="config.seed: 0 recorded, 1 now"):
        train.run(tiny.get_config(f"{args},seed=1"), tmp_path)
    with pytest.raises(workdirs.ConfigMismatch, match=r"config.head.cls_mlp.hidden_dim: 16 recorded, 8 now"):
        train.run(tiny.get_config(f"{args},head.cls_mlp.hidden_dim=8"), tmp_path)


@pytest.mark.slow
def test_a_written_schedule_recorded_before_a_block_key_resumes(tmp_path):
    args = "three_phases,phases.0.num_steps=2,phases.1.num_steps=2,phases.2.num_steps=2"
    first = train.run(tiny.get_config(args), tmp_path)

    def predate(config):
        for block in config["phases"]:
            del block["feature_cache_dtype"]
        config["phase1"]["num_steps"] = 6  # as tiny.py's three_phases left it before it cleared them

    _edit_record(tmp_path, predate)
    assert train.run(tiny.get_config(args), tmp_path)["final"] == first["final"]
    with pytest.raises(workdirs.ConfigMismatch, match=r"config.phases.1.num_steps: 2 recorded, 3 now"):
        train.run(tiny.get_config(args.replace("phases.1.num_steps=2", "phases.1.num_steps=3")), tmp_path)


def test_a_live_run_holds_the_workdir(tmp_path):
    with workdirs.exclusive(tmp_path):
        with pytest.raises(workdirs.WorkdirInUse, match="in use by a live run"):
            train.run(tiny.get_config(), tmp_path)


def test_a_killed_process_lock_does_not_block(tmp_path):
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent(
                f"""
                import time
                from pathlib import Path
                from stackft_jax.training import workdirs
                with workdirs.exclusive(Path({str(tmp_path)!r})):
                    print("locked", flush=True)
                    time.sleep(600)
                """
            ),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout.readline().strip() == "locked"
    with pytest.raises(workdirs.WorkdirInUse, match=r"pid \d+ on"):
        with workdirs.exclusive(tmp_path):
            pass
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    with workdirs.exclusive(tmp_path):
        pass


@pytest.mark.slow
def test_cli_prints_the_refusal_without_a_traceback(tmp_path, run_cli):
    assert run_cli(tmp_path, "--config.phase1.num_steps=2", "--config.phase2.num_steps=2").returncode == 0
    proc = run_cli(tmp_path, "--config.phase1.num_steps=3", "--config.phase2.num_steps=2")
    assert proc.returncode == 2  # a config the workdir does not belong to (cli_errors.py)
    assert "Traceback" not in proc.stderr
    assert "error: " in proc.stderr and "phase1.num_steps: 2 recorded, 3 now" in proc.stderr
    proc = run_cli(
        tmp_path, "--config.phase1.num_steps=3", "--config.phase2.num_steps=2", "--allow_config_change"
    )
    assert proc.returncode == 0, proc.stderr[-3000:]


def test_a_runs_folder_is_found_from_any_path_inside_it(tmp_path):
    from stackft_jax.experiments import ensembling
    from stackft_jax.runtime import cli_errors

    run = tmp_path / "run"
    (run / "predictions").mkdir(parents=True)
    (run / workdirs.CONFIG_FILE).write_text(json.dumps({"config": {}, "global_batch_size": 8}))
    assert workdirs.run_holding(run / "predictions" / "dev.jsonl") == run.resolve()
    assert workdirs.run_holding(run / "new" / "deeper") == run.resolve()
    encoder = tmp_path / "export"  # an encoder's config.json is no run's binding
    encoder.mkdir()
    (encoder / "config.json").write_text(json.dumps({"model_type": "bert", "vocab_size": 10}))
    assert workdirs.run_holding(encoder / "x") is None
    with pytest.raises(
        cli_errors.UsageError, match=rf"^--out={run}/ens is inside the workdir of the run {run}"
    ):
        ensembling.check_out(run / "ens", [])
    grid = tmp_path / "grid"
    grid.mkdir()
    (grid / workdirs.GRID.config_file).write_text("{}")
    with pytest.raises(
        cli_errors.UsageError, match=rf"^--out={grid} is the workdir of the grid {grid}; .* grid's"
    ):
        workdirs.refuse_run_target("out", grid)
