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


def test_entity_f1_from_counts_equals_seqeval_in_both_conventions():
    gold, predicted = _random_tagging(np.random.default_rng(0), 300)
    expected = metrics.entity_scores(gold, predicted)
    records = _records(gold, predicted)
    entity_scores = ("f1", "precision", "recall", "f1_PER", "f1_LOC", "f1_ORG")
    for metric in ("accuracy", *entity_scores, *(f"strict_{name}" for name in entity_scores)):
        counts = statistics.example_counts(records, metric, tagging=True)
        assert statistics.metric_of(counts) == pytest.approx(expected[metric]), metric
    assert expected["f1"] != pytest.approx(expected["strict_f1"])  # the ill-formed I- starts count once


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


def test_sign_flip_test_by_hand_is_two_sided():
    # Three seeds, all better: of the 8 sign assignments (+,+,+) and (-,-,-) reach |observed mean|.
    assert statistics.sign_flip_test([0.01, 0.02, 0.03]) == pytest.approx(2 / 8)
    assert statistics.sign_flip_test([0.01, 0.02, 0.03], "greater") == pytest.approx(1 / 8)
    # All worse gets the same p as all better (a one-sided test gave it 1.0).
    assert statistics.sign_flip_test([-0.01, -0.02, -0.03]) == pytest.approx(2 / 8)
    # (+0.03, -0.01): means of (+,+) 0.01, (+,-) 0.02, (-,+) -0.02, (-,-) -0.01: all four reach |0.01|.
    assert statistics.sign_flip_test([0.03, -0.01]) == pytest.approx(1.0)
    # Five seeds all better: 2/32 = 0.0625, like Wilcoxon's: neither can reach 0.05 at 5 seeds.
    d = [0.01, 0.02, 0.03, 0.04, 0.05]
    assert statistics.sign_flip_test(d) == pytest.approx(statistics.smallest_p("sign_flip", 5)) == 0.0625
    assert scipy.stats.wilcoxon(d).pvalue == pytest.approx(statistics.smallest_p("wilcoxon", 5)) == 0.0625
    for sample in (np.asarray(d), np.asarray([0.03, -0.01, 0.02, -0.005, 0.01])):
        exact = scipy.stats.permutation_test(
            (sample,), np.mean, permutation_type="samples", alternative="two-sided", n_resamples=np.inf
        )
        assert statistics.sign_flip_test(sample) == pytest.approx(exact.pvalue)


def test_smallest_p_and_what_holm_lets_speak():
    assert statistics.smallest_p("wilcoxon", 5) == 0.0625
    assert statistics.smallest_p("sign_flip", 5) == 2 / 32 and statistics.smallest_p("sign_flip", 6) == 2 / 64
    assert statistics.smallest_p("bootstrap", 5, samples=1000) == 0.001
    assert not statistics.can_reach("wilcoxon", 5, family_size=1)
    assert not statistics.can_reach("sign_flip", 5, family_size=1)
    assert statistics.can_reach("sign_flip", 6, family_size=1)
    assert not statistics.can_reach("sign_flip", 6, family_size=2)  # Holm: 2 x 2/64 > 0.05
    assert statistics.can_reach("t_test", 2, family_size=12)


def test_t_interval_is_scipys_paired_t_interval():
    d = [0.0435, 0.031, 0.058, 0.049, 0.036]
    result = statistics.t_interval(d)
    n, mean, sem = len(d), np.mean(d), scipy.stats.sem(d)
    low, high = scipy.stats.t.interval(0.95, n - 1, loc=mean, scale=sem)
    assert (result["ci_low"], result["ci_high"]) == (pytest.approx(low), pytest.approx(high))
    assert result["p_value"] == pytest.approx(scipy.stats.ttest_rel(np.asarray(d) + 1, np.ones(n)).pvalue)
    # All worse: the same two-sided p as all better.
    assert statistics.t_interval([-x for x in d])["p_value"] == pytest.approx(result["p_value"])
    assert statistics.t_interval([0.01])["ci_low"] is None
    flat = statistics.t_interval([0.02, 0.02, 0.02])
    assert flat["p_value"] is None and flat["ci_low"] == flat["ci_high"] == 0.02


def test_differences_equal_but_for_rounding_have_no_spread():
    # Two seeds each 1 point ahead (accuracy over 400 items): the float differences differ in their last
    # bits. A t-test on them would give p near 0 and a zero-width interval; they have no spread.
    d = [0.9525 - 0.9425, 0.94 - 0.93]
    assert d[0] != d[1]
    result = statistics.t_interval(d)
    assert result["p_value"] is None and result["ci_low"] == result["ci_high"] == pytest.approx(0.01)
    assert statistics.tost(d, 0.005)["p_value"] is None
    assert statistics.minimum_detectable_difference(d) is None
    # A real spread, however small against the scores, is still tested.
    assert statistics.t_interval([0.0100, 0.0101])["p_value"] is not None
    assert not statistics.has_spread(np.array([1e6 + 1e-7, 1e6]))


def test_tost_backs_level_only_when_the_interval_fits_in_the_margin():
    rng = np.random.default_rng(5)
    tight = 0.001 * rng.standard_normal(5)  # within +-0.3 points, margin 1 point
    wide = 0.02 * rng.standard_normal(5)  # a mean near 0 but seeds spread by 2 points: no evidence of level
    assert statistics.tost(tight, 0.01)["equivalent"] is True
    result = statistics.tost(wide, 0.01)
    assert result["equivalent"] is False and result["p_value"] > 0.05
    # TOST at level 0.05 is equivalence exactly when the 90% t-interval lies within the margin.
    for d in (tight, wide):
        interval = statistics.t_interval(d, confidence=0.90)
        inside = -0.01 < interval["ci_low"] and interval["ci_high"] < 0.01
        assert statistics.tost(d, 0.01)["equivalent"] is inside


def test_bootstrap_reports_the_monte_carlo_error_of_its_endpoints():
    rng = np.random.default_rng(6)
    cell, baseline = (_accuracy_counts((rng.random((5, 400)) < p).astype(float)) for p in (0.75, 0.7))
    runs = [
        statistics.two_level_bootstrap(cell, baseline, accuracy, samples=2000, seed=s, mc_target=None)
        for s in range(4)
    ]
    error = runs[0]["mc_error"]
    assert 0 < error < 0.01 and runs[0]["samples"] == 2000
    lows = [r["ci95_low"] for r in runs]
    assert max(lows) - min(lows) < 6 * error  # the stated error is the spread a reader sees
    # With a target, resamples are doubled until the error meets it (or 8 times the minimum).
    targeted = statistics.two_level_bootstrap(cell, baseline, accuracy, samples=500, mc_target=error)
    assert targeted["mc_error"] <= error and 500 < targeted["samples"] <= 8 * 500


@pytest.mark.slow
def test_bootstrap_endpoints_are_stable_to_a_tenth_of_a_point():
    # The measurement behind BOOTSTRAP_SAMPLES, on the committed QQP grid's comparison whose 1,000-resample
    # lower endpoint changed sign between resampling seeds (stack-and-finetune vs finetune-only cls_mlp).
    from pathlib import Path

    from stackft_jax.config import config_cli
    from stackft_jax.experiments import grid_report

    repo = Path(__file__).resolve().parent.parent
    grid = config_cli.load(str(repo / "configs/experiments/paper_qqp.py") + ":small", [], kind="grid")
    runs = {
        (r.run.cell_name, r.run.seed): r
        for r in grid_report.load_runs(grid, repo / "docs/grids/paper_qqp_small")
    }
    ours, theirs = (
        [runs[f"strategy={s}-name=cls_mlp", k] for k in range(5)]
        for s in ("stack_and_finetune", "finetune_only")
    )
    paired = grid_report._paired_counts(ours, theirs, "dev", "accuracy")
    results = [statistics.two_level_bootstrap(*paired, seed=seed) for seed in range(3)]
    for end in ("ci95_low", "ci95_high"):
        values = [100 * r[end] for r in results]
        assert max(values) - min(values) <= 0.1, (end, values)
    assert all(100 * r["mc_error"] <= 0.05 for r in results)
    assert all(r["samples"] == statistics.BOOTSTRAP_SAMPLES for r in results)  # no doubling needed here


def test_bootstrap_p_is_never_printed_as_zero():
    assert statistics.format_p(0.0, samples=1000) == "< 1/1000"
    assert statistics.format_p(0.0125, samples=1000) == "0.013"
    assert statistics.format_p(None) == "-"


def test_the_minimum_detectable_difference_is_detected_four_times_in_five():
    # Simulated paired t-tests at 5 seeds whose true mean difference is the reported one and whose SD is
    # the differences': about 80% reject at 0.05, two-sided.
    differences = [0.010, 0.022, -0.004, 0.015, 0.006]
    detectable = statistics.minimum_detectable_difference(differences)
    sd = np.std(differences, ddof=1)
    draws = np.random.default_rng(0).normal(detectable, sd, size=(20_000, 5))
    rejected = scipy.stats.ttest_1samp(draws, 0.0, axis=1).pvalue < 0.05
    assert rejected.mean() == pytest.approx(0.8, abs=0.01)
    assert statistics.minimum_detectable_difference([0.01]) is None
    assert statistics.minimum_detectable_difference([0.01, 0.01]) is None
    # Fewer seeds, a larger detectable difference at the same spread.
    assert statistics.minimum_detectable_difference(differences[:3]) > detectable


def test_resampled_totals_equal_the_gather_exactly():
    # The bootstrap's multiplicity-and-matrix-product totals are the gathered sums to the bit for integer
    # counts (so the committed reports' intervals do not move), and the gather itself for other counts.
    rng = np.random.default_rng(3)
    seeds, examples = rng.integers(0, 4, (7, 4)), rng.integers(0, 50, (7, 4, 50))
    integer = rng.integers(0, 5, (4, 50, 3)).astype(float)
    real = rng.normal(size=(4, 50, 2))
    totals = statistics._resampled_totals((integer, real[..., :1].round()), seeds, examples)
    assert np.array_equal(totals[0], integer[seeds[..., None], examples].sum(2))
    (gathered,) = statistics._resampled_totals((real,), seeds, examples)
    assert np.array_equal(gathered, real[seeds[..., None], examples].sum(2))
