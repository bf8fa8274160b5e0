"""Typed messages of the federation protocol (active <-> passive).

Every message is a registered dataclass; :mod:`protocols.serialization` turns
it into bytes. Field vocabulary follows the learner: ``node_ids``,
``feature_idx``, ``bin_idx``, ``n_samples``.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from protocols.serialization import BigInts, register


@register
@dataclass
class Ack:
    info: dict = field(default_factory=dict)


@register
@dataclass
class ErrorReply:
    """A passive party's refusal: ``kind`` is ``input`` (the user's data) or ``protocol``."""
    kind: str
    message: str


# --- alignment -------------------------------------------------------------
@register
@dataclass
class AlignRequest:
    """Start of a session: the federation's salt for hashing ids (mmh3-128 of salt + id)."""
    session_id: str
    salt: bytes
    purpose: str          # "train" or "predict"


@register
@dataclass
class IdHashes:
    """Hashed ids, shape (n, 16) uint8 (one 128-bit hash per row)."""
    hashes: np.ndarray


@register
@dataclass
class AlignResult:
    """The intersection in canonical order; every party reorders its rows to it."""
    hashes: np.ndarray


@register
@dataclass
class AlignAck:
    n_rows: int       # rows the party had
    n_kept: int       # rows in the intersection


# --- training setup --------------------------------------------------------
@register
@dataclass
class TrainSetup:
    mode: str                 # "he" or "plain"
    max_bin: int
    model_id: str


@register
@dataclass
class BinningInfo:
    """Shape of a party's histograms: ``n_bins[feature_idx]`` slots, the last one for missing."""
    n_bins: np.ndarray


@register
@dataclass
class PublicKey:
    n: str                    # the Paillier modulus, hex


# --- one boosting round (one tree, or one tree per class) -----------------
@register
@dataclass
class Gradients:
    """Packed (and in ``he`` mode encrypted) gradient/hessian pairs, one per sample.

    When the ``n_targets`` pairs of a sample do not fit one plaintext, the targets are
    split into groups of ``layout["n_targets"]`` each and ``values`` holds one block of
    ``n_samples`` values per group (group-major); tree ``t`` uses group ``t // group size``."""
    round_idx: int
    encrypted: bool
    layout: dict              # crypto.packing.PackingLayout.to_dict()
    values_per_ciphertext: int  # bin sums per returned ciphertext (compression)
    values: BigInts


@register
@dataclass
class HistogramRequest:
    """Build histograms for ``node_ids``; ``assignment[t, i]`` is sample i's node in tree t (-1: none;
    ``-2 - node_id``: at ``node_id`` but outside the round's row sample, see ``vfl.sampling``)."""
    round_idx: int
    depth: int
    tree_idx: np.ndarray      # int32, tree (within the round) of each node to build
    node_ids: np.ndarray      # int32, the nodes to build
    assignment: np.ndarray    # int32 (n_trees_in_round, n_samples)


@register
@dataclass
class HistogramResponse:
    """Compressed bin sums, node-major then flat (feature, bin) order."""
    n_values: int
    values: BigInts


@register
@dataclass
class SplitRequest:
    """Split these nodes on the receiver's ``(feature_idx, bin_idx)``."""
    round_idx: int
    node_ids: np.ndarray      # int32
    tree_idx: np.ndarray      # int32 tree (within the round) of each node
    feature_idx: np.ndarray   # int32
    bin_idx: np.ndarray       # int32
    default_left: np.ndarray  # bool: where missing values go


@register
@dataclass
class SplitResponse:
    """One record id per split, and which of the node's samples (by index order) go left."""
    record_ids: np.ndarray    # int64
    go_left: np.ndarray       # bool, the concatenation over splits
    n_rows: np.ndarray        # int64, samples per split node


@register
@dataclass
class TrainEnd:
    model_id: str
    n_trees: int
    completed: bool


# --- prediction ------------------------------------------------------------
@register
@dataclass
class PredictStart:
    model_id: str
    session_id: str
    hashes: np.ndarray        # (n, 16) uint8 hashed ids of the rows to predict


@register
@dataclass
class RouteRequest:
    """For each query: does sample ``rows[i]`` go left at the receiver's record ``record_ids[i]``?"""
    session_id: str
    record_ids: np.ndarray    # int64
    rows: np.ndarray          # int64


@register
@dataclass
class RouteResponse:
    go_left: np.ndarray       # bool


# --- learner extras (issue 4): validation sets, split gains -----------------
@register
@dataclass
class EvalStart:
    """Open a validation session during training: the receiver aligns its validation rows
    (loaded locally with ``load_validation_data``) to these hashed ids; the session then
    answers :class:`RouteRequest` like a prediction session, one round's trees at a time."""
    model_id: str
    session_id: str
    hashes: np.ndarray        # (n, 16) uint8, the active party's validation ids hashed with the salt


@register
@dataclass
class SplitGains:
    """Optional, after training: the gain of each of the receiver's own splits (its records),
    so that it can compute gain importance of its features locally. Sent only on request
    of the active party (label-derived information; see README)."""
    model_id: str
    record_ids: np.ndarray    # int64
    gains: np.ndarray         # float64
