"""Strategies as lists of phases: the presets' expansions, schedules written in a config, their
validation, gradual unfreezing, LP-FT, and what each frozen-backbone phase's boundary records."""

import dataclasses
import json
import signal
from pathlib import Path

import jax
import numpy as np
import optax
import pytest
from flax import nnx

from configs import tiny
from stackft_jax.config import config_cli, phases, spec
from stackft_jax.config.phases import Phase, StopRule
from stackft_jax.data import tasks
from stackft_jax.models import bert
from stackft_jax.runtime.cli_errors import ConfigError
from stackft_jax.trained import run_params
from stackft_jax.training import build, calibration, checkpointing, optim, train
from tests import encoders

FROZEN_BACKBONE = (("backbone/.*", "frozen"), ("head/.*", "head"))
EVERYTHING = (("backbone/.*", "backbone"), ("head/.*", "head"))


def _plan(arg: str) -> list[Phase]:
    # Steps per epoch 10; `source` (where a phase was written) is for error messages only.
    return [dataclasses.replace(p, source="") for p in spec.resolve(tiny.get_config(arg)).plan(10)]


def _as_run(phase: Phase) -> tuple:
    """What the steps read of a phase."""
    return (
        phase.name,
        phase.rules,
        phase.learning_rates,
        phase.num_steps,
        phase.warmup_steps,
        phase.schedule,
        phase.weight_decay,
        phase.stop,
        phase.gap_eval_examples,
    )


def test_the_three_named_strategies_expand_to_the_phases_they_always_had():
    finetune = (
        "finetune",
        EVERYTHING,
        {"backbone": 1e-3, "head": 1e-3},
        6,
        1,
        "warmup_linear",
        0.01,
        StopRule(),
        0,
    )
    assert [_as_run(p) for p in _plan("strategy=finetune_only")] == [finetune]
    stack = ("stack", FROZEN_BACKBONE, {"head": 1e-3}, 6, 0, "constant", 0.01, StopRule(), 0)
    assert [_as_run(p) for p in _plan("strategy=stack_only")] == [stack]
    phase1 = ("phase1", FROZEN_BACKBONE, {"head": 1e-3}, 6, 0, "constant", 0.01, StopRule(1.0), 16)
    assert [_as_run(p) for p in _plan("strategy=stack_and_finetune")] == [phase1, ("phase2", *finetune[1:])]
    # Their keys still reach them: budgets in epochs, patience, the feature cache, discriminative rates.
    cached, tuned = _plan(
        "phase1.num_steps=0,phase1.num_epochs=2.5,phase1.patience_evals=2,phase1.backbone_dropout=False,"
        "phase1.feature_cache=True,phase2.layerwise_lr_decay=0.5,phase2.head_learning_rate=0.01"
    )
    assert (cached.num_steps, cached.stop, cached.feature_cache) == (25, StopRule(1.0, 2), True)
    assert tuned.rules == (
        ("backbone/layers/0/.*", "backbone_layer0"),
        ("backbone/layers/1/.*", "backbone_layer1"),
        ("backbone/embeddings/.*", "backbone_embeddings"),
        ("backbone/.*", "backbone"),
        ("head/.*", "head"),
    )
    assert tuned.learning_rates == {
        "backbone_layer0": 1e-3 * 0.5**2,
        "backbone_layer1": 1e-3 * 0.5,
        "backbone_embeddings": 1e-3 * 0.5**3,
        "backbone": 1e-3,
        "head": 0.01,
    }


def test_gradual_unfreezing_unfreezes_top_down_with_discriminative_rates():
    plan = _plan("strategy=gradual_unfreezing,unfreezing.num_steps=2,unfreezing.layerwise_lr_decay=0.5")
    assert [(p.name, p.num_steps) for p in plan] == [
        ("head", 6),
        ("unfreeze_layer1", 2),
        ("unfreeze_layer0", 2),
        ("unfreeze_embeddings", 6),  # the last phase is phase2's budget and schedule
    ]
    assert plan[0].rules == FROZEN_BACKBONE and plan[0].stop == StopRule(1.0)  # phase1's, gap rule kept
    rates = {
        "backbone": 1e-3,
        "backbone_layer1": 5e-4,
        "backbone_layer0": 2.5e-4,
        "backbone_embeddings": 1.25e-4,
    }
    for phase, trained in zip(plan[1:], (2, 3, 4), strict=True):
        groups = list(rates)[:trained]
        assert phase.learning_rates == {**{g: rates[g] for g in groups}, "head": 1e-3}
        frozen = [group for _, group in phase.rules if group == "frozen"]
        assert frozen == ([] if phase.name == "unfreeze_embeddings" else ["frozen"])
    assert (plan[-1].schedule, plan[-1].warmup_steps) == ("warmup_linear", 1)
    two_at_a_time = _plan("strategy=gradual_unfreezing,unfreezing.layers_per_phase=2,unfreezing.num_steps=2")
    assert [p.name for p in two_at_a_time] == ["head", "unfreeze_layer0", "unfreeze_embeddings"]


def test_written_phases_and_command_line_overrides_by_index():
    config = config_cli.load(
        "configs/tiny.py:three_phases", ["phases.1.num_steps=3", "phases.2.learning_rates.all=1e-4"]
    )
    plan = spec.resolve(config).plan(10)
    assert [(p.name, p.num_steps) for p in plan] == [("head", 4), ("top", 3), ("all", 4)]
    assert plan[2].learning_rates == {"all": 1e-4} and plan[0].stop == StopRule(1.0)
    assert plan[1].source == "config.phases[1] (top)"
    assert "phases.1.learning_rates.top" in set(config_cli.flat_keys(config))
    with pytest.raises(ConfigError, match="'phases.3.num_steps' does not exist"):
        config_cli.load("configs/tiny.py:three_phases", ["phases.3.num_steps=3"])
    with pytest.raises(ConfigError, match="holds a list: set it in a config file"):
        config_cli.load("configs/tiny.py:three_phases", ["phases.0.rules=x"])
    # The plain form every results.json and config.json holds (tuples as lists, blocks as dicts).
    plain = config_cli.to_plain(config)
    assert plain["phases"][0]["rules"] == [["backbone/.*", "frozen"], ["head/.*", "head"]]
    assert json.loads(json.dumps(plain)) == plain


def _written(*blocks: dict, strategy: str = "mine"):
    config = tiny.get_config()
    config.strategy = strategy
    phases.clear_aliases(config)  # tiny's phase1.*/phase2.* do not apply to a written schedule
    config.phases = [phases.block(**b) for b in blocks]
    return config


HEAD = {"name": "head", "rules": FROZEN_BACKBONE, "learning_rates": {"head": 1e-3}, "num_steps": 2}
ALL = {"name": "all", "rules": [(".*", "all")], "learning_rates": {"all": 1e-4}, "num_steps": 2}


@pytest.mark.parametrize(
    ("second", "message"),
    [
        (
            {**ALL, "learning_rates": {}},
            r"config.phases\[1\] \(all\).learning_rates: its rules' groups \['all'\]",
        ),
        ({**ALL, "learning_rates": {"all": 1e-4, "other": 1e-3}}, r"\['other'\] name no trained group"),
        ({**ALL, "rules": [(".*", "frozen")], "learning_rates": {}}, "every group is frozen"),
        ({**ALL, "rules": [("(", "all")]}, r"rules\[0\]: '\(' is not a regular expression"),
        ({**ALL, "schedule": "cosine"}, r"config.phases\[1\] \(all\).schedule='cosine'"),
        ({**ALL, "num_steps": 0, "num_epochs": 0.0}, "num_steps and .* are both 0"),
        # Negative budgets and counts trained nothing (or stopped nothing) without a word before.
        ({**ALL, "num_steps": -5}, r"config.phases\[1\] \(all\).num_steps=-5: must be 0 or more"),
        ({**ALL, "num_steps": 0, "num_epochs": -1.0}, r"\(all\).num_epochs=-1.0: must be 0 or more"),
        ({**ALL, "warmup_steps": -1}, r"\(all\).warmup_steps=-1: must be 0 or more"),
        ({**ALL, "weight_decay": -0.01}, r"\(all\).weight_decay=-0.01: must be 0 or more"),
        ({**ALL, "patience_evals": -2}, r"\(all\).patience_evals=-2: must be 0 or more"),
        ({**ALL, "warmup_ratio": 1.5}, r"\(all\).warmup_ratio=1.5: a fraction of the budget"),
        ({**ALL, "name": "head"}, r"phase names \['head'\] repeat"),
        ({**ALL, "name": "best"}, r"config.phases\[1\].name='best'"),
        ({**ALL, "name": "phase1_end"}, r"config.phases\[1\].name='phase1_end'"),
        (
            {**ALL, "feature_cache": True, "backbone_dropout": False},
            r"config.phases\[1\] \(all\): feature_cache=True, but its rules train backbone parameters",
        ),
    ],
)
def test_invalid_written_phases_fail_before_any_work_naming_the_phase_and_key(second, message):
    config = _written(HEAD, second)
    with pytest.raises(ConfigError, match=message):
        spec.resolve(config)
        spec.resolve(config).plan(10)


@pytest.mark.parametrize("key", phases.NON_NEGATIVE_KEYS)
def test_every_count_or_amount_key_refuses_a_negative_value(key):
    with pytest.raises(ConfigError, match=rf"config.phases\[1\] \(all\).{key}=-1(\.0)?: must be 0 or more"):
        spec.resolve(_written(HEAD, {**ALL, key: -1}))


def test_written_phases_need_their_own_name_and_known_keys():
    with pytest.raises(ConfigError, match="names a preset: give the schedule its own name"):
        spec.resolve(_written(HEAD, ALL, strategy="stack_and_finetune"))
    with pytest.raises(ConfigError, match=r"unknown keys \['num_step'\]"):
        phases.block("x", rules=[], learning_rates={}, num_step=3)
    with pytest.raises(ConfigError, match="config.strategy='tune_everything'"):
        spec.resolve(tiny.get_config("strategy=tune_everything"))


def _param_names(config) -> tuple[str, ...]:
    run = spec.resolve(config)  # with the parameters its adaptation kind adds (LoRA, adapters)
    model, _ = build.build_model(
        run, run.task, bert.resolve_model_dir(config.model.name_or_path), run.adaptation
    )
    params = nnx.to_pure_dict(nnx.state(model))
    return tuple(optim.path_str(path) for path, _ in jax.tree_util.tree_leaves_with_path(params))


def test_rules_are_checked_against_the_parameters_before_any_phase_trains(tmp_path):
    names = _param_names(tiny.get_config())
    nowhere = {
        **ALL,
        "rules": [("backbone/layers/9/.*", "deep"), (".*", "all")],
        "learning_rates": {"deep": 1, "all": 1},
    }
    config = _written(HEAD, nowhere)
    with pytest.raises(
        ConfigError,
        match=r"config.phases\[1\] \(all\).rules\[0\]=\('backbone/layers/9/.\*', 'deep'\) matches no",
    ):
        phases.check_rules(spec.resolve(config).plan(10), names)
    shadowed = {**ALL, "rules": [(".*", "all"), ("head/.*", "head")], "learning_rates": {"all": 1, "head": 1}}
    with pytest.raises(
        ConfigError, match=r"rules\[1\].* matches no parameter that an earlier rule did not take"
    ):
        phases.check_rules(spec.resolve(_written(HEAD, shadowed)).plan(10), names)
    partial = {**ALL, "rules": [("head/.*", "all")]}
    with pytest.raises(ConfigError, match=r"\(all\).rules: parameter 'backbone/.*' matches no rule"):
        phases.check_rules(spec.resolve(_written(HEAD, partial)).plan(10), names)
    # A cached phase whose regexes look frozen but label a backbone parameter trainable.
    sneaky = {**HEAD, "rules": [("head/.*|backbone/pooler/.*", "head"), ("backbone/.*", "frozen")]}
    sneaky.update(feature_cache=True, backbone_dropout=False)
    with pytest.raises(ConfigError, match=r"feature_cache=True, but its rules train backbone parameters"):
        spec.resolve(_written(sneaky, ALL))
    # In a run: refused before the first phase starts, nothing trained or saved.
    with pytest.raises(ConfigError, match="matches no parameter"):
        train.run(config, tmp_path)
    assert not (tmp_path / "checkpoints").exists() and not (tmp_path / "results.json").exists()


def _phase_end_params(workdir: Path, name: str):
    return run_params.phase_params(workdir, name)


def _results(workdir: Path) -> dict:
    return json.loads((workdir / "results.json").read_text())


@pytest.fixture(scope="module")
def three_phase_run(tmp_path_factory, run_cli) -> Path:
    workdir = tmp_path_factory.mktemp("three_phases")
    proc = run_cli(workdir, config="configs/tiny.py:three_phases")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return workdir


@pytest.mark.slow
def test_a_written_three_phase_schedule_runs_and_records_its_boundaries(three_phase_run):
    results = _results(three_phase_run)
    assert results["strategy"] == "head_top_all"
    assert [(p["phase"], p["steps"], p["end_global_step"]) for p in results["phases"]] == [
        ("head", 4, 4),
        ("top", 4, 8),
        ("all", 4, 12),
    ]
    # Each boundary holds what its phase trained.
    parts = {name: checkpointing.read_phase_end(three_phase_run, name)[0] for name in ("head", "top", "all")}
    assert set(parts["head"]) == {"head"}
    assert set(parts["top"]["backbone"]) == {"layers", "pooler"} and set(
        parts["top"]["backbone"]["layers"]
    ) == {"1"}
    assert set(parts["all"]["backbone"]) == {"embeddings", "layers", "pooler"}
    head, top, every = (_phase_end_params(three_phase_run, n) for n in ("head", "top", "all"))
    same = jax.tree.map(np.array_equal, head["backbone"], top["backbone"])
    assert not same["layers"][1]["attention"]["query"]["kernel"]
    assert all(jax.tree.leaves(same["layers"][0])) and all(jax.tree.leaves(same["embeddings"]))
    assert not np.array_equal(
        top["backbone"]["embeddings"]["word_embeddings"]["embedding"],
        every["backbone"]["embeddings"]["word_embeddings"]["embedding"],
    )


@pytest.mark.slow
def test_a_written_schedule_resumes_after_a_kill_in_its_second_phase(three_phase_run, tmp_path, run_cli):
    config = "configs/tiny.py:three_phases"
    assert run_cli(tmp_path, config=config, kill_at="top:3").returncode == -signal.SIGKILL
    assert checkpointing.phase_end_path(tmp_path, "head").is_dir()
    assert not checkpointing.phase_end_path(tmp_path, "top").exists()
    proc = run_cli(tmp_path, config=config)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "head already finished" in proc.stderr and "resumed top at step 2" in proc.stderr
    a, b = _results(three_phase_run), _results(tmp_path)
    assert a["final"] == b["final"] and a["phases"][0]["boundary"] == b["phases"][0]["boundary"]
    assert [p["end_global_step"] for p in a["phases"]] == [p["end_global_step"] for p in b["phases"]]
    jax.tree.map(
        np.testing.assert_array_equal,
        _phase_end_params(three_phase_run, "all"),
        _phase_end_params(tmp_path, "all"),
    )


@pytest.mark.slow
def test_gradual_unfreezing_leaves_still_frozen_layers_bit_identical_at_every_boundary(tmp_path):
    config = tiny.get_config(
        "strategy=gradual_unfreezing,phase1.num_steps=2,unfreezing.num_steps=2,phase2.num_steps=2,eval_every_steps=2"
    )
    results = train.run(config, tmp_path)
    names = ["head", "unfreeze_layer1", "unfreeze_layer0", "unfreeze_embeddings"]
    assert [p["phase"] for p in results["phases"]] == names
    task = tasks.get_task(config.data.task).configure(config.data)
    model, _ = build.build_model(config, task, bert.resolve_model_dir(config.model.name_or_path))
    initial = nnx.to_pure_dict(nnx.state(model))["backbone"]
    # Layer groups from the top, in the order they unfreeze.
    units = [("pooler", "layers/1"), ("layers/0",), ("embeddings",)]

    def subtree(tree, path):
        for part in path.split("/"):
            tree = tree[part] if part in tree else tree[int(part)]  # nnx keys layers by int
        return tree

    for trained_units, name in enumerate(names):
        # Each boundary stores the units unfrozen so far (the rest are the initial ones, which every phase
        # end checks against its start's fingerprint), and they differ from their initial values.
        stored = checkpointing.read_phase_end(tmp_path, name)[0].get("backbone", {})
        stored_paths = [optim.path_str(path) for path, _ in jax.tree_util.tree_flatten_with_path(stored)[0]]
        for k, unit in enumerate(units):
            for path in unit:
                assert any(p.startswith(path + "/") for p in stored_paths) == (k < trained_units), (
                    name,
                    path,
                )
        backbone = _phase_end_params(tmp_path, name)["backbone"]
        for k, unit in enumerate(units):
            for path in unit:
                equal = jax.tree.leaves(
                    jax.tree.map(np.array_equal, subtree(backbone, path), subtree(initial, path))
                )
                if k < trained_units:
                    assert not all(equal), f"{path} should have trained by the end of {name}"
                else:
                    assert all(equal), f"{path} changed by the end of {name}, while frozen"
    assert "boundary" in results["phases"][0] and all("boundary" not in p for p in results["phases"][1:])


@pytest.mark.slow
def test_lp_ft_needs_a_linear_head_and_probes_then_fine_tunes(tmp_path):
    with pytest.raises(ConfigError, match="lp_ft trains a linear probe first.*'cls_mlp' is not linear"):
        spec.resolve(tiny.get_config("strategy=lp_ft"))
    config = tiny.get_config("strategy=lp_ft,head=linear,head.linear.pooling=mean")
    results = train.run(config, tmp_path)
    probe, finetune = results["phases"]
    assert (probe["phase"], finetune["phase"]) == ("linear_probe", "finetune")
    assert probe["stop_reason"].startswith("step budget") and "boundary" not in finetune
    head = _phase_end_params(tmp_path, "linear_probe")["head"]
    assert set(head) == {"net"} and set(head["net"]) == {"output"}  # one dense layer, no scalar mix
    assert probe["boundary"]["head_param_norm"] == pytest.approx(float(optax.tree.norm(head)), rel=1e-6)


@pytest.mark.slow
def test_boundary_of_a_frozen_backbone_phase(three_phase_run):
    head, top, _ = _results(three_phase_run)["phases"]
    boundary = head["boundary"]
    assert "boundary" not in top  # the top layer trains: not a frozen-backbone phase
    params = _phase_end_params(three_phase_run, "head")
    assert boundary["head_param_norm"] == pytest.approx(float(optax.tree.norm(params["head"])), rel=1e-6)
    assert 0.0 <= boundary["dev_ece"] <= 1.0
    assert boundary["train_examples"] == 16  # the phase's gap_eval_examples
    gap = boundary["train_subset"]["accuracy"] - boundary["dev"]["accuracy"]
    assert boundary["train_dev_gap_accuracy"] == pytest.approx(gap)
    # The phase's closing dev evaluation, not another one, and the same in metrics.jsonl.
    records = [json.loads(line) for line in (three_phase_run / "metrics.jsonl").read_text().splitlines()]
    last_dev = [r for r in records if r.get("split") == "dev" and r["phase"] == "head"][-1]
    assert boundary["dev"]["accuracy"] == last_dev["accuracy"]
    (logged,) = [r for r in records if r.get("split") == "boundary"]
    assert (logged["phase"], logged["step"], logged["head_param_norm"]) == (
        "head",
        4,
        boundary["head_param_norm"],
    )


@pytest.mark.slow
def test_temperature_scaling_of_the_final_model(tmp_path):
    config = tiny.get_config("strategy=finetune_only,calibration.temperature=true")
    results = train.run(config, tmp_path)
    report = results["calibration"]
    assert report["temperature"] > 0 and set(report) == {"temperature", "num_bins", "dev"}
    dev = report["dev"]
    assert dev["nll_after"] <= dev["nll_before"] + 1e-9  # fitted to minimise exactly this
    records = [json.loads(line) for line in (tmp_path / "predictions" / "dev.jsonl").read_text().splitlines()]
    probabilities = np.array([r["probabilities"] for r in records])
    labels = np.array([r["label"] for r in records])
    assert dev["ece_before"] == pytest.approx(
        calibration.expected_calibration_error(probabilities, labels), abs=1e-6
    )
    with pytest.raises(ConfigError, match="calibration.temperature=True scales class probabilities"):
        spec.resolve(tiny.get_config("calibration.temperature=true,data.task=stsb"))


@pytest.mark.parametrize(
    ("settings", "kill_at", "last_phase"),
    [
        (
            "strategy=gradual_unfreezing,phase1.num_steps=2,unfreezing.num_steps=3,phase2.num_steps=2",
            "unfreeze_layer0:3",
            "unfreeze_embeddings",
        ),
        ("strategy=lp_ft,head=linear,phase1.num_steps=3,phase2.num_steps=3", "finetune:3", "finetune"),
    ],
)
@pytest.mark.slow
def test_new_presets_resume_bit_identically_after_a_kill(settings, kill_at, last_phase, tmp_path, run_cli):
    config = f"configs/tiny.py:{settings}"
    proc = run_cli(tmp_path / "whole", config=config)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert run_cli(tmp_path / "killed", config=config, kill_at=kill_at).returncode == -signal.SIGKILL
    proc = run_cli(tmp_path / "killed", config=config)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert f"resumed {kill_at.split(':')[0]} at step 2" in proc.stderr
    a, b = _results(tmp_path / "whole"), _results(tmp_path / "killed")
    assert a["final"] == b["final"]
    assert [(p["phase"], p["end_global_step"]) for p in a["phases"]] == [
        (p["phase"], p["end_global_step"]) for p in b["phases"]
    ]
    jax.tree.map(
        np.testing.assert_array_equal,
        _phase_end_params(tmp_path / "whole", last_phase),
        _phase_end_params(tmp_path / "killed", last_phase),
    )


@pytest.mark.parametrize("family", encoders.FAMILIES)
def test_every_preset_addresses_every_family_by_the_same_parameter_paths(family, tmp_path):
    """backbone/embeddings, backbone/layers/<i> and (BERT, RoBERTa, XLM-R only) backbone/pooler, whatever
    the family's own checkpoint names; every preset's rules, discriminative rates included, label them."""
    encoders.random_encoder(family, **encoders.SMALL).save_pretrained(tmp_path)
    config = tiny.get_config()
    config.model.name_or_path = str(tmp_path)
    names = [n for n in _param_names(config) if "lora_" not in n and "_adapter/" not in n]
    has_pooler = bert.FAMILIES[family].has_pooler
    backbone = [name.split("/")[1:] for name in names if name.startswith("backbone/")]
    units = {"/".join(parts[:2]) if parts[0] == "layers" else parts[0] for parts in backbone}
    assert units == {"embeddings", "layers/0", "layers/1"} | ({"pooler"} if has_pooler else set())
    for strategy in phases.STRATEGIES:
        for decay in (1.0, 0.5):
            config.strategy = strategy
            config.head.name = "linear" if strategy == "lp_ft" else "cls_mlp"  # a linear probe first
            config.phase2.layerwise_lr_decay = decay
            config.unfreezing.layerwise_lr_decay = decay
            plan = spec.resolve(config).plan(10)
            phases.check_rules(plan, _param_names(config))
            if strategy == "gradual_unfreezing":
                assert [p.name for p in plan] == [
                    "head",
                    "unfreeze_layer1",
                    "unfreeze_layer0",
                    "unfreeze_embeddings",
                ]
