"""The passive party's screening handlers (issue 33): one screening session.

A screening is a training-type session (it starts with the alignment, under the same who-may-train
rule) that the passive party must also have granted (``screen_allowed``: in a deployment, the
``screen`` list of its federation entry; default nobody). After ``ScreenSetup`` -> ``ScreenBins``
(the training binner's slots per feature, no edge) it takes the active party's public key
(``PublicKey``) and one round of packed ``(event, 1)`` pairs (``GradientsStart`` and
``GradientShard`` of round 0, the training handlers' intake), answers one ``ScreenRequest`` with the
sums per slot of every feature (the batched-ciphertext histogram of :mod:`crypto.shards`, compressed
and re-randomised like a training histogram), takes the groups of bins the active party pooled
(``ScreenMerge``: bin indices; the party keeps what they mean in its values) and ends with
``ScreenEnd``. In mode ``dp`` it answers one ``ScreenDPRequest`` instead: every row's bucket per
feature under randomised response.

:class:`ScreeningProtocol` stands where a training's :class:`parties.passive_checks.TrainingProtocol`
does: a screening session answers no training request (histogram or split), a second round or a
second histogram; a training session answers no screening request. A refusal ends the session.

With ``screen_epsilon`` (the party's own setting) every count it returns carries two-sided geometric
(discrete Laplace) noise, added to the encrypted sums (it never sees them): events and rows of every slot
of every feature, scale ``F (g_max + h_max) / epsilon`` for ``F`` features, where ``g_max``/``h_max``
are the largest values the active party's packing layout admits per row (an honest active party sends
0/1 and 1; one that weights rows cannot go beyond the layout, and the noise covers that), charged to the
party's DP ledger before it answers: epsilon-DP per row for whatever the active party sent.
"""
from __future__ import annotations

import math
from contextlib import contextmanager

import gmpy2
import numpy as np

from crypto import schemes
from crypto.compress import compress, stride_for
from crypto.shards import ShardSet, stream_rows
from datasets.errors import InputError, ProtocolError
from datasets.pieces import PieceTable
from parties import dp
from parties.passive_state import PassiveState, TrainingSession, unsafe_seed
from parties.settings import Settings
from protocols import messages as m
from protocols.serialization import BigInts
from protocols.transport import check_deadline
from vfl.core.binning import Binner
from vfl.core.dp import ReleaseDomain, bucketize, release_buckets
from vfl.core.dp_bins_file import public_columns
from vfl.core.dp_noise import NOT_PRIVATE, noise_source
from vfl.core.woe import check_group_labels

#: the noise's tail the packing leaves room for, in noise scales (only the decoding needs it: the noisy
#: digits are what they are, a sum beyond its digit decodes wrong, it does not weaken the guarantee)
NOISE_TAIL = 30.0
#: mode dp: the share of a feature's epsilon its DP bucket edges spend (the rest: its release)
DP_EDGE_SHARE = 0.1


def noise_scale(n_features: int, g_max: int, h_max: int, epsilon: float) -> float:
    """The discrete Laplace scale of every screening count: one row moves, in each of the ``F``
    features, one slot's event digit by at most ``g_max`` and its row digit by at most ``h_max`` (the
    largest values the active party's layout admits: an honest party sends 0/1 and 1, a misbehaving
    one cannot weight rows beyond them), so ``F (g_max + h_max) / epsilon`` gives epsilon-DP per row."""
    return n_features * (g_max + h_max) / epsilon


def noise_offset(n_features: int, g_max: int, h_max: int, epsilon: float) -> int:
    """What the passive party adds to every row digit so that the noisy digit stays non-negative
    (:data:`NOISE_TAIL` scales); the active party subtracts it (public: it depends on public values)."""
    return math.ceil(NOISE_TAIL * noise_scale(n_features, g_max, h_max, epsilon))


def noise_headroom(n_rows: int, n_features: int, epsilon: float) -> int:
    """The bound ``K`` (``g_bound`` = ``h_bound``) the active party's layout uses so that the noisy event
    digit (``|events + noise| < n K``) and row digit (``0 <= rows + offset + noise < n K``) decode, the
    noise at :data:`NOISE_TAIL` scales; 1 without noise. Refused (InputError) when no ``K`` does: the
    noise at this epsilon swamps the rows."""
    if not math.isfinite(epsilon):
        return 1
    k = 1
    for _ in range(64):
        need = 1 + math.ceil((2 * noise_offset(n_features, k, k, epsilon) + 1) / max(1, n_rows))
        if need <= k:
            return k
        k = need
    raise InputError(f"DP noise at screen_epsilon {epsilon} over {n_features} features swamps {n_rows} rows: the "
                     f"noisy counts cannot be decoded (epsilon x rows must well exceed {4 * NOISE_TAIL:g} x features); "
                     "a larger epsilon, fewer features or more rows")


class ScreeningProtocol:
    """What a passive party allows in one screening: one gradient round (round 0), one screening
    histogram, one merge, nothing of a training. A refusal ends the session (``refused``)."""

    def __init__(self, party: str, mode: str):
        self.party, self.mode = party, mode
        self.refused: str | None = None
        self.rounds = 0
        self.answered = False
        self.merged = False

    def _refuse(self, what: str, rule: str, detail: str):
        self.refused = f"rule {rule!r}: {detail}"
        raise ProtocolError(f"party {self.party!r} refuses {what}: {self.refused}; the screening ends")

    def check_open(self, what: str) -> None:
        if self.refused is not None:
            raise ProtocolError(f"party {self.party!r} refuses {what}: the screening ended after a refused request "
                                f"({self.refused})")
        if what in ("HistogramRequest", "SplitRequest"):
            self._refuse(what, "screening session", "a screening session answers one screening histogram, no "
                                                    "training histogram or split")
        if what == "gradients":
            if self.mode == "dp":
                self._refuse("gradients", "screening session", "a screening in mode dp takes no gradients")
            if self.rounds or self.answered:
                self._refuse("a second gradient round", "screening session",
                             "a screening takes one round of events (round 0)")
            self.rounds += 1

    def check_round_open(self, what: str, round_idx: int) -> None:
        """A screening's one round of events is round 0."""
        if round_idx != 0:
            self._refuse(f"{what} of round {round_idx}", "screening session",
                         "a screening takes one round of events (round 0)")

    def split_request(self, round_idx, tree_idx, node_ids) -> None:
        self.check_open("SplitRequest")

    def histogram_request(self, *args) -> None:
        self.check_open("HistogramRequest")

    def screen_request(self, what: str) -> None:
        self.check_open(what)
        if self.answered:
            self._refuse(what, "screening session", "one screening histogram per feature set (already answered)")
        self.answered = True


def _screening(s: PassiveState, what: str) -> ScreeningProtocol:
    proto = s.train.protocol
    if isinstance(proto, ScreeningProtocol):
        return proto
    if proto is not None:       # a training session: the request ends it (TrainingProtocol.refused)
        proto.refused = "rule 'training session': a training session answers no screening request"
        raise ProtocolError(f"party {s.name!r} refuses {what}: {proto.refused}; the training ends")
    raise ProtocolError(f"party {s.name!r} received {what} before ScreenSetup")


def setup(s: PassiveState, req: m.ScreenSetup) -> m.ScreenBins:
    if not s.screen_allowed:
        raise ProtocolError(f"party {s.name!r} refuses ScreenSetup: rule 'who may screen': it has not granted "
                            "screening (its federation entry's screen list, default nobody)")
    rows = s.aligned_rows()
    if len(rows) == 0:
        raise InputError(f"party {s.name!r} has no rows in common with the active party: nothing to screen")
    s.close_executor()
    t = s.train
    t.settings = Settings.from_environ().for_party(s.n_jobs)
    t.mode = req.mode if req.mode != "dp" else None      # mode dp: no key, no gradients (t.mode stays unset:
    t.scheme = req.scheme                                # the DP training handlers refuse this session)
    t.nsquare = t.public_key = t.plain_bits = None
    t.protocol = ScreeningProtocol(s.name, req.mode)
    t.screen_mode = req.mode
    t.screen_groups = {}
    t.screen_id = req.model_id          # the party's model (id, lookup table) is not touched
    t.screen_max_bin = req.max_bin
    t.dp_domain, t.dp_X, t.dp_edges, t.data_digest = None, None, {}, None
    X = s.X[rows]           # a Parquet table read piece by piece: the aligned rows, read here
    categorical = np.array([f in s.categories for f in s.feature_names], dtype=bool)
    eps = s.screen_epsilon
    if req.mode == "dp":
        eps = None          # the release's own epsilon (ScreenDPRequest) is charged instead
    else:
        eps = float("inf") if eps is None else dp.check_epsilon(eps, "screen_epsilon")
        dp.charge(s, eps, "screen", n_features=len(s.feature_names), n_rows=int(len(rows)))
    t.screen_epsilon = eps
    if req.mode == "dp":        # the release domain: its slots from the public schema only, its edges DP
        if categorical.any():
            raise InputError(f"party {s.name!r}: categorical features are not supported by a screening in mode dp "
                             "(its release buckets every feature as numeric); use mode he")
        t.dp_X = np.asarray(X, dtype=np.float64)
        dom = ReleaseDomain(req.max_bin, 0.0, noise_source(None), public_columns(s.dp_bins, s.feature_names, s.name),
                            s.name)
        dom.n_features = X.shape[1]
        t.binner = None
        t.screen_n_bins = dom.n_bins.astype(np.int64)
        return m.ScreenBins(t.screen_n_bins, float("inf"))
    t.binner = Binner(req.max_bin, categorical if categorical.any() else None).fit(X)
    t.bin_idx = t.binner.transform(X)
    t.screen_n_bins = t.binner.n_bins.astype(np.int64)
    if req.mode != "dp":
        executor = s.get_executor(work=len(rows) * X.shape[1] if req.mode == "he" else -1)
        t.shards = ShardSet(executor, len(rows), prefix=f"screen-{req.model_id}/",
                            max_rows=stream_rows(len(rows), executor.n_workers) if t.settings.overlap else None)
        t.shards.place_array("bins", t.bin_idx)
    return m.ScreenBins(t.binner.n_bins.astype(np.int64), float("inf") if eps is None else eps)


def _slot_counts(s: PassiveState) -> np.ndarray:
    """Exact rows per slot of every feature, flat (feature, slot) order."""
    t = s.train
    nb = t.binner.n_bins
    return np.concatenate([np.bincount(t.bin_idx[:, j].astype(np.int64), minlength=int(nb[j]))
                           for j in range(len(nb))]).astype(np.int64)


def request(s: PassiveState, req: m.ScreenRequest) -> m.ScreenResponse:
    proto = _screening(s, "ScreenRequest")
    t = s.train
    if req.model_id != t.screen_id:
        raise ProtocolError(f"party {s.name!r}: ScreenRequest for unknown screening {req.model_id!r}")
    if proto.mode == "dp":
        proto._refuse("ScreenRequest", "screening session", "a screening in mode dp answers its release only")
    g = s.need("the events (GradientsStart)", t.grads)
    proto.screen_request("ScreenRequest")
    if t.intake is not None and t.intake.g is g:
        t.intake.finish()
    if not g.complete():
        raise ProtocolError(f"party {s.name!r} received the events of only {int(g.received.sum())} of "
                            f"{len(g.received)} rows")
    if g.groups != 1 or g.layout.n_targets != 1:
        raise ProtocolError("a screening's events are one target (one group)")
    n = len(t.rows)
    _check_weights(s, proto, g.layout, n)
    check_deadline("screening")
    modulus = t.nsquare if t.mode == "he" else None
    n_bins = t.binner.n_bins.tolist()
    total = int(sum(n_bins))
    a = np.zeros((1, n), dtype=np.int32)
    intake = t.intake if t.intake is not None and t.intake.g is g else None
    groups = intake.root_groups(np.zeros(1, dtype=np.int64), np.zeros(1, dtype=np.int64), a) \
        if intake is not None else None
    if groups is not None:
        sums, _ = t.shards.root_histograms(g, groups, n_bins, modulus)
    else:
        sums, _ = t.shards.histograms(g, a, [0], [0], n_bins, modulus)
    eps = t.screen_epsilon
    if eps is not None and math.isfinite(eps):
        if g.shifts != 1:
            raise ProtocolError(f"party {s.name!r} adds DP noise to its counts: it needs the events without "
                                "pre-shifted copies (shifts 1)")
        sums = _add_noise(s, g, sums, n, eps)
    if g.shifts < g.per:
        packed = compress(sums, g.layout.value_bits, stride_for(g.per, g.shifts), modulus,
                          executor=t.shards.executor)
    else:
        packed = sums
    if t.mode == "he":
        packed = s.need("the public key", t.randomizer).rerandomize(packed)
    return m.ScreenResponse(total, BigInts(packed))


def _check_weights(s: PassiveState, proto: ScreeningProtocol, layout, n: int) -> None:
    """What one row may weigh in the sums this party returns: integers (no fractional bits), the events
    at most :func:`noise_headroom` (1 without noise) and the row counts the same. An honest active party
    sends 0/1 and 1; larger weights would let one screening read more than counts (rows told apart by
    weight). Within the bound a misbehaving party can still single out a few rows per screening (docs:
    the threat model); the DP noise covers any weight within it."""
    eps = s.train.screen_epsilon
    cap = noise_headroom(n, len(s.train.binner.n_bins), float("inf") if eps is None else eps)
    if layout.precision_bits != 0 or layout.g_max > cap or layout.h_max > cap:
        proto._refuse("ScreenRequest", "event weights",
                      f"the events' layout admits per-row values up to {layout.g_max} / {layout.h_max} with "
                      f"{layout.precision_bits} fractional bits; a screening allows integers up to {cap}")


def _add_noise(s: PassiveState, g, sums: list, n: int, eps: float) -> list:
    """Discrete Laplace noise on every slot's event digit and row digit (:func:`noise_scale`: the largest
    weights the layout admits, whatever the active party sent), added to the packed sums, encrypted or not;
    the row digit also gets :func:`noise_offset` (non-negative). What leaves is a function of the noisy
    counts only: a digit that overflows decodes wrong, it reveals nothing more."""
    t = s.train
    F = len(t.binner.n_bins)
    G, H = int(g.layout.g_max), int(g.layout.h_max)
    scale = noise_scale(F, G, H, eps)
    offset = noise_offset(F, G, H, eps)
    total = int(t.binner.n_bins.sum())
    noise = noise_source(unsafe_seed(s, "screen"))
    z_ev = noise.laplace_counts(np.zeros(total, dtype=np.int64), scale)
    z_rows = noise.laplace_counts(np.full(total, offset, dtype=np.int64), scale)
    hb = g.layout.h_bits
    deltas = [(int(a) << hb) + int(b) for a, b in zip(z_ev.tolist(), z_rows.tolist())]
    if t.mode == "he":
        pk = s.need("the public key", t.public_key)
        n2 = gmpy2.mpz(schemes.cipher_modulus(pk))
        extra = schemes.reply_encryptor(pk).encrypt(deltas)        # signed plaintexts
        sums = [int(gmpy2.mpz(c) * gmpy2.mpz(e) % n2) for c, e in zip(sums, extra)]
    else:
        sums = [int(c) + d for c, d in zip(sums, deltas)]
    s.dp_ledger.append({"model_id": s.model_id, "kind": "screen", "epsilon": eps, "n_features": F,
                        "noise_scale": scale, "noise": noise.label(),
                        **({} if noise.private else {"privacy": NOT_PRIVATE})})
    return sums


def dp_release(s: PassiveState, req: m.ScreenDPRequest) -> m.DPRelease:
    """Mode dp: every aligned row's slot of every feature under randomised response at
    ``epsilon_per_feature`` (charged: ``epsilon_per_feature x features``), its cap this party's
    ``dp_max_epsilon_per_feature``; the edges stay here."""
    proto = _screening(s, "ScreenDPRequest")
    t = s.train
    if req.model_id != t.screen_id:
        raise ProtocolError(f"party {s.name!r}: ScreenDPRequest for unknown screening {req.model_id!r}")
    if proto.mode != "dp":
        proto._refuse("ScreenDPRequest", "screening session", f"a screening in mode {proto.mode} has no release")
    proto.screen_request("ScreenDPRequest")
    eps = dp.check_epsilon(req.epsilon_per_feature, "epsilon_per_feature")
    if not math.isfinite(eps):
        proto._refuse("ScreenDPRequest", "screening in mode dp", "a release needs a finite epsilon")
    cap = s.dp_max_epsilon_per_feature
    if cap is not None and eps > dp.check_epsilon(cap, "dp_max_epsilon_per_feature"):
        raise InputError(f"party {s.name!r} releases at most epsilon_per_feature={cap}, asked for {eps}")
    X = s.need("ScreenSetup", t.dp_X)
    F = X.shape[1]
    public = public_columns(s.dp_bins, s.feature_names, s.name)
    n_dp = F - len([j for j, e in public.items() if "edges" in e or "lo" in e])
    edge_eps = DP_EDGE_SHARE * eps if n_dp else 0.0            # per DP-binned feature, for its DP histogram
    release_eps = eps - edge_eps
    dp.charge(s, eps * F, "screen-dp", n_rows=int(len(t.rows)), n_features=F,
              epsilon_per_feature=dp.json_epsilon(eps), edge_share=DP_EDGE_SHARE if n_dp else 0.0)
    noise = noise_source(unsafe_seed(s, "screen-release"))
    order = np.argsort(t.rows, kind="stable")          # the noise in the party's own row order
    dom = ReleaseDomain(t.screen_max_bin, edge_eps * n_dp, noise, public, s.name).fit(X[order])
    cols, slots, has_missing = [], [], []
    for j in range(F):
        e = dom.edges(j, dom.max_buckets(j))
        col = bucketize(X[order, j], e)
        if not dom.missing_slot(j):
            col[col == len(e) + 1] = 0
        cols.append(col)
        t.dp_edges[j] = e
        slots.append(len(e) + 2)
        has_missing.append(dom.missing_slot(j))
    slots = np.array(slots, dtype=np.int64)
    noisy_own, domain = release_buckets(np.column_stack(cols), slots, release_eps, noise, np.array(has_missing))
    noisy = np.empty_like(noisy_own)
    noisy[order] = noisy_own
    t.dp_X = None
    s.dp_ledger.append({"model_id": t.screen_id, "kind": "screen-dp", "epsilon_per_feature": dp.json_epsilon(eps),
                        "epsilon_per_party": dp.json_epsilon(eps * F), "edge_epsilon_per_feature": edge_eps,
                        "n_samples": int(len(t.rows)), "n_features": F, "noise": noise.label(),
                        **({} if noise.private else {"privacy": NOT_PRIVATE})})
    return m.DPRelease(noisy, slots.astype(np.int32), domain, release_eps)


def merge(s: PassiveState, req: m.ScreenMerge) -> m.Ack:
    proto = _screening(s, "ScreenMerge")
    proto.check_open("ScreenMerge")
    if not proto.answered or proto.merged:
        proto._refuse("ScreenMerge", "screening session", "one merge, after the screening's counts")
    t = s.train
    nb = np.asarray(t.screen_n_bins, dtype=np.int64) - 1        # value bins per feature (as announced)
    labels = np.asarray(req.group_of_bin, dtype=np.int64)
    if len(labels) != int(nb.sum()):
        proto._refuse("ScreenMerge", "bin groups", f"{len(labels)} group labels for {int(nb.sum())} value bins")
    pos = 0
    groups = {}
    for j, k in enumerate(nb.tolist()):
        try:
            groups[j] = check_group_labels(labels[pos:pos + k], k)
        except ValueError as exc:
            proto._refuse("ScreenMerge", "bin groups", f"feature {j}: {exc}")
        pos += k
    t.screen_groups = groups
    proto.merged = True
    return m.Ack({"n_groups": int(sum(len(v) for v in groups.values()))})


def end(s: PassiveState, req: m.ScreenEnd) -> m.Ack:
    if req.model_id != s.train.screen_id:
        raise ProtocolError(f"party {s.name!r}: ScreenEnd for unknown screening {req.model_id!r}")
    _screening(s, "ScreenEnd")
    s.close_executor()
    s.train.grads = None
    return m.Ack({"screened": True})


@contextmanager
def isolated(s: PassiveState):
    """An in-process screening beside a trained model (``Federation.screen``): the screening's alignment
    and session replace the training session's rows, salt and selected features only meanwhile; the
    model keeps predicting afterwards. (A server opens a fresh party per session.)"""
    saved = (s.train, s.salt, s.X, s.feature_names, s.dp_bins, s.full_features, s.select_open)
    s.train = TrainingSession()
    restore_features(s)         # every feature is screened, also after a --min-iv training
    try:
        yield
    finally:
        s.close_executor()
        screened = s.train
        s.train, s.salt, s.X, s.feature_names, s.dp_bins, s.full_features, s.select_open = saved
        s.last_screening = screened


def local_bins(s: PassiveState) -> dict[str, list[str]]:
    """This party's own view of its last screening: per feature, the value range of every reported
    bin (the groups the active party pooled, in its own edges; the missing bin last). Never sent."""
    t = s.last_screening if s.last_screening is not None and not isinstance(s.train.protocol, ScreeningProtocol) \
        else s.train
    b = t.binner
    if t.screen_n_bins is None or not isinstance(t.protocol, ScreeningProtocol):
        raise InputError(f"party {s.name!r} has screened nothing")
    out = {}
    for j, f in enumerate(s.feature_names):
        nv = int(t.screen_n_bins[j]) - 1
        groups = t.screen_groups.get(j) or [[i] for i in range(nv)]
        if b is None:           # mode dp: the release's DP edges (a group past them is empty)
            thr = np.asarray(t.dp_edges.get(j, []), dtype=np.float64)
            out[f] = [_interval(thr, g) for g in groups] + ["missing"]
        else:
            out[f] = [_range(b, j, g) for g in groups] + ["missing"]
    return out


def _range(b: Binner, j: int, group: list[int]) -> str:
    if b.is_categorical(j):
        return "categories " + ",".join(str(i) for i in group)
    return _interval(b.thresholds_[j], group)


def _interval(thr, group: list[int]) -> str:
    lo = "-inf" if group[0] == 0 else f"{thr[group[0] - 1]:.6g}"
    hi = "inf" if group[-1] >= len(thr) else f"{thr[group[-1]]:.6g}"
    return f"({lo}, {hi}]"


# --- --min-iv: the training uses the positions the active party keeps -----------------------------------
def restore_features(s: PassiveState) -> None:
    """A new training-type session (its alignment): every feature again, and a ``FeatureSelect`` may follow."""
    full = s.full_features
    if full is not None:
        s.X, s.feature_names, s.dp_bins, s.full_features = full[0], list(full[1]), dict(full[2]), None
    s.select_open = True


def close_selection(s: PassiveState) -> None:
    s.select_open = False


def select_features(s: PassiveState, req: m.FeatureSelect) -> m.Ack:
    """Train on the feature positions ``req.positions`` only (``--min-iv``): sent after the alignment,
    before ``TrainSetup``. The names and the columns stay here; the model file lists the kept features."""
    s.aligned_rows()
    if not s.select_open:
        raise ProtocolError(f"party {s.name!r} refuses FeatureSelect: it must follow the alignment, before the "
                            "training's setup, once")
    keep = np.asarray(req.positions, dtype=np.int64)
    nf = len(s.feature_names)
    if keep.size == 0 or keep.min() < 0 or keep.max() >= nf or np.any(np.diff(keep) <= 0):
        raise ProtocolError(f"party {s.name!r}: FeatureSelect.positions must be increasing positions in [0, {nf})")
    names = [s.feature_names[i] for i in keep.tolist()]
    s.full_features = (s.X, list(s.feature_names), dict(s.dp_bins))
    s.X = s.X.with_features(names) if isinstance(s.X, PieceTable) else np.asarray(s.X)[:, keep]
    s.feature_names = names
    s.dp_bins = {k: v for k, v in s.dp_bins.items() if k in names}
    s.select_open = False
    return m.Ack({"n_features": int(len(names))})
