"""Adaptation kinds as phases of a run (issue 32): the presets lora, lp_lora, bitfit, lp_bitfit and
adapters train end to end on a small random RoBERTa loaded as a pretrained checkpoint, leave every base
weight they do not train bit-identical to the checkpoint's, checkpoint only what they train, and predict;
a written schedule uses a kind in any phase. The model side (parameters, step 0, merging, peft) is
tests/test_adaptation.py."""

import json
import re
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest
from flax import nnx

from configs import tiny
from stackft_jax.config import config_cli, phases, spec
from stackft_jax.models import bert
from stackft_jax.runtime.cli_errors import ConfigError
from stackft_jax.trained import opening, run_params
from stackft_jax.training import build, checkpointing, optim, train
from tests.test_encoder_runs import PRETRAINED, roberta_dir  # noqa: F401 (a fixture)
from tests.test_predict import FIXTURES, REPO, _predict_cli

ADAPTED = ("lora", "lp_lora", "bitfit", "lp_bitfit", "adapters")


def _flat(tree) -> dict[str, np.ndarray]:
    return {optim.path_str(p): np.asarray(v) for p, v in jax.tree_util.tree_leaves_with_path(tree)}


def _config(folder: Path, strategy: str):
    overrides = [a.removeprefix("--config.") for a in PRETRAINED]
    return config_cli.load(
        "configs/tiny.py",
        [
            f"model.name_or_path={folder}",
            *overrides,
            f"strategy={strategy}",
            "phase1.num_steps=3",
            "phase2.num_steps=3",
            "phase2.adaptation_learning_rate=0.01",
            "adaptation.lora.targets=query|value|intermediate",
        ],
    )


@pytest.mark.parametrize("strategy", ADAPTED)
@pytest.mark.slow
def test_each_adapted_preset_trains_only_its_parameters_and_keeps_the_checkpoints_weights(
    strategy,
    roberta_dir,  # noqa: F811 (the fixture)
    tmp_path,
):
    config = _config(roberta_dir, strategy)
    results = train.run(config, tmp_path)
    kind = phases.PRESET_KINDS[strategy]
    assert [p["phase"] for p in results["phases"]] == (
        ["head", kind] if strategy.startswith("lp_") else [kind]
    )
    run_spec = spec.resolve(config)
    pretrained, _ = bert.convert_hf_weights(
        bert.load_hf_weights(roberta_dir), bert.BertConfig.from_pretrained(roberta_dir)
    )
    pretrained = _flat(pretrained)
    final = _flat(run_params.phase_params(tmp_path)["backbone"])
    initial = _flat(run_params._initial_params(run_spec)["backbone"])
    trained = [
        name for name in final if re.fullmatch(r"|".join(_patterns(run_spec, kind)), f"backbone/{name}")
    ]
    assert trained, "the kind trains some backbone parameters"
    changed = {name for name, value in final.items() if not np.array_equal(value, initial[name])}
    # What moved is the kind's (all of it but leaves no loss reaches, e.g. the unused pooler's bias).
    assert changed <= set(trained) and len(changed) >= len(trained) - 1, sorted(set(trained) - changed)
    for name, value in final.items():
        if name in pretrained and name not in trained:
            np.testing.assert_array_equal(value, pretrained[name], err_msg=f"{name} moved")  # bit for bit
    # The phase's record counts what it trained; its boundary checkpoint holds only that and the head.
    record = results["phases"][-1]
    head = sum(v.size for v in jax.tree.leaves(run_params.phase_params(tmp_path)["head"]))
    backbone_trained = sum(final[name].size for name in trained)
    assert record["parameters"]["trained"] == backbone_trained + head
    part, _, _ = checkpointing.read_phase_end(tmp_path, record["phase"])
    assert sum(v.size for v in jax.tree.leaves(part)) == backbone_trained + head


def _patterns(run_spec, kind: str) -> list[str]:
    phase = next(p for p in run_spec.phases if p.adaptation == kind)
    return [pattern for pattern, group in phase.rules if group == phases.ADAPTATION]


@pytest.mark.slow  # trains a run through the command line, then predicts in a second process
@pytest.mark.parametrize("strategy", ["lora", "bitfit", "adapters"])
def test_predict_reproduces_an_adapted_runs_predictions(strategy, tmp_path, run_cli):
    workdir = tmp_path / "run"
    proc = run_cli(workdir, f"--config.strategy={strategy}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = tmp_path / "dev.jsonl"
    proc = _predict_cli(f"--workdir={workdir}", f"--input={FIXTURES / 'qqp' / 'dev.tsv'}", f"--output={out}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert out.read_bytes() == (workdir / "predictions" / "dev.jsonl").read_bytes()


def test_a_written_schedule_uses_a_kind_in_any_phase():
    config = tiny.get_config("three_phases")
    config.phases[1].adaptation = "bitfit"
    config.phases[1].learning_rates.adaptation = 1e-3
    run = spec.resolve(config)
    assert run.phases[1].rules[0] == (r"backbone/(?!.*_adapter/).*/bias", phases.ADAPTATION)
    assert run.phases[1].rules[1:] == tuple(tuple(r) for r in config.phases[1].rules)
    assert run.adaptation is None and set(run.adaptation_options) == {"bitfit"}  # BitFit adds no leaves
    config.phases[2].adaptation = "lora"
    config.phases[2].learning_rates.adaptation = 1e-3
    run = spec.resolve(config)
    assert run.adaptation.lora is not None and any("lora_a" in name for name in run.encoder.parameters)
    # A phase that names no kind keeps its own rules; a kind without its rate, or an unknown kind, is refused.
    assert not any(group == phases.ADAPTATION for _, group in run.phases[0].rules)
    config.phases[2].learning_rates = {"all": 5e-4}
    with pytest.raises(ConfigError, match=r"config.phases\[2\] \(all\).learning_rates: .*\['adaptation'\]"):
        spec.resolve(config)
    config = tiny.get_config("three_phases")
    config.phases[1].adaptation = "prefix_tuning"
    with pytest.raises(ConfigError, match=r"config.phases\[1\] \(top\).adaptation='prefix_tuning'"):
        spec.resolve(config)


def test_the_kinds_options_bind_only_runs_that_use_them():
    lora = spec.resolve(tiny.get_config("strategy=lora"))
    assert spec.binding_form(lora)["config"]["adaptation"] == {"lora": dict(lora.adaptation_options["lora"])}
    plain = spec.resolve(tiny.get_config("strategy=finetune_only,adaptation.lora.rank=2"))
    assert "adaptation" not in spec.binding_form(plain)["config"]
    changed = spec.resolve(tiny.get_config("strategy=lora,adaptation.lora.rank=2"))
    assert spec.binding_form(changed) != spec.binding_form(lora)


def test_a_lora_phases_checkpoint_and_adam_state_are_a_small_share_of_full_fine_tuning():
    """On the embedded MiniLM (22.7M parameters): what a phase saves and what Adam holds, by its rules."""
    sizes = {}
    for strategy in ("finetune_only", "lora", "bitfit", "adapters"):
        run_spec = spec.resolve(config_cli.load("configs/quora.py:demo", [f"strategy={strategy}"]))
        model, _ = build.build_model(
            run_spec, run_spec.task, bert.resolve_model_dir("embedded:minilm"), run_spec.adaptation
        )
        params = nnx.to_pure_dict(nnx.state(model))
        phase = run_spec.plan(100)[-1]
        tx, labels = optim.phase_optimizer(params, phase, max_grad_norm=1.0)
        saved = checkpointing.trained_part(params, optim.trainable_mask(labels))
        sizes[strategy] = (
            sum(v.nbytes for v in jax.tree.leaves(saved)),
            optim.optimizer_state_bytes(tx.init(params)),
        )
    full_checkpoint, full_adam = sizes["finetune_only"]
    for strategy in ("lora", "bitfit", "adapters"):
        checkpoint, adam = sizes[strategy]
        assert checkpoint < 0.1 * full_checkpoint and adam < 0.1 * full_adam, (strategy, sizes)


def _softmax(logits: np.ndarray) -> np.ndarray:
    e = np.exp(logits - logits.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


@pytest.mark.slow
def test_a_lora_runs_export_and_peft_adapter_give_predicts_probabilities(
    roberta_dir,  # noqa: F811 (the fixture)
    tmp_path,
    run_cli,
):
    """Trained LoRA on a RoBERTa checkpoint: plain transformers loads the merged export, peft loads the
    adapter onto the checkpoint; both give the predict command's probabilities on the held-out pairs."""
    import csv

    import peft
    import torch
    import transformers

    workdir, out = tmp_path / "run", tmp_path / "export"
    args = [f"--config.model.name_or_path={roberta_dir}", *PRETRAINED, "--config.strategy=lora"]
    args += ["--config.head.cls_mlp.hidden_dim=32", "--config.phase2.adaptation_learning_rate=0.05"]
    proc = run_cli(workdir, *args, "--config.adaptation.lora.targets=.*", "--config.phase2.num_steps=12")
    assert proc.returncode == 0, proc.stderr[-3000:]
    proc = subprocess.run(
        [sys.executable, "-m", "stackft_jax.export", f"--workdir={workdir}", f"--out={out}"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    exported = json.loads((out / opening.HEAD_CONFIG).read_text())
    assert exported["peft_adapter"]["base_model"] == str(roberta_dir)  # the base weights are untouched
    predicted = [json.loads(line)["probabilities"] for line in (workdir / "predictions" / "dev.jsonl").open()]
    with (FIXTURES / "qqp" / "dev.tsv").open() as f:
        rows = list(csv.DictReader(f, delimiter="\t"))
    tokenizer = transformers.AutoTokenizer.from_pretrained(out)
    encoded = tokenizer(
        [r["question1"] for r in rows],
        [r["question2"] for r in rows],
        padding=True,
        truncation=True,
        max_length=32,
        return_tensors="pt",
    )
    task_model = transformers.AutoModelForSequenceClassification.from_pretrained(
        out / "transformers_task_model"
    )
    base = transformers.AutoModel.from_pretrained(roberta_dir)
    with_adapter = peft.PeftModel.from_pretrained(base, out / "peft_adapter").eval()
    with torch.no_grad():
        merged = task_model.eval()(**encoded).logits.numpy()
        hidden = with_adapter(**encoded).last_hidden_state
        adapted = task_model.classifier(hidden).numpy()  # RoBERTa's head reads the first token itself
    # The LoRA update moved the model (else both checks would pass on the base checkpoint).
    plain = transformers.AutoModel.from_pretrained(roberta_dir).eval()
    with torch.no_grad():
        unadapted = task_model.classifier(plain(**encoded).last_hidden_state).numpy()
    assert np.abs(_softmax(unadapted) - np.asarray(predicted)).max() > 1e-3
    np.testing.assert_allclose(_softmax(merged), predicted, atol=1e-4)
    np.testing.assert_allclose(_softmax(adapted), predicted, atol=1e-4)
