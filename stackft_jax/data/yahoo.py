"""Yahoo! Answers topic classification (Zhang et al. 2015's release of 10 topics): file readers and task.

Two local layouts, told apart by each file's first record (csv module: quoted fields may hold commas,
quotes and newlines):
- `text,topic`, no header (this project's `../shared/data/yahoo_answers/`): the topic is a snake_case
  name (`society_culture`, `science_mathematics`, ...: TOPICS lower-cased, `&` and spaces to `_`);
- the original release, no header: `class,title,content,answer` with class 1-10 in TOPICS order.
The Hugging Face dataset `yahoo_answers_topics` has `topic` (0-9), `question_title`,
`question_content` and `best_answer`, and no validation split.

Title, content and answer are joined with a space, skipping empty ones: the text of the `text,topic`
files was made that way, so all three sources give one model the same input. The release escapes
newlines as the two characters `\\n`; every source gets them back as newlines (whitespace to the
tokenizer) rather than the word pieces `\\` and `n`.

`data.classes` picks topics; labels are their positions in that list. Examples of other topics are
dropped (the count is logged). Keys: `line<N>` of the record's first line in a file, or `row<N>` in the
hub split, plus the text's hash.
"""

import csv
import dataclasses
import functools
import logging
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from stackft_jax.data import batching, tokenization
from stackft_jax.data.sentence_task import Example, SentenceTask
from stackft_jax.data.task_spec import example_key
from stackft_jax.data.text_files import decoded_lines
from stackft_jax.models import objectives
from stackft_jax.runtime.cli_errors import ConfigError, DataError

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

log = logging.getLogger(__name__)

TOPICS = (
    "Society & Culture",
    "Science & Mathematics",
    "Health",
    "Education & Reference",
    "Computers & Internet",
    "Sports",
    "Business & Finance",
    "Entertainment & Music",
    "Family & Relationships",
    "Politics & Government",
)
TRUNCATIONS = ("head", "head_tail")
# head_tail keeps this share of the token budget from the start and the rest from the end: Sun et al.
# 2019's best split, 128 + 382 of 510 tokens.
HEAD_FRACTION = 128 / 510


def snake_name(topic: str) -> str:
    """The name of `topic` in the `text,topic` files: "Society & Culture" -> "society_culture"."""
    return "_".join(topic.lower().replace("&", " ").split())


_BY_SNAKE_NAME = {snake_name(t): t for t in TOPICS}


def parse_classes(value: str) -> tuple[str, ...]:
    """`data.classes`: topic names joined by `+` (config values cannot hold commas), snake_case
    (`society_culture+science_mathematics`) or as in TOPICS, in label order; `all`: the ten in class
    order."""
    if value.strip().lower() == "all":
        return TOPICS
    names = [name.strip() for name in value.split("+")]
    topics = []
    for name in names:
        topic = _BY_SNAKE_NAME.get(snake_name(name))
        if topic is None:
            raise ConfigError(
                f"config.data.classes={value!r}: unknown topic {name!r}; choose from "
                f"{sorted(_BY_SNAKE_NAME)} joined by '+', or 'all'"
            )
        if topic in topics:
            raise ConfigError(f"config.data.classes={value!r}: topic {name!r} is listed twice")
        topics.append(topic)
    if len(topics) < 2:
        raise ConfigError(f"config.data.classes={value!r}: a classifier needs at least two topics")
    return tuple(topics)


def _text(*parts: str) -> str:
    return " ".join(p.strip() for p in parts if p.strip()).replace("\\n", "\n")


def _records(path: Path, config_key: str) -> Iterator[tuple[int, list[str]]]:
    """(first line number, fields) of every non-blank CSV record."""
    if not path.is_file():
        raise FileNotFoundError(f"{config_key} = {str(path)!r}: no such file")
    reader = csv.reader(decoded_lines(path))
    start = 1
    try:
        for fields in reader:
            if any(f.strip() for f in fields):
                yield start, fields
            start = reader.line_num + 1
    except csv.Error as e:
        raise DataError(f"{path}:{start}: {e}") from e


def _release_topic(value: str, where: str) -> str:
    try:
        number = int(value)
    except ValueError:
        number = 0
    if not 1 <= number <= len(TOPICS):
        raise DataError(f"{where}: class {value!r} is not a class number 1-{len(TOPICS)}")
    return TOPICS[number - 1]


def _named_topic(value: str, where: str) -> str:
    topic = _BY_SNAKE_NAME.get(value.strip())
    if topic is None:
        raise DataError(f"{where}: unknown topic {value!r}; the topics are {sorted(_BY_SNAKE_NAME)}")
    return topic


def _layout(path: Path, line: int, fields: list[str]) -> str:
    if len(fields) == 2:
        return "text,topic"
    if len(fields) == 4 and fields[0].strip().isdigit():
        return "class,title,content,answer"
    raise DataError(
        f"{path}:{line}: unrecognized Yahoo Answers layout: expected `text,topic` (a topic such as "
        f"science_mathematics) or the release's `class,title,content,answer` (class 1-{len(TOPICS)}), "
        f"got {len(fields)} fields {[f[:20] for f in fields[:4]]}"
    )


def _select(examples: list[tuple[str, str, str]], topics: Sequence[str], source: str) -> list[Example]:
    """(key, text, topic) -> Examples of the selected `topics`, labelled by position; logs the rest."""
    label_of = {topic: label for label, topic in enumerate(topics)}
    kept = [Example(text, None, label_of[topic], key) for key, text, topic in examples if topic in label_of]
    if len(kept) < len(examples):
        log.info("%s: %d examples of other topics than %s dropped", source, len(examples) - len(kept), topics)
    return kept


def sniff_yahoo(path: Path) -> str | None:
    """The layout of a file whose first record is a Yahoo Answers one (a known topic or class), else None."""
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file")
    try:
        first = next(_records(path, "--input"), None)
    except ValueError:  # not CSV (an unbalanced quote in plain text, say); bad bytes are told later
        return None
    if first is None:
        return None
    fields = first[1]
    if len(fields) == 2 and fields[1].strip() in _BY_SNAKE_NAME:
        return "text,topic"
    if len(fields) == 4 and fields[0].strip() in {str(i) for i in range(1, len(TOPICS) + 1)}:
        return "class,title,content,answer"
    return None


def read_yahoo(
    path: str | Path, *, config_key: str, topics: Sequence[str] = TOPICS, strict: bool = False
) -> list[Example]:
    """A local file in either layout (module docstring), its examples of `topics`; `strict`: an example
    of another topic is an error at its line instead of being dropped."""
    path = Path(path)
    records = _records(path, config_key)
    first = next(records, None)
    if first is None:
        raise DataError(f"{path}: file is empty")
    layout = _layout(path, *first)
    width = len(layout.split(","))
    examples = []
    for line, fields in [first, *records]:
        where = f"{path}:{line}"
        if len(fields) != width:
            raise DataError(
                f"{where}: expected {width} fields ({layout}) like the first line, got {len(fields)}"
            )
        if layout == "text,topic":
            text, topic = _text(fields[0]), _named_topic(fields[1], where)
        else:
            text, topic = _text(*fields[1:]), _release_topic(fields[0], where)
        if strict and topic not in topics:
            raise DataError(
                f"{where}: topic {snake_name(topic)!r} is not a class the model knows: "
                f"{[snake_name(t) for t in topics]}"
            )
        examples.append((example_key(f"line{line}", text), text, topic))
    kept = _select(examples, topics, str(path))
    # A topic the training file lacks would train a classifier that never predicts it (one topic left:
    # accuracy 1.0); a dev or test file may lack one, not all.
    present = {topics[e.label] for e in kept}
    absent = [snake_name(t) for t in topics if t not in present]
    if absent and (config_key == "data.train_file" or not kept):
        found = sorted({snake_name(topic) for _, _, topic in examples})
        raise DataError(
            f"config.data.classes: topic(s) {absent} have no example in {config_key} = {str(path)!r} "
            f"(its topics: {found}); choose data.classes among those"
        )
    return kept


def examples_from_hf(rows: Mapping[str, Any], *, topics: Sequence[str] = TOPICS) -> list[Example]:
    """A split of the Hugging Face `yahoo_answers_topics` dataset (a `datasets.Dataset` or a dict of
    columns), its examples of `topics`."""
    columns = (rows["question_title"], rows["question_content"], rows["best_answer"])
    examples = []
    for row, (number, *parts) in enumerate(zip(rows["topic"], *columns, strict=True)):
        if not 0 <= int(number) < len(TOPICS):
            raise DataError(f"yahoo_answers_topics row {row}: topic {number} is outside 0-{len(TOPICS) - 1}")
        text = _text(*(p or "" for p in parts))
        examples.append((example_key(f"row{row}", text), text, TOPICS[int(number)]))
    return _select(examples, topics, "yahoo_answers_topics")


@dataclasses.dataclass(frozen=True)
class YahooTask(SentenceTask):
    """A SentenceTask whose topics, held-out dev fraction and truncation come from `config.data`."""

    topics: tuple[str, ...] = TOPICS  # label order
    dev_fraction: float = 0.0
    data_keys: tuple[str, ...] = ("classes", "dev_fraction", "truncation")

    def configure(self, data_config: Mapping[str, Any]) -> "YahooTask":
        topics = parse_classes(data_config["classes"])
        fraction = data_config["dev_fraction"]
        if not 0 < fraction < 1:
            raise ConfigError(f"config.data.dev_fraction={fraction}: choose a fraction in (0, 1)")
        if data_config["truncation"] not in TRUNCATIONS:
            raise ConfigError(
                f"config.data.truncation={data_config['truncation']!r}: choose one of {TRUNCATIONS}"
            )
        return dataclasses.replace(
            self,
            topics=topics,
            num_outputs=len(topics),
            dev_fraction=fraction,
            reader=functools.partial(read_yahoo, topics=topics),
            examples_from_hf=functools.partial(examples_from_hf, topics=topics),
        )

    @property
    def output_names(self) -> tuple[str, ...]:
        return self.topics

    def read_input_file(self, path: Path) -> list[Example]:
        return read_yahoo(path, config_key="--input", topics=self.topics, strict=True)

    def clean_text(self, text: str) -> str:
        return _text(text)

    def parse_label(self, value: Any, where: str) -> int | float:
        """A topic as in TOPICS or snake_case (`science_mathematics`), or its label id."""
        if isinstance(value, str) and _BY_SNAKE_NAME.get(snake_name(value)) in self.topics:
            return self.topics.index(_BY_SNAKE_NAME[snake_name(value)])
        return super().parse_label(value, where)

    def encoding_options(self, data_config: Mapping[str, Any]) -> dict[str, Any]:
        return {"truncation": data_config["truncation"]}

    def encode(
        self,
        tokenizer: "PreTrainedTokenizerBase",
        examples: Sequence[Example],
        *,
        max_seq_length: int,
        options: Mapping[str, Any],
    ) -> batching.Dataset:
        if options.get("truncation", "head") == "head":
            return super().encode(tokenizer, examples, max_seq_length=max_seq_length, options=options)
        arrays = tokenization.encode_head_tail(
            tokenizer,
            [e.text_a for e in examples],
            max_seq_length=max_seq_length,
            head_fraction=HEAD_FRACTION,
        )
        arrays["labels"] = np.asarray([e.label for e in examples], dtype=self.label_dtype)
        return arrays


YAHOO_ANSWERS = YahooTask(
    name="yahoo_answers",
    objective=objectives.CLASSIFICATION,
    num_outputs=len(TOPICS),
    metrics=("accuracy", "macro_f1"),
    sentence_pair=False,
    label_dtype=np.int32,
    reader=read_yahoo,
    hf_dataset=("yahoo_answers_topics",),
    examples_from_hf=examples_from_hf,
    sniffer=sniff_yahoo,
)
