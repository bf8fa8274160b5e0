"""Histogram sources: one party's features as the boosting loop sees them.

A source is the active party's own features (:class:`LocalSource`, plaintext),
a passive party behind a transport (``parties.active.RemoteSource``, encrypted
in ``he`` mode) or a passive party's noisy release (:class:`vfl.core.dp.BucketSource`).
The loop is the same for all, which is what makes ``he`` and ``plain`` grow
identical trees: every source sees the same fixed-point sums.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import numpy as np

from vfl.core.binning import Binner, bin_dtype, feature_matrix
from vfl.core.rounds import RoundGradients
from vfl.core.sampling import node_members
from vfl.core.split import goes_left


@dataclass
class SplitRef:
    """What the active party keeps about a split held by ``owner``."""
    owner: str
    record_id: int = -1
    feature_idx: int = -1
    feature: str | None = None
    threshold: float | None = None
    default_left: bool | None = None
    categories: list[int] | None = None     # categorical split: the category codes that go left


@dataclass
class NodeCandidates:
    """What a source of shuffled split candidates (a passive party, :mod:`parties.passive_splits`)
    gives for one node: the left child's sums of every candidate split, in the party's own random
    order (``gl``/``hl``, float64), the monotone constraint of each candidate's feature (None: no
    constraint anywhere), and per-category sums of its categorical features (``cat_features``: their
    positions, ``cat_offsets`` over ``cat_g``/``cat_h``; empty when the party sends none)."""
    gl: np.ndarray
    hl: np.ndarray
    monotone: np.ndarray | None = None
    cat_features: tuple = ()
    cat_offsets: np.ndarray | None = None
    cat_g: np.ndarray | None = None
    cat_h: np.ndarray | None = None


class HistogramSource(ABC):
    """One party's features, seen through histograms."""

    party: str
    bin_offsets: np.ndarray
    categorical: np.ndarray | None = None    # bool per feature: searched as category partitions
    monotone: np.ndarray | None = None       # -1/0/+1 per feature: monotone constraints
    #: True: :meth:`build` returns a :class:`NodeCandidates` per node (every node of the level asked for,
    #: the source derives siblings itself) instead of per-bin sums
    shuffled: bool = False
    #: True: :meth:`counts` gives the rows per bin, so that every split of this source leaves at least
    #: ``min_node_rows`` rows on both sides (what a passive party enforces on the partitions it sees)
    counts_rows: bool = False
    #: True: the active party's own features (the only sources of the first ``active_only_rounds``)
    own_features: bool = False

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
              assignment: np.ndarray, categories: list | None = None) -> list[tuple[SplitRef, np.ndarray]]:
        """Apply splits; per split the ref to keep and ``go_left`` over the node's samples
        in increasing sample order. ``categories[i]``: for a categorical split, the bins that go
        left (``bin_idx`` is then -1); None for a numeric one."""


class LocalSource(HistogramSource):
    """The active party's own features, in plaintext."""

    counts_rows = True
    own_features = True

    def __init__(self, party: str, X: np.ndarray, feature_names: list[str], max_bin: int,
                 categorical: np.ndarray | None = None, monotone: np.ndarray | None = None,
                 max_cat: int = 64, n_categories: dict[int, int] | None = None, binner: Binner | None = None,
                 rows: np.ndarray | None = None):
        """``X``: a float matrix, or a column reader (``shape`` and ``column(j)``, e.g.
        :class:`datasets.loaders.DeferredColumns`: one column in memory at a time, see
        :func:`vfl.core.binning.n_features`). ``categorical``: bool per feature (``X`` holds category codes there, see
        :mod:`vfl.core.binning`); ``n_categories[f]``: the vocabulary size of categorical feature f;
        ``monotone``: -1/0/+1 per feature; ``binner``: an unfitted binner to use instead of
        ``Binner(max_bin, ...)`` (e.g. DP bin edges); ``rows``: the rows of ``X`` to use, in
        order (default all): binned a column at a time, without a copy of ``X[rows]``."""
        self.party = party
        self.feature_names = list(feature_names)
        self.categorical = None if categorical is None or not np.any(categorical) else \
            np.asarray(categorical, dtype=bool)
        self.monotone = None if monotone is None or not np.any(monotone) else np.asarray(monotone, dtype=np.int8)
        self.n_categories = dict(n_categories or {})
        if binner is None:
            self.binner = Binner(max_bin, self.categorical, max_cat)
            # each column read once, straight into the type _set_bins keeps (no two-byte copy)
            self._set_bins(self.binner.fit_transform(X, rows), self.binner.n_bins)
        else:
            X = feature_matrix(X, rows)
            self.binner = binner.fit(X)
            self._set_bins(self.binner.transform(X), self.binner.n_bins)

    def _set_bins(self, bin_idx: np.ndarray, n_bins: np.ndarray) -> None:
        """``bin_idx`` of every sample; ``n_bins[f]`` slots of feature f, the last for missing."""
        self.n_bins = np.asarray(n_bins, dtype=np.int64)
        # one byte per value when every feature has at most 256 slots (the driver's per-row memory)
        self.bin_idx = np.asarray(bin_idx).astype(bin_dtype(self.n_bins), copy=False)
        self.missing_bin = self.n_bins - 1          # the last slot of every feature
        self.bin_offsets = np.concatenate([[0], np.cumsum(self.n_bins)]).astype(np.int64)
        self._g = self._h = None

    def _bin_sums(self, rows: np.ndarray, weights: list[np.ndarray]) -> list[np.ndarray]:
        """Per weight vector (one value per row of ``rows``, None: every row), its sums over the flat
        (feature, bin) slots. One feature at a time, so the temporaries are one column of ``rows``
        long; each slot adds its rows in row order, as a single bincount over all features would."""
        n_flat = int(self.bin_offsets[-1])
        out = [np.zeros(n_flat) for _ in weights]
        for f in range(self.bin_idx.shape[1]):
            lo, hi = int(self.bin_offsets[f]), int(self.bin_offsets[f + 1])
            col = (self.bin_idx[:, f] if rows is None else self.bin_idx[rows, f]).astype(np.intp)
            for o, w in zip(out, weights):
                o[lo:hi] = np.bincount(col, w, minlength=hi - lo)
        return out

    def start_round(self, gradients):
        self._g, self._h = gradients.as_float()

    def build(self, round_idx, tree_idx, node_ids, assignment):
        n_flat = int(self.bin_offsets[-1])
        sg = np.zeros((len(node_ids), n_flat))
        sh = np.zeros((len(node_ids), n_flat))
        for i, (t, nid) in enumerate(zip(tree_idx, node_ids)):
            member = assignment[t] == nid
            if member.all():         # a root of every row: no index and no copy of the gradients
                sg[i], sh[i] = self._bin_sums(None, [self._g[:, t], self._h[:, t]])
                continue
            rows = np.flatnonzero(member)
            member = None
            sg[i], sh[i] = self._bin_sums(rows, [self._g[rows, t], self._h[rows, t]])
        return sg, sh

    def counts(self, tree_idx, node_ids, assignment) -> np.ndarray:
        """Sampled rows per flat (feature, bin) slot of each node, ``(len(node_ids), n_flat)`` int64."""
        out = np.zeros((len(node_ids), int(self.bin_offsets[-1])), dtype=np.int64)
        for i, (t, nid) in enumerate(zip(tree_idx, node_ids)):
            rows = np.flatnonzero(assignment[t] == nid)
            for f in range(self.bin_idx.shape[1]):
                lo, hi = int(self.bin_offsets[f]), int(self.bin_offsets[f + 1])
                out[i, lo:hi] = np.bincount(self.bin_idx[rows, f].astype(np.intp), minlength=hi - lo)
        return out

    def _refs(self, feature_idx, bin_idx, default_left, categories=None) -> list[SplitRef]:
        """What the tree keeps of each split: the feature and its raw threshold, or for a
        categorical split the category codes that go left."""
        out = []
        categories = [None] * len(feature_idx) if categories is None else categories
        for f, b, dl, cats in zip(feature_idx, bin_idx, default_left, categories):
            f = int(f)
            if cats is not None:
                codes = self.binner.left_codes(f, cats, self.n_categories.get(f, 0))
                out.append(SplitRef(self.party, feature_idx=f, feature=self.feature_names[f],
                                    default_left=bool(dl), categories=codes))
            else:
                out.append(SplitRef(self.party, feature_idx=f, feature=self.feature_names[f],
                                    threshold=self.binner.threshold(f, b), default_left=bool(dl)))
        return out

    def split(self, round_idx, tree_idx, node_ids, feature_idx, bin_idx, default_left, assignment,
              categories=None):
        out = []
        if categories is None or all(c is None for c in categories):
            categories = [None] * len(node_ids)
            refs = self._refs(feature_idx, bin_idx, default_left)    # (subclasses: the numeric form)
        else:
            refs = self._refs(feature_idx, bin_idx, default_left, categories)
        for ref, t, nid, f, b, dl, cats in zip(refs, tree_idx, node_ids, feature_idx, bin_idx, default_left,
                                               categories):
            rows = node_members(assignment[t], nid)        # sampled and riding rows (vfl.core.sampling)
            bins = self.bin_idx[rows, f].astype(np.int64)
            go_left = goes_left(bins, b, dl, missing=bins == self.missing_bin[f], categories=cats)
            out.append((ref, go_left))
        return out
