"""The active party's boosted model and federated routing of rows through it."""
from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import pandas as pd

from datasets.errors import InputError
from vfl.core.drift import check_reference
from vfl.core.files import write_json_atomic
from vfl.core.leafmask import check_masks, leaf_masks, resolve_leaves, skeleton_of
from vfl.core.objectives import get_objective
from vfl.core.params import Objective
from vfl.core.split import goes_left
from vfl.core.tree import Tree, damaged, need_dict, need_float, need_int, need_key, need_list, need_str

MODEL_FORMAT = "vfl-boost-model"
MODEL_VERSION = 1

# route_remote(owner, record_ids, rows) -> bool array: go left?
RemoteRouter = Callable[[str, np.ndarray, np.ndarray], np.ndarray]


_HEX_RE = re.compile(r"^(?:[0-9a-f]{2})+$")
_SHA_RE = re.compile(r"^[0-9a-f]{64}$")


def read_model_json(path, what: str = "model file") -> dict:
    """A model file's JSON object, or an InputError naming the file (empty, truncated, not JSON,
    not an object, unreadable)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"cannot read {what} {path}: {getattr(exc, 'strerror', None) or exc}") from None
    if not text.strip():
        raise InputError(f"{what} {path} is empty (a failed or interrupted write?)")
    try:
        d = json.loads(text)
    except (json.JSONDecodeError, RecursionError) as exc:
        raise InputError(f"{what} {path} is damaged: not valid JSON ({exc})") from None
    if not isinstance(d, dict):
        raise InputError(f"{what} {path} is damaged: expected a JSON object, got {type(d).__name__}")
    return d


def canonical_bytes(d: dict, exclude=("content_hash",)) -> bytes:
    """The canonical bytes of a model's JSON content (what its content hash is taken of): keys
    sorted, no spaces, ``exclude``d top-level keys left out. Stable across a save and a load."""
    d = json.loads(json.dumps({k: v for k, v in d.items() if k not in exclude}))    # JSON types only
    return json.dumps(d, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode("ascii")


def content_hash(d: dict, exclude=("content_hash",)) -> str:
    """sha256 (hex) of :func:`canonical_bytes`."""
    return hashlib.sha256(canonical_bytes(d, exclude)).hexdigest()


def check_content_hash(d: dict, source: str, field_name: str = "content_hash", exclude=("content_hash",)) -> None:
    """A file that records its content hash must still have that content (an edited threshold,
    record id or leaf value is refused instead of silently changing predictions)."""
    if field_name not in d:
        return                                  # files written before the hash was recorded
    want = d[field_name]
    if not isinstance(want, str) or not _SHA_RE.match(want):
        raise damaged(source, field_name, "expected a sha256 hex digest")
    if content_hash(d, exclude) != want:
        raise InputError(f"{source} was modified after it was written: its content does not match its "
                         f"recorded {field_name} (an edited or damaged file; restore it or train again)")


def require_content_hash(d: dict, source: str, field_name: str = "content_hash") -> dict:
    """A model or checkpoint *file* must record its content hash: one whose hash was deleted could
    have been edited unnoticed (issue 36, item 10). Every file this toolkit writes records it."""
    if isinstance(d, dict) and field_name not in d:
        raise InputError(f"{source} records no {field_name}: an edit of it could go unnoticed, so it is not "
                         "used (a file this toolkit writes always records it; restore the file or train again)")
    return d


def _categories_of(value) -> dict:
    """The ``categories`` of a model file: ``{feature: [category, ...]}``."""
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(isinstance(v, list) for v in value.values()):
        raise InputError("model file: 'categories' must map feature names to lists of categories")
    return {str(f): list(v) for f, v in value.items()}


@dataclass
class OneRound:
    """What one-round prediction of a batch gathered: ``trees`` ``[(target, Tree)]``, the active
    party's skeleton, its own nodes (flat indices) and decisions there ``go_left`` ``(n, own)``,
    each passive party's checked packed masks, the leaf per (row, tree) and the raw scores."""
    trees: list
    skeleton: object
    own_nodes: np.ndarray
    go_left: np.ndarray
    masks: dict
    leaves: np.ndarray
    raw: np.ndarray


@dataclass
class BoostedModel:
    objective: str
    n_targets: int
    base_score: list[float]
    learning_rate: float
    active_party: str
    active_features: list[str]
    passives: list[str]
    model_id: str
    salt: str                                   # hex; hashing ids for prediction
    rounds: list[list[Tree]] = field(default_factory=list)
    params: dict = field(default_factory=dict)
    history: dict = field(default_factory=dict)
    best_iteration: int | None = None
    classes: list | None = None                 # multiclass: original label of each class index
    party_hashes: dict = field(default_factory=dict)  # passive party -> sha256 of its model (at training end)
    dp_model: dict | None = None                # --dp-model: mechanism, epsilon (delta), budget split
    # categorical features of the active party: {feature: its categories, code i = categories[i]}
    categories: dict = field(default_factory=dict)
    # the environment switches the active party trained with (parties.settings.Settings: n_jobs, overlap)
    settings: dict = field(default_factory=dict)
    # drift (issue 34): the training rows' bin counts of the active features ("features") and of the
    # score ("score", vfl.core.drift references), or {"withheld": why}; None: a file from before them
    drift: dict | None = None

    @property
    def n_rounds(self) -> int:
        return len(self.rounds)

    def to_dict(self) -> dict:
        return {
            "format": MODEL_FORMAT, "version": MODEL_VERSION, "role": "active",
            "objective": self.objective, "n_targets": self.n_targets,
            "base_score": [float(b) for b in self.base_score], "learning_rate": self.learning_rate,
            "active_party": self.active_party, "active_features": list(self.active_features),
            "passive_parties": list(self.passives), "model_id": self.model_id, "salt": self.salt,
            "params": self.params, "history": self.history, "best_iteration": self.best_iteration,
            "classes": self.classes, **({"party_hashes": dict(self.party_hashes)} if self.party_hashes else {}),
            **({"categories": {f: list(v) for f, v in self.categories.items()}} if self.categories else {}),
            **({"settings": dict(self.settings)} if self.settings else {}),
            "rounds": [[t.to_dict() for t in rnd] for rnd in self.rounds],
        } | ({"dp_model": self.dp_model} if self.dp_model is not None else {}) \
            | ({"drift": self.drift} if self.drift is not None else {})

    @classmethod
    def from_dict(cls, d: dict, source: str = "model") -> "BoostedModel":
        """A model from its dict, checked: the schema and every invariant prediction relies on
        (trees, see :meth:`vfl.core.tree.Tree.check_dict`; parties, features, targets, rounds, record
        ids) and the recorded content hash. Anything else: an InputError naming ``source`` and
        the field, never an IndexError/KeyError/TypeError later."""
        if not isinstance(d, dict) or d.get("format") != MODEL_FORMAT or d.get("role") != "active":
            raise InputError(f"{source} is not an active-party model file of this toolkit")
        if d.get("version") != MODEL_VERSION:
            raise InputError(f"{source}: model format version {d.get('version')!r} is not supported")
        check_content_hash(d, source)
        g = lambda k: need_key(d, k, source, "")          # noqa: E731
        objective = need_str(g("objective"), source, "objective")
        if objective not in [o.value for o in Objective]:
            raise damaged(source, "objective", f"unknown objective {objective!r}")
        n_targets = need_int(g("n_targets"), source, "n_targets", 1, 100_000)
        if objective != Objective.MULTICLASS and n_targets != 1:
            raise damaged(source, "n_targets", f"objective {objective} has 1 target, not {n_targets}")
        base = need_list(g("base_score"), source, "base_score")
        if len(base) != n_targets:
            raise damaged(source, "base_score", f"{len(base)} values for {n_targets} target(s)")
        base = [need_float(b, source, f"base_score[{i}]") for i, b in enumerate(base)]
        lr = need_float(g("learning_rate"), source, "learning_rate")
        active = need_str(g("active_party"), source, "active_party")
        feats = need_list(g("active_features"), source, "active_features")
        feats = [need_str(f, source, f"active_features[{i}]") for i, f in enumerate(feats)]
        passives = need_list(g("passive_parties"), source, "passive_parties")
        passives = [need_str(p, source, f"passive_parties[{i}]") for i, p in enumerate(passives)]
        if len(set(passives) | {active}) != len(passives) + 1:
            raise damaged(source, "passive_parties", "party names must be unique (the active one included)")
        model_id = need_str(g("model_id"), source, "model_id")
        salt = need_str(g("salt"), source, "salt")
        if not _HEX_RE.match(salt):
            raise damaged(source, "salt", "expected hex digits")
        owners = {active: len(feats), **{p: None for p in passives}}
        rounds = []
        for r, rnd in enumerate(need_list(g("rounds"), source, "rounds")):
            rnd = need_list(rnd, source, f"rounds[{r}]")
            if len(rnd) != n_targets:
                raise damaged(source, f"rounds[{r}]", f"{len(rnd)} trees for {n_targets} target(s)")
            rounds.append([Tree.from_dict(t, source, f"rounds[{r}][{k}]", owners) for k, t in enumerate(rnd)])
        seen: dict = {}
        for r, rnd in enumerate(rounds):
            for k, tree in enumerate(rnd):
                for nd in tree.nodes:
                    if nd.is_leaf or nd.owner == active:
                        continue
                    key = (nd.owner, nd.record_id)
                    if key in seen:
                        raise damaged(source, f"rounds[{r}][{k}].nodes[{nd.node_id}].record_id",
                                      f"record {nd.record_id} of party {nd.owner!r} is used twice "
                                      f"(also at {seen[key]})")
                    seen[key] = f"rounds[{r}][{k}].nodes[{nd.node_id}]"
        params = need_dict(d.get("params", {}), source, "params")
        history = need_dict(d.get("history", {}) or {}, source, "history")
        best = d.get("best_iteration")
        if best is not None:
            best = need_int(best, source, "best_iteration", 0, max(len(rounds), 1))
        classes = d.get("classes")
        if classes is not None:
            classes = need_list(classes, source, "classes")
            if len(classes) != n_targets or objective != Objective.MULTICLASS:
                raise damaged(source, "classes", f"{len(classes)} class labels for a {objective} model with "
                                                 f"{n_targets} target(s)")
            for i, c in enumerate(classes):
                if isinstance(c, bool) or not isinstance(c, (int, float, str)):
                    raise damaged(source, f"classes[{i}]", f"expected a label, got {c!r}")
        hashes = need_dict(d.get("party_hashes", {}) or {}, source, "party_hashes")
        for p, h in hashes.items():
            if p not in passives or not isinstance(h, str) or not _SHA_RE.match(h):
                raise damaged(source, f"party_hashes.{p}", "expected a passive party's sha256 hex digest")
        dp_model = d.get("dp_model")
        if dp_model is not None:
            dp_model = need_dict(dp_model, source, "dp_model")
        try:
            categories = _categories_of(d.get("categories"))
        except InputError:
            raise damaged(source, "categories", "must map feature names to lists of categories") from None
        unknown = sorted(set(categories) - set(feats))
        if unknown:
            raise damaged(source, f"categories.{unknown[0]}", "not one of the active party's features")
        settings = need_dict(d.get("settings", {}) or {}, source, "settings")
        for key, value in settings.items():
            if isinstance(value, (dict, list)):
                raise damaged(source, f"settings.{key}", "expected a number, a string or a boolean")
        drift = d.get("drift")
        if drift is not None:
            drift = need_dict(drift, source, "drift")
            for key in ("features", "score"):
                if drift.get(key) is not None:
                    check_reference(drift[key], source, f"drift.{key}")
            if drift.get("withheld") is not None:
                need_str(drift["withheld"], source, "drift.withheld")
        return cls(objective, n_targets, base, lr, active, feats, passives, model_id, salt, rounds, params,
                   history, best, classes, dict(hashes), dp_model, categories, dict(settings), drift)

    def save(self, path) -> None:
        write_json_atomic(path, self.file_dict())

    def file_dict(self) -> dict:
        """What the model file holds: :meth:`to_dict` and its content hash."""
        d = self.to_dict()
        d["content_hash"] = content_hash(d)
        return d

    @classmethod
    def load(cls, path) -> "BoostedModel":
        return cls.from_dict(require_content_hash(read_model_json(path), str(path)), str(path))

    def predict_raw(self, X_active: np.ndarray, route_remote: RemoteRouter,
                    n_rounds: int | None = None) -> np.ndarray:
        """Raw scores ``(n_samples, n_targets)``; passive nodes are resolved by ``route_remote``."""
        X = np.asarray(X_active, dtype=np.float64)
        n = X.shape[0]
        rounds = self.rounds[: (self.default_rounds if n_rounds is None else n_rounds)]
        trees = [(k, t) for rnd in rounds for k, t in enumerate(rnd)]
        raw = np.tile(np.asarray(self.base_score, dtype=np.float64), (n, 1))
        pos = np.zeros((len(trees), n), dtype=np.int64)
        for _ in range(max((t.max_depth for _, t in trees), default=0) + 1):
            queries: dict[str, list] = {}
            moves = []
            for ti, (_, tree) in enumerate(trees):
                for nid in np.unique(pos[ti]):
                    node = tree.nodes[nid]
                    if node.is_leaf:
                        continue
                    rows = np.flatnonzero(pos[ti] == nid)
                    if node.owner == self.active_party:
                        x = X[rows, node.feature_idx]
                        go = goes_left(x, node.threshold, node.default_left, categories=node.categories)
                        moves.append((ti, node, rows, go))
                    else:
                        queries.setdefault(node.owner, []).append((ti, node, rows))
            for owner, qs in queries.items():
                rec = np.concatenate([np.full(len(r), node.record_id, dtype=np.int64) for _, node, r in qs])
                rows_all = np.concatenate([r for _, _, r in qs]).astype(np.int64)
                go_all = np.asarray(route_remote(owner, rec, rows_all), dtype=bool)
                if go_all.shape != rows_all.shape:
                    raise InputError(f"party {owner!r} answered {go_all.shape} routing decisions "
                                     f"for {rows_all.shape} queries")
                start = 0
                for ti, node, rows in qs:
                    moves.append((ti, node, rows, go_all[start:start + len(rows)]))
                    start += len(rows)
            if not moves:
                break
            for ti, node, rows, go in moves:
                pos[ti, rows] = np.where(go, node.left, node.right)
        for ti, (k, tree) in enumerate(trees):
            values = np.array([nd.value for nd in tree.nodes])
            raw[:, k] += values[pos[ti]]
        return raw

    def _flat_trees(self, n_rounds: int | None = None) -> list[tuple[int, Tree]]:
        rounds = self.rounds[: (self.default_rounds if n_rounds is None else n_rounds)]
        return [(k, t) for rnd in rounds for k, t in enumerate(rnd)]

    def node_owners(self, n_rounds: int | None = None) -> list[str]:
        """Passive parties that own at least one split, in ``passives`` order."""
        owners = {n.owner for _, t in self._flat_trees(n_rounds) for n in t.nodes if not n.is_leaf}
        return [p for p in self.passives if p in owners]

    def skeleton(self, party: str, n_rounds: int | None = None):
        """What one-round prediction sends ``party``: tree shapes and its own record ids."""
        return skeleton_of([t for _, t in self._flat_trees(n_rounds)], party)

    def predict_raw_one_round(self, X_active: np.ndarray, fetch_masks, n_rounds: int | None = None) -> np.ndarray:
        """Raw scores ``(n_samples, n_targets)`` by one-round leaf masks (see :mod:`vfl.core.leafmask`).

        ``fetch_masks(owner, skeleton)`` returns the packed masks of passive party
        ``owner`` for the same rows, in the same order; it is called once per
        passive party that owns a split. Gives exactly :meth:`predict_raw`'s scores.
        """
        return self.one_round(X_active, fetch_masks, n_rounds).raw

    def one_round(self, X_active: np.ndarray, fetch_masks, n_rounds: int | None = None) -> "OneRound":
        """One-round prediction and everything it gathered (:class:`OneRound`): the active party's
        own decisions, every passive party's checked masks, the leaves and the raw scores. The
        one path for prediction and explanations (:mod:`vfl.core.explain`)."""
        X = np.asarray(X_active, dtype=np.float64)
        n = X.shape[0]
        flat = self._flat_trees(n_rounds)
        trees = [t for _, t in flat]
        sk = skeleton_of(trees, self.active_party)
        own, go = [], []
        start = 0
        for tree in trees:
            for node in tree.nodes:
                if not node.is_leaf and node.owner == self.active_party:
                    x = X[:, node.feature_idx]
                    go.append(goes_left(x, node.threshold, node.default_left, categories=node.categories))
                    own.append(start + node.node_id)
            start += len(tree.nodes)
        go_left = np.stack(go, axis=1) if go else np.zeros((n, 0), dtype=bool)
        own = np.array(own, dtype=np.int64)
        masks = leaf_masks(sk, own, go_left)
        parties = [self.active_party]
        received = {}
        for owner in self.node_owners(n_rounds):
            theirs = check_masks(fetch_masks(owner, self.skeleton(owner, n_rounds)), sk, n, owner)
            received[owner] = theirs
            masks = masks & theirs
            parties.append(owner)
        leaves = resolve_leaves(masks, sk, parties)
        raw = np.tile(np.asarray(self.base_score, dtype=np.float64), (n, 1))
        for ti, (k, tree) in enumerate(flat):
            values = np.array([nd.value for nd in tree.nodes])
            raw[:, k] += values[leaves[:, ti]]
        return OneRound(flat, sk, own, go_left, received, leaves, raw)

    # -- learner extras (issue 4) ---------------------------------------------
    @property
    def default_rounds(self) -> int:
        """Rounds used by prediction by default: up to ``best_iteration`` when early stopping set it."""
        return self.n_rounds if self.best_iteration is None else self.best_iteration + 1

    def output_to_prediction(self, raw: np.ndarray) -> np.ndarray:
        """Raw scores to predictions: class labels (binary 0/1; multiclass the original labels)
        or regression values."""
        out = get_objective(self.objective).transform(raw)
        if self.objective == Objective.BINARY:
            return (out > 0.5).astype(np.int64)
        if self.objective == Objective.MULTICLASS:
            idx = np.argmax(out, axis=1)
            classes = self.classes if self.classes is not None else list(range(self.n_targets))
            return np.asarray(classes, dtype=object if any(isinstance(c, str) for c in classes) else None)[idx]
        return out

    def check_points(self, points) -> None:
        """Refuse scorecard points (:class:`vfl.core.scorecard.PointsScale`) for a model without log-odds."""
        if points is not None and self.objective != Objective.BINARY:
            raise InputError(f"scorecard points (--points) scale the log-odds of a binary model; model "
                             f"{self.model_id} is {self.objective}")

    def prediction_table(self, ids, output, id_col: str = "id", points=None):
        """Predictions as a DataFrame: ``proba`` (binary; with ``points``, a
        :class:`vfl.core.scorecard.PointsScale`, also ``points``), ``prediction`` and
        ``proba_<class>`` (multiclass, original labels), or ``prediction`` (regression)."""
        self.check_points(points)
        if self.objective == Objective.BINARY:
            table = pd.DataFrame({id_col: ids, "proba": output})
            if points is not None:
                table["points"] = points.from_proba(output)
            return table
        if self.objective == Objective.MULTICLASS:
            classes = self.classes if self.classes is not None else list(range(self.n_targets))
            out = pd.DataFrame({id_col: ids, "prediction": [classes[i] for i in np.argmax(output, axis=1)]})
            for i, c in enumerate(classes):
                out[f"proba_{c}"] = output[:, i]
            return out
        return pd.DataFrame({id_col: ids, "prediction": output})

    def feature_importance(self, kind: str = "gain", n_rounds: int | None = None) -> dict:
        """The active party's view of importance: ``split`` (number of splits) or ``gain`` (total
        gain) over the rounds used for prediction.

        Returns ``{"features": {own feature: value}, "parties": {passive party: {"total": value,
        "records": {record_id: value}}}}``: passive features are known only as the opaque
        ``(party, record_id)`` of each split, so they are aggregated per party.
        """
        if kind not in ("split", "gain"):
            raise InputError(f"importance kind must be 'split' or 'gain', got {kind!r}")
        feats = {f: 0.0 for f in self.active_features}
        parties = {p: {"total": 0.0, "records": {}} for p in self.passives}
        for rnd in self.rounds[: (self.default_rounds if n_rounds is None else n_rounds)]:
            for tree in rnd:
                for node in tree.nodes:
                    if node.is_leaf:
                        continue
                    v = 1.0 if kind == "split" else float(node.gain)
                    if node.owner == self.active_party:
                        feats[node.feature] = feats.get(node.feature, 0.0) + v
                    else:
                        entry = parties.setdefault(node.owner, {"total": 0.0, "records": {}})
                        entry["total"] += v
                        entry["records"][int(node.record_id)] = v
        return {"features": feats, "parties": parties}
