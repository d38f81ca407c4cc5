"""spec.resolve: one resolved run spec, and the binding form that only what a run uses enters."""

import json

import pytest

from configs import common, tiny
from stackft_jax import config_cli, phases, spec


def test_the_alias_defaults_are_the_config_defaults():
    config = common.get_config()
    assert {alias: config[alias].to_dict() for alias in phases.ALIAS_DEFAULTS} == phases.ALIAS_DEFAULTS


def test_the_spec_holds_the_chosen_head_and_the_alias_blocks_its_preset_reads():
    run = spec.resolve(tiny.get_config("strategy=finetune_only"))
    assert set(run.head.keys()) == {"name", "dropout_rate", "cls_mlp"}
    assert set(run.aliases.keys()) == {"phase2"}
    assert [p.name for p in run.plan(10, 2)] == ["finetune"]
    form = spec.binding_form(run)["config"]
    assert "phase1" not in form and "unfreezing" not in form and "log_every_steps" not in form
    assert set(form["head"]) == {"name", "dropout_rate", "cls_mlp"}
    written = spec.resolve(tiny.get_config("three_phases"))
    assert written.aliases.to_dict() == {} and [b.name for b, _ in written.phase_blocks(2)] == [
        "head",
        "top",
        "all",
    ]


def test_a_recorded_config_reads_against_todays_keys():
    config = tiny.get_config()
    recorded = json.loads(json.dumps(config_cli.to_plain(config)))
    del recorded["head"]["esim"], recorded["boundary_train_examples"]
    recorded["removed_since"] = 1
    current = spec.resolve(config)
    assert spec.recorded_binding_form(recorded, current.raw) == spec.binding_form(current)
    recorded["seed"] = 3
    assert spec.recorded_binding_form(recorded, current.raw)["config"]["seed"] == 3


def test_a_recorded_written_schedule_with_alias_keys_still_resolves():
    """Older versions ignored phase1.* beside config.phases; their records resolve, new configs do not."""
    config = tiny.get_config("three_phases")
    config.phase1.num_steps = 6
    with pytest.raises(config_cli.ConfigError, match="phases is written, and config.phase1.num_steps=6"):
        spec.resolve(config)
    assert [b.name for b, _ in spec.resolve(config, recorded=True).phase_blocks(2)] == ["head", "top", "all"]
