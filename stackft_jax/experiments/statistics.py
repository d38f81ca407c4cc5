"""Statistics on arrays for the grid report (report.py): the reported metric from per-example
counts, the seed-level t-interval (the primary interval: it holds its 95% at 3-5 seeds, where a
percentile bootstrap over so few seeds covers about 76-83%, simulated with normal differences), an
equivalence test (TOST), a two-level paired bootstrap with its Monte-Carlo error, an exact two-sided
sign-flip test over seeds, and each test's smallest p. Every test is two-sided.

Per-example counts make every resample a sum: a metric is a function of count totals (accuracy: correct
and total; binary F1: true positives, predicted and gold positives; entity F1, conlleval's or strict IOB2:
the same per sentence, from seqeval's own entity extraction; Pearson r: its sufficient sums). So the bootstrap
recomputes the metric the table reports, not a proxy, and stays vectorised numpy.
"""

import dataclasses
import itertools
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import scipy.stats

from stackft_jax.data.metrics import STRICT_PREFIX

# Measured on the committed QQP grid (stack-and-finetune vs finetune-only cls_mlp, 5 seeds x 3,000 pairs;
# tests/test_statistics.py::test_bootstrap_endpoints_are_stable_to_a_tenth_of_a_point): at 1,000
# resamples the endpoints moved by up to 0.10 point between resampling seeds (MC error 0.04-0.07) and the
# lower one changed sign; at 5,000 the MC error is about 0.025 point; 10,000 (0.017) costs twice the time.
# A wider interval (a noisy cell) has a larger error at the same count: resamples are doubled until the
# error is at most 0.05 point (endpoints stable to about 0.1, two errors), up to 8 times the minimum.
BOOTSTRAP_SAMPLES = 5_000
BOOTSTRAP_MC_TARGET = 0.0005  # 0.05 point of a 0-1 metric
BOOTSTRAP_MAX_FACTOR = 8
SEED_TESTS = ("t_test", "wilcoxon", "sign_flip")  # the report's tests over seeds, each Holm-corrected
EQUIVALENCE_MARGIN = 0.01  # TOST's default margin, in the metric's units (1 point): grid key
_GATHERED = 4_000_000  # counts gathered per bootstrap chunk [resamples, seeds, examples, k]: ~32 MB
_MAX_EXACT_SEEDS = 20  # 2^20 sign vectors


@dataclasses.dataclass(frozen=True)
class Counts:
    """Per-example counts [examples, k] and the metric of their totals [..., k] -> [...]."""

    counts: np.ndarray
    metric: Callable[[np.ndarray], np.ndarray]


def _ratio(numerator: np.ndarray, denominator: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(denominator > 0, numerator / np.where(denominator > 0, denominator, 1), np.nan)


def _f1(totals: np.ndarray) -> np.ndarray:
    """[..., (true positives, predicted, gold)] -> F1 = 2 tp / (predicted + gold); NaN without gold."""
    tp, predicted, gold = totals[..., 0], totals[..., 1], totals[..., 2]
    return np.where(gold > 0, _ratio(2 * tp, predicted + gold), np.nan)


def _pearson(totals: np.ndarray) -> np.ndarray:
    n, sx, sy, sxx, syy, sxy = np.moveaxis(totals, -1, 0)
    covariance = n * sxy - sx * sy
    with np.errstate(invalid="ignore"):
        return _ratio(covariance, np.sqrt(np.maximum(n * sxx - sx**2, 0) * np.maximum(n * syy - sy**2, 0)))


def _macro_f1(num_classes: int) -> Callable[[np.ndarray], np.ndarray]:
    """Mean F1 over the classes that occur in labels or predictions (sklearn's macro F1)."""

    def metric(totals: np.ndarray) -> np.ndarray:
        per_class = totals.reshape(*totals.shape[:-1], num_classes, 3)
        tp, predicted, gold = per_class[..., 0], per_class[..., 1], per_class[..., 2]
        present = (predicted + gold) > 0
        f1 = np.where(present, _ratio(2 * tp, predicted + gold), 0.0)
        return f1.sum(-1) / present.sum(-1)

    return metric


def entity_counts(
    gold: Sequence[Sequence[str]], predicted: Sequence[Sequence[str]], *, strict: bool = False
) -> dict[str, np.ndarray]:
    """Per sentence [sentences, 3]: (exactly matched, predicted, gold) entities, overall ("") and per
    entity type, under conlleval's extraction (seqeval's default mode: an `I-` tag opening an entity
    counts) or, `strict`, seqeval's strict IOB2 extraction; their totals give metrics.entity_scores' F1
    (`f1` and `strict_f1`)."""
    from seqeval.metrics.sequence_labeling import get_entities
    from seqeval.scheme import IOB2, Entities

    if strict:
        gold_entities = [
            [e.to_tuple()[1:] for e in s] for s in Entities([list(s) for s in gold], IOB2).entities
        ]
        predicted_entities = [
            [e.to_tuple()[1:] for e in s] for s in Entities([list(s) for s in predicted], IOB2).entities
        ]
    else:  # (type, start, end) per sentence
        gold_entities = [get_entities(list(s)) for s in gold]
        predicted_entities = [get_entities(list(s)) for s in predicted]
    types = sorted({e[0] for sentence in gold_entities + predicted_entities for e in sentence})
    counts = {t: np.zeros((len(gold), 3)) for t in ["", *types]}
    for i, (g, p) in enumerate(zip(gold_entities, predicted_entities, strict=True)):
        g, p = set(g), set(p)
        for t in counts:
            gt, pt = ({e for e in s if not t or e[0] == t} for s in (g, p))
            counts[t][i] = (len(gt & pt), len(pt), len(gt))
    return counts


def example_counts(records: Sequence[Mapping[str, Any]], metric: str, *, tagging: bool) -> Counts | None:
    """The per-example counts of `metric` (a key of results.json's `final.dev`) for one run's prediction
    records (`tagging`: a word-tagging task's, a tag per word); None for a metric that is no function of
    sums (spearman, loss)."""
    first = records[0]
    if tagging:
        if metric == "accuracy":
            counts = [[sum(p == g for p, g in zip(r["prediction"], r["label"], strict=True)), len(r["label"])]
                      for r in records]  # fmt: skip
            return Counts(np.asarray(counts, float), lambda t: _ratio(t[..., 0], t[..., 1]))
        strict = metric.startswith(STRICT_PREFIX)
        name = metric.removeprefix(STRICT_PREFIX)
        if name in ("f1", "precision", "recall") or name.startswith("f1_"):
            entity_type = name[3:] if name.startswith("f1_") else ""
            gold, predicted = [r["label"] for r in records], [r["prediction"] for r in records]
            by_type = entity_counts(gold, predicted, strict=strict)
            counts = by_type.get(entity_type, np.zeros((len(records), 3)))
            if name == "precision":
                return Counts(counts, lambda t: _ratio(t[..., 0], t[..., 1]))
            if name == "recall":
                return Counts(counts, lambda t: _ratio(t[..., 0], t[..., 2]))
            return Counts(counts, _f1)
        return None
    predicted = np.asarray([r["prediction"] for r in records], float)
    labels = np.asarray([r["label"] for r in records], float)
    if metric == "accuracy":
        return Counts(np.stack([predicted == labels, np.ones_like(labels)], 1).astype(float),
                      lambda t: _ratio(t[..., 0], t[..., 1]))  # fmt: skip
    if metric == "f1":
        positive, gold = predicted == 1, labels == 1
        return Counts(np.stack([positive & gold, positive, gold], 1).astype(float), _f1)
    if metric == "macro_f1":
        num_classes = len(first["probabilities"]) if "probabilities" in first else int(labels.max()) + 1
        classes = np.arange(num_classes)
        p, g = predicted[:, None] == classes, labels[:, None] == classes
        counts = np.stack([p & g, p, g], -1).reshape(len(records), 3 * num_classes).astype(float)
        return Counts(counts, _macro_f1(num_classes))
    if metric == "pearson":
        x, y = predicted, labels
        return Counts(np.stack([np.ones_like(x), x, y, x * x, y * y, x * y], 1), _pearson)
    return None


def metric_of(counts: Counts) -> float:
    return float(counts.metric(counts.counts.sum(0)))


def _resampled_totals(
    sides: tuple[np.ndarray, ...], seeds: np.ndarray, examples: np.ndarray
) -> list[np.ndarray]:
    """Each side's counts [seeds, examples, k] summed over each resample's examples of its resampled
    seeds: [resamples, seeds, k], as `counts[seeds[..., None], examples].sum(2)`. Integer counts (every
    metric but Pearson's sums) go through each example's multiplicity, shared by the sides, and one
    matrix product per seed: the same totals, exactly (integer sums in float64), several times faster
    than gathering [resamples, seeds, examples, k]."""
    if not all(np.array_equal(counts, np.round(counts)) for counts in sides):
        return [counts[seeds[..., None], examples].sum(2) for counts in sides]
    size, num_seeds = seeds.shape
    num_examples = sides[0].shape[1]
    offsets = np.arange(size * num_seeds)[:, None] * num_examples
    multiplicity = np.bincount((offsets + examples.reshape(size * num_seeds, -1)).ravel(),
                               minlength=size * num_seeds * num_examples)  # fmt: skip
    multiplicity = multiplicity.reshape(size * num_seeds, num_examples).astype(float)
    by_source = [(source, seeds.ravel() == source) for source in range(sides[0].shape[0])]
    totals = []
    for counts in sides:
        summed = np.empty((size * num_seeds, counts.shape[2]))
        for source, rows in by_source:
            summed[rows] = multiplicity[rows] @ counts[source]
        totals.append(summed.reshape(size, num_seeds, -1))
    return totals


def two_level_bootstrap(
    cell: np.ndarray,
    baseline: np.ndarray,
    metric: Callable[[np.ndarray], np.ndarray],
    *,
    samples: int = BOOTSTRAP_SAMPLES,
    seed: int = 0,
    mc_target: float | None = BOOTSTRAP_MC_TARGET,
) -> dict[str, float]:
    """The paired difference in `metric` (cell - baseline, mean over seeds) with a 95% percentile interval
    and a two-sided p, from resamples of seeds and then, within each resampled seed, of its examples (the
    same examples for both sides of the pair): the interval covers seed-to-seed and example variance.
    `cell`, `baseline`: per-example counts [seeds, examples, k], paired by seed and example. At least
    `samples` resamples, doubled (up to BOOTSTRAP_MAX_FACTOR times) while an endpoint's Monte-Carlo error
    is above `mc_target`: a wide interval needs more resamples to be as stable as a narrow one. A p of 0
    means no resample reached 0: report it as < 1/samples."""
    num_seeds, num_examples, k = cell.shape
    chunk = max(1, _GATHERED // (num_seeds * num_examples * k))
    rng = np.random.default_rng(seed)
    differences: list[np.ndarray] = []

    def draw(count: int) -> None:
        for start in range(0, count, chunk):
            size = min(chunk, count - start)
            seeds = rng.integers(0, num_seeds, size=(size, num_seeds))
            examples = rng.integers(0, num_examples, size=(size, num_seeds, num_examples))
            ours, theirs = _resampled_totals((cell, baseline), seeds, examples)  # [size, seeds, k] each
            differences.append(np.nanmean(metric(ours) - metric(theirs), axis=1))

    def endpoint_error(resampled: np.ndarray) -> float:
        # How far the endpoints would move with other resamples: the larger of their Monte-Carlo errors.
        return max(quantile_mc_error(resampled, 0.025), quantile_mc_error(resampled, 0.975))

    draw(samples)
    resampled = np.concatenate(differences)
    while (
        mc_target is not None
        and endpoint_error(resampled) > mc_target
        and len(resampled) < BOOTSTRAP_MAX_FACTOR * samples
    ):
        draw(len(resampled))
        resampled = np.concatenate(differences)
    observed = float(np.mean(metric(cell.sum(1)) - metric(baseline.sum(1))))
    p = 2 * min(np.mean(resampled <= 0), np.mean(resampled >= 0))
    low, high = np.nanpercentile(resampled, [2.5, 97.5])
    return {"difference": observed, "ci95_low": float(low), "ci95_high": float(high),
            "p_value": float(min(p, 1.0)), "samples": len(resampled),
            "mc_error": endpoint_error(resampled)}  # fmt: skip


def quantile_mc_error(resampled: np.ndarray, q: float) -> float:
    """The Monte-Carlo standard error of the `q` quantile of `resampled` (its B draws): half the spread
    between the order statistics one binomial standard deviation, sqrt(B q (1-q)), below and above
    rank B q, the distribution-free estimate that needs no density of the resampled differences."""
    x = np.sort(resampled[np.isfinite(resampled)])
    b = len(x)
    if b < 2:
        return math.nan
    j = math.sqrt(b * q * (1 - q))
    below, above = max(0, math.floor(b * q - j)), min(b - 1, math.ceil(b * q + j))
    return float((x[above] - x[below]) / 2)


def has_spread(differences: np.ndarray) -> bool:
    """Whether the per-seed differences vary by more than float rounding. Differences of scores that are
    equal in exact arithmetic (0.9525 - 0.9425 and 0.94 - 0.93) differ in their last bits, which a t-test
    would read as an exact, infinitely narrow effect (p near 0): such differences have no spread."""
    return len(differences) > 0 and float(np.ptp(differences)) > 1e-12 * max(
        1.0, float(np.abs(differences).max())
    )


def t_interval(differences: Sequence[float], confidence: float = 0.95) -> dict[str, float | None]:
    """The paired seed-level t-interval of the mean difference and its two-sided p (scipy.stats): the
    report's primary interval. None where it is undefined (one seed; p also with no spread, the interval
    then the point)."""
    d = np.asarray(differences, float)
    mean = float(d.mean())
    if len(d) < 2:
        return {"mean": mean, "ci_low": None, "ci_high": None, "p_value": None, "df": None}
    if not has_spread(d):
        return {"mean": mean, "ci_low": mean, "ci_high": mean, "p_value": None, "df": len(d) - 1}
    result = scipy.stats.ttest_1samp(d, 0.0, alternative="two-sided")
    interval = result.confidence_interval(confidence)
    return {"mean": mean, "ci_low": float(interval.low), "ci_high": float(interval.high),
            "p_value": float(result.pvalue), "df": len(d) - 1}  # fmt: skip


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm's step-down correction of a family of p values (statsmodels), in their order; [] for none."""
    from statsmodels.stats.multitest import multipletests

    return [float(p) for p in multipletests(list(p_values), method="holm")[1]] if p_values else []


def tost(differences: Sequence[float], margin: float) -> dict[str, float | bool | None]:
    """Two one-sided t-tests over seeds (statsmodels' ttost_paired) that the mean difference lies within
    (-margin, +margin): p < 0.05 backs "equivalent within the margin"; a large p is no evidence of a
    difference, only of too few seeds or too wide a spread. None where undefined (under two seeds, no
    spread)."""
    from statsmodels.stats.weightstats import ttost_paired

    d = np.asarray(differences, float)
    if len(d) < 2 or not has_spread(d):
        return {"margin": margin, "p_value": None, "equivalent": None}
    p = float(ttost_paired(d, np.zeros_like(d), -margin, margin)[0])
    return {"margin": margin, "p_value": p, "equivalent": p < 0.05}


def minimum_detectable_difference(
    differences: Sequence[float], *, alpha: float = 0.05, power: float = 0.8
) -> float | None:
    """The smallest true mean difference a two-sided paired t-test at `alpha` detects with probability
    `power`, at these differences' seed count and standard deviation (statsmodels' TTestPower, the
    noncentral t): what a table of n seeds could have shown. None under two seeds or with no spread."""
    from statsmodels.stats.power import TTestPower

    d = np.asarray(differences, float)
    if len(d) < 2 or not has_spread(d):
        return None
    effect = TTestPower().solve_power(nobs=len(d), alpha=alpha, power=power, alternative="two-sided")
    return float(effect * d.std(ddof=1))


def sign_flip_test(differences: Sequence[float], alternative: str = "two-sided") -> float:
    """Exact paired permutation test over seeds: the share of the 2^n sign assignments of the per-seed
    differences whose mean is at least the observed one (`greater`: the cell better), or at least as
    far from 0 (`two-sided`). Its smallest p is 1/2^n (greater) or 2/2^n (two-sided)."""
    d = np.asarray(differences, float)
    if len(d) > _MAX_EXACT_SEEDS:
        raise ValueError(f"an exact sign-flip test over {len(d)} seeds enumerates 2^{len(d)} assignments")
    signs = np.asarray(list(itertools.product((1.0, -1.0), repeat=len(d))))
    means = signs @ d / len(d)
    observed, tolerance = d.mean(), 1e-12 * max(1.0, float(np.abs(d).max()))
    if alternative == "greater":
        return float(np.mean(means >= observed - tolerance))
    if alternative == "two-sided":
        return float(np.mean(np.abs(means) >= abs(observed) - tolerance))
    raise ValueError(f"alternative={alternative!r}: choose greater or two-sided")


def smallest_p(test: str, n: int, *, samples: int = BOOTSTRAP_SAMPLES) -> float:
    """The smallest p `test` can give at `n` seeds, every one two-sided: exact Wilcoxon and sign flip
    2/2^n (0.0625 at 5 seeds: neither can reach 0.05 below 6), bootstrap 1/samples (reported as
    < 1/samples), paired t-test and TOST 0 (continuous)."""
    if test in ("t_test", "tost"):
        return 0.0
    if test in ("wilcoxon", "sign_flip"):
        return 2 / 2**n
    if test == "bootstrap":
        return 1 / samples
    raise ValueError(f"unknown test {test!r}")


def can_reach(
    test: str, n: int, family_size: int, *, alpha: float = 0.05, samples: int = BOOTSTRAP_SAMPLES
) -> bool:
    """Whether `test` at `n` seeds can reject at `alpha` after Holm over `family_size` tests: its
    smallest p times the family size must reach alpha (Holm's first step)."""
    return smallest_p(test, n, samples=samples) * family_size <= alpha


def format_p(p: float | None, samples: int | None = None) -> str:
    """A p value for the table; a bootstrap p of 0 is `< 1/samples`, never 0."""
    if p is None or (isinstance(p, float) and math.isnan(p)):
        return "-"
    if samples is not None and p < 1 / samples:
        return f"< 1/{samples}"
    return f"{p:.3f}"
