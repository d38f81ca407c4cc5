"""CoNLL-2003 reading (IOB1 and IOB2 in, IOB2 out, documents, errors at file:line) and entity scores."""

import hashlib
import warnings
from pathlib import Path

import datasets
import numpy as np
import pytest
import seqeval.metrics

from stackft_jax.data import conll, metrics
from stackft_jax.data.samples import sample_path

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data" / "conll2003"
FIXTURES = Path(__file__).parent / "fixtures" / "conll"


def _write(tmp_path: Path, text: str | bytes, name: str = "train.txt") -> Path:
    path = tmp_path / name
    path.write_bytes(text.encode() if isinstance(text, str) else text)
    return path


# tests/fixtures/conll/iob1.txt and iob2.txt hold the same invented sentences, tagged IOB1 (entities
# start with I-; B- only between adjacent entities of one type) and IOB2. Worked out by hand:
FIXTURE_WORDS = [
    ("Ada", "Quillon", "joined", "Veltrix", "Holdings", "in", "Port", "Aster", "."),
    ("Squad", ":", "Mara", "Vasky", "Teodor", "Barrow", "Orlin", "."),
    ("Kestrel", "Airways", "Lisbon", "flights", "resumed", "."),
    ("Norwegian", "Swedish", "talks"),
]
FIXTURE_IOB2 = [
    ("B-PER", "I-PER", "O", "B-ORG", "I-ORG", "O", "B-LOC", "I-LOC", "O"),
    ("O", "O", "B-PER", "I-PER", "B-PER", "I-PER", "B-PER", "O"),  # three people side by side
    ("B-ORG", "I-ORG", "B-LOC", "O", "O", "O"),  # IOB1 I-LOC right after I-ORG starts an entity
    ("B-MISC", "B-MISC", "O"),
]


@pytest.mark.parametrize("scheme", ["iob1", "iob2"])
def test_both_tag_schemes_read_as_the_same_iob2_sentences(scheme):
    sentences = conll.read_conll(FIXTURES / f"{scheme}.txt", config_key="data.train_file")
    assert [s.words for s in sentences] == FIXTURE_WORDS
    assert [s.tags for s in sentences] == FIXTURE_IOB2
    assert [s.document for s in sentences] == [0, 0, 1, 1]
    assert [s.index for s in sentences] == [0, 1, 2, 3]
    digest = hashlib.sha256("\x00".join(FIXTURE_WORDS[2]).encode()).hexdigest()[:8]
    assert sentences[2].key == f"2-{digest}"
    assert len({s.key for s in sentences}) == 4


def test_sentences_before_the_first_docstart_form_document_zero(tmp_path):
    text = "Ada I-PER\n\n-DOCSTART- O\n\n-DOCSTART- O\n\nBob I-PER\n\nCarl I-PER\n-DOCSTART- O\nDan I-PER\n"
    sentences = conll.read_conll(_write(tmp_path, text), config_key="k")
    # An empty document (two -DOCSTART- in a row) takes no number; -DOCSTART- also ends a sentence.
    assert [(s.words, s.document) for s in sentences] == [
        (("Ada",), 0),
        (("Bob",), 1),
        (("Carl",), 1),
        (("Dan",), 2),
    ]


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
        ("Ada NNP I-NP I-PER\n\nBob NNP I-NP I-per\n", r"train.txt:3: unknown tag 'I-per'"),
        ("Ada NNP I-NP B-\n", r"train.txt:1: tag 'B-' is not IOB"),
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


# The columns and feature types of the Hugging Face `conll2003` dataset, with two invented rows.
HF_FEATURES = datasets.Features(
    {
        "id": datasets.Value("string"),
        "tokens": datasets.Sequence(datasets.Value("string")),
        "pos_tags": datasets.Sequence(datasets.ClassLabel(names=["NNP", "VBD", "IN", "."])),
        "chunk_tags": datasets.Sequence(datasets.ClassLabel(names=["O", "B-NP", "B-VP", "B-PP"])),
        "ner_tags": datasets.Sequence(datasets.ClassLabel(names=list(conll.TAGS))),
    }
)


def test_hugging_face_rows_take_tag_names_from_the_features():
    rows = datasets.Dataset.from_dict(
        {
            "id": ["0", "1"],
            "tokens": [["Ada", "Quillon", "spoke"], ["In", "Port", "Aster", "."]],
            "pos_tags": [[0, 0, 1], [2, 0, 0, 3]],
            "chunk_tags": [[1, 1, 2], [3, 1, 1, 0]],
            "ner_tags": [[1, 2, 0], [0, 5, 6, 0]],
        },
        features=HF_FEATURES,
    )
    with pytest.warns(UserWarning, match="no document boundaries"):
        sentences = conll.sentences_from_hf(rows)
    assert [s.words for s in sentences] == [("Ada", "Quillon", "spoke"), ("In", "Port", "Aster", ".")]
    assert [s.tags for s in sentences] == [("B-PER", "I-PER", "O"), ("O", "B-LOC", "I-LOC", "O")]
    assert [s.document for s in sentences] == [conll.NO_DOCUMENT] * 2
    assert [s.index for s in sentences] == [0, 1]


def test_hugging_face_columns_are_read_by_tag_name_not_id():
    # Another class order: ids mean what `tag_names` says; an I- opening an entity still becomes B-.
    names = ["I-LOC", "O", "I-PER", "B-PER"]
    rows = {"tokens": [["Ada", "Quillon", "in", "Aster"]], "ner_tags": [[3, 2, 1, 0]]}
    with pytest.warns(UserWarning):
        sentences = conll.sentences_from_hf(rows, names)
    assert sentences[0].tags == ("B-PER", "I-PER", "O", "B-LOC")
    with pytest.raises(ValueError, match=r"dataset row 0: 2 tokens with ner_tags \[0, 4\]; .* \[0, 4\)"):
        conll.sentences_from_hf({"tokens": [["a", "b"]], "ner_tags": [[0, 4]]}, names)
    with pytest.raises(ValueError, match=r"dataset row 0: 2 tokens with ner_tags \[-1, 0\]"):
        conll.sentences_from_hf({"tokens": [["a", "b"]], "ner_tags": [[-1, 0]]}, names)
    with pytest.raises(ValueError, match=r"dataset row 0: 2 tokens with ner_tags \[0\]"):
        conll.sentences_from_hf({"tokens": [["a", "b"]], "ner_tags": [[0]]}, names)
    with pytest.raises(ValueError, match=r"tag names \['B-PERSON'\] are not CoNLL-2003 tags"):
        conll.sentences_from_hf({"tokens": [], "ner_tags": []}, ["O", "B-PERSON"])


def test_packaged_sample_is_iob1_with_every_entity_type():
    train = conll.read_conll(sample_path("conll_train.txt"), config_key="data.train_file")
    dev = conll.read_conll(sample_path("conll_dev.txt"), config_key="data.dev_file")
    assert (len(train), len(dev)) == (402, 101)
    assert (train[-1].document + 1, dev[-1].document + 1) == (71, 18)
    for sentences in (train, dev):
        assert {tag[2:] for s in sentences for tag in s.tags if tag != "O"} == {"PER", "ORG", "LOC", "MISC"}
    raw_tags = [line.split()[-1] for line in sample_path("conll_train.txt").read_text().splitlines() if line]
    # IOB1: B- only between adjacent same-type entities, so far fewer B- tags than entities.
    assert (
        0 < sum(t.startswith("B-") for t in raw_tags) < sum(t.startswith("B-") for s in train for t in s.tags)
    )
    assert any(s.words[0].isupper() and len(s.words[0]) > 1 for s in train)  # upper-case headlines
    assert any(s.words[0].islower() and s.tags[0] != "O" for s in train)  # lower-cased sentences


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
    assert scores["strict_precision"] == pytest.approx(2 / 3)
    assert scores["strict_recall"] == pytest.approx(2 / 4)
    assert scores["strict_f1"] == pytest.approx(2 * (2 / 3) * (1 / 2) / (2 / 3 + 1 / 2))
    assert scores["accuracy"] == pytest.approx(6 / 8)
    strict_by_type = [scores[f"strict_f1_{t}"] for t in ("PER", "MISC", "LOC", "ORG")]
    assert strict_by_type == [1.0, 1.0, 0.0, 0.0]
    # conlleval's convention (the primary `f1`): the leading I-ORG opens an ORG entity, which matches the
    # gold ORG: 3 right of 4 predicted, 4 gold; ORG's F1 is 2/3 (1 right, 2 predicted, 1 gold).
    assert scores["precision"] == pytest.approx(3 / 4) and scores["recall"] == pytest.approx(3 / 4)
    assert scores["f1"] == pytest.approx(3 / 4)
    assert [scores[f"f1_{t}"] for t in ("PER", "MISC", "LOC", "ORG")] == [1.0, 1.0, 0.0, pytest.approx(2 / 3)]
    assert scores["f1"] == pytest.approx(seqeval.metrics.f1_score(gold, predicted))
    # The minimal case: conlleval counts an I- start, strict does not.
    lone_i = metrics.entity_scores([["B-ORG"]], [["I-ORG"]])
    assert (lone_i["f1"], lone_i["strict_f1"], lone_i["accuracy"]) == (1.0, 0.0, 0.0)


def test_the_two_entity_f1s_agree_on_well_formed_sequences():
    # Well-formed IOB2 on both sides (every entity opens with B-; I- continues its own type): the two
    # conventions extract the same entities, so every score agrees.
    gold = [["B-PER", "I-PER", "O", "B-LOC", "B-LOC"], ["O", "B-ORG", "I-ORG", "I-ORG", "O"]]
    predicted = [["B-PER", "I-PER", "O", "B-LOC", "O"], ["O", "B-ORG", "I-ORG", "O", "B-MISC"]]
    scores = metrics.entity_scores(gold, predicted)
    for name in ("f1", "precision", "recall", "f1_PER", "f1_LOC", "f1_ORG"):
        assert scores[name] == scores[f"strict_{name}"], name
    # PER and the first LOC right; the short ORG and the MISC wrong: 2 right, 4 predicted, 4 gold.
    assert scores["f1"] == pytest.approx(0.5) and scores["f1_PER"] == 1.0 and scores["f1_ORG"] == 0.0


def test_entity_recall_and_f1_without_gold_entities_are_undefined():
    with pytest.warns(UserWarning, match="recall and F1 are undefined"):
        scores = metrics.entity_scores([["O", "O"]], [["O", "O"]])
    assert np.isnan(scores["f1"]) and np.isnan(scores["recall"]) and np.isnan(scores["precision"])
    assert scores["accuracy"] == 1.0
    # A false alarm where the gold has none: precision 0, recall and F1 still undefined.
    with pytest.warns(UserWarning, match="recall and F1 are undefined"):
        false_alarm = metrics.entity_scores([["O"]], [["B-PER"]])
    assert false_alarm["precision"] == 0.0 and np.isnan(false_alarm["f1"]) and np.isnan(false_alarm["f1_PER"])
    # A type the gold lacks gets NaN; the others are scored, and no warning is given.
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        mixed = metrics.entity_scores([["B-LOC", "O"]], [["B-LOC", "B-PER"]])
    assert (mixed["precision"], mixed["recall"], mixed["f1_LOC"]) == (0.5, 1.0, 1.0)
    assert np.isnan(mixed["f1_PER"])
    with pytest.raises(ValueError, match="differ in number or length"):
        metrics.entity_scores([["O"]], [["O", "O"]])
