"""DP-only mode (FederBoost-style): equal-frequency buckets, randomized response, accounting.

Core module: no party wiring here (see ``parties/dp.py`` for the messages'
handlers on each side).

The mechanism
-------------
For each of its features a passive party cuts its aligned training rows into
``q <= max_bin`` buckets of (near) equal size with :class:`vfl.core.binning.Binner`
-- the very bins HE and plain modes use, so every mode sees the same
buckets: quantile cut points, tied values never split, and a feature with at
most ``q`` distinct values gets one bucket per value. Missing values (NaN)
form one more bucket, the last one.

Every row's bucket index then goes through ``q``-ary randomized response
(:func:`randomized_response`): it stays with probability

    p = e^eps / (e^eps + k - 1)

and otherwise moves to one of the ``k - 1`` other buckets uniformly at random,
where ``k`` is the size of the randomization domain: the ``q`` value buckets,
plus the missing bucket when the feature has missing values in the training
rows. So missingness is protected like any value: a missing row can be
reported in a value bucket and vice versa. A feature without missing values
has no missing bucket in its domain (none is ever reported). ``eps = inf``
means ``p = 1``: no noise, the utility ceiling of the bucketing alone.

Accounting
----------
Each released (row, feature) bucket index is ``eps``-locally differentially
private for that row (given the bucketing). A party's features compose, so
the per-row privacy loss of one party's whole release is the sum over its
features: :func:`epsilon_budget` splits a per-party total evenly over the
party's features, or multiplies a per-feature value by the feature count.
The bucketing itself (cut points, the number of buckets, whether a feature
has a missing bucket) is computed from the party's data and is not
randomized; the cut points never leave the party, the bucket counts do (as in
HE mode).

:class:`BucketSource` is the active party's view of one passive party's
release: a plaintext histogram source over the noisy buckets, so the same
:class:`vfl.core.boosting.Booster` grows the trees locally without talking to the
passive party except to register the split points it chooses (the passive
party keeps their thresholds, for prediction).
"""
from __future__ import annotations

import math
from typing import Callable

import numpy as np

from datasets.errors import InputError
from vfl.core.binning import bin_dtype
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
def randomized_response(buckets, n_buckets: int, epsilon: float, rng: np.random.Generator) -> np.ndarray:
    """``q``-ary randomized response on bucket indices in ``[0, q)``.

    Each index stays with probability :func:`stay_probability` and otherwise
    becomes one of the other ``q - 1`` indices uniformly at random.
    """
    q = check_n_buckets(n_buckets)
    eps = check_epsilon(epsilon)
    b = np.asarray(buckets)
    if b.size and (not np.issubdtype(b.dtype, np.integer) or b.min() < 0 or b.max() >= q):
        raise InputError(f"bucket indices must be integers in [0, {q}), got values in "
                         f"[{b.min()}, {b.max()}] of dtype {b.dtype}")
    b = b.astype(np.int64)
    if eps == INF:
        return b.copy()
    p = stay_probability(eps, q)
    move = rng.random(b.shape) >= p
    other = rng.integers(0, q - 1, size=b.shape)       # uniform over the q-1 other buckets:
    other = other + (other >= b)                       # skip the row's own bucket
    return np.where(move, other, b)


def release_buckets(bucket_idx: np.ndarray, n_bins: np.ndarray, epsilon_per_feature: float,
                    rng: np.random.Generator, has_missing=None) -> tuple[np.ndarray, np.ndarray]:
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
        out[:, j] = col if k < 2 else randomized_response(col, k, eps, rng)
    return out, domain


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
