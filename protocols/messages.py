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
from typing import ClassVar

import numpy as np

from crypto.compress import check_shifts
from crypto.packing import PackingLayout
from crypto.schemes import OU, PAILLIER, SCHEMES
from datasets.errors import ProtocolError
from protocols.serialization import BigInts, array, count, number, register, text

#: a session or model id on the wire
ID_CHARS = 128
#: the largest histogram a passive party builds (max_bin 256 plus the missing slot)
MAX_BINS = 257
#: the most boosting rounds a training may have (vfl.core.params.MAX_ROUNDS, the same bound on
#: n_estimators): every round index on the wire is below it (a round 2**70 is refused, not stored)
MAX_ROUNDS = 1_000_000


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
    BUSY = "busy"              # the receiver is at a limit right now: retry after ``retry_after`` s


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
    retry_after: float = number(min=0.0, max=3600.0, default=0.0)   # BUSY: seconds to wait before a retry


# --- alignment -------------------------------------------------------------
@register
@dataclass
class AlignRequest:
    """Start of a training session: the federation's salt for hashing ids (mmh3-128 of salt + id)."""
    session_id: str = text(ID_CHARS, nonempty=True)
    salt: bytes = field()


@register
@dataclass
class IdHashes:
    """Hashed ids, shape (n, 16) uint8 (one 128-bit hash per row)."""
    hashes: np.ndarray = array("uint8", 2, width=16)


@register
@dataclass
class AlignResult:
    """The intersection in canonical order; every party reorders its rows to it (never empty)."""
    hashes: np.ndarray = array("uint8", 2, width=16, nonempty=True)


@register
@dataclass
class AlignAck:
    n_rows: int = count()      # rows the party had
    n_kept: int = count()      # rows in the intersection


# --- training setup --------------------------------------------------------
@register
@dataclass
class TrainSetup:
    mode: str = text(16)                # "he" or "plain"
    max_bin: int = count(2, MAX_BINS - 1)
    model_id: str = text(ID_CHARS, nonempty=True)
    dp_binning: dict | None = None      # --dp-model: {"epsilon": this party's budget for its DP bin edges}
    max_cat: int = count(1, 1024, default=64)  # category bins of a categorical feature (vfl.core.binning.MAX_CAT_LIMIT)
    scheme: str = text(16, default=PAILLIER)   # mode he: the key's scheme (crypto.schemes), checked on PublicKey
    # what the passive party holds every training request to (parties.passive_checks): rounds, levels per
    # round (histogram requests), and the fewest rows of a node it builds a histogram of
    n_rounds: int = count(1, 1 << 20, default=10)
    max_depth: int = count(1, 30, default=4)
    min_node_rows: int = count(1, 1 << 20, default=1)
    # the first rounds grown on the active party's own features only (no request of this party's before
    # round ``active_only_rounds``): a passive party may require at least so many (its federation entry)
    active_only_rounds: int = count(0, 1 << 20, default=0)

    def validate(self) -> None:
        if self.scheme not in SCHEMES:
            raise ProtocolError(f"TrainSetup.scheme: {self.scheme!r} is not one of {', '.join(SCHEMES)}")


@register
@dataclass
class BinningInfo:
    """Shape of a party's histograms: ``n_bins[feature_idx]`` slots, the last one for missing;
    which features are categorical (their bins are categories, searched as partitions) and the
    monotone constraint the party declares on each (-1/0/+1). Empty arrays: none."""
    n_bins: np.ndarray = array("int", 1, min=1)
    categorical: np.ndarray = array("bool", 1, empty_default="bool")      # bool per feature
    monotone: np.ndarray = array("int", 1, min=-1, empty_default="int8")  # int8 per feature (-1/0/+1)
    dp_binning: dict | None = None      # --dp-model: what the DP bin edges spent {"epsilon", "dp_features", ...}

    def validate(self) -> None:
        for name in ("categorical", "monotone"):
            v = getattr(self, name)
            if len(v) and len(v) != len(self.n_bins):
                raise ProtocolError(f"BinningInfo.{name}: {len(v)} values for {len(self.n_bins)} features")
        if len(self.monotone) and int(np.max(self.monotone)) > 1:
            raise ProtocolError("BinningInfo.monotone: values must be -1, 0 or +1")


@register
@dataclass
class PublicKey:
    """The key holder's public key (:func:`crypto.schemes.public_key_fields`): Paillier ``n``, or
    Okamoto-Uchiyama ``n = p^2 q`` with ``g`` and ``h``; hex. The receiver checks ``scheme``
    against its ``TrainSetup`` and the numbers with :func:`crypto.schemes.public_key_from_fields`.
    ``proof`` (Paillier only, required by a passive party) is the key holder's proof that every unit
    modulo ``n`` has an ``n``-th root (:mod:`crypto.keyproof`: the roots of challenges derived from
    ``n``), so that replies re-randomised with the receiver's own ``r^n`` hide which of the key
    holder's ciphertexts they multiply. No base of the key holder is ever used to re-randomise
    (issue 31: an ``hs`` field once carried one, and ``hs = n^2 - 1`` switched re-randomisation off)."""
    n: str = text(4096, nonempty=True)    # the modulus, hex (at most 16,384 bits)
    scheme: str = text(16, default=PAILLIER)
    g: str = text(4096, default="")       # OU only
    h: str = text(4096, default="")       # OU only
    proof: str = text(24600, default="")  # Paillier only: the n-th roots, hex, comma-separated

    def validate(self) -> None:
        if self.scheme not in SCHEMES:
            raise ProtocolError(f"PublicKey.scheme: {self.scheme!r} is not one of {', '.join(SCHEMES)}")
        for name in ("n", "g", "h") if self.scheme == OU else ("n",):
            try:
                v = int(getattr(self, name), 16)
            except ValueError:
                raise ProtocolError(f"PublicKey.{name}: not a hexadecimal number") from None
            if name == "n" and (v < 3 or v % 2 == 0):
                raise ProtocolError(f"PublicKey.n: not a {self.scheme} modulus (must be an odd number above 2)")
        if self.scheme == PAILLIER and (self.g or self.h):
            raise ProtocolError("PublicKey: a Paillier key has no g or h (an OU key named paillier?)")
        if self.proof:
            if self.scheme != PAILLIER:
                raise ProtocolError("PublicKey.proof: only a Paillier key carries an n-th-root proof")
            if not all(part and all(c in "0123456789abcdefABCDEF" for c in part) for part in self.proof.split(",")):
                raise ProtocolError("PublicKey.proof: not comma-separated hexadecimal numbers")

    def numbers(self) -> tuple[int, int | None, int | None]:
        """``(n, g, h)`` as integers (``g``, ``h`` None for Paillier)."""
        if self.scheme == OU:
            return int(self.n, 16), int(self.g, 16), int(self.h, 16)
        return int(self.n, 16), None, None


# --- one boosting round (one tree, or one tree per class) -----------------
@register
@dataclass
class Gradients:
    """Packed (and in ``he`` mode encrypted) gradient/hessian pairs, one per sample.

    When the ``n_targets`` pairs of a sample do not fit one plaintext, the targets are
    split into groups of ``layout["n_targets"]`` each and ``values`` holds one block of
    ``n_samples`` values per group (group-major); tree ``t`` uses group ``t // group size``."""
    round_idx: int = count(0, MAX_ROUNDS - 1)
    encrypted: bool = field()
    layout: dict = field()              # crypto.packing.PackingLayout.to_dict()
    values_per_ciphertext: int = count(1)   # bin sums per returned ciphertext (compression)
    values: BigInts = field()
    shifts: int = count(1, default=1)   # 1..values_per_ciphertext: values[a * n_samples + i] is sample i's
    #   value shifted by a * stride slots (crypto.compress.stride_for; the key holder did those shifts)

    def packing_layout(self) -> PackingLayout:
        """The layout as an object (checked by :meth:`validate`)."""
        return PackingLayout.from_dict(self.layout)

    def validate(self) -> None:
        names = set(PackingLayout.__dataclass_fields__)
        if set(self.layout) != names or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0
                                                for v in self.layout.values()):
            raise ProtocolError(f"Gradients.layout: must hold the non-negative integers {sorted(names)}")
        try:
            layout = self.packing_layout()
        except (ValueError, TypeError, ArithmeticError) as exc:
            raise ProtocolError(f"Gradients.layout: {exc}") from None
        if layout.n_targets < 1 or layout.max_rows < 1 or layout.g_bits < 1 or layout.h_bits < 1:
            raise ProtocolError("Gradients.layout: n_targets, max_rows, g_bits and h_bits must be positive")
        why = check_shifts(self.shifts, self.values_per_ciphertext)
        if why is not None:
            raise ProtocolError(f"Gradients.shifts: {why}")


@register
@dataclass
class GradientsStart:
    """A round's gradients follow as a stream of :class:`GradientShard` messages (each under the
    frame cap; issue 11): the same content as :class:`Gradients` without the values. The values
    are fixed-width big-endian integers of ``width`` bytes (``signed`` in mode plain)."""
    round_idx: int = count(0, MAX_ROUNDS - 1)
    encrypted: bool
    layout: dict              # crypto.packing.PackingLayout.to_dict()
    values_per_ciphertext: int
    shifts: int               # pre-shifted copies, 1..values_per_ciphertext (see Gradients)
    groups: int               # target groups (one block of values each, see Gradients)
    n_samples: int
    width: int
    signed: bool


@register
@dataclass
class GradientShard:
    """The values of rows ``start:stop`` of the round: ``groups * shifts`` blocks of
    ``stop - start`` values (group-major, then shift, then row), ``width`` bytes each."""
    round_idx: int = count(0, MAX_ROUNDS - 1)
    start: int
    stop: int
    values: bytes


@register
@dataclass
class HistogramRequest:
    """Build histograms for ``node_ids``; ``assignment[t, i]`` is sample i's node in tree t (-1: none;
    ``-2 - node_id``: at ``node_id`` but outside the round's row sample, see ``vfl.core.sampling``)."""
    round_idx: int = count(0, MAX_ROUNDS - 1)
    tree_idx: np.ndarray = array("int", 1, min=0)     # int32, tree (within the round) of each node to build
    node_ids: np.ndarray = array("int", 1, min=0)     # int32, the nodes to build
    assignment: np.ndarray = array("int", 2)          # int32 (n_trees_in_round, n_samples)
    SAME_LENGTH: ClassVar = (("tree_idx", "node_ids"),)


@register
@dataclass
class HistogramResponse:
    """Compressed bin sums, node-major then flat (feature, bin) order."""
    n_values: int = count()
    values: BigInts = field()
    compute_us: dict = field(default_factory=dict)   # the sender's compute time by stage, integer µs


@register
@dataclass
class SplitRequest:
    """Split these nodes on the receiver's ``(feature_idx, bin_idx)``."""
    round_idx: int = count(0, MAX_ROUNDS - 1)
    node_ids: np.ndarray = array("int", 1, min=0)      # int32
    tree_idx: np.ndarray = array("int", 1, min=0)      # int32 tree (within the round) of each node
    feature_idx: np.ndarray = array("int", 1, min=0)   # int32
    bin_idx: np.ndarray = array("int", 1, min=-1)      # int32 (-1 for a categorical split)
    default_left: np.ndarray = array("bool", 1)        # bool: where missing values go
    # int32 per split: -1 numeric, else how many bins of ``left_bins`` are this split's
    n_left_bins: np.ndarray = array("int", 1, min=-1, empty_default="int32")
    left_bins: np.ndarray = array("int", 1, min=0, empty_default="int32")   # the bins going left, split after split
    SAME_LENGTH: ClassVar = (("node_ids", "tree_idx", "feature_idx", "bin_idx", "default_left"),)


@register
@dataclass
class CandidateResponse:
    """The answer to a :class:`HistogramRequest` in a training without a DP released model
    (:mod:`parties.passive_splits`): per request node (in order), the left child's sums of each of
    the sender's candidate splits (every feature, every threshold, both sides for missing values),
    in a fresh random order of its own, then the per-category sums of the features named in
    ``cat_features`` (their bins in feature order). ``n_candidates[i]``: node i's candidates;
    ``monotone``: per candidate (all nodes in order), the constraint of its feature (empty: none).
    Values are compressed like :class:`HistogramResponse`'s."""
    n_candidates: np.ndarray = array("int", 1, min=0)      # int64 per node
    n_values: int = count()
    values: BigInts = field()
    monotone: np.ndarray = array("int", 1, min=-1, empty_default="int8")
    cat_features: np.ndarray = array("int", 1, min=0, empty_default="int32")
    compute_us: dict = field(default_factory=dict)   # the sender's compute time by stage, integer µs


@register
@dataclass
class CandidatePick:
    """Split these nodes on the sender's pick among the receiver's candidates: ``positions`` (node
    after node, ``n_positions`` each) are the opaque positions in the node's :class:`CandidateResponse`
    of every candidate with the best gain (the receiver takes its canonical one), or, for a
    categorical split (``feature_idx`` >= 0), the bins that go left as in :class:`SplitRequest`
    (with positions too when they tie: the receiver decides by feature order)."""
    round_idx: int = count(0, MAX_ROUNDS - 1)
    node_ids: np.ndarray = array("int", 1, min=0)      # int32
    tree_idx: np.ndarray = array("int", 1, min=0)      # int32
    n_positions: np.ndarray = array("int", 1, min=0)   # int32 per node
    positions: np.ndarray = array("int", 1, min=0)     # int32, node after node
    feature_idx: np.ndarray = array("int", 1, min=-1)  # int32 per node: a categorical split's feature, else -1
    default_left: np.ndarray = array("bool", 1)        # bool per node: a categorical split's missing side
    n_left_bins: np.ndarray = array("int", 1, min=-1, empty_default="int32")
    left_bins: np.ndarray = array("int", 1, min=0, empty_default="int32")
    SAME_LENGTH: ClassVar = (("node_ids", "tree_idx", "n_positions", "feature_idx", "default_left"),)


@register
@dataclass
class SplitResponse:
    """One record id per split, and which of the node's samples (by index order) go left."""
    record_ids: np.ndarray = array("int", 1, min=0)    # int64
    go_left: np.ndarray = array("bool", 1)             # bool, the concatenation over splits
    n_rows: np.ndarray = array("int", 1, min=0)        # int64, samples per split node
    SAME_LENGTH: ClassVar = (("record_ids", "n_rows"),)


@register
@dataclass
class TrainEnd:
    model_id: str = text(ID_CHARS, nonempty=True)
    completed: bool = field()


# --- prediction ------------------------------------------------------------
@register
@dataclass
class PredictStart:
    model_id: str = text(ID_CHARS, nonempty=True)
    session_id: str = text(ID_CHARS, nonempty=True)
    hashes: np.ndarray = array("uint8", 2, width=16)    # (n, 16) hashed ids of the rows to predict
    # sha256 of the receiver's model as recorded at training end (its TrainEnd Ack's "model_hash");
    # the receiver refuses if its own model differs ("": not recorded, no check)
    model_hash: str = text(64, default="")


@register
@dataclass
class RouteRequest:
    """For each query: does sample ``rows[i]`` go left at the receiver's record ``record_ids[i]``?"""
    session_id: str = text(ID_CHARS, nonempty=True)
    record_ids: np.ndarray = array("int", 1, min=0)    # int64
    rows: np.ndarray = array("int", 1, min=0)          # int64
    SAME_LENGTH: ClassVar = (("record_ids", "rows"),)


@register
@dataclass
class RouteResponse:
    go_left: np.ndarray = array("bool", 1)


@register
@dataclass
class PredictEnd:
    """The prediction session ``session_id`` is over: the receiver forgets its rows (node-by-node
    prediction; a one-round session ends with its leaf-mask request)."""
    session_id: str = text(ID_CHARS, nonempty=True)


# --- private set intersection (--align psi; see protocols/psi.py) ----------
@register
@dataclass
class PsiRequest:
    """ECDH-PSI step 1: the active party's ids as X25519 points blinded with its secret
    scalar, in a secret random order. ``model_id`` names the model when ``purpose`` is
    predict or validate ("" when training)."""
    session_id: str = text(ID_CHARS, nonempty=True)
    salt: bytes = field()                # hashing ids to points (and the canonical order)
    purpose: PsiPurpose = field()
    model_id: str = text(ID_CHARS)
    blinded: np.ndarray = array("uint8", 2, width=32)    # (n, 32)
    model_hash: str = text(64, default="")               # purpose predict: as in PredictStart


@register
@dataclass
class PsiResponse:
    """Step 2: the request's values blinded again (same order), and the passive party's own
    ids blinded with its scalar, in a secret random order."""
    double_blinded: np.ndarray = array("uint8", 2, width=32)    # (n, 32)
    blinded: np.ndarray = array("uint8", 2, width=32)           # (m, 32)


@register
@dataclass
class PsiResult:
    """Step 3: positions (in the receiver's ``PsiResponse.blinded``) of the rows to use, in order."""
    session_id: str = text(ID_CHARS, nonempty=True)
    positions: np.ndarray = array("int", 1, min=0, nonempty=True)   # int64 (an empty intersection: refused)


# --- one-round batch prediction (--prediction one-round) -------------------
@register
@dataclass
class LeafMaskRequest:
    """Tree skeletons for one-round prediction: per node its children (-1, -1 at leaves) and,
    at the receiver's own nodes, its record id (-1 elsewhere). No threshold, no leaf value,
    no owner of other nodes. Trees are concatenated; ``tree_sizes`` gives their node counts."""
    session_id: str = text(ID_CHARS, nonempty=True)
    tree_sizes: np.ndarray = array("int", 1, min=1)    # int32 (n_trees,)
    left: np.ndarray = array("int", 1, min=-1)         # int32 (total nodes,)
    right: np.ndarray = array("int", 1, min=-1)        # int32
    record_ids: np.ndarray = array("int", 1, min=-1)   # int64
    SAME_LENGTH: ClassVar = (("left", "right", "record_ids"),)

    def validate(self) -> None:
        total = int(self.tree_sizes.astype(object).sum()) if self.tree_sizes.size else 0
        if total != len(self.left):
            raise ProtocolError(f"LeafMaskRequest.tree_sizes: they add up to {total} nodes, "
                                f"the trees hold {len(self.left)}")


@register
@dataclass
class LeafMaskResponse:
    """Per (row, tree) the leaves the row can reach given only the sender's decisions, as
    ``np.packbits`` of the tree's leaves in node-id order; trees concatenated along axis 1."""
    masks: np.ndarray = array("uint8", 2)   # (n_rows, sum over trees of ceil(n_leaves / 8))


# --- online scoring (vfl serve; parties/passive_online.py) ------------------
@register
@dataclass
class ServeOpen:
    """Opens a long-lived scoring channel for one model: the receiver's skeleton (as in
    :class:`LeafMaskRequest`), sent once; every :class:`ScoreRequest` of the channel is answered
    against it. ``model_hash`` as in :class:`PredictStart`."""
    channel_id: str = text(ID_CHARS, nonempty=True)
    model_id: str = text(ID_CHARS, nonempty=True)
    tree_sizes: np.ndarray = array("int", 1, min=1)    # int32 (n_trees,)
    left: np.ndarray = array("int", 1, min=-1)         # int32 (total nodes,)
    right: np.ndarray = array("int", 1, min=-1)        # int32
    record_ids: np.ndarray = array("int", 1, min=-1)   # int64
    model_hash: str = text(64, default="")
    SAME_LENGTH: ClassVar = (("left", "right", "record_ids"),)

    def validate(self) -> None:
        total = int(self.tree_sizes.astype(object).sum()) if self.tree_sizes.size else 0
        if total != len(self.left):
            raise ProtocolError(f"ServeOpen.tree_sizes: they add up to {total} nodes, the trees hold "
                                f"{len(self.left)}")


@register
@dataclass
class ScoreRequest:
    """Leaf masks for a few applicants (salted hashed ids under the model's salt) on an open
    scoring channel. Applicants the receiver does not know are answered with its default
    (missing-value) directions and flagged in :attr:`ScoreResponse.known`."""
    channel_id: str = text(ID_CHARS, nonempty=True)
    hashes: np.ndarray = array("uint8", 2, width=16, nonempty=True)


@register
@dataclass
class ScoreResponse:
    """Per applicant, the sender's decision (goes left) at each of its own nodes of the channel's
    skeleton, in node order, packed (``np.packbits`` along axis 1): the same information as its leaf
    masks (a mask reveals the sender's decision at all of its nodes), fewer bytes and no mask
    arithmetic on either side; and whether the sender knew the applicant."""
    decisions: np.ndarray = array("uint8", 2)     # (n_rows, ceil(own nodes / 8))
    known: np.ndarray = array("bool", 1)


@register
@dataclass
class ScoreRefused:
    """A scoring request refused by the receiver's own limits (its rate limit or daily row quota):
    ``rule`` names the limit, ``retry_after`` says when a retry may pass (0: not today)."""
    rule: str = text(64, nonempty=True)
    message: str = text(1024)
    retry_after: float = number(min=0.0, max=86400.0, default=0.0)


# --- DP-only mode (vfl.core.dp): one noisy release, then split registration ------
@register
@dataclass
class DPReleaseRequest:
    """Release this training's buckets once, each (row, feature) ``epsilon_per_feature``-LDP."""
    model_id: str = text(ID_CHARS, nonempty=True)
    epsilon_per_feature: float = number(min=0.0, finite=False)    # inf: no noise
    # value buckets wanted per feature (the passive party merges its training bins into at
    # most that many, equal-frequency; it keeps every boundary); None: the training bins
    n_buckets: np.ndarray | None = array("int", 1, min=1, default=None)
    # --dp-select: release only these rows (int64 positions in alignment order; None: all) and
    # these features (int32 indices; None: all). A row is released at most once per training.
    rows: np.ndarray | None = array("int", 1, min=0, default=None)
    features: np.ndarray | None = array("int", 1, min=0, default=None)

    def validate(self) -> None:
        if not self.epsilon_per_feature > 0:
            raise ProtocolError("DPReleaseRequest.epsilon_per_feature: must be positive")


@register
@dataclass
class DPRelease:
    """Noisy bucket index per aligned row (alignment order) per feature; boundaries stay home."""
    buckets: np.ndarray = array("uint", 2)        # uint8/uint16 (n_samples, n_features)
    n_bins: np.ndarray = array("int", 1, min=1)   # per feature: value buckets + the missing slot (last)
    rr_domain: np.ndarray = array("int", 1, min=1)   # per feature: buckets randomized over
    epsilon_per_feature: float = number(min=0.0, finite=False)
    SAME_LENGTH: ClassVar = (("n_bins", "rr_domain"),)


@register
@dataclass
class DPSplitRegister:
    """The active party chose these splits on the receiver's buckets: keep their thresholds."""
    model_id: str = text(ID_CHARS, nonempty=True)
    feature_idx: np.ndarray = array("int", 1, min=0)    # int32
    bin_idx: np.ndarray = array("int", 1, min=0)        # int32: "bucket <= bin_idx" goes left
    default_left: np.ndarray = array("bool", 1)         # where missing values go
    SAME_LENGTH: ClassVar = (("feature_idx", "bin_idx", "default_left"),)


@register
@dataclass
class DPSplitRecords:
    record_ids: np.ndarray = array("int", 1, min=0)     # one per registered split


# --- network deployments: resuming an interrupted training ----------------
@register
@dataclass
class TrainResume:
    """Continue model ``model_id`` after its first ``n_rounds`` rounds (sent right after
    :class:`TrainSetup`); the active party's checkpoint references ``n_records`` of the
    receiver's lookup-table records, which the receiver must still hold."""
    model_id: str = text(ID_CHARS, nonempty=True)
    n_rounds: int = count(0, MAX_ROUNDS)
    n_records: int = count()


# --- warm start: continuing a completed model with more rounds (issue 37) ----
@register
@dataclass
class TrainContinue:
    """Start the model set up by :class:`TrainSetup` (a new model id, the id salt of the base)
    from the receiver's completed model ``base_model_id``: its first ``n_rounds`` rounds, whose
    ``n_records`` lookup-table records the receiver copies (record ids 0 .. n_records - 1);
    the rounds trained next are numbered from ``n_rounds`` on, below the setup's total."""
    base_model_id: str = text(ID_CHARS, nonempty=True)
    n_rounds: int = count(1, MAX_ROUNDS)
    n_records: int = count()


# --- learner extras (issue 4): validation sets, split gains -----------------
@register
@dataclass
class EvalStart:
    """Open a validation session during training: the receiver aligns its validation rows
    (loaded locally with ``load_validation_data``) to these hashed ids; the session then
    answers :class:`RouteRequest` like a prediction session, one round's trees at a time."""
    model_id: str = text(ID_CHARS, nonempty=True)
    session_id: str = text(ID_CHARS, nonempty=True)
    hashes: np.ndarray = array("uint8", 2, width=16)   # the active party's validation ids hashed with the salt


@register
@dataclass
class SplitGains:
    """Optional, after training: the gain of each of the receiver's own splits (its records),
    so that it can compute gain importance of its features locally. Sent only on request
    of the active party (label-derived information; see docs/learner.md)."""
    model_id: str = text(ID_CHARS, nonempty=True)
    record_ids: np.ndarray = array("int", 1, min=0)    # int64
    gains: np.ndarray = array("float", 1)              # float64
    SAME_LENGTH: ClassVar = (("record_ids", "gains"),)


# --- drift of the parties' own inputs on scoring batches (issue 34; parties/drift.py) -----------
class DriftStatus(Vocabulary):
    """What a :class:`DriftReply` holds."""
    COUNTED = "counted"            # the session's rows were added to the drift run; more to come
    PSI = "psi"                    # the run's PSI per feature
    DECLINED = "declined"          # the receiver does not answer drift requests (its federation entry)
    NO_REFERENCE = "no_reference"  # its model file holds no training counts (written before they existed)


@register
@dataclass
class DriftRequest:
    """Add the rows of prediction session ``session_id`` to the drift run ``drift_id`` (the
    receiver counts its own features in its training bins, locally) and, when ``final``, answer
    the run's PSI per feature. Sent before the session's leaf-mask request."""
    model_id: str = text(ID_CHARS, nonempty=True)
    session_id: str = text(ID_CHARS, nonempty=True)
    drift_id: str = text(ID_CHARS, nonempty=True)
    final: bool = field()


@register
@dataclass
class DriftReply:
    """One PSI per feature of the receiver (NaN: undefined), in its feature order; ``names`` only
    where the receiver shares its feature names (else empty: positions)."""
    status: DriftStatus = field()
    psi: np.ndarray = array("float", 1, empty_default="float64")
    names: list[str] = field(default_factory=list)
    n_rows: int = count(default=0)
    reason: str = text(512, default="")


# --- feature screening (issue 33): WOE/IV over the encrypted histogram -------
@register
@dataclass
class ScreenSetup:
    """Open a screening instead of a training, right after the alignment (the same who-may-train
    rule; the passive party also requires its own grant to screen). The session then takes one
    key, one round of packed (event, 1) pairs (``GradientsStart`` + ``GradientShard``, round 0) and
    one :class:`ScreenRequest`: no training request. Mode ``dp``: no key and no gradients, one
    :class:`ScreenDPRequest` instead."""
    model_id: str = text(ID_CHARS, nonempty=True)       # the screening's id
    mode: str = text(16)                                # "he", "plain" or "dp"
    max_bin: int = count(2, MAX_BINS - 1)
    scheme: str = text(16, default=PAILLIER)

    def validate(self) -> None:
        if self.mode not in ("he", "plain", "dp"):
            raise ProtocolError(f"ScreenSetup.mode: {self.mode!r} is not one of he, plain, dp")
        if self.scheme not in SCHEMES:
            raise ProtocolError(f"ScreenSetup.scheme: {self.scheme!r} is not one of {', '.join(SCHEMES)}")


@register
@dataclass
class ScreenBins:
    """Slots per feature (value bins, the missing slot last) of the screening's bins; no edge.
    ``epsilon``: the DP noise the party adds to every count it returns (inf: exact counts)."""
    n_bins: np.ndarray = array("int", 1, min=2)
    epsilon: float = number(min=0.0, finite=False, default=float("inf"))


@register
@dataclass
class ScreenRequest:
    """The screening's one histogram: per slot of every feature, the sum of the round's packed
    (event, 1) pairs over the slot's rows."""
    model_id: str = text(ID_CHARS, nonempty=True)


@register
@dataclass
class ScreenResponse:
    """Compressed (and re-randomised) slot sums in flat (feature, slot) order, as a
    :class:`HistogramResponse`; with DP noise (``ScreenBins.epsilon`` finite) both digits of every slot
    carry two-sided geometric noise, the row digit a public offset too (parties.passive_screen)."""
    n_values: int = count()
    values: BigInts = field()


@register
@dataclass
class ScreenDPRequest:
    """Mode dp: release every aligned row's bucket of every feature once, ``epsilon_per_feature``-LDP
    (randomised response over the feature's slots)."""
    model_id: str = text(ID_CHARS, nonempty=True)
    epsilon_per_feature: float = number(min=0.0, finite=False)

    def validate(self) -> None:
        if not self.epsilon_per_feature > 0:
            raise ProtocolError("ScreenDPRequest.epsilon_per_feature: must be positive")


@register
@dataclass
class ScreenMerge:
    """The bins the active party pooled (monotone WOE, minimum share): per feature its number of
    value bins' groups, and for every value bin its group (consecutive runs 0, 1, ...): bin indices,
    never a value. The passive party keeps what each group means in its own values."""
    model_id: str = text(ID_CHARS, nonempty=True)
    group_of_bin: np.ndarray = array("int", 1, min=0)     # int32, value bins of every feature, in order


@register
@dataclass
class ScreenEnd:
    """The screening is over: the passive party frees its rows and closes the session."""
    model_id: str = text(ID_CHARS, nonempty=True)


@register
@dataclass
class FeatureSelect:
    """``--min-iv`` (issue 33): train on these of the receiver's feature positions only (sent after the
    alignment, before ``TrainSetup``); the names stay with their owner."""
    positions: np.ndarray = array("int", 1, min=0, nonempty=True)     # int64, increasing


# --- declared request -> reply pairs (checked once, in the transport) ---------
#: every request type and the reply types it expects (besides an :class:`ErrorReply`)
REPLIES: dict[type, tuple[type, ...]] = {
    AlignRequest: (IdHashes,),
    AlignResult: (AlignAck,),
    TrainSetup: (BinningInfo,),
    TrainResume: (Ack,),
    TrainContinue: (Ack,),
    PublicKey: (Ack,),
    Gradients: (Ack,),
    GradientsStart: (Ack,),
    GradientShard: (Ack,),
    HistogramRequest: (HistogramResponse, CandidateResponse),
    SplitRequest: (SplitResponse,),
    CandidatePick: (SplitResponse,),
    TrainEnd: (Ack,),
    PredictStart: (Ack,),
    RouteRequest: (RouteResponse,),
    PredictEnd: (Ack,),
    PsiRequest: (PsiResponse,),
    PsiResult: (AlignAck,),
    LeafMaskRequest: (LeafMaskResponse,),
    DPReleaseRequest: (DPRelease,),
    DPSplitRegister: (DPSplitRecords,),
    EvalStart: (Ack,),
    SplitGains: (Ack,),
    DriftRequest: (DriftReply,),
    ScreenSetup: (ScreenBins,),
    ScreenRequest: (ScreenResponse,),
    ScreenDPRequest: (DPRelease,),
    ScreenMerge: (Ack,),
    ScreenEnd: (Ack,),
    FeatureSelect: (Ack,),
    ServeOpen: (Ack,),
    ScoreRequest: (ScoreResponse, ScoreRefused),
}


@register
@dataclass
class FeatureSplitRequest:
    """Opt-in (a passive party whose federation entry says ``explain_features = true``), in a
    prediction session over the rows being explained: what the receiver needs to split its
    grouped attribution among its own features (``vfl.core.explain.own_feature_values``). Per
    leaf under one of the receiver's nodes: the leaf's target and the receiver's nodes on its path
    (``path_start[l]:path_start[l + 1]`` of the path arrays: its record ids, the path's direction,
    the node's cover fraction); per row and leaf the leaf's group weight ``weights[row, l]``.
    The receiver answers with an :class:`FeatureSplitDone`, never with the values."""
    session_id: str = text(ID_CHARS, nonempty=True)
    n_targets: int = count(min=1, max=1 << 16)
    leaf_target: np.ndarray = array("int", 1, min=0)    # int64 (L,)
    path_start: np.ndarray = array("int", 1, min=0)     # int64 (L + 1,)
    path_record: np.ndarray = array("int", 1, min=0)    # int64 (P,)
    path_left: np.ndarray = array("bool", 1)             # bool (P,)
    path_z: np.ndarray = array("float", 1)               # float64 (P,) in [0, 1]
    weights: np.ndarray = array("float", 2)              # float64 (n rows, L)
    SAME_LENGTH: ClassVar = (("path_record", "path_left", "path_z"),)

    def validate(self) -> None:
        L, P = len(self.leaf_target), len(self.path_record)
        if len(self.path_start) != L + 1 or (L + 1 and (self.path_start[0] != 0 or self.path_start[-1] != P)) \
                or np.any(np.diff(self.path_start) < 1):
            raise ProtocolError(f"FeatureSplitRequest.path_start: expected {L + 1} increasing offsets from 0 to "
                                f"{P}, each leaf with at least one node")
        if self.weights.shape[1] != L:
            raise ProtocolError(f"FeatureSplitRequest.weights: {self.weights.shape[1]} columns for {L} leaves")
        if L and int(self.leaf_target.max()) >= self.n_targets:
            raise ProtocolError(f"FeatureSplitRequest.leaf_target: a target beyond n_targets={self.n_targets}")
        if not np.all(np.isfinite(self.weights)):
            raise ProtocolError("FeatureSplitRequest.weights: not finite")
        if P and not (np.all(np.isfinite(self.path_z)) and self.path_z.min() >= 0 and self.path_z.max() <= 1):
            raise ProtocolError("FeatureSplitRequest.path_z: cover fractions must lie in [0, 1]")


@register
@dataclass
class FeatureSplitDone:
    """The receiver split its attributions among its own features and kept them: only how many
    rows it explained, never a value."""
    n_rows: int = count(min=0)


REPLIES[FeatureSplitRequest] = (FeatureSplitDone,)
