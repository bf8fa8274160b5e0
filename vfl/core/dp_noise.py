"""Where every DP mechanism's randomness comes from: the mechanism seam (issue 23).

Two sources, one interface:

* :class:`SecureNoise` (the default, always for a real release): uniform bits from the operating
  system's cryptographic generator (``os.urandom``) for randomized response and Poisson sampling,
  and OpenDP (``opendp``, the ``[dp]`` extra) for Laplace, Gaussian and selection: discrete Laplace
  on integer counts, OpenDP's float-safe Laplace / Gaussian (noise sampled exactly on a grid, no
  Mironov-style gaps in the low bits) and report-noisy-max (exponential noise, exact arithmetic).
  OpenDP's samplers draw from a cryptographically secure generator. No seed reaches any of them.
* :class:`SeededNoise`: numpy's PCG64 from a seed, **NOT PRIVATE** (anyone who knows the seed can
  invert the noise). Only for reproducible tests and experiments, asked for explicitly
  (``dp_unsafe_noise_seed``); every output made with it says ``NOT PRIVATE``.

Randomized response is sampled with integer thresholds so its realized probabilities never exceed
the claimed ratio: a row keeps its bucket when a uniform 64-bit integer is below
``floor(p * 2^64)`` (so the realized ``p' <= p``), and otherwise moves to one of the ``k - 1`` other
buckets drawn exactly uniformly (rejection sampling); the realized ratio ``p' / ((1 - p') / (k - 1))``
is then at most ``e^eps``.

OpenDP marks its mechanisms as ``contrib`` (vetted by the OpenDP team's proofs, not yet by an
external audit); :func:`opendp` enables that feature on first use: the measurements used here
(``make_laplace``, ``make_gaussian``, ``make_noisy_max``) all carry proofs in OpenDP's repository.
"""
from __future__ import annotations

import abc
import math
import os

import numpy as np

from datasets.errors import InputError

NOT_PRIVATE = "NOT PRIVATE"
_TWO64 = 1 << 64


def opendp():
    """``opendp.prelude`` with the ``contrib`` feature on (the ``[dp]`` extra), imported on use."""
    try:
        import opendp.prelude as dp
    except ImportError:     # pragma: no cover - the extra is installed in CI
        raise InputError("DP noise (Laplace, Gaussian, noisy max) needs OpenDP: pip install 'vfl-boost[dp]'") from None
    dp.enable_features("contrib")
    return dp


def threshold_u64(p: float) -> int:
    """``floor(p * 2^64)`` as an exact integer (never above ``p * 2^64``): ``u < T`` for a uniform
    64-bit ``u`` happens with probability at most ``p``."""
    if not 0.0 <= p <= 1.0:
        raise InputError(f"a probability must be in [0, 1], got {p!r}")
    num, den = float(p).as_integer_ratio()
    t = min((num << 64) // den, _TWO64)
    # p itself was computed in floating point (a few ulps from the true value): keep a margin of
    # 2^-48 below it so the realized probability never exceeds the exact one
    return t if t in (0, _TWO64) else max(t - (1 << 16), 0)


def _float_noise(values, scale: float, make: str, metric: str) -> np.ndarray:
    """OpenDP's float-safe ``make`` (``make_laplace`` under ``l1_distance``, ``make_gaussian`` under
    ``l2_distance``) of ``scale`` on every value of ``values`` (no NaN), in their shape."""
    dp = opendp()
    v = np.asarray(values, dtype=np.float64)
    meas = getattr(dp.m, make)(dp.vector_domain(dp.atom_domain(T=float, nan=False)), getattr(dp, metric)(T=float),
                               float(scale))
    return np.asarray(meas([float(x) for x in v.ravel()]), dtype=np.float64).reshape(v.shape)


class NoiseSource(abc.ABC):
    """The interface every DP mechanism draws through (a source lacking a method cannot be made)."""

    private = True

    @abc.abstractmethod
    def label(self) -> str:
        """What the noise comes from, as the model files and reports state it."""

    # -- uniform bits ----------------------------------------------------------------------------
    @abc.abstractmethod
    def u64(self, size: int) -> np.ndarray:
        """``size`` uniform 64-bit integers."""

    def below(self, threshold: int, size: int) -> np.ndarray:
        """``size`` Bernoulli draws of probability ``threshold / 2^64``."""
        if threshold >= _TWO64:
            return np.ones(size, dtype=bool)
        return self.u64(size) < np.uint64(threshold)

    def bernoulli(self, p: float, shape) -> np.ndarray:
        n = int(np.prod(shape))
        return self.below(threshold_u64(p), n).reshape(shape)

    def randbelow(self, n, size: int) -> np.ndarray:
        """``size`` integers, each exactly uniform in ``[0, n_i)`` (``n``: an int or one per draw)."""
        n = np.broadcast_to(np.asarray(n, dtype=np.uint64), (size,)).copy()
        if size and int(n.min()) < 1:
            raise InputError("randbelow needs n >= 1")
        # reject u >= limit, the largest multiple of n not above 2^64, then u mod n is uniform
        limit = (np.uint64(_TWO64 - 1) // n) * n      # (2^64 - 1) // n * n: multiple of n, <= 2^64 - 1
        out = np.empty(size, dtype=np.uint64)
        todo = np.arange(size)
        while todo.size:
            u = self.u64(todo.size)
            ok = u < limit[todo]
            out[todo[ok]] = u[ok] % n[todo[ok]]
            todo = todo[~ok]
        return out.astype(np.int64)

    # -- noise (OpenDP in SecureNoise) ---------------------------------------------------------------
    @abc.abstractmethod
    def laplace_counts(self, counts, scale: float) -> np.ndarray:
        """Integer counts plus discrete Laplace noise of ``scale``."""

    @abc.abstractmethod
    def laplace(self, values, scale: float) -> np.ndarray:
        """Values plus Laplace noise of ``scale``."""

    @abc.abstractmethod
    def gaussian(self, values, scale: float) -> np.ndarray:
        """Values plus Gaussian noise of standard deviation ``scale``."""

    @abc.abstractmethod
    def noisy_max(self, scores, scale: float) -> int:
        """Report-noisy-max: argmax of ``scores`` plus noise of ``scale``; ``epsilon = 2 Delta / scale``
        for scores of sensitivity ``Delta`` (the exponential mechanism's guarantee)."""


class SecureNoise(NoiseSource):
    """Cryptographic randomness: ``os.urandom`` bits and OpenDP's mechanisms. No seed."""

    def label(self) -> str:
        return "os.urandom + OpenDP (cryptographically secure)"

    def u64(self, size: int) -> np.ndarray:
        return np.frombuffer(os.urandom(8 * int(size)), dtype=np.uint64).copy()

    def laplace_counts(self, counts, scale: float) -> np.ndarray:
        """Discrete Laplace (two-sided geometric) noise on integer counts."""
        dp = opendp()
        c = np.asarray(counts, dtype=np.int64)
        meas = dp.m.make_laplace(dp.vector_domain(dp.atom_domain(T=int)), dp.l1_distance(T=int), float(scale))
        return np.asarray(meas([int(v) for v in c.ravel()]), dtype=np.int64).reshape(c.shape)

    def laplace(self, values, scale: float) -> np.ndarray:
        return _float_noise(values, scale, "make_laplace", "l1_distance")

    def gaussian(self, values, scale: float) -> np.ndarray:
        return _float_noise(values, scale, "make_gaussian", "l2_distance")

    def noisy_max(self, scores, scale: float) -> int:
        dp = opendp()
        s = np.asarray(scores, dtype=np.float64)
        if s.size == 1:
            return 0
        if not np.all(np.isfinite(s)):
            raise InputError("noisy max needs finite scores")
        meas = dp.m.make_noisy_max(dp.vector_domain(dp.atom_domain(T=float, nan=False)), dp.linf_distance(T=float),
                                   dp.max_divergence(), float(scale))
        return int(meas([float(x) for x in s]))


class SeededNoise(NoiseSource):
    """numpy PCG64 from ``seed``: reproducible and **NOT PRIVATE** (tests and experiments only)."""

    private = False

    def __init__(self, seed):
        self.seed = seed
        self.rng = np.random.default_rng(seed)

    def label(self) -> str:
        return f"{NOT_PRIVATE}: numpy PCG64 seeded with {self.seed!r} (dp_unsafe_noise_seed)"

    def u64(self, size: int) -> np.ndarray:
        return self.rng.integers(0, _TWO64, size=int(size), dtype=np.uint64)

    def laplace_counts(self, counts, scale: float) -> np.ndarray:
        c = np.asarray(counts, dtype=np.int64)
        return c + np.rint(self.rng.laplace(0.0, scale, size=c.shape)).astype(np.int64)

    def laplace(self, values, scale: float) -> np.ndarray:
        v = np.asarray(values, dtype=np.float64)
        return v + self.rng.laplace(0.0, scale, size=v.shape)

    def gaussian(self, values, scale: float) -> np.ndarray:
        v = np.asarray(values, dtype=np.float64)
        return v + self.rng.normal(0.0, scale, size=v.shape)

    def noisy_max(self, scores, scale: float) -> int:
        s = np.asarray(scores, dtype=np.float64)
        return int(np.argmax(s + self.rng.exponential(scale, size=s.size)))


def noise_source(unsafe_seed=None) -> NoiseSource:
    """:class:`SecureNoise`, or with ``unsafe_seed`` the :class:`SeededNoise` that is NOT PRIVATE."""
    return SecureNoise() if unsafe_seed is None else SeededNoise(unsafe_seed)


def randomized_response_exact(buckets: np.ndarray, k: int, epsilon: float, noise: NoiseSource) -> np.ndarray:
    """``k``-ary randomized response of integer ``buckets`` in ``[0, k)``: keep with probability
    ``p' = floor(p 2^64) / 2^64 <= p = e^eps / (e^eps + k - 1)``, else one of the other ``k - 1``
    uniformly (exact). The realized ratio ``p' (k - 1) / (1 - p')`` is at most ``e^eps``."""
    b = np.asarray(buckets, dtype=np.int64).ravel()
    if math.isinf(epsilon) or k < 2:
        return b.copy()
    p = 1.0 / (1.0 + (k - 1) * math.exp(-epsilon))
    keep = noise.below(threshold_u64(p), b.size)
    other = noise.randbelow(k - 1, b.size)
    other = other + (other >= b)
    return np.where(keep, b, other)
