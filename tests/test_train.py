"""End to end on the tiny config: outputs, errors, and resume after kills at any moment."""

import json
import logging
import os
import shutil
import signal
import time
from pathlib import Path

import jax
import numpy as np
import pytest

from configs import quora, tiny
from stackft_jax.data import glue, tasks
from stackft_jax.models import bert
from stackft_jax.runtime import sharding
from stackft_jax.trained import run_params
from stackft_jax.training import build, checkpointing, loop, prediction_files, preemption, run_report, train


def _final_params(workdir: Path):
    """Read onto one device, whatever devices or processes wrote them."""
    return run_params.phase_params(workdir, "phase2")


def _eval_records(workdir: Path) -> list[dict]:
    return [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]


def _assert_same_run(a: Path, b: Path, *, num_dev_examples: int = 16) -> None:
    ra, rb = (json.loads((w / "results.json").read_text()) for w in (a, b))
    assert ra["final"] == rb["final"]
    assert ra["best"] == rb["best"]
    assert [(p["phase"], p["steps"], p["stop_reason"]) for p in ra["phases"]] == [
        (p["phase"], p["steps"], p["stop_reason"]) for p in rb["phases"]
    ]
    assert _eval_records(a) == _eval_records(b)
    # Two runs' prediction files match example by example (and, bit-identical, record by record).
    pairs = prediction_files.paired(prediction_files.path(a, "dev"), prediction_files.path(b, "dev"))
    assert len(pairs) == num_dev_examples and all(x == y for x, y in pairs)
    pa, pb = _final_params(a), _final_params(b)
    jax.tree.map(np.testing.assert_array_equal, pa, pb)


def test_outputs(uninterrupted):
    results = json.loads((uninterrupted / "results.json").read_text())
    assert results["strategy"] == "stack_and_finetune"
    assert results["num_devices"] == 8 and results["global_batch_size"] == 8
    assert [p["phase"] for p in results["phases"]] == ["phase1", "phase2"]
    assert all(p["stop_reason"].startswith("step budget") for p in results["phases"])
    assert set(results["final"]["dev"]) == {"accuracy", "f1", "loss"}
    assert results["config"]["strategy"] == "stack_and_finetune"
    records = _eval_records(uninterrupted)
    assert {(r["phase"], r["step"], r["split"]) for r in records} >= {
        ("phase1", 3, "dev"),
        ("phase1", 6, "dev"),
        ("phase1", 3, "train_subset"),
        ("phase2", 3, "dev"),
        ("phase2", 6, "dev"),
    }
    # Train scalars, read back: the head moves in both phases, the frozen backbone only in phase 2.
    scalars = run_report.train_scalars(uninterrupted)
    phase1_steps = results["phases"][0]["steps"]
    assert [step for step, _ in scalars["loss"]] == list(range(2, 13, 2))  # log_every_steps=2
    assert all(value > 0 for _, value in scalars["update_norm/head"])
    assert [step for step, _ in scalars["update_norm/backbone"]] == list(range(phase1_steps + 2, 13, 2))
    assert all(value > 0 for _, value in scalars["update_norm/backbone"] + scalars["grad_norm/backbone"])
    # The final dev predictions, one record per dev example in file order, agree with the final scores.
    dev = list(prediction_files.read(prediction_files.path(uninterrupted, "dev")).values())
    examples = glue.read_qqp(tiny.FIXTURES / "qqp" / "dev.tsv", config_key="data.dev_file")
    assert [r["key"] for r in dev] == [e.key for e in examples] and dev[0]["key"].startswith("1000-")
    assert [r["label"] for r in dev] == [e.label for e in examples]
    for r in dev:
        assert (
            r["prediction"] == int(np.argmax(r["probabilities"])) and abs(sum(r["probabilities"]) - 1) < 1e-5
        )
    accuracy = np.mean([r["prediction"] == r["label"] for r in dev])
    np.testing.assert_allclose(results["final"]["dev"]["accuracy"], accuracy)
    for name in ("phase1_end", "phase2_end", "best"):
        assert (uninterrupted / "checkpoints" / name).is_dir()
    # A boundary holds what its phase trained: phase 1 the head (the backbone is the initial one).
    assert set(checkpointing.read_phase_end(uninterrupted, "phase1")[0]) == {"head"}
    assert set(checkpointing.read_phase_end(uninterrupted, "phase2")[0]) == {"backbone", "head"}
    # Phase 1 held optimizer state for the head only.
    p1, p2 = results["phases"]
    assert p1["optimizer_state_bytes"] < p2["optimizer_state_bytes"] / 100


@pytest.mark.slow
def test_sigkill_inside_phase1_at_the_boundary_and_inside_phase2(uninterrupted, tmp_path, run_cli):
    for kill_at in ("phase1:3", "phase1:6", "phase2:5"):
        proc = run_cli(tmp_path, kill_at=kill_at)
        assert proc.returncode == -signal.SIGKILL, proc.stdout + proc.stderr
    assert (tmp_path / "checkpoints" / "phase1_end").is_dir()
    proc = run_cli(tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    _assert_same_run(uninterrupted, tmp_path)


@pytest.mark.slow
def test_checkpoints_of_a_phase_started_from_other_frozen_weights_are_refused(
    uninterrupted, tmp_path, run_cli
):
    # Seed 1 draws another random backbone than seed 0's, under which phase 1 trained its head.
    finished, killed = tmp_path / "finished", tmp_path / "killed"
    shutil.copytree(uninterrupted, finished)
    assert run_cli(killed, kill_at="phase1:3").returncode == -signal.SIGKILL
    newest = max(int(p.name) for p in (killed / "checkpoints" / "phase1").glob("[0-9]*"))
    for workdir, checkpoint in ((finished, "phase1_end"), (killed, f"phase1/{newest}")):
        proc = run_cli(workdir, "--config.seed=1", "--allow_config_change")
        assert proc.returncode == 1, proc.stdout + proc.stderr
        error = proc.stderr.strip().splitlines()[-1]
        assert error.startswith(f"error: {workdir / 'checkpoints' / checkpoint} was saved by a phase that ")
        assert "Traceback" not in proc.stderr
        assert (workdir / "checkpoints" / checkpoint).is_dir()  # kept: nothing saved is lost


@pytest.mark.slow
def test_sigterm_saves_and_resumes(uninterrupted, tmp_path, run_cli):
    proc = run_cli(tmp_path, kill_at="phase1:2:SIGTERM")  # a real SIGTERM at a step load cannot move
    out = proc.stdout + proc.stderr
    assert (
        proc.returncode == 1 and "SIGTERM: checkpoint saved at phase1 step 3; rerun the same command" in out
    )
    proc = run_cli(tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    _assert_same_run(uninterrupted, tmp_path)


def test_sigterm_flag_reaches_every_phase():
    """Each phase asks for the flag; a SIGTERM in a later phase must still be seen (the handler used
    to keep setting the first phase's flag)."""
    previous = signal.getsignal(signal.SIGTERM)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        preemption.install_sigterm_flag()  # phase 1
        flag = preemption.install_sigterm_flag()  # phase 2
        assert not flag["set"]
        os.kill(os.getpid(), signal.SIGTERM)
        deadline = time.time() + 5
        while not flag["set"] and time.time() < deadline:
            time.sleep(0.01)
        assert flag["set"]
    finally:
        preemption.acknowledge()
        signal.signal(signal.SIGTERM, previous)


class _SigtermWhenPhaseEnds(loop.LoopObserver):
    """SIGTERM to this process once `phase` has trained its last step: after the step loop's last look
    at the stop flag, where a Ctrl-C during the phase's final evaluation lands."""

    def __init__(self, phase: str):
        self.phase = phase

    def phase_ended(self, name: str) -> None:
        if name == self.phase:
            os.kill(os.getpid(), signal.SIGTERM)


@pytest.mark.slow
def test_a_signal_after_the_last_step_stops_at_the_phase_boundary(uninterrupted, tmp_path):
    """The flag set after the loop's last check used to be forgotten: the last phase finished and the
    run exited 0 after promising to save and stop (Ctrl-C under load in the CLI drill)."""
    previous = signal.getsignal(signal.SIGTERM)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        with pytest.raises(preemption.Preempted, match="SIGTERM: checkpoint saved at phase2 end"):
            train.run(tiny.get_config(), tmp_path, observer=_SigtermWhenPhaseEnds("phase2"))
    finally:
        preemption.acknowledge()
        signal.signal(signal.SIGTERM, previous)
    assert (tmp_path / "checkpoints" / "phase2_end").is_dir()
    assert not (tmp_path / "results.json").exists()
    train.run(tiny.get_config(), tmp_path)  # resumes: both phases finished, then scored
    _assert_same_run(uninterrupted, tmp_path)


def test_missing_data_file_names_the_key(tmp_path):
    config = tiny.get_config()
    config.data.dev_file = str(tmp_path / "nope.tsv")
    with pytest.raises(FileNotFoundError, match=r"data\.dev_file.*nope\.tsv"):
        train.run(config, tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_object_store_workdir_is_refused(tmp_path):
    with pytest.raises(ValueError, match="gs://bucket/run"):
        train.run(tiny.get_config(), "gs://bucket/run")


@pytest.mark.parametrize("strategy", ["finetune_only", "stack_only"])
@pytest.mark.slow
def test_single_phase_strategies(strategy, tmp_path):
    config = tiny.get_config(f"strategy={strategy}")
    config.model.scalar_mix = strategy == "stack_only"
    results = train.run(config, tmp_path)
    name = {"finetune_only": "finetune", "stack_only": "stack"}[strategy]
    assert [p["phase"] for p in results["phases"]] == [name]
    assert 0.0 <= results["final"]["dev"]["accuracy"] <= 1.0


@pytest.mark.slow
def test_final_scoring_reuses_the_last_steps_dev_evaluation(tmp_path, monkeypatch):
    # A phase that ends on a dev evaluation has scored the final parameters already: scoring them again
    # would double the run's largest evaluation cost. Its scores and predictions are the final ones.
    from stackft_jax.training import evaluation

    calls = []
    original = evaluation.Evaluator.evaluate

    def counted(self, params, split, **kwargs):
        calls.append((split.name, kwargs.get("limit")))
        return original(self, params, split, **kwargs)

    monkeypatch.setattr(evaluation.Evaluator, "evaluate", counted)
    config = tiny.get_config("strategy=finetune_only")
    config.phase2.num_steps, config.eval_every_steps = 4, 2
    results = train.run(config, tmp_path / "last")
    assert [c for c in calls if c[0] == "dev"] == [("dev", None)] * 2  # steps 2 and 4; no third
    last_eval = [r for r in _eval_records(tmp_path / "last") if r.get("split") == "dev"][-1]
    assert results["final"]["dev"] == {k: last_eval[k] for k in results["final"]["dev"]}
    assert len(prediction_files.read(prediction_files.path(tmp_path / "last", "dev"))) == 16

    calls.clear()  # "best" parameters are scored anew (they may come from an earlier step)
    config.final_params = "best"
    train.run(config, tmp_path / "best")
    assert [c for c in calls if c[0] == "dev"] == [("dev", None)] * 3


@pytest.mark.slow
def test_gap_rule_stops_phase1_early(tmp_path):
    config = tiny.get_config()
    config.phase1.max_train_dev_gap = -1.0  # any gap at all exceeds this
    config.phase1.num_steps = 9
    results = train.run(config, tmp_path)
    phase1 = results["phases"][0]
    assert phase1["steps"] == 3 and "gap" in phase1["stop_reason"]


@pytest.mark.slow
def test_a_stop_rule_that_ends_a_phase_on_an_unlearned_head_is_recorded_and_warned(tmp_path, caplog):
    # A dev split of one class: whatever the head predicts, it is at or below the majority class there,
    # so the gap rule (which fires at the first evaluation) stops a head that has not learned the task.
    lines = (tiny.FIXTURES / "qqp" / "dev.tsv").read_text().splitlines()
    one_class = tmp_path / "dev_one_class.tsv"
    one_class.write_text("\n".join([lines[0], *(row for row in lines[1:] if row.endswith("\t0"))]) + "\n")
    config = tiny.get_config()
    config.data.dev_file = str(one_class)
    config.phase1.max_train_dev_gap = -1.0
    config.phase1.num_steps = 9
    with caplog.at_level(logging.WARNING):
        results = train.run(config, tmp_path / "run")
    phase1, phase2 = results["phases"]
    assert phase1["steps"] == 3 and "at_or_below_majority" in phase1["dev_degenerate_at_stop"]
    assert "dev_degenerate_at_stop" not in phase2  # it ran its budget: no rule stopped it
    assert "phase1: a stop rule (train/dev accuracy gap" in caplog.text
    assert "the head had not learned the task" in caplog.text


def test_devices(tmp_path):
    assert sharding.make_mesh().size == jax.device_count() == 8


def test_architecture_overrides_need_random_init():
    config = quora.get_config("demo")
    model_dir = bert.resolve_model_dir(config.model.name_or_path)
    task = tasks.get_task(config.data.task)
    config.model.config_overrides.num_hidden_layers = 1
    with pytest.raises(ValueError, match="change the architecture"):
        build.build_model(config, task, model_dir)
    config.model.init = "random"
    assert build.build_model(config, task, model_dir)[1].num_hidden_layers == 1
    # Dropout is not architecture: pretrained weights load with the rate overridden.
    config = quora.get_config("demo")
    config.model.dropout_rate = 0.2
    _, bert_config = build.build_model(config, task, model_dir)
    assert bert_config.hidden_dropout_prob == bert_config.attention_probs_dropout_prob == 0.2


@pytest.mark.slow
def test_log_windows_report_throughput_without_evaluation_time(tmp_path, monkeypatch):
    # Every log window's rates count its training steps only: an evaluation inside the window (here
    # slowed to 1.5 s after steps 1 and 3, which do not log) and compilation are left out.
    from stackft_jax.training import evaluation

    original = evaluation.Evaluator.evaluate

    def slow(self, params, split, **kwargs):
        time.sleep(1.5)
        return original(self, params, split, **kwargs)

    monkeypatch.setattr(evaluation.Evaluator, "evaluate", slow)
    config = tiny.get_config("strategy=finetune_only")
    config.phase2.num_steps, config.eval_every_steps, config.log_every_steps = 4, 1, 2
    results = train.run(config, tmp_path)
    scalars = run_report.train_scalars(tmp_path)
    assert [step for step, _ in scalars["step_seconds"]] == [2, 4]
    assert all(0 < seconds < 1.5 for _, seconds in scalars["step_seconds"])
    for (_, seconds), (_, rate) in zip(scalars["step_seconds"], scalars["examples_per_s"], strict=True):
        assert rate == pytest.approx(2 * 8 / seconds, rel=1e-5)  # two steps of the tiny global batch 8
    for (_, real), (_, padded) in zip(
        scalars["real_tokens_per_s"], scalars["padded_tokens_per_s"], strict=True
    ):
        assert 0 < real < padded
    assert all(value > 0 for _, value in scalars["model_tflops_per_s"])
    assert "mfu" not in scalars  # no bf16 peak for a CPU
    throughput = results["phases"][0]["throughput"]
    assert throughput["device_kind"] == "cpu" and throughput["mfu"] is None
    assert throughput["step_seconds"] == pytest.approx(sum(s for _, s in scalars["step_seconds"]), rel=1e-4)
