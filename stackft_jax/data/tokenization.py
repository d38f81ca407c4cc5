"""Examples -> fixed-width token arrays, cached on disk so a run tokenizes each split once."""

import dataclasses
import hashlib
import os
import tempfile
from pathlib import Path

import numpy as np
from transformers import AutoTokenizer, PreTrainedTokenizerBase

from stackft_jax.data.tasks import Example, TaskSpec

# Bump when the arrays written to the cache change meaning, so old cache files are ignored.
_CACHE_VERSION = 1
# Texts per tokenizer call: large enough that the Rust tokenizer's batch parallelism pays off,
# small enough that the intermediate Python lists stay modest for SST-2-sized splits.
_CHUNK_SIZE = 8192


def load_tokenizer(model_dir: str | Path) -> PreTrainedTokenizerBase:
    return AutoTokenizer.from_pretrained(str(model_dir), use_fast=True)


@dataclasses.dataclass
class TokenizedDataset:
    """Right-padded token arrays; batching slices them down to a length bucket."""

    input_ids: np.ndarray  # [N, max_seq_length] int32
    token_type_ids: np.ndarray  # [N, max_seq_length] int32
    lengths: np.ndarray  # [N] int32, real tokens including [CLS]/[SEP]
    labels: np.ndarray  # [N] int32 (classification) or float32 (regression)

    def __len__(self) -> int:
        return len(self.labels)


def tokenize_examples(
    tokenizer: PreTrainedTokenizerBase,
    examples: list[Example],
    *,
    max_seq_length: int,
    task: TaskSpec,
    cache_dir: str | Path | None = None,
) -> TokenizedDataset:
    """[CLS] a [SEP] (b [SEP]), truncated longest-first to `max_seq_length` and padded to it."""
    if task.sentence_pair and any(e.text_b is None for e in examples):
        raise ValueError(f"task {task.name!r} takes sentence pairs but an example has no text_b")
    cache_file = None
    if cache_dir is not None:
        key = _cache_key(tokenizer, examples, max_seq_length=max_seq_length, task=task)
        cache_file = Path(cache_dir) / f"{task.name}-{max_seq_length}-{key}.npz"
        if cache_file.is_file():
            with np.load(cache_file) as arrays:
                return TokenizedDataset(**{k: arrays[k] for k in arrays.files})

    dataset = _tokenize(tokenizer, examples, max_seq_length=max_seq_length, task=task)
    if cache_file is not None:
        _write_atomically(cache_file, dataset)
    return dataset


def _tokenize(
    tokenizer: PreTrainedTokenizerBase,
    examples: list[Example],
    *,
    max_seq_length: int,
    task: TaskSpec,
) -> TokenizedDataset:
    n = len(examples)
    input_ids = np.zeros((n, max_seq_length), np.int32)
    token_type_ids = np.zeros((n, max_seq_length), np.int32)
    lengths = np.zeros((n,), np.int32)
    for start in range(0, n, _CHUNK_SIZE):
        chunk = examples[start : start + _CHUNK_SIZE]
        encoded = tokenizer(
            [e.text_a for e in chunk],
            [e.text_b for e in chunk] if task.sentence_pair else None,
            truncation="longest_first",
            max_length=max_seq_length,
            padding="max_length",
            return_token_type_ids=True,
            return_attention_mask=True,
        )  # plain lists: converting them here is faster than return_tensors="np"
        stop = start + len(chunk)
        input_ids[start:stop] = np.asarray(encoded["input_ids"], np.int32)
        token_type_ids[start:stop] = np.asarray(encoded["token_type_ids"], np.int32)
        lengths[start:stop] = np.asarray(encoded["attention_mask"], np.int32).sum(axis=1)
    label_dtype = np.float32 if task.kind == "regression" else np.int32
    labels = np.asarray([e.label for e in examples], dtype=label_dtype)
    return TokenizedDataset(input_ids, token_type_ids, lengths, labels)


def _cache_key(
    tokenizer: PreTrainedTokenizerBase,
    examples: list[Example],
    *,
    max_seq_length: int,
    task: TaskSpec,
) -> str:
    h = hashlib.sha256()
    tokenizer_id = (
        f"v{_CACHE_VERSION}|{type(tokenizer).__module__}.{type(tokenizer).__qualname__}|"
        f"{tokenizer.name_or_path}|{len(tokenizer)}|{max_seq_length}|{task.name}"
    )
    h.update(tokenizer_id.encode())
    for e in examples:
        # \x00 separates fields and \x01 marks a missing text_b, so no two inputs collide.
        b = "\x01" if e.text_b is None else e.text_b
        h.update(f"\x00{e.text_a}\x00{b}\x00{e.label!r}".encode())
    return h.hexdigest()[:24]


def _write_atomically(path: Path, dataset: TokenizedDataset) -> None:
    """tmp file + rename, so a crash or a concurrent host never leaves a half-written cache."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            np.savez(f, **dataclasses.asdict(dataset))
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
