"""Expected calibration error and temperature scaling, against hand computation and a known temperature."""

import numpy as np
import pytest
import scipy.special

from stackft_jax.training import calibration


def test_ece_by_hand():
    # Confidences 0.9, 0.6, 0.8 fall in three different bins of 15; right, wrong, right.
    probabilities = np.array([[0.9, 0.1], [0.6, 0.4], [0.2, 0.8]])
    labels = np.array([0, 1, 1])
    assert calibration.expected_calibration_error(probabilities, labels) == pytest.approx(
        (0.1 + 0.6 + 0.2) / 3
    )
    # One bin, confidence 0.75, three of four right: calibrated.
    probabilities = np.array([[0.75, 0.25]] * 4)
    assert calibration.expected_calibration_error(probabilities, np.array([0, 0, 0, 1])) == pytest.approx(0.0)
    # Bins are (k/M, (k+1)/M]: confidence 1/3 of 3 bins falls in the first, 1.0 in the last.
    assert calibration.expected_calibration_error(np.array([[1 / 3] * 3]), np.array([0]), num_bins=3) == (
        pytest.approx(2 / 3)
    )


def test_temperature_fit_recovers_a_known_overconfidence():
    rng = np.random.default_rng(0)
    true_logits = rng.normal(0, 2.0, size=(20000, 4))
    labels = np.array([rng.choice(4, p=p) for p in scipy.special.softmax(true_logits, -1)])
    overconfident = scipy.special.softmax(true_logits * 2.5, -1).astype(np.float32)  # logits 2.5x too large
    temperature = calibration.fit_temperature(overconfident, labels)
    assert temperature == pytest.approx(2.5, rel=0.05)
    report = calibration.temperature_report((overconfident, labels), test=(overconfident[:500], labels[:500]))
    assert report["dev"]["ece_after"] < report["dev"]["ece_before"] / 3
    assert report["dev"]["nll_after"] < report["dev"]["nll_before"]
    assert set(report["test"]) == {"ece_before", "ece_after", "nll_before", "nll_after"}
    np.testing.assert_allclose(calibration.scale(overconfident, temperature).sum(-1), 1.0, rtol=1e-9)


def test_probabilities_that_underflowed_to_zero_stay_finite():
    probabilities = np.array([[1.0, 0.0], [0.0, 1.0]], np.float32)
    assert np.isfinite(calibration.negative_log_likelihood(probabilities, np.array([1, 1])))
    assert np.isfinite(calibration.fit_temperature(probabilities, np.array([0, 1])))
