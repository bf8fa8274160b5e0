"""DP-only mode (FederBoost-style): a data-independent bucketing, randomized response, accounting.

Core module: no party wiring here (see ``parties/dp.py`` for the messages'
handlers on each side).

The mechanism (issue 23)
------------------------
Each passive party's release domain (:class:`ReleaseDomain`) comes from public
information or a charged DP step, never from the raw data: per feature the
user's public bins (bounds or edges, ``--dp-bins``), else a DP histogram
(:func:`dp_histogram`, discrete Laplace, change-one-row sensitivity 2) whose
quantiles place the edges; the slot counts the active party is told come from
``max_bin`` or the public edges, the number of buckets ``q`` from epsilon. The
missing slot is always the last and always in the randomization domain (unless
the public schema says the column is never missing).

Every row's bucket index then goes through ``k``-ary randomized response
(:func:`randomized_response`, exact integer sampling from ``os.urandom``, see
:mod:`vfl.core.dp_noise`): it stays with probability

    p = e^eps / (e^eps + k - 1)

and otherwise moves to one of the ``k - 1`` other buckets uniformly at random,
``k = q + 1``. ``eps = inf`` means ``p = 1``: no noise (and no claim; the
training bins are then used as they are).

Accounting
----------
Each released (row, feature) bucket index is ``eps``-DP for that row (change
one row's values; its id and the alignment are public). A party's features
compose: the per-row loss of one party's release is the sum over its released
features, plus what its edges' DP histograms spent (``EDGE_SHARE`` of the
party's budget by default). :func:`epsilon_budget` splits a per-party total
evenly over the party's features, or multiplies a per-feature value by the
feature count.

:class:`BucketSource` is the active party's view of one passive party's
release: a plaintext histogram source over the noisy buckets, so the same
:class:`vfl.core.boosting.Booster` grows the trees locally without talking to the
passive party except to register the split points it chooses (the passive
party keeps their thresholds, release edges, for prediction).
"""
from __future__ import annotations

import math
from typing import Callable

import numpy as np

from datasets.errors import InputError
from vfl.core.binning import bin_dtype, check_max_bin
from vfl.core.dp_bins import dp_bounds
from vfl.core.dp_bins_file import _symexp, _symlog
from vfl.core.dp_noise import NoiseSource, randomized_response_exact
from vfl.core.params import check_epsilon  # (the privacy parameter check lives with the other parameters)
from vfl.core.sources import LocalSource, SplitRef

INF = float("inf")


# --- parameters ----------------------------------------------------------------
def check_n_buckets(n_buckets, name: str = "n_buckets (q)") -> int:
    if isinstance(n_buckets, bool) or not isinstance(n_buckets, (int, np.integer)) or n_buckets < 2:
        raise InputError(f"{name} must be an integer >= 2, got {n_buckets!r}")
    return int(n_buckets)


def stay_probability(epsilon: float, n_buckets: int) -> float:
    """``p = e^eps / (e^eps + q - 1)``: the probability that randomized response keeps a bucket."""
    eps = check_epsilon(epsilon)
    q = check_n_buckets(n_buckets)
    if eps == INF:
        return 1.0
    # 1 / (1 + (q-1) e^-eps): no overflow for large eps
    return 1.0 / (1.0 + (q - 1) * math.exp(-eps))


def json_epsilon(eps: float):
    """JSON-safe epsilon: ``inf`` becomes the string ``"inf"`` (JSON has no infinity)."""
    return "inf" if eps == INF else float(eps)


# --- the mechanism -------------------------------------------------------------
def randomized_response(buckets, n_buckets: int, epsilon: float, noise: NoiseSource) -> np.ndarray:
    """``q``-ary randomized response on bucket indices in ``[0, q)``.

    Each index stays with probability (at most) :func:`stay_probability` and otherwise becomes
    one of the other ``q - 1`` indices uniformly at random; the randomness comes from ``noise``
    (:class:`vfl.core.dp_noise.SecureNoise` for any real release: cryptographic, never seeded;
    see :func:`vfl.core.dp_noise.randomized_response_exact`).
    """
    q = check_n_buckets(n_buckets)
    eps = check_epsilon(epsilon)
    if not isinstance(noise, NoiseSource):
        raise InputError(f"randomized response draws from a vfl.core.dp_noise.NoiseSource, got {type(noise).__name__}")
    b = np.asarray(buckets)
    if b.size and (not np.issubdtype(b.dtype, np.integer) or b.min() < 0 or b.max() >= q):
        raise InputError(f"bucket indices must be integers in [0, {q}), got values in "
                         f"[{b.min()}, {b.max()}] of dtype {b.dtype}")
    b = b.astype(np.int64)
    if eps == INF:
        return b.copy()
    return randomized_response_exact(b, q, eps, noise).reshape(b.shape)


def release_buckets(bucket_idx: np.ndarray, n_bins: np.ndarray, epsilon_per_feature: float,
                    noise: NoiseSource, has_missing=None) -> tuple[np.ndarray, np.ndarray]:
    """Randomize every column of a party's bucket matrix; return ``(noisy, rr_domain)``.

    ``n_bins[j]`` counts column ``j``'s value buckets plus the missing slot
    (last). ``rr_domain[j]`` is the number of buckets the column's indices
    are randomized over: ``n_bins[j]`` when the column has a missing value,
    else ``n_bins[j] - 1`` (``has_missing[j]``, when given, decides instead: a release of
    some rows uses the domain of all training rows). A domain of one bucket (a constant
    column) is released as is: every row has the same index, there is nothing to hide.
    """
    eps = check_epsilon(epsilon_per_feature, "epsilon_per_feature")
    B = np.asarray(bucket_idx)
    n_bins = np.asarray(n_bins, dtype=np.int64)
    if B.ndim != 2 or B.shape[1] != len(n_bins):
        raise InputError(f"bucket matrix of shape {B.shape} does not match {len(n_bins)} features")
    out = np.empty(B.shape, dtype=bin_dtype(n_bins))
    domain = np.empty(len(n_bins), dtype=np.int32)
    for j, nb in enumerate(n_bins.tolist()):
        col = B[:, j].astype(np.int64)
        missing_slot = nb - 1
        missing = np.any(col == missing_slot) if has_missing is None else bool(has_missing[j])
        k = nb if missing else nb - 1
        domain[j] = k
        out[:, j] = col if k < 2 else randomized_response(col, k, eps, noise)
    return out, domain


# --- a data-independent release domain (issue 23) ----------------------------------
#: default share of a passive party's DP-only budget spent on the bucket edges of the features it has
#: no public bins for (one DP histogram per feature); public bins spend nothing
EDGE_SHARE = 0.1
#: cells of the fine DP histogram between a feature's DP bounds (equal width on the symmetric log scale)
FINE_CELLS = 32
#: a changed row moves between two cells of a histogram: L1 sensitivity 2 (the neighbouring relation
#: of mode dp is "one aligned row's values change", its id and the alignment being public)
HIST_SENSITIVITY = 2.0


def dp_histogram(col: np.ndarray, epsilon: float, noise: NoiseSource) -> tuple[float, float, np.ndarray]:
    """One feature's ``epsilon``-DP histogram (change-one-row neighbours): DP bounds on the symmetric
    log scale with ``epsilon / 2`` (:func:`vfl.core.dp_bins.dp_bounds`, sensitivity 2), then
    discrete-Laplace counts of ``FINE_CELLS`` equal cells between them with ``epsilon / 2`` (values
    outside count in the first or last cell; missing values in none). Returns ``(lo, hi, counts)``
    on the symmetric log scale; everything derived from it is post-processing."""
    z = _symlog(np.asarray(col, dtype=np.float64))
    z = z[~np.isnan(z)]
    lo, hi = dp_bounds(z, epsilon / 2.0, noise, HIST_SENSITIVITY)
    width = (hi - lo) / FINE_CELLS
    cell = np.clip(((np.clip(z, lo, hi) - lo) / width).astype(np.int64), 0, FINE_CELLS - 1)
    counts = np.bincount(cell, minlength=FINE_CELLS)
    noisy = noise.laplace_counts(counts, HIST_SENSITIVITY / (epsilon / 2.0))
    return float(lo), float(hi), np.maximum(noisy, 0).astype(np.float64)


def histogram_edges(lo: float, hi: float, counts: np.ndarray, n_buckets: int) -> np.ndarray:
    """``n_buckets - 1`` non-decreasing edges at the ``i / n_buckets`` quantiles of a (noisy) histogram
    of equal cells over ``[lo, hi]`` on the symmetric log scale (linear inside a cell), back on the
    raw scale; an empty histogram gives equally spaced edges. Always ``n_buckets - 1`` edges (a
    repeated edge leaves a bucket empty: the count never depends on the data)."""
    q = check_n_buckets(n_buckets)
    c = np.maximum(np.asarray(counts, dtype=np.float64), 0.0)
    width = (hi - lo) / len(c)
    total = float(c.sum())
    if total <= 0:
        z = np.linspace(lo, hi, q + 1)[1:-1]
    else:
        cum = np.concatenate([[0.0], np.cumsum(c)])
        targets = total * np.arange(1, q) / q
        i = np.clip(np.searchsorted(cum, targets, side="left") - 1, 0, len(c) - 1)
        frac = np.clip((targets - cum[i]) / np.where(c[i] > 0, c[i], 1.0), 0.0, 1.0)
        z = lo + width * (i + frac)
    return np.maximum.accumulate(_symexp(z))


class ReleaseDomain:
    """A passive party's buckets for mode dp, independent of its data except through a charged step.

    Per feature: the user's public bins (``public``: ``{feature index: entry}`` of
    :func:`vfl.core.dp_bins_file.check_dp_bins`; no budget), else one :func:`dp_histogram` with an even
    share of ``epsilon`` (the party's edge budget). :attr:`n_bins` (the slots the active party is
    told) is ``max_bin + 1`` per feature, or the public edges' count + 2: public schema only. A
    release in ``q`` buckets (:meth:`edges`) takes the public edges (every ``k``-th one when there are
    more than ``q - 1``), ``q - 1`` edges equally spaced between public bounds, or the DP histogram's
    ``q``-quantiles; the missing slot is always the last, present in every feature's domain unless
    the public schema says the column is never missing (:meth:`missing_slot`)."""

    def __init__(self, max_bin: int, epsilon: float, noise: NoiseSource, public: dict | None = None,
                 party: str = ""):
        self.max_bin = check_max_bin(max_bin)
        self.epsilon = check_epsilon(epsilon, "edge epsilon") if epsilon else 0.0
        self.noise = noise
        public = dict(public or {})
        self.public = {j: e for j, e in public.items() if "edges" in e or "lo" in e}     # bounds or edges
        self.never_missing = {j for j, e in public.items() if e.get("missing") is False}  # the schema says so
        self.party = party
        self.hist: dict[int, tuple] = {}
        self.n_features = 0
        self.spent = 0.0

    def fit(self, X) -> "ReleaseDomain":
        X = np.asarray(X, dtype=np.float64)
        self.n_features = X.shape[1]
        bad = [j for j in self.public if not (isinstance(j, (int, np.integer)) and 0 <= j < self.n_features)]
        if bad:
            raise InputError(f"public bins of party {self.party!r}: no feature {bad[0]!r}")
        for j, e in self.public.items():
            if "edges" in e and len(e["edges"]) > self.max_bin - 1:
                raise InputError(f"public bins of party {self.party!r}, feature {j}: {len(e['edges'])} edges make "
                                 f"more than max_bin = {self.max_bin} buckets")
        dp_features = [j for j in range(self.n_features) if j not in self.public]
        if dp_features and not self.epsilon > 0:
            raise InputError(f"party {self.party!r}: features without public bins need an edge budget > 0")
        per = self.epsilon / len(dp_features) if dp_features else 0.0
        self.hist = {j: dp_histogram(X[:, j], per, self.noise) for j in dp_features}
        self.spent = self.epsilon if dp_features else 0.0
        return self

    def missing_slot(self, j: int) -> bool:
        """Whether feature ``j``'s release randomizes over a missing slot: always, unless the public
        schema says the column is never missing (``"missing": false``; a missing value then goes to
        bucket 0, a fixed rule)."""
        return j not in self.never_missing

    def max_buckets(self, j: int) -> int:
        e = self.public.get(j)
        return len(e["edges"]) + 1 if e is not None and "edges" in e else self.max_bin

    @property
    def n_bins(self) -> np.ndarray:
        return np.array([self.max_buckets(j) + 1 for j in range(self.n_features)], dtype=np.int32)

    def edges(self, j: int, n_buckets: int) -> np.ndarray:
        """Feature ``j``'s ``q - 1`` edges for a release in ``q = n_buckets`` buckets (at most
        :meth:`max_buckets`); a value ``x <= edges[i]`` is in bucket ``i`` or lower."""
        q = min(check_n_buckets(n_buckets), self.max_buckets(j))
        e = self.public.get(j)
        if e is not None and "edges" in e:
            pub = np.asarray(e["edges"], dtype=np.float64)
            if q - 1 >= pub.size:
                return pub
            return pub[(np.arange(1, q) * (pub.size + 1)) // q - 1]      # every k-th public edge
        if e is not None:
            lo, hi = _symlog(np.float64(e["lo"])), _symlog(np.float64(e["hi"]))
            return _symexp(np.linspace(lo, hi, q + 1)[1:-1])
        return histogram_edges(*self.hist[j], q)

    def report(self) -> dict:
        """What the edges spent: ``{"epsilon", "dp_features", "public_features"}``."""
        return {"epsilon": self.spent, "dp_features": self.n_features - len(self.public),
                "public_features": len(self.public)}


def bucketize(col: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """Bucket of every value (``x <= edges[i]``: bucket ``i`` or lower); missing: the last slot."""
    col = np.asarray(col, dtype=np.float64)
    b = np.searchsorted(edges, col, side="left")
    b[np.isnan(col)] = len(edges) + 1
    return b.astype(np.int64)


# --- accounting ----------------------------------------------------------------
def epsilon_budget(n_features: dict[str, int], epsilon: float | None = None,
                   epsilon_per_feature: float | None = None) -> dict:
    """Per-party accounting of one release.

    Give exactly one of ``epsilon`` (each passive party's total, split evenly
    over its features) and ``epsilon_per_feature``. Returns
    ``{"epsilon_per_feature": {party: eps_f}, "epsilon_per_party": {party: eps_total}}``.
    """
    if (epsilon is None) == (epsilon_per_feature is None):
        raise InputError("mode 'dp' needs exactly one of epsilon (per-party total) and epsilon_per_feature")
    per_feature, per_party = {}, {}
    for party, d in n_features.items():
        if isinstance(d, bool) or not isinstance(d, (int, np.integer)) or d < 1:
            raise InputError(f"party {party!r} has {d!r} features; a release needs at least one")
        if epsilon is not None:
            total = check_epsilon(epsilon, "epsilon")
            per_feature[party], per_party[party] = total / int(d), total
        else:
            ef = check_epsilon(epsilon_per_feature, "epsilon_per_feature")
            per_feature[party], per_party[party] = ef, ef * int(d)
    return {"epsilon_per_feature": per_feature, "epsilon_per_party": per_party}


# --- the active party's view of a release --------------------------------------
# register(feature_idx, bin_idx, default_left) -> record ids (one per split), held by the owner
SplitRegistrar = Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray]


class BucketSource(LocalSource):
    """One passive party's released (noisy) buckets as a plaintext histogram source.

    Histograms and split decisions during training use the noisy bucket
    indices (all the active party has). Each chosen split is registered with
    its owner through ``register``, which returns the owner's record id: the
    owner keeps the split's true threshold and routes new rows by their true
    values at prediction time, exactly as in HE mode.
    """

    own_features = False      # a passive party's (released) features
    counts_rows = False

    def __init__(self, party: str, buckets: np.ndarray, n_bins: np.ndarray, register: SplitRegistrar):
        buckets = np.asarray(buckets)
        n_bins = np.asarray(n_bins, dtype=np.int64)
        if buckets.ndim != 2 or buckets.shape[1] != len(n_bins):
            raise InputError(f"party {party!r}: released buckets of shape {buckets.shape} do not match "
                             f"{len(n_bins)} features")
        if n_bins.size and n_bins.min() < 2:
            raise InputError(f"party {party!r}: every feature needs at least 2 bucket slots")
        if buckets.size and (buckets.min() < 0 or np.any(buckets.max(axis=0) >= n_bins)):
            raise InputError(f"party {party!r}: a released bucket index is out of range")
        self.party = party
        self.feature_names = [f"{party}:{j}" for j in range(len(n_bins))]   # names stay with the owner
        self._set_bins(buckets, n_bins)
        self.register = register

    def _refs(self, feature_idx, bin_idx, default_left) -> list[SplitRef]:
        """Register the splits with their owner, which keeps the true thresholds."""
        feature_idx = np.asarray(feature_idx, dtype=np.int32)
        record_ids = np.asarray(self.register(feature_idx, np.asarray(bin_idx, dtype=np.int32),
                                              np.asarray(default_left, dtype=bool)), dtype=np.int64)
        if record_ids.shape != feature_idx.shape:
            raise InputError(f"party {self.party!r} returned {record_ids.size} record ids "
                             f"for {feature_idx.size} splits")
        return [SplitRef(self.party, record_id=int(rid)) for rid in record_ids]
