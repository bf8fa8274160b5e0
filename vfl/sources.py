"""Histogram sources: one party's features as the boosting loop sees them.

A source is the active party's own features (:class:`LocalSource`, plaintext),
a passive party behind a transport (``parties.active.RemoteSource``, encrypted
in ``he`` mode) or a passive party's noisy release (:class:`vfl.dp.BucketSource`).
The loop is the same for all, which is what makes ``he`` and ``plain`` grow
identical trees: every source sees the same fixed-point sums.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import numpy as np

from vfl.binning import Binner
from vfl.rounds import RoundGradients
from vfl.sampling import node_members
from vfl.split import goes_left


@dataclass
class SplitRef:
    """What the active party keeps about a split held by ``owner``."""
    owner: str
    record_id: int = -1
    feature_idx: int = -1
    feature: str | None = None
    threshold: float | None = None
    default_left: bool | None = None


class HistogramSource(ABC):
    """One party's features, seen through histograms."""

    party: str
    bin_offsets: np.ndarray

    @abstractmethod
    def start_round(self, gradients: RoundGradients) -> None:
        """The round's gradients (fixed-point integers, their bounds and precision, the rows some
        tree of the round uses)."""

    @abstractmethod
    def build(self, round_idx: int, tree_idx: np.ndarray, node_ids: np.ndarray,
              assignment: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(sum_gradients, sum_hessians)``, each ``(len(node_ids), n_flat_bins)`` float64,
        for each node's own target (``tree_idx``)."""

    @abstractmethod
    def split(self, round_idx: int, tree_idx: np.ndarray, node_ids: np.ndarray,
              feature_idx: np.ndarray, bin_idx: np.ndarray, default_left: np.ndarray,
              assignment: np.ndarray) -> list[tuple[SplitRef, np.ndarray]]:
        """Apply splits; per split the ref to keep and ``go_left`` over the node's samples
        in increasing sample order."""


class LocalSource(HistogramSource):
    """The active party's own features, in plaintext."""

    def __init__(self, party: str, X: np.ndarray, feature_names: list[str], max_bin: int,
                 binner: Binner | None = None):
        """``binner``: an unfitted binner to use instead of ``Binner(max_bin)`` (e.g. DP bin edges)."""
        self.party = party
        self.feature_names = list(feature_names)
        self.binner = (Binner(max_bin) if binner is None else binner).fit(X)
        self._set_bins(self.binner.transform(X), self.binner.n_bins)

    def _set_bins(self, bin_idx: np.ndarray, n_bins: np.ndarray) -> None:
        """``bin_idx`` of every sample; ``n_bins[f]`` slots of feature f, the last for missing."""
        self.n_bins = np.asarray(n_bins, dtype=np.int64)
        self.bin_idx = np.asarray(bin_idx).astype(np.uint16)
        self.missing_bin = self.n_bins - 1          # the last slot of every feature
        self.bin_offsets = np.concatenate([[0], np.cumsum(self.n_bins)]).astype(np.int64)
        self._flat = self.bin_idx.astype(np.int64) + self.bin_offsets[:-1][None, :]
        self._g = self._h = None

    def start_round(self, gradients):
        self._g, self._h = gradients.as_float()

    def build(self, round_idx, tree_idx, node_ids, assignment):
        n_flat = int(self.bin_offsets[-1])
        F = self.bin_idx.shape[1]
        sg = np.zeros((len(node_ids), n_flat))
        sh = np.zeros((len(node_ids), n_flat))
        for i, (t, nid) in enumerate(zip(tree_idx, node_ids)):
            rows = np.flatnonzero(assignment[t] == nid)
            idx = self._flat[rows].ravel()
            sg[i] = np.bincount(idx, np.repeat(self._g[rows, t], F), minlength=n_flat)
            sh[i] = np.bincount(idx, np.repeat(self._h[rows, t], F), minlength=n_flat)
        return sg, sh

    def _refs(self, feature_idx, bin_idx, default_left) -> list[SplitRef]:
        """What the tree keeps of each split: here the feature and its raw threshold."""
        return [SplitRef(self.party, feature_idx=int(f), feature=self.feature_names[f],
                         threshold=self.binner.threshold(f, b), default_left=bool(dl))
                for f, b, dl in zip(feature_idx, bin_idx, default_left)]

    def split(self, round_idx, tree_idx, node_ids, feature_idx, bin_idx, default_left, assignment):
        out = []
        refs = self._refs(feature_idx, bin_idx, default_left)
        for ref, t, nid, f, b, dl in zip(refs, tree_idx, node_ids, feature_idx, bin_idx, default_left):
            rows = node_members(assignment[t], nid)        # sampled and riding rows (vfl.sampling)
            bins = self.bin_idx[rows, f].astype(np.int64)
            go_left = goes_left(bins, b, dl, missing=bins == self.missing_bin[f])
            out.append((ref, go_left))
        return out
