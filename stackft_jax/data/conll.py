"""CoNLL-2003 named-entity files: sentences of words and tags, grouped into documents.

The original files hold one `token POS chunk NER` line per word (two columns, `token NER`, are accepted
too; the tag is the last column), a blank line after each sentence and a `-DOCSTART-` line at the start
of each document. Their tags are IOB1 (an entity may start with `I-`; `B-` only separates two adjacent
entities of one type); the Hugging Face `conll2003` dataset uses IOB2 (every entity starts with `B-`).
Both are read into ONE internal scheme, IOB2, which seqeval's strict mode scores.

Documents are numbered from 0 in file order (sentences before the first `-DOCSTART-` form document 0).
The Hugging Face rows carry no document boundaries (its loader drops the `-DOCSTART-` lines): their
sentences get `NO_DOCUMENT`, and document context is unavailable for them.
"""

import dataclasses
import hashlib
import re
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from stackft_jax.data.text_files import decoded_lines

# CoNLL-2003's tags, in the order of the Hugging Face dataset's `ner_tags` class names.
TAGS = ("O", "B-PER", "I-PER", "B-ORG", "I-ORG", "B-LOC", "I-LOC", "B-MISC", "I-MISC")
DOCSTART = "-DOCSTART-"
NO_DOCUMENT = -1
_TAG = re.compile(r"O|[BI]-\S+")


@dataclasses.dataclass(frozen=True)
class Sentence:
    words: tuple[str, ...]
    tags: tuple[str, ...]  # IOB2
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


def read_conll(path: str | Path, *, config_key: str, tags: Sequence[str] = TAGS) -> list[Sentence]:
    """The file's sentences, tags converted to IOB2. A malformed line or an unknown tag is an error
    naming `file:line`."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{config_key} = {str(path)!r}: no such file")
    known = set(tags)
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
                raise ValueError(
                    f"{where}: expected `token POS chunk NER` or `token NER`, got {line.strip()!r}"
                )
            num_columns = len(fields)
        if len(fields) != num_columns:
            raise ValueError(
                f"{where}: {len(fields)} columns where the file's first token line has {num_columns}"
            )
        tag = fields[-1]
        if not _TAG.fullmatch(tag):
            raise ValueError(f"{where}: tag {tag!r} is not IOB: expected O, B-TYPE or I-TYPE")
        if tag not in known and to_iob2([tag])[0] not in known:
            raise ValueError(f"{where}: unknown tag {tag!r}; the tags are {list(tags)}")
        words.append(fields[0])
        sentence_tags.append(tag)
    end_sentence()
    if not sentences:
        raise ValueError(f"{config_key} = {str(path)!r}: the file holds no sentences")
    return sentences


def sentences_from_hf(rows: Mapping[str, Any], tag_names: Sequence[str] | None = None) -> list[Sentence]:
    """Rows of the Hugging Face `conll2003` dataset (`tokens`, integer `ner_tags`; IOB2). `tag_names`
    defaults to the class names of the dataset's `ner_tags` feature (a dict of columns must pass them).
    The dataset has no document boundaries, so document context is unavailable."""
    if tag_names is None:
        tag_names = rows.features["ner_tags"].feature.names
    unknown = [name for name in tag_names if name not in TAGS]
    if unknown:
        raise ValueError(f"the dataset's tag names {unknown} are not CoNLL-2003 tags {list(TAGS)}")
    sentences = []
    for index, (tokens, ner_tags) in enumerate(zip(rows["tokens"], rows["ner_tags"], strict=True)):
        if len(tokens) != len(ner_tags) or not all(0 <= t < len(tag_names) for t in ner_tags):
            raise ValueError(
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
