"""CoNLL-2003 reading (IOB1 and IOB2 in, IOB2 out, documents, errors at file:line) and entity scores."""

import warnings
from pathlib import Path

import numpy as np
import pytest

from stackft_jax import metrics
from stackft_jax.data import conll

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data" / "conll2003"

# Invented sentences in the original layout, IOB1 tags: "Ada Byron" starts with I-, and two adjacent
# locations are told apart by B-LOC.
IOB1_FILE = """-DOCSTART- -X- O O

Ada NNP I-NP I-PER
Byron NNP I-NP I-PER
visited VBD I-VP O
Paris NNP I-NP I-LOC
Texas NNP I-NP B-LOC
. . O O

Zorblax NNP I-NP I-ORG
rose VBD I-VP O

-DOCSTART- -X- O O

Nothing NN I-NP O
happened VBD I-VP O
"""


def _write(tmp_path: Path, text: str | bytes, name: str = "train.txt") -> Path:
    path = tmp_path / name
    path.write_bytes(text.encode() if isinstance(text, str) else text)
    return path


def test_iob1_file_reads_as_iob2_sentences_with_documents(tmp_path):
    sentences = conll.read_conll(_write(tmp_path, IOB1_FILE), config_key="data.train_file")
    assert [s.words for s in sentences] == [
        ("Ada", "Byron", "visited", "Paris", "Texas", "."),
        ("Zorblax", "rose"),
        ("Nothing", "happened"),
    ]
    assert sentences[0].tags == ("B-PER", "I-PER", "O", "B-LOC", "B-LOC", "O")
    assert sentences[1].tags == ("B-ORG", "O")
    assert [s.document for s in sentences] == [0, 0, 1]
    assert [s.index for s in sentences] == [0, 1, 2]
    assert sentences[0].key.startswith("0-") and sentences[0].key != sentences[1].key


def test_to_iob2():
    assert conll.to_iob2(["I-PER", "I-PER", "I-ORG", "O", "I-LOC", "B-LOC", "I-LOC"]) == (
        "B-PER",
        "I-PER",
        "B-ORG",
        "O",
        "B-LOC",
        "B-LOC",
        "I-LOC",
    )
    iob2 = ("B-PER", "I-PER", "B-PER", "O", "B-MISC")
    assert conll.to_iob2(iob2) == iob2  # IOB2 passes unchanged


def test_two_column_files_and_files_without_docstart(tmp_path):
    sentences = conll.read_conll(_write(tmp_path, "Ada B-PER\nspoke O\n\nBob B-PER\n"), config_key="k")
    assert [s.tags for s in sentences] == [("B-PER", "O"), ("B-PER",)]
    assert [s.document for s in sentences] == [0, 0]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "Ada NNP I-NP I-PER\nBob NNP I-PER\n",
            r"train.txt:2: 3 columns where the file's first token line has 4",
        ),
        ("Ada NNP I-NP PER\n", r"train.txt:1: tag 'PER' is not IOB"),
        ("Ada NNP I-NP B-PERSON\n", r"train.txt:1: unknown tag 'B-PERSON'"),
        ("Ada\n", r"train.txt:1: expected `token POS chunk NER` or `token NER`"),
        ("-DOCSTART- -X- O O\n\n", r"data.train_file = '.*train.txt': the file holds no sentences"),
    ],
)
def test_malformed_files_name_file_and_line(tmp_path, text, message):
    with pytest.raises(ValueError, match=message):
        conll.read_conll(_write(tmp_path, text), config_key="data.train_file")


def test_non_utf8_and_missing_files(tmp_path):
    with pytest.raises(ValueError, match=r"train.txt:2: not UTF-8 text \(byte 0xe9 at column 4\)"):
        conll.read_conll(_write(tmp_path, b"Ada NNP I-NP I-PER\nJos\xe9 x y O\n"), config_key="k")
    with pytest.raises(FileNotFoundError, match="data.dev_file = '.*nope.txt': no such file"):
        conll.read_conll(tmp_path / "nope.txt", config_key="data.dev_file")


def test_hugging_face_rows():
    rows = {"tokens": [["Ada", "spoke"], ["In", "Paris"]], "ner_tags": [[1, 0], [0, 5]]}
    with pytest.warns(UserWarning, match="no document boundaries"):
        sentences = conll.sentences_from_hf(rows, conll.TAGS)
    assert [s.tags for s in sentences] == [("B-PER", "O"), ("O", "B-LOC")]
    assert [s.document for s in sentences] == [-1, -1]


@pytest.mark.skipif(not SHARED.is_dir(), reason="the shared CoNLL-2003 files are not on this machine")
def test_the_real_files_have_the_published_counts():
    train = conll.read_conll(SHARED / "eng.train", config_key="data.train_file")
    dev = conll.read_conll(SHARED / "eng.testa", config_key="data.dev_file")
    assert (len(train), len(dev)) == (14041, 3250)
    assert (train[-1].document + 1, dev[-1].document + 1) == (946, 216)

    def entities(sentences):
        counts = {}
        for sentence in sentences:
            for tag in sentence.tags:
                if tag.startswith("B-"):
                    counts[tag[2:]] = counts.get(tag[2:], 0) + 1
        return counts

    assert entities(train) == {"PER": 6600, "ORG": 6321, "LOC": 7140, "MISC": 3438}
    assert entities(dev) == {"PER": 1842, "ORG": 1341, "LOC": 1837, "MISC": 922}


def test_entity_scores_on_hand_worked_sentences():
    gold = [["B-PER", "I-PER", "O", "B-LOC"], ["B-ORG", "O", "B-MISC", "I-MISC"]]
    predicted = [["B-PER", "I-PER", "O", "B-ORG"], ["I-ORG", "O", "B-MISC", "I-MISC"]]
    # Gold entities: PER, LOC, ORG, MISC. Predicted, strict IOB2: PER (right), ORG where LOC is (wrong),
    # MISC (right); "I-ORG" opening a sentence is no entity in strict mode. 2 right of 3 predicted, 4 gold.
    scores = metrics.entity_scores(gold, predicted)
    assert scores["precision"] == pytest.approx(2 / 3)
    assert scores["recall"] == pytest.approx(2 / 4)
    assert scores["f1"] == pytest.approx(2 * (2 / 3) * (1 / 2) / (2 / 3 + 1 / 2))
    assert scores["accuracy"] == pytest.approx(6 / 8)
    assert (scores["f1_PER"], scores["f1_MISC"], scores["f1_LOC"], scores["f1_ORG"]) == (1.0, 1.0, 0.0, 0.0)
    # conlleval-style (default) seqeval would count the leading I-ORG as an ORG entity: strict does not.
    strict_org = metrics.entity_scores([["B-ORG"]], [["I-ORG"]])
    assert strict_org["f1"] == 0.0 and strict_org["accuracy"] == 0.0


def test_entity_f1_without_entities_is_undefined():
    with pytest.warns(UserWarning, match="entity F1 is undefined"):
        scores = metrics.entity_scores([["O", "O"]], [["O", "O"]])
    assert np.isnan(scores["f1"]) and scores["accuracy"] == 1.0
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert metrics.entity_scores([["O"]], [["B-PER"]])["f1"] == 0.0
    with pytest.raises(ValueError, match="differ in number or length"):
        metrics.entity_scores([["O"]], [["O", "O"]])
