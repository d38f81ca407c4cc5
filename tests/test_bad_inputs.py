"""Bad input fails before training, naming the file, line or config key."""

import json
import shutil
import warnings

import numpy as np
import pytest

from configs import tiny
from stackft_jax.data import metrics, task_spec, tasks, tokenization
from stackft_jax.models import bert
from stackft_jax.runtime.cli_errors import DataError, UsageError
from stackft_jax.training import train


def test_header_only_dev_file_is_refused_at_load(tmp_path):
    dev = tmp_path / "dev.tsv"
    dev.write_text("id\tqid1\tqid2\tquestion1\tquestion2\tis_duplicate\n")
    with pytest.raises(ValueError, match=r"data.dev_file = '.*dev.tsv': the file holds no examples"):
        task_spec.read_examples(tasks.get_task("qqp"), "dev", dev)
    with pytest.raises(ValueError, match="holds no examples"):
        train.run(tiny.get_config(f"data.dev_file={dev}"), tmp_path / "run")
    assert not list((tmp_path / "run").glob("checkpoints/*/*"))  # failed before the first step


def test_non_utf8_bytes_name_file_and_line(tmp_path):
    train_file = tmp_path / "train.tsv"
    train_file.write_bytes(
        b"id\tqid1\tqid2\tquestion1\tquestion2\tis_duplicate\n"
        b"1\t1\t2\tHow?\tWhat?\t0\n"
        b"2\t3\t4\tCaf\xe9 or tea?\tWhich one?\t1\n"
    )
    with pytest.raises(ValueError, match=r"train.tsv:3: not UTF-8 text \(byte 0xe9 at column 10\)"):
        task_spec.read_examples(tasks.get_task("qqp"), "train", train_file)


def test_max_seq_length_above_the_models_positions(tmp_path):
    with pytest.raises(ValueError, match=r"config.max_seq_length=600 exceeds the 512 tokens the model"):
        train.run(tiny.get_config("max_seq_length=600"), tmp_path)


def test_truncated_weights_file_is_named(tmp_path):
    model_dir = tmp_path / "model"
    shutil.copytree(bert.resolve_model_dir("embedded:minilm"), model_dir)
    weights = model_dir / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 3])
    with pytest.raises(ValueError, match=rf"{weights}: cannot read the weights .* truncated or damaged"):
        bert.load_hf_weights(model_dir)


def test_f1_of_a_dev_set_without_positives_is_undefined():
    labels = np.zeros(5, np.int64)
    with pytest.warns(UserWarning, match="F1 is undefined: the 5 labels hold no positive example"):
        assert np.isnan(metrics.binary_f1(np.array([0, 1, 0, 0, 0]), labels))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        # All positive predictions wrong: defined, and 0; a perfect prediction: 1.
        assert metrics.binary_f1(np.array([0, 0]), np.array([1, 1])) == 0.0
        assert metrics.binary_f1(np.array([1, 0]), np.array([1, 0])) == 1.0


def test_unlabelled_dev_file_is_refused(tmp_path):
    # GLUE test files have no labels: fine as data.test_file (predicted), not for model selection.
    test_file = tiny.FIXTURES / "sst2" / "test.tsv"
    tokenizer = tokenization.load_tokenizer(bert.resolve_model_dir("embedded:minilm"))
    with pytest.raises(ValueError, match=r"data.dev_file = '.*test.tsv': the dev split has no labels"):
        task_spec.load_split(tasks.get_task("sst2"), "dev", test_file, tokenizer=tokenizer, max_seq_length=16)


def test_unsupported_model_type_is_one_line_listing_the_families(tmp_path, run_cli):
    model_dir = tmp_path / "gpt2"
    model_dir.mkdir()
    (model_dir / "config.json").write_text('{"model_type": "gpt2", "vocab_size": 10, "n_embd": 8}')
    proc = run_cli(tmp_path / "run", f"--config.model.name_or_path={model_dir}")
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr  # a model: exit 1
    assert proc.stderr.strip().splitlines()[-1] == (
        f"error: {model_dir / 'config.json'}: model_type='gpt2' is not supported; "
        "supported: bert, roberta, xlm-roberta, electra, distilbert"
    )


def _model_without(tmp_path, *names: str):
    model_dir = tmp_path / "model"
    shutil.copytree(bert.resolve_model_dir("embedded:minilm"), model_dir)
    for name in names:
        (model_dir / name).unlink()
    return model_dir


def test_model_folder_without_tokenizer_files_is_refused_before_training(tmp_path):
    # transformers would build a 5-token tokenizer from config.json: every word [UNK], exit 0.
    model_dir = _model_without(tmp_path, "vocab.txt", "tokenizer.json", "tokenizer_config.json")
    with pytest.raises(
        DataError, match=rf"^{model_dir}: no tokenizer files \(none of tokenizer.json, vocab.txt"
    ):
        train.run(tiny.get_config(f"model.name_or_path={model_dir}"), tmp_path / "run")
    assert not (tmp_path / "run").exists()  # refused before anything was written


def test_tokenizer_ids_beyond_the_embedding_table_are_refused_before_training(tmp_path):
    # A 400-entry encoder with a 30522-entry tokenizer: not a learning-rate problem at step 1.
    model_dir = _model_without(tmp_path)
    encoder = json.loads((model_dir / "config.json").read_text())
    (model_dir / "config.json").write_text(json.dumps({**encoder, "vocab_size": 400}))
    table = r"but the encoder's embedding table has 400 rows \(vocab_size in config.json\)"
    with pytest.raises(
        DataError, match=rf"^{model_dir}: its tokenizer gives token id \d+ on the \w+ split, {table}"
    ):
        train.run(tiny.get_config(f"model.name_or_path={model_dir}"), tmp_path / "run")
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_max_seq_length_above_positions_is_a_usage_error(tmp_path):
    with pytest.raises(UsageError, match=r"config.max_seq_length=600 exceeds"):
        train.run(tiny.get_config("max_seq_length=600"), tmp_path)
