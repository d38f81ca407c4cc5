"""spec.resolve: one resolved run spec, and the binding form that only what a run uses enters."""

import json

import pytest

from configs import tiny
from stackft_jax.config import config_cli, defaults, phases, spec
from stackft_jax.runtime.cli_errors import ConfigError


def test_the_phase_keys_are_written_once_and_every_block_reads_them():
    """Phase's fields are the keys of a written block, the alias blocks carry a subset of them with
    Phase's comments, and --show_config prints those comments for every form."""
    config = defaults.get_config()
    written = phases.block("x", rules=[(".*", "all")], learning_rates={"all": 1.0})
    assert set(written.keys()) == set(phases.BLOCK_KEYS)
    for alias, declared in phases.ALIASES.items():
        assert config[alias].to_dict() == declared.config().to_dict()
        assert set(declared.phase_keys) <= set(phases.OPTION_KEYS)
    comments = config_cli.key_comments()
    for key, field in phases.BLOCK_KEYS.items():
        assert comments[f"phases.{key}"] == field.metadata["doc"]
    assert comments["phase1.num_steps"] == comments["phases.num_steps"] == "step budget; 0: use num_epochs"
    assert comments["phase2.backbone_learning_rate"] == "peak learning rate of BERT"


def test_the_spec_holds_the_chosen_head_and_the_alias_blocks_its_preset_reads():
    run = spec.resolve(tiny.get_config("strategy=finetune_only"))
    assert set(run.head.keys()) == {"name", "dropout_rate", "cls_mlp"}
    assert [p.name for p in run.plan(10)] == ["finetune"]
    assert (run.encoder.num_layers, run.encoder.has_pooler) == (2, True)  # tiny's override of MiniLM's 6
    form = spec.binding_form(run)["config"]
    assert "phase1" not in form and "unfreezing" not in form and "log_every_steps" not in form
    assert set(form["head"]) == {"name", "dropout_rate", "cls_mlp"}
    written = spec.resolve(tiny.get_config("three_phases"))
    assert written.written and [p.name for p in written.phases] == ["head", "top", "all"]


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
    with pytest.raises(ConfigError, match="phases is written, and config.phase1.num_steps=6"):
        spec.resolve(config)
    assert [p.name for p in spec.resolve(config, recorded=True).phases] == ["head", "top", "all"]


@pytest.mark.parametrize(
    "strategy, key, binds",
    [
        ("stack_only", "phase1.gap_eval_examples", False),  # stack-only has no gap rule
        ("stack_and_finetune", "phase1.gap_eval_examples", True),
        ("finetune_only_uniform", "phase2.new_head_learning_rate", False),  # one rate for all
        ("finetune_only", "phase2.new_head_learning_rate", True),
    ],
)
def test_a_preset_binds_what_its_phases_read(strategy, key, binds):
    """Changing a key the preset reads into no phase leaves the binding form (and a finished run) alone."""
    before = spec.binding_form(spec.resolve(tiny.get_config(f"strategy={strategy}")))
    after = spec.binding_form(spec.resolve(tiny.get_config(f"strategy={strategy},{key}=123")))
    assert (before != after) == binds
    assert ("phase1" in before["config"]) == strategy.startswith("stack")


def test_a_phase_key_its_phase_ignores_does_not_bind():
    form = spec.binding_form(spec.resolve(tiny.get_config("strategy=stack_only,phase1.num_steps=5")))
    phase1 = form["config"]["phase1"]
    assert "num_epochs" not in phase1 and "gap_eval_examples" not in phase1
    unfreezing = spec.binding_form(spec.resolve(tiny.get_config("strategy=gradual_unfreezing")))["config"]
    assert isinstance(unfreezing["unfreezing"], list) and unfreezing["phase1"]["name"] == "head"


def test_a_record_from_before_the_phase_vocabulary_binds_as_today():
    """Records written before feature_cache_dir became a run option and before adaptation kinds: the
    folder sat in phase1 (or a written phase), and there was no `adaptation` block."""
    for arg in (
        "strategy=stack_and_finetune,phase1.backbone_dropout=false,phase1.feature_cache=true",
        "three_phases",
    ):
        current = spec.resolve(tiny.get_config(arg))
        old = json.loads(json.dumps(current.raw))
        del old["adaptation"], old["feature_cache_dir"], old["phase2"]["adaptation_learning_rate"]
        for block in [old["phase1"], *old["phases"]]:
            block["feature_cache_dir"] = "/shared/features"
            block.pop("adaptation", None)
        assert spec.recorded_binding_form(old, current.raw) == spec.binding_form(current)
        assert spec.config_from_plain(old).feature_cache_dir == "/shared/features"


@pytest.mark.parametrize("key", spec._POSITIVE)
@pytest.mark.parametrize("value", [0, -1])
def test_counts_that_must_be_positive_are_refused_naming_the_key(key, value):
    config = tiny.get_config()
    config[key] = value
    with pytest.raises(ConfigError, match=rf"^config\.{key} must be positive, got {value}$"):
        spec.resolve(config)
