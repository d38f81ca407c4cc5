"""Writes conll_train.txt / conll_dev.txt: a small invented CoNLL-2003-format NER sample for the offline demo.

The layout is the original files': `token POS chunk NER` per line, a blank line after each sentence, a
`-DOCSTART- -X- O O` line before each document, IOB1 tags (an entity starts with `I-`; `B-` only where
an entity directly follows another of the same type). Each document is a short invented news item: an
upper-case headline, an upper-case dateline, then body sentences from templates filled with invented
people, organisations, places (some real place names) and miscellaneous names (nationalities,
events). Some templates put two entities of one type side by side (a squad list, a results line,
"Norwegian Swedish talks"), so `B-` tags occur; a few body sentences are all lower case. The POS and
chunk columns come from a small lexicon (unknown lower-case words NN, entities NNP, nationalities
JJ); stackft_jax reads only the words and NER tags. Not Reuters text. Deterministic: rerunning
rewrites identical files.

    python tools/samples/make_conll_sample.py
"""

import random
from pathlib import Path

import sample_cli  # tools/samples/sample_cli.py, beside this script

SEED = 20240602
NUM_TRAIN, NUM_DEV = 400, 100  # sentences, about: the last document may run over
LOWER_CASE_FRACTION = 0.04

# fmt: off
ENTITIES = {
    "PER": [
        "Mara Quillon", "Teodor Vasky", "Ines Barrow", "Kofi Adeyemi", "Lena Marsh", "Pavel Orlin",
        "Ruth Okafor", "Dario Fenwick", "Saoirse Dunne", "Tomas Reyl", "Amina Castell", "Hugo Brandt",
        "Yuki Tanabe", "Nils Haraldsen", "Greta Moll", "Omar Saleh", "Clara Jessop", "Iván Duarte",
        "Quillon", "Vasky", "Barrow", "Adeyemi", "Orlin", "Fenwick",
    ],
    "ORG": [
        "Veltrix Holdings", "Northgate Rovers", "Calder Bank", "Harbour Council", "Brightwater United",
        "Asterion Motors", "Pellmark", "Kestrel Airways", "Union of Port Workers", "Marrow Institute",
        "Duneside Athletic", "Orbis Telecom", "Greywell FC", "Solent Mining", "Lakeshore Insurance",
        "National Grain Board",
    ],
    "LOC": [
        "Veldhaven", "Port Aster", "Norway", "Lisbon", "Kenya", "Ostrava", "Dunmore", "Lake Halden",
        "Brazil", "Canada", "Marrakesh", "New Calder", "Finland", "Quito", "South Ferris", "Osaka",
    ],
    "MISC_ADJ": [
        "Norwegian", "Swedish", "Brazilian", "Kenyan", "Finnish", "Canadian", "Portuguese", "Japanese",
    ],
    "MISC_EVENT": [
        "Lunar Cup", "Aster Open", "Harbour Regatta", "Northern Games", "Veldhaven Marathon", "Copper Trophy",
    ],
}

HEADLINES = [
    "SOCCER - {ORG} BEAT {ORG} .",
    "{MISC_ADJ} MARKETS CLOSE HIGHER .",
    "{PER} WINS {MISC_EVENT} TITLE .",
    "{ORG} TO CUT JOBS IN {LOC} .",
    "TENNIS - {PER} THROUGH TO {MISC_EVENT} FINAL .",
    "FLOODS CLOSE ROADS IN {LOC} .",
]

BODY = [
    "{PER} scored twice as {ORG} beat {ORG} {SCORE} on {DAY} .",
    "{ORG} said on {DAY} it would buy {ORG} for {NUM} million dollars .",
    "The {MISC_ADJ} government announced new rules for {ORG} .",
    "{PER} , who joined {ORG} last year , will lead the team at the {MISC_EVENT} .",
    "Shares in {ORG} fell {NUM} percent in {LOC} trading .",
    "{PER} told reporters in {LOC} that the talks had failed .",
    "Police in {LOC} said {NUM} people were hurt in the storm .",
    "The {MISC_EVENT} will be held in {LOC} next year , organisers said .",
    "The {MISC_ADJ} {MISC_ADJ} border talks resumed in {LOC} on {DAY} .",
    "Squad : {PER} {PER} {PER} {PER} .",
    "Result : {ORG} {ORG} {SCORE} .",
    "{PER} ( {LOC} ) beat {PER} ( {LOC} ) {SCORE} {SCORE} .",
    "{ORG} {NUM} {NUM} {NUM} {NUM} .",
    "A spokesman for {ORG} declined to comment .",
    "{MISC_ADJ} fans travelled to {LOC} for the {MISC_EVENT} .",
    "Prices rose slightly on {DAY} .",
    "{PER} , the {MISC_ADJ} champion , withdrew with an injury .",
    "{ORG} and {ORG} agreed to merge their {LOC} offices .",
]

DAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]

POS = {
    "the": "DT", "a": "DT", "an": "DT", "their": "PRP$", "it": "PRP", "who": "WP", "that": "IN",
    "in": "IN", "on": "IN", "at": "IN", "for": "IN", "with": "IN", "of": "IN", "to": "TO",
    "and": "CC", "last": "JJ", "next": "JJ", "new": "JJ", "slightly": "RB", "twice": "RB", "as": "IN",
    "said": "VBD", "would": "MD", "buy": "VB", "fell": "VBD", "rose": "VBD", "told": "VBD", "had": "VBD",
    "failed": "VBN", "were": "VBD", "hurt": "VBN", "will": "MD", "be": "VB", "held": "VBN",
    "lead": "VB", "joined": "VBD", "scored": "VBD", "beat": "VBD", "announced": "VBD",
    "resumed": "VBD", "declined": "VBD", "comment": "VB", "travelled": "VBD", "withdrew": "VBD",
    "agreed": "VBD", "merge": "VB", "wins": "VBZ", "close": "VBP", "cut": "VB", "through": "IN",
    "million": "CD", "people": "NNS", "rules": "NNS", "shares": "NNS", "prices": "NNS", "fans": "NNS",
    "jobs": "NNS", "roads": "NNS", "offices": "NNS", "markets": "NNS", "floods": "NNS",
    "dollars": "NNS", "organisers": "NNS", "reporters": "NNS", "police": "NNS", "higher": "RBR",
    "result": "NN", "squad": "NN", "spokesman": "NN", "soccer": "NN", "tennis": "NN", "final": "NN",
    ",": ",", ".": ".", ":": ":", "-": ":", "(": "(", ")": ")",
}
CHUNK = {
    "DT": "NP", "PRP$": "NP", "PRP": "NP", "JJ": "NP", "NN": "NP", "NNS": "NP", "NNP": "NP", "CD": "NP",
    "WP": "NP", "VB": "VP", "VBD": "VP", "VBN": "VP", "VBP": "VP", "VBZ": "VP", "MD": "VP", "TO": "VP",
    "IN": "PP", "RB": "ADVP", "RBR": "ADVP", "CC": "O", ",": "O", ".": "O", ":": "O", "(": "O", ")": "O",
}
# fmt: on


def _tokens(part: str, rng: random.Random, used: set[str]) -> list[tuple[str, str, str]]:
    """(word, POS, entity type or "") per token of one template part: a word or a `{SLOT}`."""
    if not part.startswith("{"):
        pos = POS.get(part.lower(), "CD" if part[0].isdigit() else "NNP" if part[0].isupper() else "NN")
        return [(part, pos, "")]
    slot = part[1:-1]
    if slot in ENTITIES:
        # No entity twice in one sentence: "Norwegian Norwegian talks" reads as a typo.
        name = rng.choice([e for e in ENTITIES[slot] if e not in used])
        used.add(name)
        entity_type = "MISC" if slot.startswith("MISC") else slot
        pos = "JJ" if slot == "MISC_ADJ" else "NNP"
        return [(word, pos, entity_type) for word in name.split()]
    if slot == "SCORE":
        return [(f"{rng.randint(0, 6)}-{rng.randint(0, 6)}", "CD", "")]
    if slot == "NUM":
        return [(str(rng.randint(1, 99)), "CD", "")]
    if slot == "DAY":
        return [(rng.choice(DAYS), "NNP", "")]
    raise ValueError(f"unknown slot {part!r}")


def _sentence(template: str, rng: random.Random, upper: bool = False) -> list[str]:
    """`word POS chunk NER` lines, IOB1: an entity starts with I- unless it directly follows another
    entity of its type (then B-)."""
    lines = []
    used: set[str] = set()
    previous_type = ""
    for part in template.split():
        for i, (word, pos, entity_type) in enumerate(_tokens(part, rng, used)):
            if not entity_type:
                tag = "O"
            elif i == 0 and previous_type == entity_type:
                tag = f"B-{entity_type}"
            else:
                tag = f"I-{entity_type}"
            previous_type = entity_type
            chunk = CHUNK.get(pos, "NP")
            chunk_tag = "O" if chunk == "O" else f"I-{chunk}"
            lines.append(f"{word.upper() if upper else word} {pos} {chunk_tag} {tag}")
    return lines


def make_documents(rng: random.Random, num_sentences: int) -> list[list[list[str]]]:
    """Documents of sentences of lines, until `num_sentences` sentences are written."""
    documents = []
    total = 0
    while total < num_sentences:
        day = rng.randint(1, 28)
        sentences = [
            _sentence(rng.choice(HEADLINES), rng, upper=True),
            _sentence(f"{{LOC}} 2024-{rng.randint(1, 12):02d}-{day:02d}", rng, upper=True),
        ]
        for template in rng.sample(BODY, rng.randint(2, 6)):
            lines = _sentence(template, rng)
            if rng.random() < LOWER_CASE_FRACTION:
                lines = [line.split(" ", 1)[0].lower() + " " + line.split(" ", 1)[1] for line in lines]
            sentences.append(lines)
        documents.append(sentences)
        total += len(sentences)
    return documents


def write_conll(path: Path, documents: list[list[list[str]]]) -> None:
    out = []
    for sentences in documents:
        out += ["-DOCSTART- -X- O O", ""]
        for lines in sentences:
            out += lines + [""]
    path.write_text("\n".join(out), encoding="utf-8")


def main() -> None:
    out_dir = sample_cli.out_dir(__doc__.splitlines()[0])
    rng = random.Random(SEED)
    for name, num_sentences in (("conll_train.txt", NUM_TRAIN), ("conll_dev.txt", NUM_DEV)):
        documents = make_documents(rng, num_sentences)
        write_conll(out_dir / name, documents)
        written = sum(len(d) for d in documents)
        print(f"wrote {len(documents)} documents, {written} sentences to {out_dir / name}")


if __name__ == "__main__":
    main()
