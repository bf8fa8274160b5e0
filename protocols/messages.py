"""Typed messages of the federation protocol (active <-> passive).

Every message is a registered dataclass; :mod:`protocols.serialization` turns
it into bytes. Field vocabulary follows the learner: ``node_ids``,
``feature_idx``, ``bin_idx``, ``n_samples``. Fields whose values are protocol
vocabulary are :class:`Vocabulary` enums (on the wire: their string value).

Every request declares the replies it expects in :data:`REPLIES`; the
transport (:meth:`protocols.transport.Transport.call`) checks each reply
against it once, so callers never test reply types themselves. An
:class:`ErrorReply` may answer any request.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

import numpy as np

from protocols.serialization import BigInts, register


class Vocabulary(str, Enum):
    """A str-valued enum of protocol words: equal to, printed and sent as its value."""

    def __str__(self) -> str:
        return self.value

    def __repr__(self) -> str:
        return repr(self.value)

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)


class ErrorKind(Vocabulary):
    """Whose fault an :class:`ErrorReply` reports."""
    INPUT = "input"            # the user's data or options (raised as InputError at the caller)
    PROTOCOL = "protocol"      # the conversation itself (raised as PeerError at the caller)


class PsiPurpose(Vocabulary):
    """What a PSI alignment is for (:class:`PsiRequest`)."""
    TRAIN = "train"
    PREDICT = "predict"
    VALIDATE = "validate"      # the validation set of the training under way


@register
@dataclass
class Ack:
    info: dict = field(default_factory=dict)


@register
@dataclass
class ErrorReply:
    """A passive party's refusal: ``kind`` says whose fault it is."""
    kind: ErrorKind
    message: str


# --- alignment -------------------------------------------------------------
@register
@dataclass
class AlignRequest:
    """Start of a training session: the federation's salt for hashing ids (mmh3-128 of salt + id)."""
    session_id: str
    salt: bytes


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
    max_cat: int = 64         # category bins of a categorical feature (the rest pooled)


def _no_features(dtype):
    return field(default_factory=lambda: np.zeros(0, dtype=dtype))


@register
@dataclass
class BinningInfo:
    """Shape of a party's histograms: ``n_bins[feature_idx]`` slots, the last one for missing;
    which features are categorical (their bins are categories, searched as partitions) and the
    monotone constraint the party declares on each (-1/0/+1). Empty arrays: none."""
    n_bins: np.ndarray
    categorical: np.ndarray = _no_features(bool)    # bool per feature
    monotone: np.ndarray = _no_features(np.int8)    # int8 per feature


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
    shifts: int = 1           # 1, or values_per_ciphertext: values[s * n_samples + i] is sample i's
    #                           value shifted by s slots (the key holder did the compression shifts)


@register
@dataclass
class HistogramRequest:
    """Build histograms for ``node_ids``; ``assignment[t, i]`` is sample i's node in tree t (-1: none;
    ``-2 - node_id``: at ``node_id`` but outside the round's row sample, see ``vfl.sampling``)."""
    round_idx: int
    tree_idx: np.ndarray      # int32, tree (within the round) of each node to build
    node_ids: np.ndarray      # int32, the nodes to build
    assignment: np.ndarray    # int32 (n_trees_in_round, n_samples)


@register
@dataclass
class HistogramResponse:
    """Compressed bin sums, node-major then flat (feature, bin) order."""
    n_values: int
    values: BigInts
    compute_us: dict = field(default_factory=dict)   # the sender's compute time by stage, integer µs


@register
@dataclass
class SplitRequest:
    """Split these nodes on the receiver's ``(feature_idx, bin_idx)``."""
    round_idx: int
    node_ids: np.ndarray      # int32
    tree_idx: np.ndarray      # int32 tree (within the round) of each node
    feature_idx: np.ndarray   # int32
    bin_idx: np.ndarray       # int32 (-1 for a categorical split)
    default_left: np.ndarray  # bool: where missing values go
    n_left_bins: np.ndarray = _no_features(np.int32)   # int32 per split: -1 numeric, else how many
    #                                                    bins of ``left_bins`` are this split's
    left_bins: np.ndarray = _no_features(np.int32)     # int32: the bins going left, split after split


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


# --- private set intersection (--align psi; see protocols/psi.py) ----------
@register
@dataclass
class PsiRequest:
    """ECDH-PSI step 1: the active party's ids as X25519 points blinded with its secret
    scalar, in a secret random order. ``model_id`` names the model when ``purpose`` is
    predict or validate ("" when training)."""
    session_id: str
    salt: bytes               # hashing ids to points (and the canonical order)
    purpose: PsiPurpose
    model_id: str
    blinded: np.ndarray       # (n, 32) uint8


@register
@dataclass
class PsiResponse:
    """Step 2: the request's values blinded again (same order), and the passive party's own
    ids blinded with its scalar, in a secret random order."""
    double_blinded: np.ndarray    # (n, 32) uint8
    blinded: np.ndarray           # (m, 32) uint8


@register
@dataclass
class PsiResult:
    """Step 3: positions (in the receiver's ``PsiResponse.blinded``) of the rows to use, in order."""
    session_id: str
    positions: np.ndarray     # int64


# --- one-round batch prediction (--prediction one-round) -------------------
@register
@dataclass
class LeafMaskRequest:
    """Tree skeletons for one-round prediction: per node its children (-1, -1 at leaves) and,
    at the receiver's own nodes, its record id (-1 elsewhere). No threshold, no leaf value,
    no owner of other nodes. Trees are concatenated; ``tree_sizes`` gives their node counts."""
    session_id: str
    tree_sizes: np.ndarray    # int32 (n_trees,)
    left: np.ndarray          # int32 (total nodes,)
    right: np.ndarray         # int32
    record_ids: np.ndarray    # int64


@register
@dataclass
class LeafMaskResponse:
    """Per (row, tree) the leaves the row can reach given only the sender's decisions, as
    ``np.packbits`` of the tree's leaves in node-id order; trees concatenated along axis 1."""
    masks: np.ndarray         # uint8 (n_rows, sum over trees of ceil(n_leaves / 8))


# --- DP-only mode (vfl.dp): one noisy release, then split registration ------
@register
@dataclass
class DPReleaseRequest:
    """Release this training's buckets once, each (row, feature) ``epsilon_per_feature``-LDP."""
    model_id: str
    epsilon_per_feature: float    # inf: no noise


@register
@dataclass
class DPRelease:
    """Noisy bucket index per aligned row (alignment order) per feature; boundaries stay home."""
    buckets: np.ndarray           # uint8/uint16 (n_samples, n_features)
    n_bins: np.ndarray            # int32 per feature: value buckets + the missing slot (last)
    rr_domain: np.ndarray         # int32 per feature: buckets randomized over (missing included if present)
    epsilon_per_feature: float


@register
@dataclass
class DPSplitRegister:
    """The active party chose these splits on the receiver's buckets: keep their thresholds."""
    model_id: str
    feature_idx: np.ndarray       # int32
    bin_idx: np.ndarray           # int32: "bucket <= bin_idx" goes left
    default_left: np.ndarray      # bool: where missing values go


@register
@dataclass
class DPSplitRecords:
    record_ids: np.ndarray        # int64, one per registered split


# --- network deployments: resuming an interrupted training ----------------
@register
@dataclass
class TrainResume:
    """Continue model ``model_id`` after its first ``n_rounds`` rounds (sent right after
    :class:`TrainSetup`); the active party's checkpoint references ``n_records`` of the
    receiver's lookup-table records, which the receiver must still hold."""
    model_id: str
    n_rounds: int
    n_records: int


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


# --- declared request -> reply pairs (checked once, in the transport) ---------
#: every request type and the reply types it expects (besides an :class:`ErrorReply`)
REPLIES: dict[type, tuple[type, ...]] = {
    AlignRequest: (IdHashes,),
    AlignResult: (AlignAck,),
    TrainSetup: (BinningInfo,),
    TrainResume: (Ack,),
    PublicKey: (Ack,),
    Gradients: (Ack,),
    HistogramRequest: (HistogramResponse,),
    SplitRequest: (SplitResponse,),
    TrainEnd: (Ack,),
    PredictStart: (Ack,),
    RouteRequest: (RouteResponse,),
    PsiRequest: (PsiResponse,),
    PsiResult: (AlignAck,),
    LeafMaskRequest: (LeafMaskResponse,),
    DPReleaseRequest: (DPRelease,),
    DPSplitRegister: (DPSplitRecords,),
    EvalStart: (Ack,),
    SplitGains: (Ack,),
}
