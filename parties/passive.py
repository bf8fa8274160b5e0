"""The passive party: holds feature columns, never sees a label or a plaintext gradient.

It is a message handler: every request from the active party arrives as a
typed message (already deserialized from bytes by the transport) and gets a
typed reply. Its thresholds live in its own lookup table, saved to its own
model file; the active party only ever learns ``(party, record_id)``.
"""
from __future__ import annotations

import json
import time
from pathlib import Path

import gmpy2
import numpy as np
import pandas as pd

from crypto.compress import compress, compressed_histogram
from crypto.executor import LocalExecutor
from crypto.histogram import histogram
from crypto.keys import public_key_from_n
from crypto.packing import PackingLayout
from crypto.parallel import resolve_workers
from datasets.errors import InputError, ProtocolError
from datasets.frames import feature_matrix
from parties.dp import DPPassiveMixin
from protocols import alignment
from protocols import messages as m
from protocols.serialization import BigInts
from vfl.binning import Binner
from vfl.model import read_model_json
from vfl.sampling import node_members

PASSIVE_FORMAT = "vfl-boost-passive-model"


def _jf(x: float):
    x = float(x)
    return x if np.isfinite(x) else repr(x)


class PassiveParty(DPPassiveMixin):
    """A passive party: ``frame`` has the id column and this party's feature columns."""

    # What this party accepts from the active party; set on an instance to restrict
    # (e.g. ``party.allowed_align = ("psi",)`` refuses hashed ids, also for prediction).
    allowed_align: tuple = ("hash", "psi")
    allowed_prediction: tuple = ("one-round", "node")

    def __init__(self, name: str, frame: pd.DataFrame | None = None, id_col: str = "id",
                 source: str | None = None, n_jobs: int | None = None):
        self.name = str(name)
        resolve_workers(n_jobs)       # validate early
        self.n_jobs = n_jobs          # worker processes for the ciphertext kernels (None: all cores)
        self._pool = None
        self.id_col = id_col
        self.source = source
        self.feature_names: list[str] = []
        self._ids = None
        self._X = None
        if frame is not None:
            self._ids, self._X, self.feature_names = feature_matrix(frame, self.name, id_col, None,
                                                                    source, require_features=True)
        self.model_id: str | None = None
        self.salt: bytes | None = None
        self.records: list[dict] = []
        self._record_cols = None
        self._reset_training()
        self._pred_ids = None
        self._pred_X = None
        self._pred_rows = {}
        self._psi_pending = {}
        self._val_ids = None
        self._val_X = None
        self._eval_session = None

    # -- state --------------------------------------------------------------
    def _reset_training(self):
        self._hashes = None
        self.close_pool()
        self._shifts = 1
        self._rows = None
        self._bin_idx = None
        self._binner = None
        self._nsquare = None
        self._mode = None
        self._values = None
        self._groups = 1
        self._group_values = None
        self._layout = None
        self._per = None
        self._assignment = None
        self._round = None
        self.completed = False

    def handle(self, request):
        """Answer one message from the active party."""
        handler = getattr(self, "_on_" + type(request).__name__, None)
        if handler is None:
            raise ProtocolError(f"party {self.name!r} does not accept {type(request).__name__}")
        self._dp_guard(request)
        return handler(request)

    def _need(self, what, value):
        if value is None:
            raise ProtocolError(f"party {self.name!r} received a request before {what}")
        return value

    # -- alignment ----------------------------------------------------------
    def _on_AlignRequest(self, req: m.AlignRequest):
        self._check_allowed("hash", self.allowed_align, "alignment")
        if len(req.salt) < 16:
            raise ProtocolError("salt must have at least 16 bytes")
        self._need("any training data", self._X)
        self._reset_training()
        self.salt = req.salt
        self._hashes = alignment.hash_ids(self._ids, req.salt)
        alignment.check_unique(alignment.hashes_to_keys(self._hashes), self.name)
        return m.IdHashes(self._hashes)

    def _on_AlignResult(self, req: m.AlignResult):
        self._rows = alignment.positions(self._need("alignment", self._hashes), req.hashes, self.name)
        return m.AlignAck(int(len(self._ids)), int(len(self._rows)))

    # -- setup --------------------------------------------------------------
    def _on_TrainSetup(self, req: m.TrainSetup):
        rows = self._need("alignment", self._rows)
        if req.mode not in ("he", "plain", "dp"):
            raise ProtocolError(f"unknown mode {req.mode!r}")
        self._mode = req.mode
        self.model_id = req.model_id
        self.records = []
        X = self._X[rows]
        self._binner = Binner(req.max_bin).fit(X)
        self._bin_idx = self._binner.transform(X)
        return m.BinningInfo(self._binner.n_bins)

    def _on_PublicKey(self, req: m.PublicKey):
        pk = public_key_from_n(int(req.n, 16))
        self._nsquare = gmpy2.mpz(pk.nsquare)
        return m.Ack()

    # -- one round ----------------------------------------------------------
    def _on_Gradients(self, req: m.Gradients):
        self._need("setup", self._binner)
        if req.shifts < 1 or len(req.values) == 0 or len(req.values) % (req.shifts * len(self._rows)):
            raise ProtocolError(f"got {len(req.values)} gradient values for {len(self._rows)} samples "
                                f"(shifts={req.shifts})")
        if req.encrypted != (self._mode == "he"):
            raise ProtocolError(f"mode {self._mode!r} does not match encrypted={req.encrypted}")
        if req.encrypted:
            n2 = self._need("the public key", self._nsquare)
            if any(not (0 < v < n2) for v in req.values):
                raise ProtocolError("a ciphertext is out of range")
        self._layout = PackingLayout.from_dict(req.layout)
        if req.values_per_ciphertext < 1:
            raise ProtocolError("values_per_ciphertext must be positive")
        self._per = int(req.values_per_ciphertext)
        if req.shifts not in (1, self._per):
            raise ProtocolError(f"shifts must be 1 or values_per_ciphertext={self._per}, got {req.shifts}")
        self._shifts = int(req.shifts)
        block = self._shifts * len(self._rows)
        self._groups = len(req.values) // block                # target groups (see m.Gradients)
        self._group_values = [req.values.values[j * block:(j + 1) * block] for j in range(self._groups)]
        self._values = req.values.values
        self._round = req.round_idx
        return m.Ack()

    def _node_rows(self, assignment, tree_idx, node_ids):
        return [np.flatnonzero(assignment[t] == nid) for t, nid in zip(tree_idx, node_ids)]

    def _check_assignment(self, a):
        if a.ndim != 2 or a.shape[1] != len(self._rows):
            raise ProtocolError(f"assignment of shape {a.shape} does not cover {len(self._rows)} samples")

    def _check_round(self, round_idx: int) -> None:
        if round_idx != self._round:
            raise ProtocolError(f"party {self.name!r} holds the gradients of round {self._round}, "
                                f"not of round {round_idx}")

    def _on_HistogramRequest(self, req: m.HistogramRequest):
        self._need("gradients", self._values)
        self._check_round(req.round_idx)
        self._check_assignment(req.assignment)
        self._assignment = req.assignment
        node_rows = self._node_rows(req.assignment, req.tree_idx, req.node_ids)
        modulus = self._nsquare if self._mode == "he" else None
        offsets = self._binner.bin_offsets
        pool = self._get_pool() if modulus is not None else None
        t0 = time.perf_counter()
        if self._groups == 1:
            groups = {0: np.arange(len(node_rows))}
        else:   # each node sums the block of its tree's target group
            group = np.asarray(req.tree_idx, dtype=np.int64) // self._layout.n_targets
            if group.size and (group.min() < 0 or group.max() >= self._groups):
                raise ProtocolError("tree index out of the range of the gradient groups")
            groups = {j: np.flatnonzero(group == j) for j in np.unique(group).tolist()}
        n_values = len(node_rows) * int(offsets[-1])
        if self._shifts == 1:
            hists = [None] * len(node_rows)
            for j, idx in groups.items():
                part = histogram(self._group_values[j], self._bin_idx, [node_rows[i] for i in idx.tolist()],
                                 offsets, modulus, executor=pool, slot=f"values{j}")
                for i, hist in zip(idx.tolist(), part):
                    hists[i] = hist
            flat = [v for h in hists for v in h]
            t1 = time.perf_counter()
            packed = compress(flat, self._layout.value_bits, self._per, modulus, executor=pool)
        else:       # the key holder sent pre-shifted copies: rows go straight into their slots
            packed = None
            for j, idx in groups.items():
                part = compressed_histogram(self._group_values[j], self._bin_idx,
                                            [node_rows[i] for i in idx.tolist()], offsets, self._layout.value_bits,
                                            self._per, modulus, shifts=self._shifts, executor=pool,
                                            slot=f"values{j}", node_slots=idx.tolist(), n_nodes=len(node_rows))
                if packed is None:
                    packed = part
                elif modulus is None:
                    packed = [a + b for a, b in zip(packed, part)]
                else:       # nodes of several groups may share an output ciphertext
                    packed = [b if a == 1 else a if b == 1 else a * b % modulus for a, b in zip(packed, part)]
            if packed is None:
                packed = []
            t1 = time.perf_counter()
        t2 = time.perf_counter()
        return m.HistogramResponse(n_values, BigInts(packed), {"histogram": int((t1 - t0) * 1e6),
                                                               "compress": int((t2 - t1) * 1e6)})

    def _get_pool(self):
        """This party's worker processes (started at the first big request, closed at TrainEnd)."""
        if (self._pool is None or self._pool.closed) and resolve_workers(self.n_jobs) > 1:
            self._pool = LocalExecutor(self.n_jobs, name=f"passive:{self.name}")
        return self._pool

    def close_pool(self) -> None:
        """Stop this party's worker processes (also done at TrainEnd and by garbage collection)."""
        pool, self._pool = getattr(self, "_pool", None), None
        if pool is not None:
            pool.close()

    def _add_record(self, binner, feature_idx: int, bin_idx: int, default_left, round_idx: int,
                    tree: int, node_id: int) -> int:
        """Store the split "feature <= threshold of bin_idx" in the lookup table; its record id."""
        f, b = feature_idx, bin_idx
        if not 0 <= f < len(self.feature_names) or not 0 <= b < len(binner.thresholds_[f]) + 1:
            raise ProtocolError(f"no feature {f} / bin {b} at party {self.name!r}")
        rid = len(self.records)
        self.records.append({"record_id": rid, "round": round_idx, "tree": tree, "node_id": node_id,
                             "feature_idx": f, "feature": self.feature_names[f],
                             "threshold": binner.threshold(f, b), "default_left": bool(default_left)})
        return rid

    def _go_left(self, record_ids: np.ndarray, x: np.ndarray) -> np.ndarray:
        """Split decisions of our records on raw values ``x`` (same shape; NaN: default direction).

        The records' columns are kept as arrays, rebuilt only when the table changes
        (records are only ever appended, or the whole table replaced)."""
        cache = self._record_cols
        if cache is None or cache[0] is not self.records or cache[1] != len(self.records):
            cache = (self.records, len(self.records),
                     np.array([r["threshold"] for r in self.records], dtype=np.float64),
                     np.array([r["default_left"] for r in self.records], dtype=bool))
            self._record_cols = cache
        thr, dl = cache[2][record_ids], cache[3][record_ids]
        return np.where(np.isnan(x), dl, x <= thr)

    def _record_features(self, record_ids: np.ndarray) -> np.ndarray:
        return np.array([self.records[r]["feature_idx"] for r in record_ids.tolist()], dtype=np.int64)

    def _on_SplitRequest(self, req: m.SplitRequest):
        a = self._need("a histogram request", self._assignment)
        self._check_round(req.round_idx)
        record_ids, go_left, n_rows = [], [], []
        for t, nid, f, b, dl in zip(req.tree_idx, req.node_ids, req.feature_idx, req.bin_idx,
                                    req.default_left):
            f, b = int(f), int(b)
            rid = self._add_record(self._binner, f, b, dl, int(self._round), int(t), int(nid))
            rows = node_members(a[int(t)], int(nid))     # sampled and riding rows
            bins = self._bin_idx[rows, f].astype(np.int64)
            missing = bins == len(self._binner.thresholds_[f]) + 1
            go_left.append(np.where(missing, bool(dl), bins <= b))
            n_rows.append(len(rows))
            record_ids.append(rid)
        return m.SplitResponse(np.array(record_ids, dtype=np.int64),
                               np.concatenate(go_left) if go_left else np.zeros(0, dtype=bool),
                               np.array(n_rows, dtype=np.int64))

    def _on_TrainEnd(self, req: m.TrainEnd):
        if req.model_id != self.model_id:
            raise ProtocolError("TrainEnd for an unknown model")
        self.completed = bool(req.completed)
        self._values = None
        self._group_values = None
        self.close_pool()
        if self._eval_session is not None:      # the validation session ends with training
            self._pred_rows.pop(self._eval_session, None)
            self._eval_session = None
        return m.Ack({"n_records": len(self.records)})

    # -- prediction ---------------------------------------------------------
    def load_prediction_data(self, frame: pd.DataFrame, source: str | None = None) -> None:
        """Rows this party can answer prediction queries about (its features of new samples)."""
        ids, X, names = feature_matrix(frame, self.name, self.id_col, None, source, require_features=True)
        missing = [f for f in self.feature_names if f not in names]
        if missing:
            raise InputError(f"party {self.name!r}: prediction data{' ' + source if source else ''} "
                             f"lacks the model's feature column(s) {missing}")
        idx = [names.index(f) for f in self.feature_names]
        self._pred_ids, self._pred_X = ids, X[:, idx]

    def _prediction_data(self):
        """``(ids, X)`` prediction queries are answered from: new data if loaded, else the training rows."""
        ids = self._pred_ids if self._pred_ids is not None else self._ids
        X = self._pred_X if self._pred_X is not None else self._X
        if ids is None:
            raise InputError(f"party {self.name!r} has no data to predict on")
        return ids, X

    def clear_prediction_data(self) -> None:
        """Answer prediction queries about the training rows again."""
        self._pred_ids = self._pred_X = None

    def _on_PredictStart(self, req: m.PredictStart):
        self._check_allowed("hash", self.allowed_align, "alignment")
        if req.model_id != self.model_id:
            raise ProtocolError(f"party {self.name!r} holds no model {req.model_id!r}")
        ids, X = self._prediction_data()
        own = alignment.hash_ids(ids, self.salt)
        rows = alignment.positions(own, req.hashes, self.name)
        self._pred_rows[req.session_id] = X[rows]
        return m.Ack({"n_rows": int(len(rows))})

    def _on_RouteRequest(self, req: m.RouteRequest):
        self._check_allowed("node", self.allowed_prediction, "prediction")
        X = self._pred_rows.get(req.session_id)
        if X is None:
            raise ProtocolError(f"unknown prediction session {req.session_id!r}")
        rec = req.record_ids
        if rec.size and (rec.min() < 0 or rec.max() >= len(self.records)):
            raise ProtocolError(f"unknown record id at party {self.name!r}")
        if req.rows.size and (req.rows.min() < 0 or req.rows.max() >= len(X)):
            raise ProtocolError("row index out of range")
        x = X[req.rows, self._record_features(rec)] if rec.size else np.zeros(0)
        return m.RouteResponse(self._go_left(rec, x))

    # -- validation set and feature importance (issue 4) --------------------
    def load_validation_data(self, frame: pd.DataFrame, source: str | None = None) -> None:
        """This party's features of the validation rows (used during training for metrics and
        early stopping; aligned by hashed id like the training set)."""
        try:
            ids, X, names = feature_matrix(frame, self.name, self.id_col, None, source, require_features=True)
        except InputError as exc:
            raise InputError(f"validation set: {exc}") from None
        if self._X is not None:
            missing = [f for f in self.feature_names if f not in names]
            if missing:
                raise InputError(f"validation set: party {self.name!r} lacks feature column(s) {missing}")
            X = X[:, [names.index(f) for f in self.feature_names]]
        self._val_ids, self._val_X = ids, X

    def _on_EvalStart(self, req: m.EvalStart):
        self._check_allowed("hash", self.allowed_align, "alignment")
        if req.model_id != self.model_id:
            raise ProtocolError(f"party {self.name!r} is not training model {req.model_id!r}")
        if self._val_ids is None:
            raise InputError(f"party {self.name!r} has no validation data (load_validation_data) but the "
                             "active party uses a validation set")
        own = alignment.hash_ids(self._val_ids, self.salt)
        alignment.check_unique(alignment.hashes_to_keys(own), self.name, "validation ids")
        try:
            rows = alignment.positions(own, req.hashes, self.name)
        except InputError as exc:
            raise InputError(f"validation set does not align: {exc}") from None
        self._pred_rows[req.session_id] = self._val_X[rows]
        self._eval_session = req.session_id
        return m.Ack({"n_rows": int(len(rows))})

    def _on_SplitGains(self, req: m.SplitGains):
        if req.model_id != self.model_id:
            raise ProtocolError(f"party {self.name!r} holds no model {req.model_id!r}")
        rec = np.asarray(req.record_ids, dtype=np.int64)
        if rec.shape != np.shape(req.gains) or (rec.size and (rec.min() < 0 or rec.max() >= len(self.records))):
            raise ProtocolError(f"split gains do not match the records of party {self.name!r}")
        for r, gain in zip(rec.tolist(), np.asarray(req.gains, dtype=np.float64).tolist()):
            self.records[r]["gain"] = float(gain)
        return m.Ack({"n_records": int(rec.size)})

    def feature_importance(self, kind: str = "split", n_rounds: int | None = None) -> dict[str, float]:
        """This party's own features by name, from its own records: ``split`` (number of splits)
        or ``gain`` (total gain; needs the gains shared by the active party, see
        ``Federation.share_split_gains``). Unused features get 0. ``n_rounds``: count only the
        first rounds (e.g. up to the best iteration)."""
        if kind not in ("split", "gain"):
            raise InputError(f"importance kind must be 'split' or 'gain', got {kind!r}")
        if self.model_id is None:
            raise InputError(f"party {self.name!r} has no trained model")
        out = {f: 0.0 for f in self.feature_names}
        for r in self.records:
            if n_rounds is not None and r["round"] >= n_rounds:
                continue
            if kind == "gain":
                if "gain" not in r:
                    raise InputError(f"party {self.name!r} does not know the gains of its splits: the active "
                                     "party has not shared them (Federation.share_split_gains)")
                out[r["feature"]] += r["gain"]
            else:
                out[r["feature"]] += 1.0
        return out
    # -- policy, PSI alignment, one-round prediction ---------------------------
    def _check_allowed(self, method: str, allowed, what: str) -> None:
        if method not in allowed:
            raise ProtocolError(f"party {self.name!r} does not allow {what} by {method!r} "
                                f"(it allows {list(allowed)})")

    def drop_session(self, session_id: str) -> None:
        """Forget a prediction session (its rows and any pending PSI state)."""
        self._pred_rows.pop(session_id, None)
        self._psi_pending.pop(session_id, None)

    def _on_PsiRequest(self, req: m.PsiRequest):
        """ECDH-PSI step 2: blind the active party's values again; send own ids blinded."""
        from protocols import psi
        self._check_allowed("psi", self.allowed_align, "alignment")
        if req.purpose == "train":
            self._need("any training data", self._X)
            ids, X = self._ids, None
        elif req.purpose == "predict":
            if req.model_id != self.model_id:
                raise ProtocolError(f"party {self.name!r} holds no model {req.model_id!r}")
            ids, X = self._prediction_data()
        elif req.purpose == "validate":       # the validation set of the training under way (issue 4)
            if req.model_id != self.model_id:
                raise ProtocolError(f"party {self.name!r} is not training model {req.model_id!r}")
            if self._val_ids is None:
                raise InputError(f"party {self.name!r} has no validation data (load_validation_data) but "
                                 "the active party uses a validation set")
            ids, X = self._val_ids, self._val_X
        else:
            raise ProtocolError(f"unknown PSI purpose {req.purpose!r}")
        alignment.check_unique(alignment.normalize_ids(ids), self.name)
        points = psi.hash_to_points(ids, req.salt)          # checks the salt
        key = psi.BlindingKey()
        double = key.blind(req.blinded, "the active party's blinded ids")
        perm = psi.secret_permutation(len(points))          # sent[j] is own row perm[j]
        own = key.blind(points[perm], "own ids")
        if req.purpose == "train":
            self._reset_training()
            self.salt = req.salt
        pending = self._psi_pending
        pending[req.session_id] = {"purpose": req.purpose, "perm": perm, "X": X}
        while len(pending) > 8:                              # forget abandoned sessions
            pending.pop(next(iter(pending)))
        return m.PsiResponse(double, own)

    def _on_PsiResult(self, req: m.PsiResult):
        """ECDH-PSI end: the positions (in our blinded list) of the rows to use, in order."""
        from protocols import psi
        state = self._psi_pending.pop(req.session_id, None)
        if state is None:
            raise ProtocolError(f"unknown PSI session {req.session_id!r} at party {self.name!r}")
        perm = state["perm"]
        pos = psi.check_positions(req.positions, len(perm), "PSI result positions")
        rows = perm[pos]
        if state["purpose"] == "train":
            if rows.size == 0:
                raise ProtocolError("the PSI result is empty")
            self._rows = rows
        else:
            self._pred_rows[req.session_id] = state["X"][rows]
            if state["purpose"] == "validate":
                self._eval_session = req.session_id
        return m.AlignAck(int(len(perm)), int(len(rows)))

    def _on_LeafMaskRequest(self, req: m.LeafMaskRequest):
        """One-round prediction: per (row, tree) the leaves reachable given our own splits."""
        from vfl.leafmask import Skeleton, leaf_masks
        self._check_allowed("one-round", self.allowed_prediction, "prediction")
        X = self._pred_rows.get(req.session_id)
        if X is None:
            raise ProtocolError(f"unknown prediction session {req.session_id!r}")
        sk = Skeleton(req.tree_sizes, req.left, req.right, req.record_ids).validate(len(self.records))
        own = np.flatnonzero(sk.record_ids >= 0)
        rec = sk.record_ids[own]
        go_left = self._go_left(rec[None, :], X[:, self._record_features(rec)])
        if req.session_id != self._eval_session:             # (validation: one request per round)
            del self._pred_rows[req.session_id]             # a one-round session is complete
        return m.LeafMaskResponse(leaf_masks(sk, own, go_left))

    # -- persistence --------------------------------------------------------
    def model_dict(self) -> dict:
        if self.model_id is None:
            raise InputError(f"party {self.name!r} has no trained model to save")
        return {"format": PASSIVE_FORMAT, "version": 1, "role": "passive", "party": self.name,
                "model_id": self.model_id, "salt": self.salt.hex(), "id_col": self.id_col,
                "features": list(self.feature_names), "completed": self.completed,
                "records": [{**r, "threshold": _jf(r["threshold"])} for r in self.records],
                **({"dp_release": self.dp_release_info()} if self.dp_release_info() else {})}

    def save_model(self, path) -> None:
        Path(path).write_text(json.dumps(self.model_dict(), indent=1))

    @classmethod
    def from_model_dict(cls, d: dict) -> "PassiveParty":
        if d.get("format") != PASSIVE_FORMAT or d.get("role") != "passive":
            raise InputError("not a passive-party model file of this toolkit")
        p = cls(d["party"], None, d.get("id_col", "id"))
        p.feature_names = list(d["features"])
        p.model_id = d["model_id"]
        p.salt = bytes.fromhex(d["salt"])
        p.completed = bool(d.get("completed", True))
        p.records = [{**r, "threshold": float(r["threshold"])} for r in d["records"]]
        if d.get("dp_release"):
            p.dp_releases.append(dict(d["dp_release"]))
        return p

    @classmethod
    def load_model(cls, path) -> "PassiveParty":
        return cls.from_model_dict(read_model_json(path))
