"""CoNLL-2003 named-entity recognition: the file reader and the task (`CONLL2003`, `data.task=conll2003`).

The original files hold one `token POS chunk NER` line per word (two columns, `token NER`, are accepted
too; the tag is the last column), a blank line after each sentence and a `-DOCSTART-` line at the start
of each document. Their tags are IOB1 (an entity may start with `I-`; `B-` only separates two adjacent
entities of one type); the Hugging Face `conll2003` dataset uses IOB2 (every entity starts with `B-`).
Both are read into ONE internal scheme, IOB2.

Documents are numbered from 0 in file order (sentences before the first `-DOCSTART-` form document 0).
The Hugging Face rows carry no document boundaries (its loader drops the `-DOCSTART-` lines): their
sentences get `NO_DOCUMENT`, and document context is unavailable for them.

The task encodes sentences as sub-token windows whose first sub-tokens carry the word labels
(data/word_pieces.py), trains with the word-tagging objective (objectives.py: the head's per-word
scores own the loss and decoding), joins split sentences back and scores entities under conlleval's
convention (`f1`, the primary, as the field reports CoNLL-2003) and strict IOB2 (`strict_f1`) beside it
(metrics.entity_scores). `data.entity_f1` names the one a run's rules read (best checkpoint, the phase-1
gap rule's `f1`). An example is a sentence; its prediction record holds its tags.

Inputs to predict (predict.py): CoNLL files, or one sentence per line: whitespace-separated words, or a
JSON object `{"words": [...], "tags": [...]}` (`tags` optional). A sentence without tags is predicted,
not scored.
"""

import dataclasses
import hashlib
import re
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from stackft_jax.data import batching, metrics, word_pieces
from stackft_jax.data.task_spec import Split, TaskSpec, hub_rows
from stackft_jax.data.text_files import decoded_lines, first_line, json_object
from stackft_jax.data.word_pieces import NO_DOCUMENT
from stackft_jax.models import objectives
from stackft_jax.runtime.cli_errors import ConfigError, DataError

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

# CoNLL-2003's tags, in the order of the Hugging Face dataset's `ner_tags` class names.
TAGS = ("O", "B-PER", "I-PER", "B-ORG", "I-ORG", "B-LOC", "I-LOC", "B-MISC", "I-MISC")
DOCSTART = "-DOCSTART-"
_TAG = re.compile(r"O|[BI]-\S+")


@dataclasses.dataclass(frozen=True)
class Sentence:
    words: tuple[str, ...]
    tags: tuple[str, ...] | None  # IOB2; None: unlabelled (an input to predict)
    document: int  # numbered from 0 in file order; NO_DOCUMENT: unknown (the hub dataset)
    index: int  # the sentence's position in its file or split, from 0

    @property
    def key(self) -> str:
        """Stable across runs and readers of the same file: position plus a hash of the words, so that
        predictions of two runs match sentence by sentence and a different file is noticed."""
        digest = hashlib.sha256("\x00".join(self.words).encode()).hexdigest()[:8]
        return f"{self.index}-{digest}"


def to_iob2(tags: Sequence[str]) -> tuple[str, ...]:
    """IOB1 (or IOB2) -> IOB2: an `I-X` that does not continue an `X` entity starts one, as `B-X`."""
    converted = []
    previous = "O"
    for tag in tags:
        if tag.startswith("I-") and (previous == "O" or previous[2:] != tag[2:]):
            tag = "B-" + tag[2:]
        converted.append(tag)
        previous = tag
    return tuple(converted)


def sniff_conll(path: Path) -> str | None:
    """ "CoNLL" when the first non-blank line is `-DOCSTART-` or a token line ending in an IOB tag."""
    line = first_line(path)
    fields = line.split() if line is not None else []
    if fields and (fields[0] == DOCSTART or (len(fields) >= 2 and _TAG.fullmatch(fields[-1]))):
        return "CoNLL"
    return None


def check_tags(tags: Sequence[str], known: Sequence[str], where: str) -> tuple[str, ...]:
    """IOB2 `tags`, each a tag of `known` (IOB1 accepted); an unknown tag is an error at `where`."""
    for tag in tags:
        if not isinstance(tag, str) or not _TAG.fullmatch(tag):
            raise DataError(f"{where}: tag {tag!r} is not IOB: expected O, B-TYPE or I-TYPE")
        if tag not in known and to_iob2([tag])[0] not in known:
            raise DataError(f"{where}: unknown tag {tag!r}; the tags are {list(known)}")
    return to_iob2(tags)


def read_conll(path: str | Path, *, config_key: str, tags: Sequence[str] = TAGS) -> list[Sentence]:
    """The file's sentences, tags converted to IOB2. A malformed line or an unknown tag is an error
    naming `file:line`."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{config_key} = {str(path)!r}: no such file")
    sentences: list[Sentence] = []
    words: list[str] = []
    sentence_tags: list[str] = []
    document = 0
    num_columns = None

    def end_sentence() -> None:
        if words:
            sentences.append(Sentence(tuple(words), to_iob2(sentence_tags), document, len(sentences)))
            words.clear()
            sentence_tags.clear()

    for number, line in enumerate(decoded_lines(path), start=1):
        fields = line.split()
        if not fields:
            end_sentence()
            continue
        if fields[0] == DOCSTART:
            end_sentence()
            if sentences and sentences[-1].document == document:  # the document so far had sentences
                document += 1
            continue
        where = f"{path}:{number}"
        if num_columns is None:
            if len(fields) < 2:
                raise DataError(
                    f"{where}: expected `token POS chunk NER` or `token NER`, got {line.strip()!r}"
                )
            num_columns = len(fields)
        if len(fields) != num_columns:
            raise DataError(
                f"{where}: {len(fields)} columns where the file's first token line has {num_columns}"
            )
        check_tags([fields[-1]], tags, where)
        words.append(fields[0])
        sentence_tags.append(fields[-1])
    end_sentence()
    if not sentences:
        raise DataError(f"{config_key} = {str(path)!r}: the file holds no sentences")
    return sentences


def sentences_from_hf(rows: Mapping[str, Any], tag_names: Sequence[str] | None = None) -> list[Sentence]:
    """Rows of the Hugging Face `conll2003` dataset (`tokens`, integer `ner_tags`; IOB2). `tag_names`
    defaults to the class names of the dataset's `ner_tags` feature (a dict of columns must pass them).
    The dataset has no document boundaries, so document context is unavailable."""
    if tag_names is None:
        tag_names = rows.features["ner_tags"].feature.names
    unknown = [name for name in tag_names if name not in TAGS]
    if unknown:
        raise DataError(f"the dataset's tag names {unknown} are not CoNLL-2003 tags {list(TAGS)}")
    sentences = []
    for index, (tokens, ner_tags) in enumerate(zip(rows["tokens"], rows["ner_tags"], strict=True)):
        if len(tokens) != len(ner_tags) or not all(0 <= t < len(tag_names) for t in ner_tags):
            raise DataError(
                f"dataset row {index}: {len(tokens)} tokens with ner_tags {list(ner_tags)}; expected one "
                f"tag id in [0, {len(tag_names)}) per token"
            )
        tags = to_iob2([tag_names[t] for t in ner_tags])
        sentences.append(Sentence(tuple(tokens), tags, NO_DOCUMENT, index))
    warnings.warn(
        "the Hugging Face conll2003 rows carry no document boundaries: document context is unavailable",
        stacklevel=2,
    )
    return sentences


@dataclasses.dataclass(frozen=True)
class ConllTask(TaskSpec):
    """Named-entity tagging on CoNLL-format files (or the Hugging Face dataset `hf_dataset`)."""

    name: str
    hf_dataset: tuple[str, ...]  # arguments of datasets.load_dataset
    tags: tuple[str, ...] = TAGS  # IOB2 tag names; the head outputs one score per tag, in this order
    objective: objectives.Objective = objectives.WORD_TAGGING
    # Entity F1 first: it picks the best checkpoint and is what phase 1's train/dev gap compares (the
    # phase key `gap_metric` may name another); `data.entity_f1` says which convention (`configure`).
    # `accuracy` (per word) is the paper's measure.
    metrics: tuple[str, ...] = ("f1", "strict_f1", "precision", "recall", "accuracy")
    data_keys: tuple[str, ...] = ("document_context", "entity_f1")
    entity_f1: str = "conlleval"  # config key data.entity_f1 (metrics.ENTITY_F1)
    beside_metrics: Mapping[str, tuple[str, ...]] = dataclasses.field(
        default_factory=lambda: {"f1": ("strict_f1",), "strict_f1": ("f1",)}
    )

    def configure(self, data_config: Mapping[str, Any]) -> "ConllTask":
        """`data.entity_f1="strict"` puts strict IOB2 F1 first (the runs recorded before conlleval's
        became the default read it: config_cli.with_legacy_keys)."""
        chosen = data_config.get("entity_f1", "conlleval")
        if chosen not in metrics.ENTITY_F1:
            raise ConfigError(
                f"config.data.entity_f1={chosen!r}: choose one of {metrics.ENTITY_F1} (conlleval: an I- "
                "tag opening an entity counts, as the field reports CoNLL-2003; strict: IOB2 as written)"
            )
        first = "f1" if chosen == "conlleval" else "strict_f1"
        ordered = (first, *(m for m in self.metrics if m != first))
        return dataclasses.replace(self, metrics=ordered, entity_f1=chosen)

    def rule_metric(self, name: str) -> str:
        # A rule's `f1` is the run's entity F1: strict IOB2 in runs recorded before conlleval's default.
        return "strict_f1" if name == "f1" and self.entity_f1 == "strict" else name

    @property
    def legacy_gap_metric(self) -> str:
        # Per-word accuracy, near 1 on NER, left the gap at most 0.011 while entity F1's was 0.04-0.085.
        return "accuracy"

    @property
    def num_outputs(self) -> int:
        return len(self.tags)

    @property
    def output_names(self) -> tuple[str, ...]:
        return self.tags

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "tag_scheme": "IOB2", "scoring": metrics.ENTITY_SCORING}

    def read_file(self, path: Path, *, config_key: str) -> list[Sentence]:
        return read_conll(path, config_key=config_key, tags=self.tags)

    def read_hub(self, split: str, *, config_key: str) -> list[Sentence]:
        return sentences_from_hf(hub_rows(self.hf_dataset, split, config_key=config_key))

    def encoding_options(self, data_config: Mapping[str, Any]) -> dict[str, Any]:
        return {"document_context": bool(data_config.get("document_context", False))}

    def encode(
        self,
        tokenizer: "PreTrainedTokenizerBase",
        examples: Sequence[Sentence],
        *,
        max_seq_length: int,
        options: Mapping[str, Any],
    ) -> batching.Dataset:
        arrays, _ = word_pieces.encode_sentences(
            tokenizer,
            examples,
            tag_ids={tag: i for i, tag in enumerate(self.tags)},
            max_seq_length=max_seq_length,
            document_context=options.get("document_context", False),
        )
        return arrays

    def is_labelled(self, examples: Sequence[Sentence]) -> bool:
        return any(sentence.tags is not None for sentence in examples)  # files: a tag on every word

    def input_layout(self, path: Path) -> str | None:
        return sniff_conll(path)

    def example_from_line(self, line: str, *, index: int, where: str) -> Sentence:
        record = json_object(line, where)
        if record is None:
            return Sentence(tuple(line.split()), None, NO_DOCUMENT, index)
        words, tags = record.get("words"), record.get("tags")
        if not isinstance(words, list) or not words or not all(isinstance(w, str) and w for w in words):
            raise DataError(f'{where}: expected a JSON object {{"words": [...], "tags": [...]}} with words')
        if tags is not None:
            if not isinstance(tags, list) or len(tags) != len(words):
                raise DataError(f"{where}: {len(words)} words need as many tags, got {tags!r}")
            tags = check_tags(tags, self.tags, where)
        return Sentence(tuple(words), tags, NO_DOCUMENT, index)

    def _sentence_tags(self, split: Split, predictions: np.ndarray) -> list[tuple[str, ...]]:
        """Tag names per sentence for the sentences whose windows all lie in the first
        `len(predictions)` rows (the whole split, or a prefix: the train subset of the gap check)."""
        arrays = split.arrays
        rows = len(predictions)
        # Windows are in sentence order: the sentences before the first row left out are complete.
        num_sentences = len(split.examples) if rows >= split.num_rows else int(arrays["sentence_index"][rows])
        rows = int(np.searchsorted(arrays["sentence_index"], num_sentences))
        prefix = {key: value[:rows] for key, value in arrays.items()}
        joined = word_pieces.join_windows(predictions[:rows], prefix, split.examples[:num_sentences])
        return [tuple(self.tags[t] for t in sentence) for sentence in joined]

    def score(self, split: Split, rows: Mapping[str, np.ndarray]) -> dict[str, float]:
        predicted = self._sentence_tags(split, rows["predictions"])
        gold = [sentence.tags for sentence in split.examples[: len(predicted)]]
        return metrics.entity_scores(gold, predicted)

    def prediction_records(self, split: Split, rows: Mapping[str, np.ndarray]) -> list[dict[str, Any]]:
        predicted = self._sentence_tags(split, rows["predictions"])
        return [
            {"key": sentence.key, "prediction": list(tags)}
            | ({"label": list(sentence.tags)} if sentence.tags is not None else {})
            for sentence, tags in zip(split.examples, predicted, strict=True)
        ]


# The Hugging Face copy of CoNLL-2003 (IOB2 tags, no document boundaries).
CONLL2003 = ConllTask(name="conll2003", hf_dataset=("eriktks/conll2003",))
