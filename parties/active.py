"""The active party: holds the labels and the private key, and drives training.

Passive parties appear to the boosting loop as :class:`RemoteSource`
histogram sources; the transport underneath (in memory or network) is
invisible here.
"""
from __future__ import annotations

import secrets
import threading
import time
from dataclasses import dataclass, field, replace

import gmpy2
import numpy as np
import pandas as pd

from crypto.compress import choose_shifts, shifted_plaintexts
from crypto.executor import LocalExecutor
from crypto.keys import generate_keypair
from crypto.packing import PackingLayout, decode_sums, pack
from crypto.paillier import Decryptor, Encryptor
from crypto.parallel import resolve_workers
from datasets.errors import InputError, PeerError
from datasets.frames import party_data
from parties.checkpoint import CheckpointTracker
from parties.fanout import source_map
from parties.monitor import TrainingMonitor
from protocols import alignment
from protocols import messages as m
from protocols.serialization import BigInts
from protocols.transport import Transport
from vfl.boosting import Booster, HistogramSource, LocalSource, SplitRef
from vfl.fixedpoint import decode_fixed
from vfl.loss import get_loss
from vfl.model import BoostedModel
from vfl.params import TrainParams


@dataclass
class RoundCrypto:
    """The gradient vector of one round, packed and encrypted once for all passive parties."""
    round_idx: int = -1
    message: m.Gradients | None = None
    layout: PackingLayout | None = None
    per: int = 1
    stats: dict = field(default_factory=dict)
    group_size: int = 1       # targets per packed value (see m.Gradients)
    shifts: int = 1           # pre-shifted copies per value (see m.Gradients)


class GradientChannel:
    """Packs, encrypts (``he``) and decrypts for every remote source of one training."""

    def __init__(self, mode: str, key_bits: int, encryption: str, n_jobs: int | None = None,
                 n_samples: int | None = None):
        self.mode = mode
        self.key_bits = key_bits
        self.public_key = self.private_key = None
        self.encryptor = self.decryptor = None
        self.pool = None
        if mode == "he":
            if resolve_workers(n_jobs) > 1:
                self.pool = LocalExecutor(n_jobs, name="active")
                if n_samples is not None and n_samples >= 64:   # start up while the key is generated
                    self.pool.start()
            try:
                self.public_key, self.private_key = generate_keypair(key_bits)
                self.encryptor = Encryptor(self.public_key, self.private_key, method=encryption)
                self.decryptor = Decryptor(self.private_key)
            except BaseException:
                self.close()
                raise
        self.current = RoundCrypto()
        self.timing: dict[str, float] = {}
        self._sample = (-1, None)     # (round, rows some tree of the round uses)
        self.n_bins = 0          # histogram slots of one node, over all passive parties
        self.max_depth = 1
        self.preshift: str | bool = "auto"
        self.frame_cap: int | None = None
        self._stats_lock = threading.Lock()     # remote sources may run in threads (fan-out)
        self._round_lock = threading.Lock()

    def set_sample(self, round_idx, in_any_sample) -> None:
        self._sample = (round_idx, np.asarray(in_any_sample, dtype=bool))

    def group_size(self, layout: PackingLayout) -> int:
        """Targets packed per plaintext: all of them when they fit the key, else the most that fit."""
        fit = replace(layout, n_targets=1).values_per_plaintext(self.key_bits)   # raises if none fits
        return min(layout.n_targets, fit)

    def plan(self, n_bins: int, max_depth: int, preshift: str | bool = "auto",
             frame_cap: int | None = None) -> None:
        """What the shifts decision needs: passive slots per node, tree depth, the policy
        (``"auto"``: cost model, ``True``/``False``: always/never send pre-shifted copies) and
        the largest frame the transport and the peers accept (pre-shifted copies never
        make the gradient message exceed it)."""
        self.n_bins, self.max_depth, self.preshift = int(n_bins), int(max_depth), preshift
        self.frame_cap = frame_cap

    def close(self) -> None:
        """Stop the worker processes (end of training)."""
        if self.pool is not None:
            self.pool.close()
            self.pool = None

    def _tick(self, stage, t0, rc: RoundCrypto | None = None):
        self.add_stat(stage, time.perf_counter() - t0, rc, total=True)

    def add_stat(self, stage: str, seconds: float, rc: RoundCrypto | None = None, total: bool = False) -> None:
        """Add to this round's per-stage seconds (and to the whole training's ``timing``)."""
        with self._stats_lock:
            stats = (rc or self.current).stats
            stats[stage] = stats.get(stage, 0.0) + seconds
            if total:
                self.timing[stage] = self.timing.get(stage, 0.0) + seconds

    def _shifts(self, n_samples: int, layout: PackingLayout, per: int, n_trees: int = 1,
                n_groups: int = 1, frame_rows: int | None = None) -> int:
        """1, or ``per`` pre-shifted copies of every value (see :mod:`crypto.compress`).

        ``n_samples`` rows are encrypted and summed; the message carries ``frame_rows``
        values per copy and group (all rows: unsampled ones as full-width placeholders)."""
        if self.mode != "he" or per <= 1 or self.preshift is False:
            return 1
        frame_rows = n_samples if frame_rows is None else frame_rows
        if self.frame_cap is not None and \
                n_groups * frame_rows * per * ((2 * self.key_bits + 7) // 8) + 65536 > 0.9 * self.frame_cap:
            return 1
        if self.preshift is True:
            return per
        return choose_shifts(n_samples, self.n_bins, per, layout.value_bits, self.max_depth,
                             n_trees=n_trees, n_groups=n_groups)

    def gradients(self, round_idx, g_int, h_int, layout) -> RoundCrypto:
        """The round's message, packed and encrypted once for every remote source (thread-safe:
        concurrent sources wait for the first one's encryption)."""
        with self._round_lock:
            if self.current.round_idx != round_idx:
                self.current = self._encrypt_round(round_idx, g_int, h_int, layout)
            return self.current

    def _encrypt_round(self, round_idx, g_int, h_int, layout) -> RoundCrypto:
        rc = RoundCrypto(round_idx)
        t0 = time.perf_counter()
        K, G = layout.n_targets, self.group_size(layout)
        glayout = layout if G == K else replace(layout, n_targets=G)
        per = glayout.values_per_plaintext(self.key_bits)
        g_int = np.asarray(g_int, dtype=np.int64).reshape(len(g_int), -1)
        h_int = np.asarray(h_int, dtype=np.int64).reshape(len(h_int), -1)
        n = len(g_int)
        used = self._sample[1] if self._sample[0] == round_idx else None
        rows = np.arange(n) if used is None else np.flatnonzero(used)
        n_groups = -(-K // G)
        shifts = self._shifts(len(rows), glayout, per, n_trees=K, n_groups=n_groups, frame_rows=n)
        values = []
        for start in range(0, K, G):        # one block of n values per target group (and shift)
            gj = np.zeros((n, G), dtype=np.int64)
            hj = np.zeros((n, G), dtype=np.int64)
            stop = min(K, start + G)
            gj[:, :stop - start], hj[:, :stop - start] = g_int[:, start:stop], h_int[:, start:stop]
            packed = pack(gj[rows], hj[rows], glayout)
            if shifts > 1:
                packed = shifted_plaintexts(packed, glayout.value_bits, shifts)
            enc = self.encryptor.encrypt(packed, executor=self.pool) if self.mode == "he" else packed
            if used is None:
                values.extend(enc)
            else:   # rows no tree of the round uses: trivial placeholders (never summed)
                for sh in range(shifts):
                    block = [gmpy2.mpz(1) if self.mode == "he" else 0] * n
                    for i, v in zip(rows.tolist(), enc[sh * len(rows):(sh + 1) * len(rows)]):
                        block[i] = v
                    values.extend(block)
        self._tick("encrypt", t0, rc)
        rc.message = m.Gradients(round_idx, self.mode == "he", glayout.to_dict(), per, BigInts(values), shifts)
        rc.layout, rc.per, rc.group_size, rc.shifts = glayout, per, G, shifts
        return rc

    def decode(self, values, total: int):
        t0 = time.perf_counter()
        if self.mode == "he":
            plain = self.decryptor.decrypt_signed(values, executor=self.pool)
        else:
            plain = [int(v) for v in values]
        self._tick("decrypt", t0)
        return decode_sums(plain, self.current.layout, self.current.per, total)


class RemoteSource(HistogramSource):
    """A passive party's features behind a transport."""

    def __init__(self, transport: Transport, peer: str, bin_offsets: np.ndarray, channel: GradientChannel):
        self.transport = transport
        self.party = peer
        self.bin_offsets = np.asarray(bin_offsets, dtype=np.int64)
        self.channel = channel

    def start_round(self, round_idx, g_int, h_int, layout):
        rc = self.channel.gradients(round_idx, g_int, h_int, layout)
        self.transport.call(self.party, rc.message)

    def set_sample(self, round_idx, in_any_sample):
        self.channel.set_sample(round_idx, in_any_sample)

    def build(self, round_idx, depth, tree_idx, node_ids, assignment):
        reply = self.transport.call(self.party, m.HistogramRequest(
            round_idx, np.asarray(tree_idx, np.int32), np.asarray(node_ids, np.int32),
            np.asarray(assignment, np.int32)))
        n_flat = int(self.bin_offsets[-1])
        total = len(node_ids) * n_flat
        if reply.n_values != total:
            raise PeerError(f"party {self.party!r} returned {reply.n_values} bin sums, expected {total}")
        for stage in ("histogram", "compress"):     # the passive party's own compute time
            v = reply.compute_us.get(stage, 0)
            if isinstance(v, int) and not isinstance(v, bool) and v >= 0:
                self.channel.add_stat(stage, v / 1e6)
        g, h = self.channel.decode(reply.values.values, total)
        precision = self.channel.current.layout.precision_bits
        tgt = np.repeat(np.asarray(tree_idx, dtype=np.int64) % self.channel.current.group_size, n_flat)
        sel = np.arange(total)
        sg = decode_fixed(g[sel, tgt], precision)
        sh = decode_fixed(h[sel, tgt], precision)
        return sg.reshape(len(node_ids), n_flat), sh.reshape(len(node_ids), n_flat)

    def split(self, round_idx, tree_idx, node_ids, feature_idx, bin_idx, default_left, assignment):
        reply = self.transport.call(self.party, m.SplitRequest(
            round_idx, node_ids, tree_idx, feature_idx, bin_idx, default_left))
        if len(reply.record_ids) != len(node_ids) or len(reply.n_rows) != len(node_ids) \
                or int(reply.n_rows.sum()) != len(reply.go_left):
            raise PeerError(f"party {self.party!r} sent a malformed split response")
        out, start = [], 0
        for rid, cnt in zip(reply.record_ids.tolist(), reply.n_rows.tolist()):
            out.append((SplitRef(self.party, record_id=int(rid)), reply.go_left[start:start + cnt]))
            start += cnt
        return out


class ActiveParty:
    """The label holder. ``frame`` has the id column, the label column and zero or more features."""

    #: send pre-shifted gradient copies so passive parties skip compression squarings:
    #: "auto" (cost model per round), True or False
    preshift: str | bool = "auto"

    def __init__(self, name: str, frame: pd.DataFrame, id_col: str = "id", label_col: str = "y",
                 source: str | None = None, n_jobs: int | None = None):
        self.name = str(name)
        resolve_workers(n_jobs)       # validate early
        self.n_jobs = n_jobs          # worker processes for encryption/decryption (None: all cores)
        self.id_col, self.label_col, self.source = id_col, label_col, source
        d = party_data(frame, self.name, id_col, label_col, source, require_features=False,
                       allow_text_label=True)
        self.ids, self.X, self.feature_names, self.y_raw = d
        self.model: BoostedModel | None = None
        self.alignment_report: dict = {}
        self.timings: list[dict] = []
        self.channel: GradientChannel | None = None
        self.label_mapping: dict | None = None     # multiclass: {original label: class index}

    # -- training -----------------------------------------------------------
    def align(self, transport: Transport, peers: list[str], salt: bytes, session_id: str):
        own = alignment.hash_ids(self.ids, salt)
        replies = transport.call_many({p: m.AlignRequest(session_id, salt) for p in peers})
        # intersect checks that every party's ids are unique, ours included
        common = alignment.intersect({self.name: own, **{p: r.hashes for p, r in replies.items()}})
        acks = transport.call_many({p: m.AlignResult(common) for p in peers})
        rows = alignment.positions(own, common, self.name)
        self.alignment_report = {self.name: {"n_rows": int(len(self.ids)), "n_kept": int(len(rows))},
                                 **{p: {"n_rows": a.n_rows, "n_kept": a.n_kept} for p, a in acks.items()}}
        return rows

    def align_psi(self, transport: Transport, peers: list[str], salt: bytes, session_id: str):
        """ECDH-PSI alignment (``TrainParams.align == "psi"``): own rows of the intersection,
        in the same canonical order as :meth:`align` with the same salt."""
        from parties.psi_align import align_train
        rows, self.alignment_report = align_train(transport, peers, self.name, self.ids, salt, session_id)
        return rows

    def fit(self, transport: Transport, peers: list[str], params: TrainParams | None = None,
            on_round=None, checkpoint=None, resume=None,
            validation: pd.DataFrame | None = None) -> BoostedModel:
        """Train with the passive parties ``peers`` behind ``transport``.

        ``checkpoint(ck)`` (optional) receives a :class:`parties.checkpoint.Checkpoint` after every
        round; ``resume`` (such a checkpoint) continues that training with the same salt and model
        id, after checks that the data and parameters are the same.
        ``validation``: this party's frame of validation rows (id, label, features); the peers must
        have loaded theirs (``load_validation_data``). Gives per-round metrics (``model.history``)
        and early stopping (:mod:`parties.monitor`).
        """
        params = params or TrainParams()
        peers = list(peers)
        if len(set(peers)) != len(peers) or self.name in peers:
            raise InputError(f"party names must be unique, got active {self.name!r} and passive {peers}")
        loss = get_loss(params.objective, huber_slope=params.huber_slope)
        if params.early_stopping_rounds is not None and validation is None:
            raise InputError("early_stopping_rounds needs a validation set")
        val = self._validation_data(validation) if validation is not None else None
        if not peers and not self.feature_names:
            raise InputError(f"party {self.name!r} has no feature columns and there is no passive party")
        salt = alignment.new_salt()
        session_id = secrets.token_hex(8)
        model_id = secrets.token_hex(8)
        if resume is not None:
            salt, model_id = bytes.fromhex(resume.salt), resume.model_id
        rows = (self.align_psi if params.align == "psi" else self.align)(transport, peers, salt, session_id)
        y = loss.check_labels(self.y_raw[rows], self.name, self.label_col, ids=self.ids[rows])
        X = self.X[rows]
        tracker = None
        if checkpoint is not None or resume is not None:
            tracker = CheckpointTracker(self.name, peers, params, salt, model_id, self.ids[rows], X, y,
                                        self.feature_names, resume, checkpoint)
        infos = transport.call_many({p: m.TrainSetup(params.mode, params.max_bin, model_id) for p in peers})
        if resume is not None:
            transport.call_many({p: m.TrainResume(model_id, resume.n_rounds, resume.records.get(p, 0))
                                 for p in peers})
        self.channel = GradientChannel(params.mode, params.key_bits, params.encryption, self.n_jobs, len(rows))
        booster, completed = None, False
        try:   # from here on, workers and passive parties are released whatever happens
            caps = [getattr(transport, "max_frame_bytes", None)] + \
                [info.get("max_frame_bytes") for info in getattr(transport, "peer_info", {}).values()]
            caps = [c for c in caps if isinstance(c, int) and c > 0]
            self.channel.plan(sum(int(np.sum(infos[p].n_bins)) for p in peers), params.max_depth, self.preshift,
                              min(caps) if caps else None)
            if params.mode == "he":
                transport.call_many({p: m.PublicKey(format(self.channel.public_key.n, "x")) for p in peers})
            sources: list[HistogramSource] = []
            if self.feature_names:
                sources.append(LocalSource(self.name, X, self.feature_names, params.max_bin))
            self.dp_report = {}
            if params.mode == "dp":     # one noisy release per passive party, then local training
                from parties.dp import dp_sources
                dp, self.dp_report = dp_sources(transport, peers, infos, params, model_id, len(rows))
                sources.extend(dp)
            for p in (peers if params.mode != "dp" else []):
                nb = infos[p].n_bins
                sources.append(RemoteSource(transport, p, np.concatenate([[0], np.cumsum(nb)]), self.channel))
            monitor = TrainingMonitor(loss, params, y)
            user_hook = tracker.wrap(on_round) if tracker is not None else on_round

            def round_hook(r, info):
                stop = monitor.on_round(r, info)       # metrics and early stopping (info gets "history")
                if user_hook is not None and user_hook(r, info):
                    stop = True
                return stop

            booster = Booster(sources, loss, params, self._round_hook(transport, round_hook),
                              map_sources=source_map(transport, sources))
            if val is not None:
                monitor.start_validation(transport, peers, model_id, salt, self.name, self.feature_names, *val)
            if resume is not None:
                monitor.restore(resume.rounds, resume.history)
            base, rounds, _ = booster.fit(y, row_keys=rows,
                                          **(tracker.booster_kwargs() if tracker is not None else {}))
            completed = True
        finally:
            self.channel.close()
            try:
                transport.call_many({p: m.TrainEnd(model_id, completed) for p in peers})
            except Exception:
                if completed:
                    raise
        self.timings = booster.timings
        self.model = BoostedModel(loss.name, loss.n_targets, [float(b) for b in base], params.learning_rate,
                                  self.name, self.feature_names, peers, model_id, salt.hex(), rounds,
                                  params.to_dict())
        monitor.finish(self.model)
        self.model.classes = getattr(loss, "classes", None)
        self.label_mapping = dict(loss.mapping) if getattr(loss, "classes", None) else None
        return self.model

    def _round_hook(self, transport: Transport, on_round):
        """Complete each round's timing with the per-tree breakdown, then call ``on_round``.

        Added keys: ``encrypt`` and ``decrypt`` (this party), ``histogram`` and
        ``compress`` (compute time reported by the passive parties, summed),
        ``bytes_sent`` (all frames of the round, both directions)."""
        last = [transport.total_bytes()]

        def hook(r, info):
            timing = info["timing"]
            stats = self.channel.current.stats if self.channel.current.round_idx == r else {}
            for stage in ("encrypt", "histogram", "compress", "decrypt"):
                timing[stage] = float(stats.get(stage, 0.0))
            total = transport.total_bytes()
            timing["bytes_sent"] = int(total - last[0])
            last[0] = total
            return on_round(r, info) if on_round is not None else None

        return hook

    def _validation_data(self, frame):
        try:
            d = party_data(frame, self.name, self.id_col, self.label_col, None, require_features=False,
                           allow_text_label=True)
        except InputError as exc:
            raise InputError(f"validation set: {exc}") from None
        missing = [f for f in self.feature_names if f not in d.feature_names]
        if missing:
            raise InputError(f"validation set: party {self.name!r} lacks feature column(s) {missing}")
        X = d.X[:, [d.feature_names.index(f) for f in self.feature_names]] if self.feature_names \
            else np.zeros((len(d.ids), 0))
        return d.ids, X, d.y

    # -- prediction ---------------------------------------------------------
    def predict_raw(self, transport: Transport, frame: pd.DataFrame | None = None,
                    source: str | None = None, prediction: str | None = None,
                    align: str | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Raw scores for the rows of ``frame`` (the active party's columns of new samples);
        returns ``(ids, raw)``.

        ``prediction``: "one-round" (leaf masks, the default) or "node" (node-by-node
        routing); ``align``: how the passive parties find the rows, "hash" (salted hashes
        under the model's salt) or "psi" (a fresh PSI per batch); default: as in training."""
        from vfl.leafmask import DEFAULT_PREDICTION, PREDICTIONS
        from vfl.params import ALIGNMENTS
        model = self.model
        if model is None:
            raise InputError(f"party {self.name!r} has no trained model")
        if frame is None:
            ids, X = self.ids, self.X
        else:
            d = party_data(frame, self.name, self.id_col, None, source, require_features=False)
            missing = [f for f in model.active_features if f not in d.feature_names]
            if missing:
                raise InputError(f"party {self.name!r}: prediction data lacks feature column(s) {missing}")
            ids, X = d.ids, d.X[:, [d.feature_names.index(f) for f in model.active_features]] \
                if model.active_features else np.zeros((len(d.ids), 0))
        prediction = DEFAULT_PREDICTION if prediction is None else prediction
        align = model.params.get("align", "hash") if align is None else align
        if prediction not in PREDICTIONS:
            raise InputError(f"prediction must be one of {PREDICTIONS}, got {prediction!r}")
        if align not in ALIGNMENTS:
            raise InputError(f"align must be one of {ALIGNMENTS}, got {align!r}")
        if align == "psi":
            from parties.psi_align import align_predict
            session_id = secrets.token_hex(8)
            align_predict(transport, list(model.passive_parties), self.name, ids, session_id, model.model_id)
        else:
            salt = bytes.fromhex(model.salt)
            hashes = alignment.hash_ids(ids, salt)
            alignment.check_unique(alignment.hashes_to_keys(hashes), self.name)
            session_id = secrets.token_hex(8)
            transport.call_many({p: m.PredictStart(model.model_id, session_id, hashes)
                                 for p in model.passive_parties})

        if prediction == "one-round":
            def fetch_masks(owner, skeleton):
                reply = transport.call(owner, m.LeafMaskRequest(session_id, **skeleton.to_fields()))
                if not isinstance(reply, m.LeafMaskResponse):
                    raise PeerError(f"party {owner!r} answered {type(reply).__name__} to a leaf-mask request")
                return reply.masks

            return ids, model.predict_raw_one_round(X, fetch_masks)

        def route(owner, record_ids, rows):
            return transport.call(owner, m.RouteRequest(session_id, record_ids, rows)).go_left

        return ids, model.predict_raw(X, route)

    def predict_proba(self, transport, frame=None, source=None, prediction=None,
                      align=None) -> tuple[np.ndarray, np.ndarray]:
        ids, raw = self.predict_raw(transport, frame, source, prediction, align)
        return ids, get_loss(self.model.objective).transform(raw)

    def predict(self, transport, frame=None, source=None, prediction=None,
                align=None) -> tuple[np.ndarray, np.ndarray]:
        """``(ids, predictions)``: original class labels (binary 0/1, multiclass as in training)
        or regression values."""
        ids, raw = self.predict_raw(transport, frame, source, prediction, align)
        return ids, self.model.output_to_prediction(raw)

    def share_split_gains(self, transport) -> dict[str, int]:
        """Tell every passive party the gain of each of its own splits (opt-in; see README)."""
        model = self._need_model()
        per_party: dict[str, tuple[list, list]] = {p: ([], []) for p in model.passive_parties}
        for rnd in model.rounds:
            for tree in rnd:
                for node in tree.nodes:
                    if not node.is_leaf and node.owner in per_party:
                        per_party[node.owner][0].append(node.record_id)
                        per_party[node.owner][1].append(node.gain)
        transport.call_many({p: m.SplitGains(model.model_id, np.array(r, dtype=np.int64),
                                             np.array(g, dtype=np.float64))
                             for p, (r, g) in per_party.items()})
        return {p: len(r) for p, (r, _) in per_party.items()}

    def _need_model(self) -> BoostedModel:
        if self.model is None:
            raise InputError(f"party {self.name!r} has no trained model")
        return self.model

    def save_model(self, path) -> None:
        if self.model is None:
            raise InputError(f"party {self.name!r} has no trained model to save")
        self.model.save(path)

    @classmethod
    def from_model(cls, model: BoostedModel, id_col: str = "id") -> "ActiveParty":
        obj = cls.__new__(cls)
        obj.name, obj.id_col, obj.label_col, obj.source = model.active_party, id_col, None, None
        obj.ids = obj.X = obj.y_raw = None
        obj.feature_names = list(model.active_features)
        obj.model = model
        obj.alignment_report, obj.timings, obj.channel = {}, [], None
        obj.label_mapping = {c: i for i, c in enumerate(model.classes)} if model.classes else None
        obj.n_jobs = None
        return obj
