"""Writes yahoo_train.csv / yahoo_dev.csv: a small invented Yahoo-Answers-like sample for the offline demo.

Layout of `../shared/data/yahoo_answers/`: no header, `text,topic`, the text a question title, its
details and a best answer joined with spaces; topics `society_culture` and `science_mathematics`,
balanced. Every question and answer is made here from templates and word lists, none is Yahoo text.

Learnable but not trivial: each topic has its own questions and subjects, but every answer also draws
on sentences common to both topics ("I read about this a lot", "hope this helps"), a fifth of the
questions are about subjects on the border (the history of science, the ethics of research), asked in
neutral words, with a one-sentence hint of their topic in the answer, and 5% of labels are flipped,
as askers file questions under the wrong topic. Some answers run over several lines and hold commas
and quotes, so the csv module's quoting is exercised. Deterministic: rerunning rewrites identical files.

    python tools/samples/make_yahoo_sample.py
"""

import csv
import random
from pathlib import Path

import sample_cli  # tools/samples/sample_cli.py, beside this script

SEED = 20261122
NUM_TRAIN, NUM_DEV = 400, 100
LABEL_NOISE = 0.05
BORDER_SHARE = 0.2
TOPICS = ("society_culture", "science_mathematics")

# fmt: off
SUBJECTS = {
    "society_culture": [
        "wedding traditions", "the Day of the Dead", "tipping in restaurants", "arranged marriages",
        "Ramadan fasting", "Chinese New Year", "table manners in Japan", "the caste system",
        "wearing black at funerals", "naming a baby after a grandparent", "Thanksgiving dinner",
        "saying bless you after a sneeze", "the meaning of karma", "religious holidays at work",
        "gift giving at Christmas", "bowing when greeting", "shaking hands with the left hand",
        "Halloween costumes", "the role of elders", "bridesmaid dresses",
    ],
    "science_mathematics": [
        "prime numbers", "the speed of light", "photosynthesis", "black holes", "the Pythagorean theorem",
        "compound interest", "DNA replication", "the boiling point of water", "quadratic equations",
        "plate tectonics", "the derivative of sin x", "electric current", "the periodic table",
        "probability of rolling two sixes", "the area of a circle", "gravity on the moon",
        "chemical bonds", "the half-life of carbon-14", "logarithms", "the water cycle",
    ],
}
BORDER_SUBJECTS = [
    "the history of astronomy", "the ethics of cloning", "why people believe in astrology",
    "calendars of ancient cultures", "the philosophy of mathematics", "evolution taught in schools",
    "superstitions about the number 13", "how the Maya counted", "medicine in the Middle Ages",
    "whether animals have feelings",
]
QUESTIONS = {
    "society_culture": [
        "What is the meaning behind {s}?", "Why do people still follow {s}?",
        "Is {s} considered rude in some countries?", "How did {s} start?",
        "What does your family do about {s}?", "Is it wrong to ignore {s}?",
        "Where does the custom of {s} come from?", "How do different religions see {s}?",
    ],
    "science_mathematics": [
        "How do you calculate {s}?", "Can someone explain {s} simply?", "What is the formula for {s}?",
        "Why does {s} work the way it does?", "How was {s} discovered?", "Is there a proof about {s}?",
        "What experiment shows {s}?", "Help with my homework on {s}?",
    ],
}
DETAILS = {
    "society_culture": [
        "My grandmother insists on it and my friends think it is old fashioned.",
        "We are having an argument about this at work.", "I am writing an essay for my culture class.",
        "Just moved to a new country and want to respect the locals.", "",
    ],
    "science_mathematics": [
        "I have a test tomorrow and the textbook makes no sense.",
        "Please show the steps, not only the answer.",
        "My teacher explained it but I got lost halfway.", "I tried it twice and got different numbers.", "",
    ],
}
ANSWERS = {
    "society_culture": [
        "It comes from an old tradition, and many families keep it to honour their ancestors.",
        "In most cultures it is a sign of respect; people who skip it are seen as rude, not modern.",
        "Religion played a big part: priests encouraged it, and the custom stayed after belief faded.",
        "Every community does it differently. Ask the elders, they will \"explain\" it with stories.",
        "Society changes slowly, so customs like this survive long after anyone remembers why.",
        "It is about belonging: doing what your neighbours do shows you are part of the group.",
    ],
    "science_mathematics": [
        "Write down the equation first, then solve for the unknown; the answer is about 3.14.",
        "It follows from conservation of energy, which you can check with a simple experiment.",
        "Take the derivative, set it to zero, and you get the maximum; plug the numbers back in.",
        "The molecules move faster when heated, so the pressure rises; that is the whole theory.",
        "Use the formula, keep track of the units (metres, seconds), and round at the end.",
        "Scientists measured it many times; the value is constant, within experimental error.",
    ],
}
BORDER_QUESTIONS = [
    "What do you know about {s}?", "Can anyone tell me about {s}?", "Is it true what they say about {s}?",
    "Where can I learn more about {s}?",
]
BORDER_ANSWERS = {
    "society_culture": [
        "People in that culture saw it as part of their religion and their festivals.",
        "It says more about society and its beliefs than about nature itself.",
    ],
    "science_mathematics": [
        "The calculations behind it were remarkably accurate, using simple geometry.",
        "Experiments since then have tested the idea and measured the effect.",
    ],
}
COMMON = [
    "I read about this a lot.", "Good question!", "Hope this helps.", "Many people wonder the same thing.",
    "My uncle told me about this once.", "Search online for more, there are good articles.",
    "Honestly, it depends who you ask.", "I learned this in school years ago.",
]
# fmt: on


def _answer(topic: str, border: bool, rng: random.Random) -> str:
    own = BORDER_ANSWERS[topic] if border else ANSWERS[topic]
    sentences = [rng.choice(COMMON)] + rng.sample(own, 1 if border else 2) + [rng.choice(COMMON)]
    rng.shuffle(sentences)
    if rng.random() < 0.3:  # multi-line answers, as Yahoo answers often are
        return "\n".join(sentences)
    return " ".join(sentences)


def make_rows(rng: random.Random, count: int, seen: set[str]) -> list[tuple[str, str]]:
    """`count` unique (text, topic) rows, half of each topic, shuffled."""
    rows = []
    for index in range(count):
        topic = TOPICS[index % 2]
        while True:
            border = rng.random() < BORDER_SHARE
            subject = rng.choice(BORDER_SUBJECTS if border else SUBJECTS[topic])
            # A border question's wording is neutral: only its answer leans to its topic.
            question = rng.choice(BORDER_QUESTIONS if border else QUESTIONS[topic]).format(s=subject)
            details = "" if border else rng.choice(DETAILS[topic])
            parts = [question, details, _answer(topic, border, rng)]
            text = " ".join(p for p in parts if p)
            if text not in seen:
                break
        seen.add(text)
        label = TOPICS[1 - TOPICS.index(topic)] if rng.random() < LABEL_NOISE else topic
        rows.append((text, label))
    rng.shuffle(rows)
    return rows


def write_csv(path: Path, rows: list[tuple[str, str]]) -> None:
    with path.open("w", newline="") as f:
        csv.writer(f, lineterminator="\n").writerows(rows)


def main() -> None:
    out_dir = sample_cli.out_dir(__doc__.splitlines()[0])
    rng = random.Random(SEED)
    seen: set[str] = set()
    write_csv(out_dir / "yahoo_train.csv", make_rows(rng, NUM_TRAIN, seen))
    write_csv(out_dir / "yahoo_dev.csv", make_rows(rng, NUM_DEV, seen))


if __name__ == "__main__":
    main()
