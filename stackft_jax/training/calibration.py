"""Calibration of class probabilities: expected calibration error and temperature scaling (Guo et al.
2017, "On Calibration of Modern Neural Networks").

Both work on the probabilities evaluation already returns: log-probabilities are the logits less a
per-row constant, and softmax(log p / T) = softmax(logits / T), so no logits need to be kept.
"""

import numpy as np
import scipy.optimize
import scipy.special

NUM_BINS = 15  # Guo et al.'s M


def expected_calibration_error(
    probabilities: np.ndarray, labels: np.ndarray, num_bins: int = NUM_BINS
) -> float:
    """sum over equal-width confidence bins of |bin| / n * |accuracy(bin) - mean confidence(bin)|, with
    the confidence of the predicted (top) class; bins are (k/M, (k+1)/M], the first one closed at 0."""
    probabilities = np.asarray(probabilities, np.float64)
    confidence = probabilities.max(-1)
    correct = probabilities.argmax(-1) == np.asarray(labels)
    bins = np.clip(np.ceil(confidence * num_bins).astype(int) - 1, 0, num_bins - 1)
    ece = 0.0
    for b in range(num_bins):
        members = bins == b
        if members.any():
            ece += members.mean() * abs(correct[members].mean() - confidence[members].mean())
    return float(ece)


def _log_probabilities(probabilities: np.ndarray) -> np.ndarray:
    # float32 softmax underflows to exactly 0 for hopeless classes: floor them, keeping them hopeless.
    return np.log(np.maximum(np.asarray(probabilities, np.float64), np.finfo(np.float32).tiny))


def scale(probabilities: np.ndarray, temperature: float) -> np.ndarray:
    """The probabilities with their logits divided by `temperature`."""
    return scipy.special.softmax(_log_probabilities(probabilities) / temperature, axis=-1)


def negative_log_likelihood(probabilities: np.ndarray, labels: np.ndarray) -> float:
    log_p = _log_probabilities(probabilities)
    return float(-np.mean(log_p[np.arange(len(labels)), np.asarray(labels)]))


def fit_temperature(probabilities: np.ndarray, labels: np.ndarray) -> float:
    """The temperature minimising the negative log-likelihood of `labels`, searched over log T in
    [-5, 5] (T from 0.007 to 148)."""
    log_p = _log_probabilities(probabilities)
    rows, labels = np.arange(len(labels)), np.asarray(labels)

    def nll(log_t: float) -> float:
        scaled = log_p / np.exp(log_t)
        return float(np.mean(scipy.special.logsumexp(scaled, axis=-1) - scaled[rows, labels]))

    result = scipy.optimize.minimize_scalar(
        nll, bounds=(-5.0, 5.0), method="bounded", options={"xatol": 1e-6}
    )
    return float(np.exp(result.x))


def temperature_report(dev: tuple[np.ndarray, np.ndarray], **others: tuple[np.ndarray, np.ndarray]) -> dict:
    """The temperature fitted on dev's (probabilities, labels), and ECE and NLL before and after it on
    dev and on each of `others` (e.g. test=...)."""
    temperature = fit_temperature(*dev)
    report: dict = {"temperature": temperature, "num_bins": NUM_BINS}
    for name, (probabilities, labels) in {"dev": dev, **others}.items():
        scaled = scale(probabilities, temperature)
        report[name] = {
            "ece_before": expected_calibration_error(probabilities, labels),
            "ece_after": expected_calibration_error(scaled, labels),
            "nll_before": negative_log_likelihood(probabilities, labels),
            "nll_after": negative_log_likelihood(scaled, labels),
        }
    return report
