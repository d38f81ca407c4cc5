"""Word-level sequences (NER) as BERT windows: sub-tokens, with the first sub-token of each word labelled.

A window is `[CLS] sub-tokens [SEP]` (the tokenizer's own cls / sep: <s> and </s> for RoBERTa and XLM-R),
right-padded to `max_seq_length`. Per window:

    input_ids, token_type_ids  [N, max_seq_length]   token_type_ids all 0 (one segment)
    segment_ids                [N, max_seq_length]   SEGMENT_A between [CLS] and [SEP], else 0
    lengths                    [N]                   real tokens, [CLS] and [SEP] included
    word_starts                [N, max_words]        position of each labelled word's first sub-token,
                                                     packed left (padding 0); max_words = max_seq_length - 2
    num_words                  [N]                   labelled words in the window
    labels                     [N, max_words]        tag ids, -1 at padding
    sentence_index, word_offset [N]                  the sentence, and its first word, the window labels

No word is dropped: a sentence whose sub-tokens do not fit is split at word boundaries into several
windows (their number is returned), a word with no sub-token becomes the unknown token, and a word
longer than a window keeps its first sub-tokens (only the first is labelled). With `document_context`,
the rest of each window is filled with the sub-tokens of the neighbouring sentences of the same document,
half before and half after, unlabelled, as BERT's own NER setup did (Devlin et al. 2019, section 5.3).
Sentences without a document (`NO_DOCUMENT`: the Hugging Face conll2003 rows) get no context.

Words are tokenized one by one, as a word inside a sentence is: WordPiece and SentencePiece (XLM-R's
"▁word") need nothing more; byte-level BPE (RoBERTa) codes the space before a word into its first piece
("Ġword"), so each word is given that space, as transformers' `add_prefix_space=True` does for pre-split
words.

Any word-level task can use this module: its sentences need `words`, `tags` and `document` (data/conll.py's
`Sentence` is one).
"""

import json
import logging
import warnings
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Protocol

import numpy as np

from stackft_jax.models.features import SEGMENT_A

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

PAD_LABEL = -1
NO_DOCUMENT = -1  # a sentence's `document` when its document is unknown


class Sentence(Protocol):
    """What this module reads of a sentence."""

    @property
    def words(self) -> Sequence[str]: ...

    @property
    def tags(self) -> Sequence[str] | None: ...  # None: unlabelled

    @property
    def document(self) -> int: ...  # sentences of one document share it; NO_DOCUMENT: unknown


def word_piece_ids(tokenizer: "PreTrainedTokenizerBase", words: Sequence[str]) -> dict[str, list[int]]:
    """Each distinct word's sub-token ids (one batched tokenizer call); a word the tokenizer maps to
    nothing (control characters, say) gets the unknown token."""
    distinct = sorted(set(words))
    prefix = " " if _byte_level_without_prefix_space(tokenizer) else ""
    texts = [prefix + word for word in distinct]
    encoded = tokenizer(texts, add_special_tokens=False)["input_ids"] if distinct else []
    return {word: ids or [tokenizer.unk_token_id] for word, ids in zip(distinct, encoded, strict=True)}


def _byte_level_without_prefix_space(tokenizer: "PreTrainedTokenizerBase") -> bool:
    """Whether the tokenizer's pre-tokenizer is byte-level BPE that does not add the word's space itself."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return False
    spec = json.loads(backend.to_str()).get("pre_tokenizer") or {}
    return any(
        part.get("type") == "ByteLevel" and not part.get("add_prefix_space")
        for part in spec.get("pretokenizers", [spec])
    )


def _chunks(pieces: list[list[int]], budget: int) -> list[tuple[int, int]]:
    """[start, stop) word ranges whose sub-tokens fit `budget` (a too-long word alone, truncated)."""
    ranges, start, used = [], 0, 0
    for i, word in enumerate(pieces):
        size = min(len(word), budget)
        if used + size > budget and i > start:
            ranges.append((start, i))
            start, used = i, 0
        used += size
    ranges.append((start, len(pieces)))
    return ranges


def encode_sentences(
    tokenizer: "PreTrainedTokenizerBase",
    sentences: Sequence[Sentence],
    *,
    tag_ids: Mapping[str, int],
    max_seq_length: int,
    document_context: bool = False,
) -> tuple[dict[str, np.ndarray], int]:
    """The windows' arrays (module docstring) and how many sentences had to be split."""
    if max_seq_length < 3:
        raise ValueError(f"max_seq_length={max_seq_length}: a window needs [CLS], a word and [SEP]")
    budget = max_seq_length - 2
    if document_context and any(sentence.document == NO_DOCUMENT for sentence in sentences):
        warnings.warn(
            "document context asked for, but some sentences have no document (Hugging Face conll2003 "
            "rows have none): those are encoded without context",
            stacklevel=2,
        )
    vocabulary = word_piece_ids(tokenizer, [word for sentence in sentences for word in sentence.words])
    # Every window before context: (sentence, first word, its words' sub-tokens).
    windows: list[tuple[int, int, list[list[int]]]] = []
    num_split = 0
    for index, sentence in enumerate(sentences):
        pieces = [vocabulary[word][:budget] for word in sentence.words]
        ranges = _chunks(pieces, budget)
        num_split += len(ranges) > 1
        windows.extend((index, start, pieces[start:stop]) for start, stop in ranges)

    n = len(windows)
    arrays = {
        "input_ids": np.full((n, max_seq_length), tokenizer.pad_token_id, np.int32),
        "token_type_ids": np.zeros((n, max_seq_length), np.int32),
        "segment_ids": np.zeros((n, max_seq_length), np.int32),
        "lengths": np.zeros(n, np.int32),
        "word_starts": np.zeros((n, budget), np.int32),
        "num_words": np.zeros(n, np.int32),
        "labels": np.full((n, budget), PAD_LABEL, np.int32),
        "sentence_index": np.zeros(n, np.int32),
        "word_offset": np.zeros(n, np.int32),
    }
    flat = [[token for word in pieces for token in word] for _, _, pieces in windows]
    for w, (index, start, pieces) in enumerate(windows):
        left, right = (
            _context(windows, flat, w, sentences, budget - len(flat[w])) if document_context else ([], [])
        )
        tokens = [tokenizer.cls_token_id, *left, *flat[w], *right, tokenizer.sep_token_id]
        starts = np.cumsum([0] + [len(word) for word in pieces[:-1]]) + 1 + len(left)
        tags = sentences[index].tags
        arrays["input_ids"][w, : len(tokens)] = tokens
        arrays["segment_ids"][w, 1 : len(tokens) - 1] = SEGMENT_A
        arrays["lengths"][w] = len(tokens)
        arrays["word_starts"][w, : len(pieces)] = starts
        arrays["num_words"][w] = len(pieces)
        # An unlabelled sentence (predict's input) gets tag id 0 per word: a finite loss nothing scores.
        words = tags[start : start + len(pieces)] if tags is not None else [None] * len(pieces)
        arrays["labels"][w, : len(pieces)] = [tag_ids[tag] if tag is not None else 0 for tag in words]
        arrays["sentence_index"][w] = index
        arrays["word_offset"][w] = start
    if num_split:
        logging.info(
            "%d of %d sentences are longer than max_seq_length=%d sub-tokens: split into consecutive windows",
            num_split,
            len(sentences),
            max_seq_length,
        )
    return arrays, num_split


def _context(
    windows: list[tuple[int, int, list[list[int]]]],
    flat: list[list[int]],
    w: int,
    sentences: Sequence[Sentence],
    room: int,
) -> tuple[list[int], list[int]]:
    """Sub-tokens of the same document's neighbouring windows: up to half of `room` before (the nearest
    ones), the rest after; a side that runs out leaves its share to the other."""
    document = sentences[windows[w][0]].document
    if document == NO_DOCUMENT:
        return [], []

    def gather(indices) -> list[list[int]]:
        collected, size = [], 0
        for other in indices:
            if sentences[windows[other][0]].document != document or size >= room:
                break
            collected.append(flat[other])
            size += len(flat[other])
        return collected

    before = [t for tokens in reversed(gather(range(w - 1, -1, -1))) for t in tokens]
    after = [t for tokens in gather(range(w + 1, len(windows))) for t in tokens]
    take_before = min(len(before), max(room // 2, room - len(after)))
    take_after = min(len(after), room - take_before)
    return before[len(before) - take_before :], after[:take_after]


def join_windows(
    predictions: np.ndarray,
    arrays: Mapping[str, np.ndarray],
    sentences: Sequence[Sentence],
) -> list[np.ndarray]:
    """Per-window word predictions [N, max_words] -> one array per sentence, every word exactly once
    (a word without a prediction, or with two, is an error: say, eval padding rows left in)."""
    if len(predictions) != len(arrays["num_words"]):
        raise ValueError(f"{len(predictions)} prediction rows for {len(arrays['num_words'])} windows")
    joined = [np.zeros(len(sentence.words), predictions.dtype) for sentence in sentences]
    times_predicted = [np.zeros(len(sentence.words), np.int32) for sentence in sentences]
    for row, index, offset, count in zip(
        predictions, arrays["sentence_index"], arrays["word_offset"], arrays["num_words"], strict=True
    ):
        joined[index][offset : offset + count] = row[:count]
        times_predicted[index][offset : offset + count] += 1
    missing = [i for i, counts in enumerate(times_predicted) if (counts == 0).any()]
    if missing:
        raise ValueError(f"the windows leave words of sentences {missing[:5]} without a prediction")
    repeated = [i for i, counts in enumerate(times_predicted) if (counts > 1).any()]
    if repeated:
        raise ValueError(f"words of sentences {repeated[:5]} are in more than one window")
    return joined
