"""Word sequences as BERT windows: first sub-token alignment, split and joined sentences, unknown-token
words, and document context."""

from pathlib import Path

import numpy as np
import pytest
from transformers import AutoTokenizer

from stackft_jax.data import conll, word_pieces
from stackft_jax.data.conll import Sentence
from stackft_jax.models import bert
from tests import encoders

TAG_IDS = {tag: i for i, tag in enumerate(conll.TAGS)}
SHARED_DEV = Path(__file__).resolve().parents[2] / "shared" / "data" / "conll2003" / "eng.testa"


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
    n = arrays["lengths"][0]
    assert arrays["segment_ids"][0].tolist() == [0] + [1] * (n - 2) + [0] * (33 - n)


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


def test_alignment_matches_the_tokenizer_on_whole_sentences(tokenizer):
    # Accents, hyphens, apostrophes, numbers and punctuation: words of several sub-tokens.
    words = "Iván O'Neill-Barrow scored 3-6 at Veldhaven's 2024-11-09 Harbour-Regatta ( Zürich ) .".split()
    sentence = Sentence(tuple(words), ("O",) * len(words), 0, 0)
    arrays, _ = word_pieces.encode_sentences(tokenizer, [sentence], tag_ids=TAG_IDS, max_seq_length=64)
    reference = tokenizer(words, is_split_into_words=True)
    assert arrays["input_ids"][0][: arrays["lengths"][0]].tolist() == reference["input_ids"]
    word_ids = reference.word_ids()
    first_sub_tokens = [word_ids.index(w) for w in range(len(words))]
    assert arrays["word_starts"][0][: len(words)].tolist() == first_sub_tokens
    assert len(reference["input_ids"]) > len(words) + 8  # many words really are split


def test_sentences_without_a_document_get_no_context(tokenizer):
    sentences = [
        Sentence(("Ada", "spoke"), ("B-PER", "O"), conll.NO_DOCUMENT, 0),
        Sentence(("Bob", "listened"), ("B-PER", "O"), conll.NO_DOCUMENT, 1),
    ]
    with pytest.warns(UserWarning, match="some sentences have no document"):
        arrays, _ = word_pieces.encode_sentences(
            tokenizer, sentences, tag_ids=TAG_IDS, max_seq_length=16, document_context=True
        )
    assert arrays["lengths"].tolist() == [4, 4]  # [CLS] word word [SEP]: no neighbour joined in


def test_join_refuses_missing_repeated_and_miscounted_windows(tokenizer):
    sentences = [_sentence("a b c", "O O O", index=0), _sentence("d e", "O O", index=1)]
    arrays, _ = word_pieces.encode_sentences(tokenizer, sentences, tag_ids=TAG_IDS, max_seq_length=8)
    predictions = arrays["labels"]
    # A padded eval batch that still carries a copy of window 0:
    padded = {key: np.concatenate([value, value[:1]]) for key, value in arrays.items()}
    with pytest.raises(ValueError, match=r"sentences \[0\] are in more than one window"):
        word_pieces.join_windows(np.concatenate([predictions, predictions[:1]]), padded, sentences)
    only_first = {key: value[:1] for key, value in arrays.items()}
    with pytest.raises(ValueError, match=r"sentences \[1\] without a prediction"):
        word_pieces.join_windows(predictions[:1], only_first, sentences)
    with pytest.raises(ValueError, match="1 prediction rows for 2 windows"):
        word_pieces.join_windows(predictions[:1], arrays, sentences)


@pytest.mark.skipif(not SHARED_DEV.is_file(), reason="the shared CoNLL-2003 files are not on this machine")
def test_real_dev_split_matches_the_tokenizer_and_round_trips(tokenizer):
    sentences = conll.read_conll(SHARED_DEV, config_key="data.dev_file")
    arrays, num_split = word_pieces.encode_sentences(tokenizer, sentences, tag_ids=TAG_IDS, max_seq_length=64)
    assert num_split > 0  # at 64 tokens some sentences must be split
    assert (arrays["lengths"] <= 64).all()
    # Every window of a sentence that was not split is exactly the tokenizer's own encoding of it.
    reference = tokenizer([list(s.words) for s in sentences], is_split_into_words=True)
    whole = np.bincount(arrays["sentence_index"]) == 1
    rows = {int(i): row for row, i in enumerate(arrays["sentence_index"])}
    for i in np.flatnonzero(whole):
        row, word_ids = rows[i], reference.word_ids(int(i))
        assert arrays["input_ids"][row][: arrays["lengths"][row]].tolist() == reference["input_ids"][i]
        starts = [word_ids.index(w) for w in range(len(sentences[i].words))]
        assert arrays["word_starts"][row][: len(starts)].tolist() == starts
    joined = word_pieces.join_windows(arrays["labels"], arrays, sentences)
    assert [j.tolist() for j in joined] == [[TAG_IDS[t] for t in s.tags] for s in sentences]


@pytest.mark.skipif(not SHARED_DEV.is_file(), reason="the shared CoNLL-2003 files are not on this machine")
def test_real_dev_split_with_document_context(tokenizer):
    sentences = conll.read_conll(SHARED_DEV, config_key="data.dev_file")
    plain, _ = word_pieces.encode_sentences(tokenizer, sentences, tag_ids=TAG_IDS, max_seq_length=64)
    context, _ = word_pieces.encode_sentences(
        tokenizer, sentences, tag_ids=TAG_IDS, max_seq_length=64, document_context=True
    )
    # The same labelled words in the same windows, now surrounded by their document.
    for key in ("num_words", "labels", "sentence_index", "word_offset"):
        np.testing.assert_array_equal(plain[key], context[key])
    assert plain["lengths"].mean() < 32 and (context["lengths"] == 64).mean() > 0.9
    rows = np.arange(len(plain["lengths"]))[:, None]
    np.testing.assert_array_equal(
        plain["input_ids"][rows, plain["word_starts"]], context["input_ids"][rows, context["word_starts"]]
    )
    joined = word_pieces.join_windows(context["labels"], context, sentences)
    assert [j.tolist() for j in joined] == [[TAG_IDS[t] for t in s.tags] for s in sentences]


# --- Byte-level BPE (RoBERTa) and SentencePiece (XLM-R) as WordPiece ------------------------------------

CORPUS = [
    "EU rejects German call to boycott British lamb .",
    "Peter Blackburn visited Paris and Brussels on Monday .",
    "The European Commission said on Thursday it disagreed with German advice .",
] * 4


@pytest.fixture(scope="module", params=["wordpiece", "bpe", "unigram"])
def any_tokenizer(request, tmp_path_factory):
    """(tokenizer as stackft_jax loads it, the same files loaded as transformers' token classification
    loads them for pre-split words: add_prefix_space=True for byte-level BPE)."""
    if request.param == "wordpiece":
        folder = str(bert.resolve_model_dir("embedded:minilm"))
        return AutoTokenizer.from_pretrained(folder), AutoTokenizer.from_pretrained(folder)
    folder = tmp_path_factory.mktemp(request.param)
    (encoders.train_bpe if request.param == "bpe" else encoders.train_unigram)(folder, CORPUS)
    prefix_space = {"add_prefix_space": True} if request.param == "bpe" else {}
    return AutoTokenizer.from_pretrained(folder), AutoTokenizer.from_pretrained(folder, **prefix_space)


def test_words_are_tokenized_as_in_a_sentence_for_every_tokenizer_kind(any_tokenizer):
    """The window's ids are exactly transformers' encoding of the pre-split words, and each word's first
    sub-token is the one labelled, for WordPiece, byte-level BPE (the word's space coded into its first
    piece) and SentencePiece ("▁word") alike."""
    tokenizer, reference = any_tokenizer
    sentence = _sentence("Zorblaxian unbelievably visited Paris , EU", "B-MISC O O B-LOC O B-ORG")
    arrays, _ = word_pieces.encode_sentences(tokenizer, [sentence], tag_ids=TAG_IDS, max_seq_length=48)
    expected = reference(list(sentence.words), is_split_into_words=True)
    n = arrays["lengths"][0]
    assert arrays["input_ids"][0, :n].tolist() == expected["input_ids"]
    word_ids = expected.word_ids()
    first_pieces = [word_ids.index(w) for w in range(len(sentence.words))]
    assert arrays["word_starts"][0, : len(sentence.words)].tolist() == first_pieces
    assert first_pieces[1] - first_pieces[0] > 1  # "Zorblaxian" really is several pieces
    assert (
        arrays["input_ids"][0, 0] == tokenizer.cls_token_id
        and arrays["input_ids"][0, n - 1] == tokenizer.sep_token_id
    )
    assert (arrays["input_ids"][0, n:] == tokenizer.pad_token_id).all()
