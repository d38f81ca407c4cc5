"""Texts -> fixed-width token arrays, and the on-disk cache that lets a run encode each split once."""

import functools
import hashlib
import os
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from stackft_jax.models.features import SEGMENT_A
from stackft_jax.runtime.cli_errors import DataError

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

# Bump when the arrays written to the cache (or its keys) change meaning, so old cache files are ignored.
_CACHE_VERSION = 4  # 4: segment_ids
# A model folder's files that are not the tokenizer's: everything else there is hashed into cache keys.
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".h5", ".msgpack", ".onnx", ".ot", ".pt", ".pth", ".ckpt")
# Texts per tokenizer call: large enough that the Rust tokenizer's batch parallelism pays off,
# small enough that the intermediate Python lists stay modest for SST-2-sized splits.
_CHUNK_SIZE = 8192


# Files that hold a vocabulary; a model folder with none of them has no tokenizer: transformers would
# then build one of the five special tokens from config.json alone, and every word would be [UNK].
VOCABULARY_FILES = (
    "tokenizer.json",
    "vocab.txt",
    "vocab.json",
    "sentencepiece.bpe.model",
    "spiece.model",
    "tokenizer.model",
)
# What a tokenizer is loaded from (VOCABULARY_FILES and their settings): what a workdir's binding
# fingerprints, since the same data tokenized otherwise is other input.
TOKENIZER_FILES = (
    *VOCABULARY_FILES,
    "merges.txt",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
)


def check_tokenizer_files(model_dir: str | Path) -> None:
    """Refuses a model folder without a vocabulary file (DataError naming the folder)."""
    model_dir = Path(model_dir)
    if not any((model_dir / name).is_file() for name in VOCABULARY_FILES):
        raise DataError(
            f"{model_dir}: no tokenizer files (none of {', '.join(VOCABULARY_FILES)}); without them every "
            "word would be [UNK]. Copy the tokenizer files of the model the weights came from into the folder"
        )


def check_ids_fit(model_dir: str | Path, vocab_size: int, arrays: dict[str, dict[str, np.ndarray]]) -> None:
    """Refuses token ids beyond the encoder's embedding table (`vocab_size` rows): the tokenizer files
    belong to another model than the weights (DataError naming the folder and the split)."""
    for split, split_arrays in arrays.items():
        ids = split_arrays["input_ids"]
        if ids.size and int(ids.max()) >= vocab_size:
            raise DataError(
                f"{model_dir}: its tokenizer gives token id {int(ids.max())} on the {split} split, but the "
                f"encoder's embedding table has {vocab_size} rows (vocab_size in config.json): the tokenizer "
                "files and the weights come from different models"
            )


def tokenizer_fingerprint(model_dir: str | Path) -> dict[str, str]:
    """{file name: sha256} of the folder's TOKENIZER_FILES."""
    model_dir = Path(model_dir)
    return {
        name: hashlib.sha256((model_dir / name).read_bytes()).hexdigest()
        for name in TOKENIZER_FILES
        if (model_dir / name).is_file()
    }


class Tokenizer:
    """A model folder's tokenizer, loaded (through transformers: seconds of imports) on first use.

    Cache keys hash the folder's tokenizer files instead of the loaded tokenizer, so a run whose
    splits are all cached, such as every run after a grid's first, never loads it."""

    def __init__(self, model_dir: str | Path):
        self.model_dir = Path(model_dir)

    @functools.cached_property
    def loaded(self) -> "PreTrainedTokenizerBase":
        from transformers import AutoTokenizer

        check_tokenizer_files(self.model_dir)  # a finished run's folder may have lost them since
        return AutoTokenizer.from_pretrained(str(self.model_dir), use_fast=True)

    @functools.cached_property
    def fingerprint(self) -> str:
        """A hash of every file of the model folder but the weights: vocabulary, tokenizer and model
        configs, whatever format they come in."""
        h = hashlib.sha256()
        for path in sorted(self.model_dir.iterdir()):
            if path.is_file() and not path.name.endswith(_WEIGHT_SUFFIXES):
                h.update(f"{path.name}|".encode() + path.read_bytes() + b"\x00")
        return h.hexdigest()


def load_tokenizer(model_dir: str | Path) -> Tokenizer:
    return Tokenizer(model_dir)


def encode_texts(
    tokenizer: "PreTrainedTokenizerBase",
    texts_a: Sequence[str],
    texts_b: Sequence[str] | None,
    *,
    max_seq_length: int,
) -> dict[str, np.ndarray]:
    """The tokenizer's own layout of one text or a pair (BERT: [CLS] a [SEP] b [SEP]; RoBERTa:
    <s> a </s></s> b </s>), truncated longest-first to `max_seq_length` and padded to it.

    Returns int32 `input_ids`, `token_type_ids`, `segment_ids` [N, max_seq_length] and `lengths` [N]
    (real tokens). `segment_ids` says which text a token belongs to (`SEGMENT_A`, `SEGMENT_B`, or 0 for
    special tokens and padding), from the tokenizer's own `sequence_ids`, so pair heads find the second
    text whatever the family; `token_type_ids` stay 0 for a tokenizer whose model takes none (RoBERTa,
    XLM-R, DistilBERT: `model_input_names`)."""
    n = len(texts_a)
    input_ids = np.zeros((n, max_seq_length), np.int32)
    token_type_ids = np.zeros((n, max_seq_length), np.int32)
    segment_ids = np.zeros((n, max_seq_length), np.int32)
    lengths = np.zeros((n,), np.int32)
    uses_token_types = "token_type_ids" in tokenizer.model_input_names
    for start in range(0, n, _CHUNK_SIZE):
        stop = min(start + _CHUNK_SIZE, n)
        encoded = tokenizer(
            list(texts_a[start:stop]),
            list(texts_b[start:stop]) if texts_b is not None else None,
            truncation="longest_first",
            max_length=max_seq_length,
            padding="max_length",
            return_token_type_ids=uses_token_types,
            return_attention_mask=True,
        )  # plain lists: converting them here is faster than return_tensors="np"
        input_ids[start:stop] = np.asarray(encoded["input_ids"], np.int32)
        if uses_token_types:
            token_type_ids[start:stop] = np.asarray(encoded["token_type_ids"], np.int32)
        segment_ids[start:stop] = [
            [0 if s is None else s + SEGMENT_A for s in encoded.sequence_ids(i)] for i in range(stop - start)
        ]
        lengths[start:stop] = np.asarray(encoded["attention_mask"], np.int32).sum(axis=1)
    return {
        "input_ids": input_ids,
        "token_type_ids": token_type_ids,
        "segment_ids": segment_ids,
        "lengths": lengths,
    }


def cached(
    encode: Callable[[], dict[str, np.ndarray]],
    *,
    cache_dir: str | Path | None,
    name: str,
    identity: str,
    tokenizer: Tokenizer,
    examples: Sequence[Any],
) -> dict[str, np.ndarray]:
    """`encode()`, or its arrays from `cache_dir/<name>-<key>.npz`. The key hashes the tokenizer's files,
    `identity` (task, length, encoding options) and every example's repr (texts, labels, keys), so
    anything that could change the arrays changes the file."""
    if cache_dir is None:
        return encode()
    cache_file = Path(cache_dir) / f"{name}-{_cache_key(tokenizer, identity, examples)}.npz"
    if cache_file.is_file():
        with np.load(cache_file) as arrays:
            return {k: arrays[k] for k in arrays.files}
    arrays = encode()
    _write_atomically(cache_file, arrays)
    return arrays


def _cache_key(tokenizer: Tokenizer, identity: str, examples: Sequence[Any]) -> str:
    h = hashlib.sha256(f"v{_CACHE_VERSION}|{tokenizer.fingerprint}|{identity}".encode())
    for example in examples:
        h.update(b"\x00" + repr(example).encode())
    return h.hexdigest()[:24]


def _write_atomically(path: Path, arrays: dict[str, np.ndarray]) -> None:
    """tmp file + rename, so a crash or a concurrent host never leaves a half-written cache."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            np.savez(f, **arrays)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def encode_head_tail(
    tokenizer: "PreTrainedTokenizerBase", texts: Sequence[str], *, max_seq_length: int, head_fraction: float
) -> dict[str, np.ndarray]:
    """[CLS] text [SEP] (the tokenizer's own cls and sep) like `encode_texts` for single texts, but a text
    longer than the `max_seq_length - 2` tokens between [CLS] and [SEP] keeps its first `head_fraction` of
    them and its last tokens for the rest, instead of its first tokens only (Sun et al. 2019, "How to
    fine-tune BERT for text classification": head 128 + tail 382 of 510 scored best on long IMDb reviews)."""
    budget = max_seq_length - 2
    head = round(budget * head_fraction)
    n = len(texts)
    input_ids = np.full((n, max_seq_length), tokenizer.pad_token_id, np.int32)
    lengths = np.zeros((n,), np.int32)
    for start in range(0, n, _CHUNK_SIZE):
        chunk = texts[start : start + _CHUNK_SIZE]
        # verbose=False: long texts are the point here, not a mistake to warn about.
        encoded = tokenizer(list(chunk), add_special_tokens=False, truncation=False, verbose=False)
        pieces = encoded["input_ids"]
        for i, ids in enumerate(pieces, start=start):
            if len(ids) > budget:
                ids = ids[:head] + ids[len(ids) - (budget - head) :]
            row = [tokenizer.cls_token_id, *ids, tokenizer.sep_token_id]
            input_ids[i, : len(row)] = row
            lengths[i] = len(row)
    token_type_ids = np.zeros((n, max_seq_length), np.int32)
    # The text is every real token between [CLS] and [SEP].
    positions = np.arange(max_seq_length)[None, :]
    segment_ids = ((positions >= 1) & (positions < lengths[:, None] - 1)).astype(np.int32) * SEGMENT_A
    return {
        "input_ids": input_ids,
        "token_type_ids": token_type_ids,
        "segment_ids": segment_ids,
        "lengths": lengths,
    }
