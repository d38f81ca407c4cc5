"""The report's statistics on arrays: metrics from per-example counts equal the task metrics, the two-level
bootstrap sees seed-to-seed variance, the exact sign-flip test and each test's smallest p by hand."""

import numpy as np
import pytest
import scipy.stats

from stackft_jax.data import metrics
from stackft_jax.experiments import statistics

TAGS = ["O", "B-PER", "I-PER", "B-LOC", "I-LOC", "B-ORG"]


def _random_tagging(rng, sentences: int) -> tuple[list[list[str]], list[list[str]]]:
    gold, predicted = [], []
    for _ in range(sentences):
        length = int(rng.integers(1, 9))
        g = list(rng.choice(TAGS, size=length, p=[0.6, 0.1, 0.1, 0.08, 0.07, 0.05]))
        # Mostly right, sometimes another tag (ill-formed I- tags included: strict mode drops them).
        p = [t if rng.random() < 0.8 else str(rng.choice(TAGS)) for t in g]
        gold.append(g)
        predicted.append(p)
    return gold, predicted


def _records(gold, predicted):
    return [
        {"key": str(i), "label": g, "prediction": p}
        for i, (g, p) in enumerate(zip(gold, predicted, strict=True))
    ]


def test_entity_f1_from_counts_equals_seqeval_strict():
    gold, predicted = _random_tagging(np.random.default_rng(0), 300)
    expected = metrics.entity_scores(gold, predicted)
    records = _records(gold, predicted)
    for metric in ("f1", "precision", "recall", "accuracy", "f1_PER", "f1_LOC", "f1_ORG"):
        counts = statistics.example_counts(records, metric, tagging=True)
        assert statistics.metric_of(counts) == pytest.approx(expected[metric]), metric


@pytest.mark.parametrize("metric", ["accuracy", "f1", "macro_f1"])
def test_classification_metrics_from_counts(metric):
    rng = np.random.default_rng(1)
    labels = rng.integers(0, 3 if metric == "macro_f1" else 2, 200)
    predicted = np.where(
        rng.random(200) < 0.7, labels, rng.integers(0, 3 if metric == "macro_f1" else 2, 200)
    )
    num_classes = 3 if metric == "macro_f1" else 2
    records = [{"key": str(i), "label": int(y), "prediction": int(p), "probabilities": [0.0] * num_classes}
               for i, (y, p) in enumerate(zip(labels, predicted, strict=True))]  # fmt: skip
    counts = statistics.example_counts(records, metric, tagging=False)
    assert statistics.metric_of(counts) == pytest.approx(metrics.METRICS[metric](predicted, labels))


def test_pearson_from_sums_and_spearman_has_no_counts():
    rng = np.random.default_rng(2)
    y = rng.normal(size=100)
    x = y + rng.normal(size=100)
    records = [
        {"key": str(i), "label": float(a), "prediction": float(b)}
        for i, (a, b) in enumerate(zip(y, x, strict=True))
    ]
    assert statistics.metric_of(
        statistics.example_counts(records, "pearson", tagging=False)
    ) == pytest.approx(metrics.pearson(x, y))
    assert statistics.example_counts(records, "spearman", tagging=False) is None


def _accuracy_counts(correct: np.ndarray) -> np.ndarray:
    return np.stack([correct, np.ones_like(correct)], -1).astype(float)


def accuracy(totals):
    return totals[..., 0] / totals[..., 1]


def test_two_level_bootstrap_covers_seed_variance():
    # Per seed the cell is far better or far worse than the baseline (+40 / -36 points), each on 500
    # examples: resampling examples alone would call the mean (+1.6) certain; resampling seeds too cannot.
    rng = np.random.default_rng(3)
    baseline = (rng.random((5, 500)) < 0.5).astype(float)
    cell = baseline.copy()
    for seed, flip in enumerate([0.4, -0.36, 0.4, -0.36, 0.0]):
        rows = rng.permutation(500)[: int(abs(flip) * 500)]
        cell[seed, rows] = 1.0 if flip > 0 else 0.0
        baseline[seed, rows] = 0.0 if flip > 0 else 1.0
    result = statistics.two_level_bootstrap(_accuracy_counts(cell), _accuracy_counts(baseline), accuracy)
    per_seed = cell.mean(1) - baseline.mean(1)
    assert result["difference"] == pytest.approx(per_seed.mean())
    assert result["ci95_low"] < 0 < result["ci95_high"] and result["p_value"] > 0.2
    one_level = statistics.two_level_bootstrap(
        _accuracy_counts(cell.reshape(1, -1)), _accuracy_counts(baseline.reshape(1, -1)), accuracy
    )
    assert one_level["ci95_high"] - one_level["ci95_low"] < (result["ci95_high"] - result["ci95_low"]) / 4


def test_two_level_bootstrap_draws_all_its_samples_at_grid_size():
    # 5 seeds x 3,000 examples, chunked in memory (its speed is a benchmark's, not a unit test's).
    rng = np.random.default_rng(4)
    cell, baseline = (_accuracy_counts((rng.random((5, 3000)) < 0.7).astype(float)) for _ in range(2))
    result = statistics.two_level_bootstrap(cell, baseline, accuracy)
    assert result["samples"] == statistics.BOOTSTRAP_SAMPLES


def test_sign_flip_test_by_hand():
    # Three seeds, all better: of the 8 sign assignments only (+,+,+) reaches the observed mean.
    assert statistics.sign_flip_test([0.01, 0.02, 0.03]) == pytest.approx(1 / 8)
    assert statistics.sign_flip_test([0.01, 0.02, 0.03], "two-sided") == pytest.approx(2 / 8)
    # (+0.03, -0.01): means of (+,+) 0.01, (+,-) 0.02, (-,+) -0.02, (-,-) -0.01; >= 0.01: two of four.
    assert statistics.sign_flip_test([0.03, -0.01]) == pytest.approx(2 / 4)
    # Five seeds all better: 1/32, below 0.05, where Wilcoxon's two-sided 2/32 cannot go.
    d = [0.01, 0.02, 0.03, 0.04, 0.05]
    assert statistics.sign_flip_test(d) == pytest.approx(1 / 32) and 1 / 32 < 0.05
    assert scipy.stats.wilcoxon(d).pvalue == pytest.approx(statistics.smallest_p("wilcoxon", 5)) == 0.0625
    exact = scipy.stats.permutation_test(
        (np.asarray(d),), np.mean, permutation_type="samples", alternative="greater", n_resamples=np.inf
    )
    assert statistics.sign_flip_test(d) == pytest.approx(exact.pvalue)


def test_smallest_p_and_what_holm_lets_speak():
    assert statistics.smallest_p("wilcoxon", 5) == 0.0625
    assert statistics.smallest_p("sign_flip", 5) == 1 / 32
    assert statistics.smallest_p("bootstrap", 5, samples=1000) == 0.001
    assert not statistics.can_reach("wilcoxon", 5, family_size=1)
    assert statistics.can_reach("sign_flip", 5, family_size=1)
    assert not statistics.can_reach("sign_flip", 5, family_size=2)  # Holm: 2 x 1/32 > 0.05
    assert statistics.can_reach("t_test", 2, family_size=12)


def test_bootstrap_p_is_never_printed_as_zero():
    assert statistics.format_p(0.0, samples=1000) == "< 1/1000"
    assert statistics.format_p(0.0125, samples=1000) == "0.013"
    assert statistics.format_p(None) == "-"
