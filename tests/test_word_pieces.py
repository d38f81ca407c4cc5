"""Word sequences as BERT windows: first sub-token alignment, split and joined sentences, unknown-token
words, and document context."""

import numpy as np
import pytest
from transformers import AutoTokenizer

from stackft_jax.data import conll, word_pieces
from stackft_jax.data.conll import Sentence
from stackft_jax.models import bert

TAG_IDS = {tag: i for i, tag in enumerate(conll.TAGS)}


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(str(bert.resolve_model_dir("embedded:minilm")))


def _sentence(words: str, tags: str, document: int = 0, index: int = 0) -> Sentence:
    return Sentence(tuple(words.split()), tuple(tags.split()), document, index)


def test_first_sub_token_of_each_word_is_labelled(tokenizer):
    sentence = _sentence("Zorblaxian unbelievably visited Paris", "B-MISC O O B-LOC")
    arrays, num_split = word_pieces.encode_sentences(
        tokenizer, [sentence], tag_ids=TAG_IDS, max_seq_length=32
    )
    assert num_split == 0 and arrays["num_words"].tolist() == [4]
    ids = arrays["input_ids"][0]
    assert ids[0] == tokenizer.cls_token_id and ids[arrays["lengths"][0] - 1] == tokenizer.sep_token_id
    for position, word in zip(arrays["word_starts"][0][:4], sentence.words, strict=True):
        assert ids[position] == tokenizer(word, add_special_tokens=False)["input_ids"][0]
    assert len(tokenizer("Zorblaxian", add_special_tokens=False)["input_ids"]) > 1  # really sub-tokens
    assert arrays["labels"][0][:5].tolist() == [TAG_IDS["B-MISC"], 0, 0, TAG_IDS["B-LOC"], -1]
    assert (arrays["token_type_ids"] == 0).all()


def test_long_sentences_are_split_and_joined_back(tokenizer):
    words = " ".join(f"w{i}" for i in range(30))
    sentences = [_sentence("short one", "O O", index=0), _sentence(words, " ".join(["O"] * 30), index=1)]
    arrays, num_split = word_pieces.encode_sentences(tokenizer, sentences, tag_ids=TAG_IDS, max_seq_length=12)
    assert num_split == 1
    assert (arrays["lengths"] <= 12).all()
    assert arrays["sentence_index"].tolist()[0] == 0 and set(arrays["sentence_index"][1:]) == {1}
    # Predict each word's own index: joining must give every word once, in order.
    predictions = arrays["word_offset"][:, None] + np.arange(arrays["word_starts"].shape[1])[None]
    joined = word_pieces.join_windows(predictions, arrays, sentences)
    assert joined[0].tolist() == [0, 1] and joined[1].tolist() == list(range(30))


def test_zero_piece_words_become_unknown_and_long_words_are_truncated(tokenizer):
    assert tokenizer("\u200b", add_special_tokens=False)["input_ids"] == []
    sentence = _sentence("a \u200b " + "x" * 200 + " b", "O O B-PER O")
    arrays, _ = word_pieces.encode_sentences(tokenizer, [sentence], tag_ids=TAG_IDS, max_seq_length=8)
    assert arrays["num_words"].sum() == 4
    first = arrays["input_ids"][0]
    assert first[arrays["word_starts"][0][1]] == tokenizer.unk_token_id
    joined = word_pieces.join_windows(arrays["labels"], arrays, [sentence])
    assert joined[0].tolist() == [0, 0, TAG_IDS["B-PER"], 0]


def test_document_context_fills_the_window_with_unlabelled_neighbours(tokenizer):
    sentences = [
        _sentence("alpha beta", "O O", document=0, index=0),
        _sentence("Ada spoke", "B-PER O", document=0, index=1),
        _sentence("gamma delta", "O O", document=0, index=2),
        _sentence("other document", "O O", document=1, index=3),
    ]
    arrays, _ = word_pieces.encode_sentences(
        tokenizer, sentences, tag_ids=TAG_IDS, max_seq_length=16, document_context=True
    )
    centre = tokenizer.convert_ids_to_tokens(arrays["input_ids"][1][: arrays["lengths"][1]])
    assert centre == ["[CLS]", "alpha", "beta", "ada", "spoke", "gamma", "delta", "[SEP]"]
    assert arrays["num_words"][1] == 2
    assert [centre[p] for p in arrays["word_starts"][1][:2]] == ["ada", "spoke"]
    assert arrays["labels"][1][:3].tolist() == [TAG_IDS["B-PER"], 0, -1]
    last = tokenizer.convert_ids_to_tokens(arrays["input_ids"][3][: arrays["lengths"][3]])
    assert last == ["[CLS]", "other", "document", "[SEP]"]  # nothing from document 0


def test_document_context_is_balanced_and_bounded(tokenizer):
    sentences = [_sentence(" ".join(["one"] * 6), " ".join(["O"] * 6), index=i) for i in range(5)]
    arrays, _ = word_pieces.encode_sentences(
        tokenizer, sentences, tag_ids=TAG_IDS, max_seq_length=12, document_context=True
    )
    assert (arrays["lengths"] == 12).all()  # room filled from both sides or the one that has some
    starts = arrays["word_starts"][2][:6]
    assert starts[0] - 1 == 2 and 12 - 1 - (starts[-1] + 1) == 2  # 4 tokens of room: 2 before, 2 after
