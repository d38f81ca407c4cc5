"""config.nonfinite_guard: both guards make the same finite steps and leave the state as it was from a
non-finite step on; a record written before the key reads as the guard it ran (select)."""

import json
import re
from pathlib import Path

import jax
import numpy as np
import pytest

from configs import tiny
from stackft_jax.config import config_cli, spec
from stackft_jax.runtime import sharding
from stackft_jax.runtime.cli_errors import ConfigError
from stackft_jax.training import steps, workdirs
from tests.test_grad_accum import _phase_step, _setup

REPO = Path(__file__).resolve().parent.parent
GUARDS = spec.NONFINITE_GUARDS


def _steps(setup, guard: str, batches: list[dict]) -> list[steps.TrainState]:
    """The host copies of the initial state and of the state after each of `batches`."""
    phase_step, mesh = _phase_step(setup, nonfinite_guard=guard)
    state = steps.TrainState(**phase_step.init_state(jax.tree.map(np.copy, setup[3])))
    states = [jax.device_get(state)]
    for batch in batches:
        state, _ = phase_step.train_step(state, sharding.put_batch(batch, mesh))
        states.append(jax.device_get(state))
    return states


def test_both_guards_make_the_same_finite_steps():
    setup = _setup()
    batch = setup[4]
    skip, select = (_steps(setup, guard, [batch] * 3) for guard in GUARDS)
    moved = jax.tree.leaves(
        jax.tree.map(lambda a, b: float(np.abs(a - b).max()), skip[-1].params, skip[0].params)
    )
    assert max(moved) > 1e-4  # the steps moved the parameters (the first step's warmup rate is 0)
    for a, b in zip(skip, select, strict=True):
        jax.tree.map(
            lambda x, y: np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-7),
            (a.params, a.opt_state),
            (b.params, b.opt_state),
        )
        assert int(a.first_nonfinite_step) == int(b.first_nonfinite_step) == -1


@pytest.mark.parametrize("guard", GUARDS)
def test_a_nan_batch_and_every_step_after_it_change_nothing(guard):
    setup = _setup()
    finite = setup[4]
    nan = {**finite, "example_mask": np.where(np.arange(len(finite["labels"])) == 0, np.nan, 1.0)}
    before, after_nan, after_finite = _steps(setup, guard, [nan.copy(), finite])
    for state in (after_nan, after_finite):
        jax.tree.map(
            np.testing.assert_array_equal, (state.params, state.opt_state), (before.params, before.opt_state)
        )
        assert int(state.first_nonfinite_step) == 0
    assert int(after_finite.step) == 2


def test_a_new_config_skips_the_update_and_a_record_without_the_key_reads_as_select(tmp_path):
    assert spec.resolve(tiny.get_config()).nonfinite_guard == "skip_update"
    plain = config_cli.to_plain(tiny.get_config())
    del plain["nonfinite_guard"]
    (tmp_path / "config.json").write_text(json.dumps({"config": plain}))
    for config in (config_cli.load(str(tmp_path / "config.json")), spec.config_from_plain(plain)):
        assert spec.resolve(config, recorded=True).nonfinite_guard == "select"
    # Every committed run reruns with the guard it ran: `select` where it recorded none.
    committed = sorted((REPO / "docs" / "grids").glob("*/runs/*/config.json"))
    recorded = {
        path: json.loads(path.read_text())["config"].get("nonfinite_guard") for path in committed[::25]
    }
    assert None in recorded.values()
    for path, guard in recorded.items():
        resolved = spec.resolve(config_cli.recorded_run_config(path), recorded=True).nonfinite_guard
        assert resolved == (guard or "select"), path


def test_an_unknown_guard_is_one_line_naming_the_key_and_the_choices():
    config = tiny.get_config("nonfinite_guard=where")
    with pytest.raises(ConfigError, match=r"^config\.nonfinite_guard='where': choose skip_update or select$"):
        spec.resolve(config)


def test_resuming_with_another_guard_is_refused_and_a_record_without_the_key_resumes_as_select(tmp_path):
    def bind(items: str = "") -> None:
        run_spec = spec.resolve(tiny.get_config(items or None))
        workdirs.bind_run(tmp_path, run_spec, global_batch_size=8, allow_change=False)

    bind()
    (tmp_path / "metrics.jsonl").write_text("")  # the run has started (a workdir without progress rebinds)
    with pytest.raises(
        workdirs.ConfigMismatch,
        match=re.escape("config.nonfinite_guard: 'skip_update' recorded, 'select' now"),
    ):
        bind("nonfinite_guard=select")
    record = json.loads((tmp_path / workdirs.CONFIG_FILE).read_text())
    del record["config"]["nonfinite_guard"]
    (tmp_path / workdirs.CONFIG_FILE).write_text(json.dumps(record))
    with pytest.raises(workdirs.ConfigMismatch, match="config.nonfinite_guard: 'select' recorded"):
        bind()
    bind("nonfinite_guard=select")
