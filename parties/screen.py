"""The active party's side of feature screening (issue 33): federated WOE and IV.

:func:`screen` drives one screening over a transport, like a training's first round with the label
in place of the gradient: align the ids (the training's alignment, hashed ids or PSI), open a
screening session at every passive party (``ScreenSetup`` -> ``ScreenBins``: slots per feature, no
edge), send the public key, pack every aligned row's ``(event, 1)`` pair with the gradient channel
(:class:`parties.channel.GradientChannel`: encrypted once for every passive party, streamed under
the frame cap), and ask each party its one screening histogram (``ScreenRequest``): the decrypted
sums per slot are the events and the rows of each bin of each of its features. The active party
then decides any pooling of bins (monotone WOE, a minimum share of rows) from those counts and
tells the owner the groups as bin indices (``ScreenMerge``), never values; ``ScreenEnd`` closes the
session. In mode ``dp`` each passive party releases its rows' buckets once under randomised response
(``ScreenDPRequest``) and the active party debiases the per-bucket counts.

The active party's own features are screened locally with the same binner.
"""
from __future__ import annotations

import json
import math
import secrets
import time
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from crypto.schemes import PAILLIER
from datasets.errors import InputError, PeerError
from parties.channel import GradientChannel
from parties.passive_screen import noise_headroom, noise_offset
from parties.psi_align import align_train
from parties.settings import Settings
from protocols import alignment
from protocols import messages as m
from protocols.transport import Transport
from vfl.core.binning import Binner, check_max_bin, feature_matrix
from vfl.core.dp_debias import debias, rr_channel
from vfl.core.params import Alignment, Mode
from vfl.core.rounds import RoundGradients, RoundTiming
from vfl.core.woe import FeatureScreen, WOEError, check_binary_labels, naive_counts, screen_feature

MODES = ("he", "plain", "dp")


@dataclass
class ScreenParams:
    """How to screen: ``mode`` (``he``: the label encrypted, ``plain``: no encryption, for tests and
    trusted setups, ``dp``: each passive party's randomised-response release), ``scheme`` and
    ``key_bits`` of the key (mode he), ``max_bin`` the training binner's bins per feature
    (``--bins``), ``monotone`` pool adjacent bins until WOE is monotone, ``min_share`` the least share
    of rows a bin keeps (bins below are pooled with a neighbour), ``align`` as in training,
    ``dp_epsilon_per_feature`` mode dp's release."""
    mode: str = "he"
    scheme: str = PAILLIER
    key_bits: int = 2048
    encryption: str = "fast"
    max_bin: int = 32
    monotone: bool = False
    min_share: float = 0.0
    align: str = "hash"
    dp_epsilon_per_feature: float | None = None

    def __post_init__(self):
        if self.mode not in MODES:
            raise InputError(f"screening mode must be one of {', '.join(MODES)}, got {self.mode!r}")
        self.max_bin = check_max_bin(self.max_bin)
        if isinstance(self.min_share, bool) or not isinstance(self.min_share, (int, float)) \
                or not 0 <= self.min_share < 0.5:
            raise InputError(f"min_share (the least share of rows per bin) must be in [0, 0.5), got {self.min_share!r}")
        if self.mode == "dp":
            e = self.dp_epsilon_per_feature
            if isinstance(e, bool) or not isinstance(e, (int, float)) or not e > 0:
                raise InputError("a screening in mode dp needs dp_epsilon_per_feature > 0 (--dp-epsilon)")
        if self.align not in ("hash", "psi"):
            raise InputError(f"align must be 'hash' or 'psi', got {self.align!r}")


@dataclass
class ScreenResult:
    """Every screened feature (the active party's first, then each passive party's, in order)."""
    features: list
    n_rows: int
    n_events: int
    params: dict
    alignment: dict = field(default_factory=dict)
    parties: dict = field(default_factory=dict)    # party -> {"epsilon": the DP noise on its counts, ...}
    seconds: dict = field(default_factory=dict)    # wall seconds by stage (align, own, setup, key, events, ...)

    def table(self) -> pd.DataFrame:
        """One row per feature: party, position, feature, IV, missing share, bins, notes."""
        return pd.DataFrame([{"party": f.party, "position": f.position, "feature": f.feature, "iv": f.iv,
                              "missing_share": f.missing_share, "n_bins": len(f.groups) - 1,
                              "notes": "; ".join(f.notes)} for f in self.features])

    def bins_table(self) -> pd.DataFrame:
        """One row per bin of every feature: rows, events, WOE, IV contribution."""
        rows = []
        for f in self.features:
            for b in f.bins_table():
                rows.append({"party": f.party, "position": f.position, "feature": f.feature, **b})
        return pd.DataFrame(rows)

    def iv(self) -> dict[str, dict[str, float]]:
        """``{party: {feature: IV}}``."""
        out: dict = {}
        for f in self.features:
            out.setdefault(f.party, {})[f.feature] = f.iv
        return out

    def kept(self, min_iv: float) -> dict[str, list[int]]:
        """``{party: positions of its features with IV >= min_iv}``."""
        out: dict = {}
        for f in self.features:
            out.setdefault(f.party, [])
            if f.iv >= min_iv:
                out[f.party].append(f.position)
        return out

    def to_dict(self) -> dict:
        return {"format": "vfl-boost-screening", "version": 1, "n_rows": self.n_rows, "n_events": self.n_events,
                "params": self.params, "alignment": self.alignment, "parties": self.parties, "seconds": self.seconds,
                "features": [f.to_dict() for f in self.features]}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=1, default=_json_default)


def _json_default(x):
    if isinstance(x, (np.integer,)):
        return int(x)
    if isinstance(x, (np.floating,)):
        return float(x)
    raise TypeError(f"not JSON: {type(x).__name__}")


def _labels(active, rows: np.ndarray) -> np.ndarray:
    if active.y_raw is None:
        raise InputError(f"party {active.name!r} holds no labels to screen with")
    y = active.y_raw[rows]
    try:
        if y.dtype.kind in "OUS":
            raise WOEError(f"the label column {active.label_col!r} of party {active.name!r} holds text "
                           f"(values {', '.join(map(str, pd.unique(y)[:4]))}): information value needs a binary 0/1 "
                           "label (1 = event)")
        return check_binary_labels(y, f"the label column {active.label_col!r} of party {active.name!r}")
    except WOEError as exc:
        raise InputError(str(exc)) from None


def _align(active, transport: Transport, passives: list[str], params: ScreenParams) -> np.ndarray:
    salt, session_id = alignment.new_salt(), secrets.token_hex(8)
    if params.align == Alignment.PSI:
        rows, active.alignment_report = align_train(transport, passives, active.name, active.ids, salt, session_id)
        return rows
    return active.align(transport, passives, salt, session_id)


def screen(active, transport: Transport, passives: list[str], params: ScreenParams | None = None,
           names: dict | None = None) -> ScreenResult:
    """Screen every feature of the active party and of the passive parties ``passives``.
    ``names``: ``{passive party: its feature names}`` where the caller knows them (a simulation);
    a passive party's feature is else named by its position (``#3``)."""
    params = params or ScreenParams()
    passives = list(passives)
    if len(set(passives)) != len(passives) or active.name in passives:
        raise InputError(f"party names must be unique, got active {active.name!r} and passive {passives}")
    if active.y_raw is None:
        raise InputError(f"party {active.name!r} holds no labels to screen with")
    _labels(active, np.arange(len(active.ids)))     # a non-binary label is refused before any message
    screen_id = "screen-" + secrets.token_hex(8)
    opened = False
    channel = None
    clock = _Clock()
    try:
        try:
            rows = _align(active, transport, passives, params) if passives else np.arange(len(active.ids))
        except InputError as exc:
            raise InputError(str(exc).replace("nothing to train on", "nothing to screen")) from None
        opened = bool(passives)
        clock.lap("align")
        y = _labels(active, rows)
        n = len(rows)
        if active._deferred is not None:
            active._read_deferred()
        features = _own_features(active, rows, y, params)
        clock.lap("own_features")
        infos = transport.call_many({p: m.ScreenSetup(screen_id, params.mode, params.max_bin, params.scheme)
                                     for p in passives})
        clock.lap("setup")
        counts: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        if passives and params.mode != "dp":
            channel, counts = _encrypted_counts(active, transport, passives, infos, y, params, screen_id, clock)
        elif passives:
            counts = _dp_counts(transport, passives, infos, y, params, screen_id)
            clock.lap("release")
        party_info = {}
        for p in passives:
            nb = infos[p].n_bins.astype(np.int64)
            rows_flat, events_flat = counts[p]
            labels = []
            offs = np.concatenate([[0], np.cumsum(nb)])
            pn = (names or {}).get(p)
            for j in range(len(nb)):
                a, b = int(offs[j]), int(offs[j + 1])
                name = pn[j] if pn is not None and j < len(pn) else f"#{j}"
                try:
                    fs, lab = screen_feature(p, j, name, rows_flat[a:b], events_flat[a:b], params.monotone,
                                             params.min_share)
                except WOEError as exc:
                    raise InputError(f"party {p!r}, feature {name}: {exc}") from None
                features.append(fs)
                labels.append(lab)
            transport.call(p, m.ScreenMerge(screen_id, np.concatenate(labels).astype(np.int32) if labels
                                            else np.zeros(0, dtype=np.int32)))
            eps = float(infos[p].epsilon)
            party_info[p] = {"n_features": int(len(nb)),
                             "epsilon": "inf" if not math.isfinite(eps) else eps,
                             **({"dp_epsilon_per_feature": params.dp_epsilon_per_feature} if params.mode == "dp"
                                else {})}
        clock.lap("woe")
    finally:
        if channel is not None:
            channel.close()
        if opened:
            for p in passives:
                try:
                    transport.call(p, m.ScreenEnd(screen_id))
                except Exception:       # noqa: BLE001  (best effort: the session ends with its owner)
                    pass
    params_d = {k: getattr(params, k) for k in ("mode", "scheme", "key_bits", "max_bin", "monotone", "min_share",
                                                "align", "dp_epsilon_per_feature")}
    clock.lap("end")
    return ScreenResult(features, n, int(y.sum()), params_d, dict(active.alignment_report), party_info,
                        clock.seconds)


class _Clock:
    """Wall seconds of consecutive stages."""

    def __init__(self):
        self.t = time.perf_counter()
        self.seconds: dict[str, float] = {}

    def lap(self, stage: str) -> None:
        now = time.perf_counter()
        self.seconds[stage] = self.seconds.get(stage, 0.0) + now - self.t
        self.t = now


def _own_features(active, rows: np.ndarray, y: np.ndarray, params: ScreenParams) -> list[FeatureScreen]:
    if not active.feature_names:
        return []
    X = feature_matrix(active.X, rows)
    categorical = np.array([f in active.categories for f in active.feature_names], dtype=bool)
    binner = Binner(params.max_bin, categorical if categorical.any() else None)
    bins = binner.fit_transform(X)
    out = []
    for j, f in enumerate(active.feature_names):
        r, e = naive_counts(bins[:, j], y, int(binner.n_bins[j]))
        try:
            fs, _ = screen_feature(active.name, j, f, r, e, params.monotone and not binner.is_categorical(j),
                                   params.min_share)
        except WOEError as exc:
            raise InputError(f"party {active.name!r}, feature {f!r}: {exc}") from None
        fs.labels = _ranges(binner, j, fs.groups)
        out.append(fs)
    return out


def _ranges(binner: Binner, j: int, groups: list) -> list[str]:
    out = []
    for g in groups[:-1]:
        if binner.is_categorical(j):
            out.append("categories " + ",".join(map(str, g)))
            continue
        thr = binner.thresholds_[j]
        lo = "-inf" if g[0] == 0 else f"{thr[g[0] - 1]:.6g}"
        hi = "inf" if g[-1] >= len(thr) else f"{thr[g[-1]]:.6g}"
        out.append(f"({lo}, {hi}]")
    return out + ["missing"]


def _encrypted_counts(active, transport: Transport, passives: list[str], infos: dict, y: np.ndarray,
                      params: ScreenParams, screen_id: str, clock: _Clock):
    """The events and rows per slot of every passive party's features, from one packed round."""
    n = len(y)
    settings = Settings.from_environ().for_party(active.n_jobs)
    channel = GradientChannel(params.mode, params.key_bits, params.encryption, settings, n,
                              executor=active.executor, name=active.name, scheme=params.scheme)
    try:
        noisy = any(math.isfinite(float(infos[p].epsilon)) for p in passives)
        total_bins = sum(int(np.sum(infos[p].n_bins)) for p in passives)
        caps = [getattr(transport, "max_frame_bytes", None)] + \
            [info.get("max_frame_bytes") for info in getattr(transport, "peer_info", {}).values()]
        caps = [c for c in caps if isinstance(c, int) and c > 0]
        # noise is added to each slot's sum: no pre-shifted copies then
        channel.plan(total_bins, 1, False if noisy else "auto", min(caps) if caps else None, passives=passives,
                     link_mbps=active.link_mbps)
        if params.mode == Mode.HE:
            with channel.waiting():
                key = channel.public_key_message()
                enc = channel.encryptor
                if key.scheme == PAILLIER and getattr(enc, "method", None) == "fast":
                    key.hs = format(int(enc.hs), "x")
                transport.call_many({p: key for p in passives})
        clock.lap("key")
        bound = max(noise_headroom(n, len(infos[p].n_bins), float(infos[p].epsilon)) for p in passives)
        rg = RoundGradients(0, y.astype(np.int64).reshape(-1, 1), np.ones((n, 1), dtype=np.int64), float(bound),
                            float(bound), 0, None, RoundTiming())
        channel.round_started(rg)
        for p in passives:
            for message in channel.messages(0):
                transport.call(p, message)
        clock.lap("events")             # encrypted (overlapped with sending) and sent
        counts = {}
        for p in passives:
            reply = transport.call(p, m.ScreenRequest(screen_id))
            clock.lap("histograms")
            counts[p] = _decode(p, channel, reply, infos[p])
            clock.lap("decrypt")
        return channel, counts
    except BaseException:
        channel.close()
        raise


def _decode(p: str, channel: GradientChannel, reply: m.ScreenResponse, info: m.ScreenBins):
    """``(rows, events)`` per slot of party ``p``'s features, checked: every feature counts every row
    once (exact counts), events between 0 and the rows."""
    nb = info.n_bins.astype(np.int64)
    total = int(nb.sum())
    if reply.n_values != total:
        raise PeerError(f"party {p!r} returned {reply.n_values} screening sums for {total} slots")
    try:
        g, h = channel.decode(reply.values, total)
    except (OverflowError, ValueError) as exc:
        raise PeerError(f"party {p!r}: its screening sums do not decode ({exc})") from None
    events = np.array([int(v) for v in g[:, 0]], dtype=np.float64)
    eps = float(info.epsilon)
    if math.isfinite(eps):          # noisy digits: the row digit carries the public offset
        lay = channel.current.layout
        rows = np.array([int(v) for v in h[:, 0]], dtype=np.float64) - noise_offset(len(nb), lay.g_max, lay.h_max,
                                                                                     eps)
        rows = np.maximum(rows, 0.0)
        return rows, np.clip(events, 0.0, rows)
    rows = np.array([int(v) for v in h[:, 0]], dtype=np.float64)
    n = channel.current.start.n_samples
    offs = np.concatenate([[0], np.cumsum(nb)])
    for j in range(len(nb)):
        a, b = int(offs[j]), int(offs[j + 1])
        if int(rows[a:b].sum()) != n or np.any(events[a:b] < 0) or np.any(events[a:b] > rows[a:b]):
            raise PeerError(f"party {p!r}: the screening counts of its feature {j} are not counts of the {n} "
                            "aligned rows (a misbehaving party)")
    return rows, events


def _dp_counts(transport: Transport, passives: list[str], infos: dict, y: np.ndarray, params: ScreenParams,
               screen_id: str) -> dict:
    """Mode dp: every passive party's one randomised-response release; the rows and events per bucket,
    debiased (``(noisy - r total) / lambda``, clipped at 0)."""
    eps = float(params.dp_epsilon_per_feature)
    n, E = len(y), float(y.sum())
    out = {}
    for p in passives:
        rel = transport.call(p, m.ScreenDPRequest(screen_id, eps))
        nb = infos[p].n_bins.astype(np.int64)
        B = np.asarray(rel.buckets)
        got = np.asarray(rel.n_bins, dtype=np.int64)
        if B.shape != (n, len(nb)) or len(got) != len(nb) or np.any(got > nb) or np.any(got < 2):
            raise PeerError(f"party {p!r}: its release does not cover {n} rows x {len(nb)} features")
        rows, events = [], []
        for j in range(len(nb)):
            col = B[:, j].astype(np.int64)
            k = int(got[j])
            if col.size and (col.min() < 0 or col.max() >= k):
                raise PeerError(f"party {p!r}: a released bucket is out of range")
            _, r, lam = rr_channel(float(rel.epsilon_per_feature), int(rel.rr_domain[j]))
            nr = np.bincount(col, minlength=k).astype(np.float64)
            ne = np.bincount(col, weights=y.astype(np.float64), minlength=k)
            er = np.maximum(debias(nr, n, r, lam), 0.0)
            ee = np.clip(debias(ne, E, r, lam), 0.0, er)
            pad = np.zeros(int(nb[j]) - k)        # fewer DP edges than announced: empty value bins, missing last
            rows.append(np.concatenate([er[:-1], pad, er[-1:]]))
            events.append(np.concatenate([ee[:-1], pad, ee[-1:]]))
        out[p] = (np.concatenate(rows), np.concatenate(events))
    return out



def select_by_iv(active, transport: Transport, passives: list[str], params) -> tuple[list[str], dict]:
    """``--min-iv`` (:class:`vfl.core.params.TrainParams` ``min_iv``): screen every feature as the
    training will bin it (its mode, scheme, key size and ``max_bin``), keep the active party's own
    features at or above the cut (its matrix and names restricted) and return the passive parties that
    keep at least one feature with the positions each keeps (sent as ``FeatureSelect`` after the
    training's alignment; a party keeping none takes no part). The screening is a session of its own,
    granted by each passive party like any screening."""
    restore_own_features(active)
    sp = ScreenParams(mode=str(params.mode), scheme=str(params.scheme), key_bits=params.key_bits,
                      encryption=str(params.encryption), max_bin=params.max_bin, align=str(params.align))
    result = screen(active, transport, passives, sp)
    kept = result.kept(params.min_iv)
    own = kept.get(active.name, [])
    if active.feature_names and len(own) < len(active.feature_names):
        X = feature_matrix(active.X)
        active.full_features = (active.X, list(active.feature_names))
        active.X, active.feature_names = X[:, own], [active.feature_names[i] for i in own]
    selection = {p: kept.get(p, []) for p in passives}
    keep = [p for p in passives if selection[p]]
    if not keep and not active.feature_names:
        raise InputError(f"min_iv {params.min_iv}: no feature of any party reaches that information value "
                         f"(the highest is {max((f.iv for f in result.features), default=0.0):.4g})")
    active.screening = result
    return keep, {p: selection[p] for p in keep}


def restore_own_features(active) -> None:
    """Every feature of the active party again (a training after one with ``min_iv``)."""
    full = getattr(active, "full_features", None)
    if full is not None:
        active.X, active.feature_names = full[0], list(full[1])
        active.full_features = None
