"""The histogram kernel: per-node, per-(feature, bin) sums of packed gradients.

Contract (the hot path; one function, one contract)::

    histogram(values, bin_idx, node_rows, bin_offsets, modulus=None) -> list[list]

* ``values``: one packed value per sample (``n_samples``). With ``modulus`` set
  they are raw Paillier ciphertexts (gmpy2 ``mpz``) and "sum" means the
  homomorphic addition, multiplication modulo ``modulus = n**2``; without it
  they are plaintext ints and "sum" is integer addition (``plain`` mode).
* ``bin_idx``: ``(n_samples, n_features)`` integer bin of every sample.
* ``node_rows``: one array of sample indices per node to build.
* ``bin_offsets``: ``(n_features + 1,)``; feature ``feature_idx`` owns the flat
  slots ``bin_offsets[feature_idx]:bin_offsets[feature_idx + 1]``.

Returns, per node, a list of ``bin_offsets[-1]`` sums; an empty bin holds the
identity (``1`` for ciphertexts, the encryption of zero with ``r = 1``; ``0``
in plaintext). :func:`reference_histogram` is the naive plaintext oracle.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np


def histogram(values: Sequence, bin_idx: np.ndarray, node_rows: Sequence[np.ndarray],
              bin_offsets: np.ndarray, modulus=None) -> list[list]:
    bin_idx = np.asarray(bin_idx)
    offsets = np.asarray(bin_offsets, dtype=np.int64)
    n_features = bin_idx.shape[1]
    total = int(offsets[-1])
    out = []
    for rows in node_rows:
        rows = np.asarray(rows, dtype=np.int64)
        vals = [values[r] for r in rows.tolist()]
        if modulus is None:
            acc = [0] * total
            for f in range(n_features):
                for v, slot in zip(vals, (bin_idx[rows, f].astype(np.int64) + offsets[f]).tolist()):
                    acc[slot] += v
        else:
            acc = [1] * total
            m = modulus
            for f in range(n_features):
                for v, slot in zip(vals, (bin_idx[rows, f].astype(np.int64) + offsets[f]).tolist()):
                    acc[slot] = acc[slot] * v % m
        out.append(acc)
    return out


def reference_histogram(plain_values: Sequence[int], bin_idx: np.ndarray,
                        node_rows: Sequence[np.ndarray], bin_offsets: np.ndarray) -> list[list[int]]:
    """Naive plaintext oracle: sum of ``plain_values`` per node, feature and bin."""
    bin_idx = np.asarray(bin_idx)
    out = []
    for rows in node_rows:
        rows = set(int(r) for r in rows)
        sums = []
        for feature_idx in range(bin_idx.shape[1]):
            n_bins = int(bin_offsets[feature_idx + 1] - bin_offsets[feature_idx])
            for b in range(n_bins):
                sums.append(sum(int(plain_values[r]) for r in rows if int(bin_idx[r, feature_idx]) == b))
        out.append(sums)
    return out
