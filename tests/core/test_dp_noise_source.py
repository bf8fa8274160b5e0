"""The noise seam (vfl.core.dp_noise) in process: exact thresholds and uniform draws, the refusals
of bad probabilities and bounds, report-noisy-max's edge cases, randomized response's range."""
import math

import numpy as np
import pytest

from vfl.core.dp_noise import (
    NOT_PRIVATE,
    NoiseSource,
    SecureNoise,
    SeededNoise,
    noise_source,
    randomized_response_exact,
    threshold_u64,
)
from vfl.core.errors import InputError


@pytest.mark.parametrize("p", [-0.1, 1.5, float("nan")])
def test_a_probability_outside_0_1_is_refused(p):
    with pytest.raises(InputError, match="a probability must be in \\[0, 1\\], got"):
        threshold_u64(p)


def test_thresholds_at_the_ends_are_exact():
    assert threshold_u64(0.0) == 0 and threshold_u64(1.0) == 1 << 64
    assert threshold_u64(0.5) == (1 << 63) - (1 << 16)         # a margin below the floating point value


def test_certain_and_impossible_draws():
    noise = SeededNoise(1)
    assert noise.below(1 << 64, 5).all() and not noise.below(0, 5).any()
    assert noise.bernoulli(1.0, (2, 3)).shape == (2, 3) and noise.bernoulli(1.0, (2, 3)).all()


def test_randbelow_stays_in_range_per_draw_and_refuses_an_empty_range():
    noise = SeededNoise(7)
    n = np.array([1, 2, 3, 1000] * 500)
    got = noise.randbelow(n, n.size)
    assert got.dtype == np.int64 and np.all((got >= 0) & (got < n))
    assert np.all(got[n == 1] == 0) and set(got[n == 3].tolist()) == {0, 1, 2}
    assert noise.randbelow(5, 0).size == 0
    with pytest.raises(InputError, match="randbelow needs n >= 1"):
        noise.randbelow(np.array([3, 0]), 2)


def test_noisy_max_of_one_score_needs_no_noise_and_scores_must_be_finite():
    secure = SecureNoise()
    assert secure.noisy_max([float("nan")], 1.0) == 0        # nothing to choose: no draw, no check
    with pytest.raises(InputError, match="noisy max needs finite scores"):
        secure.noisy_max([1.0, float("inf")], 1.0)
    assert secure.noisy_max([0.0, 1e9, 0.0], 1e-3) == 1       # a margin no noise of this scale crosses


def test_randomized_response_keeps_buckets_when_it_must_and_stays_in_range():
    noise = SeededNoise(3)
    b = np.array([[0, 1], [2, 3]])
    assert randomized_response_exact(b, 4, math.inf, noise).tolist() == [0, 1, 2, 3]
    assert randomized_response_exact(b, 1, 0.1, noise).tolist() == [0, 1, 2, 3]
    out = randomized_response_exact(np.zeros(4000, np.int64), 4, 0.0, noise)
    assert set(out.tolist()) == {0, 1, 2, 3}
    kept = np.mean(out == 0)             # epsilon 0: every bucket equally likely
    assert 0.2 < kept < 0.3


def test_sources_and_their_labels():
    assert isinstance(noise_source(), SecureNoise) and noise_source().private
    seeded = noise_source(11)
    assert isinstance(seeded, SeededNoise) and not seeded.private and seeded.label().startswith(NOT_PRIVATE)
    assert "11" in seeded.label() and "OpenDP" in SecureNoise().label()


def test_a_source_lacking_a_mechanism_cannot_be_made():
    class NoGaussian(SeededNoise.__mro__[1]):       # NoiseSource
        def label(self):
            return "partial"

        def u64(self, size):
            return np.zeros(size, np.uint64)

        def laplace_counts(self, counts, scale):
            return counts

        def laplace(self, values, scale):
            return values

        def noisy_max(self, scores, scale):
            return 0

    assert NoGaussian.__mro__[1] is NoiseSource
    with pytest.raises(TypeError, match="gaussian"):
        NoGaussian()
