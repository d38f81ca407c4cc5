"""Writes qqp_train.tsv / qqp_dev.tsv: a small invented QQP-format sample for the offline demo.

Every question comes from a template filled with a topic word. A duplicate pair asks the same
thing (same intent, same topic) in two different wordings; a non-duplicate pair is related but
different: either the same intent about another topic ("learn Python" / "learn Java") or another
intent about the same topic ("learn Python" / "is Python worth learning"). About 37% of pairs are
duplicates, as in QQP. Deterministic: rerunning rewrites identical files.

    python tools/samples/make_qqp_sample.py
"""

import random
from pathlib import Path

import sample_cli  # tools/samples/sample_cli.py, beside this script

SEED = 20240601
NUM_TRAIN, NUM_DEV = 400, 100
POSITIVE_FRACTION = 0.37

# fmt: off
TOPICS = {
    "skill": [
        "Python", "Java", "guitar", "piano", "Spanish", "French", "machine learning",
        "photography", "chess", "calculus", "data science", "swimming", "public speaking",
        "drawing", "web development", "Japanese", "statistics", "C++",
    ],
    "city": [
        "Paris", "Tokyo", "London", "New York", "Berlin", "Mumbai", "Sydney", "Toronto",
        "Rome", "Bangalore", "Dubai", "Singapore", "Barcelona", "Seoul",
    ],
    "job": [
        "doctor", "software engineer", "pilot", "lawyer", "data scientist", "teacher", "nurse",
        "architect", "chef", "civil engineer", "journalist", "pharmacist", "actor",
    ],
    "device": [
        "laptop", "phone", "iPhone", "Android phone", "PC", "tablet", "MacBook", "smartwatch",
    ],
    "subject": [
        "World War II", "quantum physics", "economics", "psychology", "the stock market",
        "black holes", "climate change", "philosophy", "ancient Rome", "evolution",
        "artificial intelligence", "the French Revolution",
    ],
    "dish": [
        "pasta", "biryani", "pizza", "pancakes", "sushi", "fried rice", "chocolate cake",
        "bread", "curry", "ramen", "lasagna",
    ],
    "pair": [
        ("weather", "climate"), ("a virus", "bacteria"), ("Java", "JavaScript"), ("RAM", "ROM"),
        ("a CV", "a resume"), ("stocks", "bonds"), ("speed", "velocity"), ("HTML", "CSS"),
        ("socialism", "communism"), ("a crocodile", "an alligator"), ("weight", "mass"),
        ("a startup", "a small business"),
    ],
}

# intent -> (topic kind, paraphrase templates). `{x}` is the topic, `{a_x}` it with "a"/"an".
INTENTS = {
    "learn": ("skill", [
        "How do I learn {x}?",
        "What is the best way to learn {x}?",
        "How can I start learning {x} on my own?",
        "What is the fastest way to get good at {x}?",
        "How should a beginner learn {x}?",
    ]),
    "worth": ("skill", [
        "Is {x} worth learning?",
        "Is it worth learning {x} today?",
        "Should I spend my time learning {x}?",
        "Is learning {x} still useful nowadays?",
    ]),
    "hard": ("skill", [
        "How hard is it to learn {x}?",
        "Is {x} difficult to learn?",
        "How difficult is {x} for a complete beginner?",
    ]),
    "visit": ("city", [
        "What are the best places to visit in {x}?",
        "What should a tourist see in {x}?",
        "Which places in {x} are worth visiting?",
        "What are the must-see sights in {x}?",
    ]),
    "live": ("city", [
        "What is it like to live in {x}?",
        "How is life in {x}?",
        "What is daily life like for people living in {x}?",
    ]),
    "cost": ("city", [
        "How expensive is it to live in {x}?",
        "What is the cost of living in {x}?",
        "How much money do I need per month to live in {x}?",
    ]),
    "become": ("job", [
        "How do I become {a_x}?",
        "What does it take to become {a_x}?",
        "What are the steps to become {a_x}?",
        "How can someone become {a_x}?",
    ]),
    "salary": ("job", [
        "How much does {a_x} earn?",
        "What is the average salary of {a_x}?",
        "How much money does {a_x} make in a year?",
    ]),
    "slow": ("device", [
        "Why is my {x} so slow?",
        "How can I speed up my slow {x}?",
        "What can I do when my {x} becomes very slow?",
    ]),
    "battery": ("device", [
        "How can I make my {x} battery last longer?",
        "How do I improve the battery life of my {x}?",
        "What are some tips to save battery on my {x}?",
    ]),
    "books": ("subject", [
        "What are some good books about {x}?",
        "Which books would you recommend on {x}?",
        "What are the best books to read on {x}?",
    ]),
    "explain": ("subject", [
        "Can someone explain {x} in simple terms?",
        "What is the simplest explanation of {x}?",
        "How would you explain {x} to a child?",
    ]),
    "cook": ("dish", [
        "How do I make {x} at home?",
        "What is a simple recipe for {x}?",
        "How can I cook {x} at home?",
        "What is the easiest way to prepare {x} at home?",
    ]),
    "diff": ("pair", [
        "What is the difference between {a} and {b}?",
        "How is {a} different from {b}?",
        "What are the differences between {a} and {b}?",
        "How do {a} and {b} differ?",
    ]),
}
# fmt: on


def _fill(template: str, topic: str | tuple[str, str]) -> str:
    if isinstance(topic, tuple):
        return template.format(a=topic[0], b=topic[1])
    article = "an" if topic[0].lower() in "aeiou" else "a"
    return template.format(x=topic, a_x=f"{article} {topic}")


def _noisy(question: str, rng: random.Random) -> str:
    """Light Quora-style noise: some users skip capitals or the question mark."""
    r = rng.random()
    if r < 0.08:
        return question[0].lower() + question[1:]
    if r < 0.14:
        return question.rstrip("?")
    return question


def _positive(rng: random.Random) -> tuple[str, str]:
    intent = rng.choice(list(INTENTS))
    kind, templates = INTENTS[intent]
    topic = rng.choice(TOPICS[kind])
    t1, t2 = rng.sample(templates, 2)
    return _fill(t1, topic), _fill(t2, topic)


def _negative(rng: random.Random) -> tuple[str, str]:
    intent = rng.choice(list(INTENTS))
    kind, templates = INTENTS[intent]
    same_kind = [other for other in INTENTS if other != intent and INTENTS[other][0] == kind]
    if same_kind and rng.random() < 0.5:
        # Same topic, another intent.
        topic = rng.choice(TOPICS[kind])
        other_templates = INTENTS[rng.choice(same_kind)][1]
        return _fill(rng.choice(templates), topic), _fill(rng.choice(other_templates), topic)
    # Same intent, another topic.
    topic1, topic2 = rng.sample(TOPICS[kind], 2)
    return _fill(rng.choice(templates), topic1), _fill(rng.choice(templates), topic2)


def make_pairs(rng: random.Random, num_positive: int, num_negative: int) -> list[tuple]:
    """Unique (question1, question2, label) triples, shuffled."""
    seen = set()
    pairs = []
    for label, count, make in ((1, num_positive, _positive), (0, num_negative, _negative)):
        made = 0
        while made < count:
            q1, q2 = make(rng)
            if (q1, q2) in seen or (q2, q1) in seen:
                continue
            seen.add((q1, q2))
            if rng.random() < 0.5:
                q1, q2 = q2, q1
            pairs.append((_noisy(q1, rng), _noisy(q2, rng), label))
            made += 1
    rng.shuffle(pairs)
    return pairs


def write_tsv(path: Path, pairs: list[tuple], qids: dict[str, int]) -> None:
    lines = ["id\tqid1\tqid2\tquestion1\tquestion2\tis_duplicate"]
    for row_id, (q1, q2, label) in enumerate(pairs):
        ids = [qids.setdefault(q, len(qids) + 1) for q in (q1, q2)]
        lines.append(f"{row_id}\t{ids[0]}\t{ids[1]}\t{q1}\t{q2}\t{label}")
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def main() -> None:
    out_dir = sample_cli.out_dir(__doc__.splitlines()[0])
    rng = random.Random(SEED)
    total = NUM_TRAIN + NUM_DEV
    num_positive = round(POSITIVE_FRACTION * total)
    pairs = make_pairs(rng, num_positive, total - num_positive)
    # Split so both files keep the positive rate.
    positives = [p for p in pairs if p[2] == 1]
    negatives = [p for p in pairs if p[2] == 0]
    dev_positive = round(POSITIVE_FRACTION * NUM_DEV)
    dev = positives[:dev_positive] + negatives[: NUM_DEV - dev_positive]
    train = positives[dev_positive:] + negatives[NUM_DEV - dev_positive :]
    rng.shuffle(dev)
    rng.shuffle(train)
    qids: dict[str, int] = {}
    write_tsv(out_dir / "qqp_train.tsv", train, qids)
    write_tsv(out_dir / "qqp_dev.tsv", dev, qids)
    print(f"wrote {len(train)} train and {len(dev)} dev pairs to {out_dir}")


if __name__ == "__main__":
    main()
