"""export: a run's encoder that transformers loads in PyTorch, its head, and predictions from the export."""

import json
import subprocess
import sys
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from stackft_jax.config import spec
from stackft_jax.trained import hf_export, opening
from stackft_jax.training import build

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

REPO = Path(__file__).resolve().parent.parent
FIXTURES = REPO / "tests" / "fixtures"
PAIRS = (["How do I learn Python?", "short"], ["What is the best way to learn Python?", "x y z"])


def _cli(module: str, *args: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", f"stackft_jax.{module}", *args]
    return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600)


def _check_encoder(folder: Path, source: opening.Source) -> None:
    """AutoModel loads `folder` with no missing or unexpected keys and gives stackft_jax's hidden states."""
    model, info = transformers.AutoModel.from_pretrained(folder, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    encoded = tokenizer(*PAIRS, padding=True, return_tensors="pt")
    with torch.no_grad():
        theirs = model.eval()(**encoded, output_hidden_states=True).hidden_states
    loaded = source.load()
    # RoBERTa's and DistilBERT's tokenizers give no token types: their one type is 0.
    token_types = encoded.get("token_type_ids", torch.zeros_like(encoded["input_ids"]))
    ours = nnx.merge(loaded.graphdef, loaded.params).backbone(
        *(jnp.asarray(t.numpy()) for t in (encoded["input_ids"], token_types, encoded["attention_mask"])),
        deterministic=True,
    )
    real = encoded["attention_mask"].numpy()[..., None]
    assert len(ours.hidden_states) == len(theirs)
    for a, b in zip(ours.hidden_states, theirs, strict=True):
        np.testing.assert_allclose(np.asarray(a) * real, b.numpy() * real, atol=1e-4)


@pytest.fixture(scope="module")
def exported(uninterrupted, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("exports") / "tiny"
    proc = _cli("export", f"--workdir={uninterrupted}", f"--out={out}")
    assert proc.returncode == 0, proc.stderr
    assert not [line for line in proc.stderr.splitlines() if " WARNING " in line or "Metadata" in line]
    return out


@pytest.mark.slow
def test_transformers_loads_the_trained_encoder(exported, uninterrupted):
    assert {"config.json", "model.safetensors", "vocab.txt", "head.safetensors", "README.md"} <= {
        p.name for p in exported.iterdir()
    }
    _check_encoder(exported, opening.open_workdir(uninterrupted))


def test_head_config_and_model_card(exported, uninterrupted):
    record = json.loads((exported / opening.HEAD_CONFIG).read_text())
    results = json.loads((uninterrupted / "results.json").read_text())
    assert (
        record["label_names"] == ["not_duplicate", "duplicate"] and record["strategy"] == "stack_and_finetune"
    )
    assert [p["phase"] for p in record["phases"]] == ["phase1", "phase2"] and record["final"] == results[
        "final"
    ]
    assert (
        record["transformers_task_model"] is None and "cls_mlp" in record["transformers_task_model_why_not"]
    )
    card = (exported / "README.md").read_text()
    assert "AutoModel.from_pretrained" in card and f"{results['final']['dev']['accuracy']:.4f}" in card
    assert f'from_pretrained("{exported.name}")' in card and ".tmp-" not in card  # the final name


@pytest.mark.slow
def test_predict_on_the_export_equals_predict_on_the_workdir(exported, uninterrupted, tmp_path):
    out = tmp_path / "dev.jsonl"
    proc = _cli(
        "predict", f"--model={exported}", f"--input={FIXTURES / 'qqp' / 'dev.tsv'}", f"--output={out}"
    )
    assert proc.returncode == 0, proc.stderr
    assert out.read_bytes() == (uninterrupted / "predictions" / "dev.jsonl").read_bytes()


@pytest.mark.slow
def test_export_never_overwrites_unless_asked(exported, uninterrupted):
    before = (exported / "model.safetensors").read_bytes()
    refused = _cli("export", f"--workdir={uninterrupted}", f"--out={exported}")
    assert refused.returncode == 2 and refused.stderr.strip().splitlines() == [
        f"error: --out={exported} exists and is not empty: pass --overwrite to replace it"
    ]
    a_file = exported.parent / "notes.txt"
    a_file.write_text("mine")
    refused = _cli("export", f"--workdir={uninterrupted}", f"--out={a_file}", "--overwrite")
    assert refused.returncode == 2 and refused.stderr.strip().splitlines() == [
        f"error: --out={a_file} is a file: an export is a folder"
    ]
    assert a_file.read_text() == "mine"
    phase1 = _cli(
        "export", f"--workdir={uninterrupted}", f"--out={exported}", "--phase=phase1", "--overwrite"
    )
    assert phase1.returncode == 0, phase1.stderr
    assert (exported / "model.safetensors").read_bytes() != before  # phase 1 left the encoder untrained
    assert not list(exported.parent.glob(f".{exported.name}.*"))  # no temporary folder left
    restored = _cli("export", f"--workdir={uninterrupted}", f"--out={exported}", "--overwrite")
    assert restored.returncode == 0 and (exported / "model.safetensors").read_bytes() == before


@pytest.mark.slow
def test_a_new_run_starts_from_the_exported_encoder(exported, run_cli, tmp_path):
    overrides = [f"--config.model.config_overrides.{k}=0" for k in ("hidden_size", "num_hidden_layers")]
    overrides += [
        f"--config.model.config_overrides.{k}=0" for k in ("num_attention_heads", "intermediate_size")
    ]
    proc = run_cli(
        tmp_path / "run",
        f"--config.model.name_or_path={exported}",
        "--config.model.init=pretrained",
        "--config.data.task=sst2",
        f"--config.data.train_file={FIXTURES / 'sst2' / 'train.tsv'}",
        f"--config.data.dev_file={FIXTURES / 'sst2' / 'train.tsv'}",
        *overrides,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert json.loads((tmp_path / "run" / "results.json").read_text())["task"]["name"] == "sst2"


def _random_source(tmp_path: Path, preset: str, **keys) -> tuple[opening.Source, opening.Loaded]:
    """The tiny config's model, initialised, as a Source/Loaded pair (no training needed for parity)."""
    sys.path.insert(0, str(REPO))
    from configs import tiny

    config = tiny.get_config(preset)
    for key, value in keys.items():
        node = config
        *parents, leaf = key.split(".")
        for parent in parents:
            node = node[parent]
        node[leaf] = value
    run_spec = spec.resolve(config)
    source = opening.Source(tmp_path, run_spec, False, "last", None, {})
    model, bert_config = build.build_model(run_spec, run_spec.task, source.model_dir)
    graphdef, state = nnx.split(model)
    params = nnx.to_pure_dict(state)
    # Non-zero biases, so a bias mapped to the wrong place shows.
    params = __import__("jax").tree.map(
        lambda x: x + 0.01 * np.arange(x.size).reshape(x.shape) / x.size, params
    )
    return source, opening.Loaded(graphdef, params, bert_config, "last")


def test_a_cls_tanh_head_as_wide_as_bert_is_bert_for_sequence_classification(tmp_path):
    source, loaded = _random_source(tmp_path, "", **{"head.cls_mlp.hidden_dim": 32})
    folder = tmp_path / "export"
    folder.mkdir()
    record = hf_export.write(source, loaded, folder)
    assert record["transformers_task_model"] == "BertForSequenceClassification"
    model, info = transformers.AutoModelForSequenceClassification.from_pretrained(
        folder / hf_export.TASK_MODEL_DIR, output_loading_info=True
    )
    assert not info["missing_keys"] and not info["unexpected_keys"]
    assert model.config.id2label == {0: "not_duplicate", 1: "duplicate"}
    encoded = transformers.AutoTokenizer.from_pretrained(folder)(*PAIRS, padding=True, return_tensors="pt")
    with torch.no_grad():
        theirs = model.eval()(**encoded).logits.numpy()
    batch = {k: jnp.asarray(v.numpy()) for k, v in encoded.items()}
    batch["segment_ids"] = batch["token_type_ids"]
    ours = nnx.merge(loaded.graphdef, loaded.params)(batch, deterministic=True)
    np.testing.assert_allclose(np.asarray(ours), theirs, atol=1e-4)


def test_a_linear_word_tagger_is_bert_for_token_classification(tmp_path):
    source, loaded = _random_source(
        tmp_path, "conll", **{"head.name": "token_mlp", "head.token_mlp.hidden_dim": 0}
    )
    folder = tmp_path / "export"
    folder.mkdir()
    assert hf_export.write(source, loaded, folder)["transformers_task_model"] == "BertForTokenClassification"
    model = transformers.AutoModelForTokenClassification.from_pretrained(folder / hf_export.TASK_MODEL_DIR)
    words = ["Peter", "Blackburn", "visited", "Brussels"]
    examples = [source.task.example_from_line(" ".join(words), index=0, where="x:1")]
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    arrays = source.task.encode(tokenizer, examples, max_seq_length=32, options={})
    length = int(arrays["lengths"][0])
    ids = torch.tensor(arrays["input_ids"][:, :length].astype(np.int64))
    with torch.no_grad():
        theirs = model.eval()(input_ids=ids).logits.numpy()[0]
    batch = {
        k: jnp.asarray(v[:, :length] if v.ndim == 2 and v.shape[1] == 32 else v) for k, v in arrays.items()
    }
    batch["attention_mask"] = jnp.ones((1, length), jnp.int32)
    ours = nnx.merge(loaded.graphdef, loaded.params)(batch, deterministic=True).logits
    starts = arrays["word_starts"][0, : len(words)]
    np.testing.assert_allclose(np.asarray(ours)[0, : len(words)], theirs[starts], atol=1e-4)


@pytest.mark.slow
def test_minilm_run_exports_to_transformers(run_cli, tmp_path):
    """The embedded MiniLM (pretrained weights), a few steps of each phase, exported and loaded."""
    proc = run_cli(
        tmp_path / "run",
        "--config.phase1.num_steps=2",
        "--config.phase2.num_steps=2",
        "--config.eval_every_steps=2",
        config="configs/quora.py:demo",
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = tmp_path / "export"
    assert _cli("export", f"--workdir={tmp_path / 'run'}", f"--out={out}").returncode == 0
    _check_encoder(out, opening.open_workdir(tmp_path / "run"))


@pytest.mark.slow
def test_export_never_replaces_a_run_or_a_folder_it_did_not_write(uninterrupted, tmp_path):
    before = {
        p: p.read_bytes() for p in sorted(uninterrupted.rglob("*")) if p.is_file() and "locks" not in p.parts
    }
    run = uninterrupted.resolve()
    for out in (uninterrupted, uninterrupted / "predictions", uninterrupted / "new"):
        where = "is" if out == uninterrupted else "is inside"
        refused = _cli("export", f"--workdir={uninterrupted}", f"--out={out}", "--overwrite")
        assert refused.returncode == 2 and refused.stderr.strip().splitlines() == [
            f"error: --out={out} {where} the workdir of the run {run}; a command never writes into a "
            "run's folder (even with --overwrite): choose a path outside it"
        ]
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "mine.txt").write_text("mine")
    refused = _cli("export", f"--workdir={uninterrupted}", f"--out={notes}", "--overwrite")
    assert refused.returncode == 2 and refused.stderr.strip().splitlines() == [
        f"error: --out={notes} holds files that are no export (no head_config.json); --overwrite "
        "replaces only an earlier export: choose a new folder"
    ]
    assert (notes / "mine.txt").read_text() == "mine"
    after = {
        p: p.read_bytes() for p in sorted(uninterrupted.rglob("*")) if p.is_file() and "locks" not in p.parts
    }
    assert after == before and not (uninterrupted / "new").exists()


def test_an_exported_phase_carries_its_own_scores(uninterrupted, tmp_path):
    results = json.loads((uninterrupted / "results.json").read_text())
    phase1 = opening.open_workdir(uninterrupted, phase="phase1")
    out = hf_export.export(phase1, tmp_path / "phase1")
    record = json.loads((out / opening.HEAD_CONFIG).read_text())
    own = {"dev": results["phases"][0]["boundary"]["dev"]}
    assert record["final"] == record["run"]["final"] == own  # not the run's final (phase 2) scores
    card = (out / "README.md").read_text()
    assert "## Results (the end of phase1 (its boundary evaluation))" in card
    assert f"accuracy {own['dev']['accuracy']:.4f}" in card
    assert hf_export.exported_scores(opening.open_workdir(uninterrupted, params="best"), results)[0] == {
        "dev": results["best"]["dev"]
    }


def test_a_damaged_export_or_an_export_as_workdir_is_one_line(exported, tmp_path):
    import shutil

    from stackft_jax.runtime.cli_errors import DataError, UsageError

    with pytest.raises(
        UsageError, match=rf"^--workdir={exported} is an export, not a run's workdir: pass it as"
    ):
        opening.open_workdir(exported)
    damaged = tmp_path / "damaged"
    shutil.copytree(exported, damaged)
    head = damaged / opening.HEAD_WEIGHTS
    head.write_bytes(head.read_bytes()[: head.stat().st_size // 2])
    with pytest.raises(DataError, match=rf"^{head}: cannot read the head's weights .* damaged or truncated"):
        opening.open_export(damaged).load()
    record = damaged / opening.HEAD_CONFIG
    record.write_text(record.read_text()[:100])
    with pytest.raises(DataError, match=rf"^{record} is damaged \(truncated: .*\); export the run again"):
        opening.open_export(damaged)
    for size in ("-3", "0"):
        proc = _cli(
            "predict", f"--model={exported}", "--input=-", "--output=-", f"--per_device_batch_size={size}"
        )
        assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [
            f"error: --per_device_batch_size={size}: give a positive number of examples (or leave it out for "
            "the run's eval batch)"
        ]
