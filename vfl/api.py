"""Public Python API: build parties from DataFrames, federate, fit, predict, save, load.

Example (three parties)::

    from vfl.api import ActiveParty, PassiveParty, Federation, TrainParams
    bank = ActiveParty("bank", bank_df, id_col="id", label_col="y")
    telco = PassiveParty("telco", telco_df, id_col="id")
    shop = PassiveParty("shop", shop_df, id_col="id")
    fed = Federation(bank, [telco, shop])
    fed.fit(TrainParams(mode="he", n_estimators=10, max_depth=4))
    proba = fed.predict_proba({"bank": bank_new, "telco": telco_new, "shop": shop_new})
    fed.save("model_dir")            # one JSON file per party
    fed2 = Federation.load("model_dir")

In-process federations are wired here and nowhere else in the public face: the
scikit-learn estimators (:mod:`vfl.estimators`) and the mode comparison
(:mod:`vfl.compare`) go through :class:`Federation` and :func:`simulate`;
``cli.py`` calls this module for ``vfl simulate`` and :mod:`parties.network` (the
parties floor) for the networked commands, which wires gRPC transports.
"""
from __future__ import annotations

import contextlib
import hashlib
import os
import time
from pathlib import Path

import numpy as np
import pandas as pd

from datasets.errors import InputError
from datasets.frames import PartyFrame, validate_party_frame
from datasets.loaders import DEFAULT_BATCH_ROWS, iter_party_batches, read_party_table
from datasets.pieces import open_piece_table
from datasets.split import _check_int, common_rows, train_test_split_parties
from parties.active import ActiveParty
from parties.channel import ASSUMED_LINK_MBPS
from parties.drift import DriftRun, with_last
from parties.passive import PassiveParty
from parties.screen import ScreenParams, ScreenResult, screen
from protocols.transport import InMemoryTransport, frame_handler
from vfl.core import credit_metrics, metrics
from vfl.core.dp_bins_file import check_dp_bins
from vfl.core.explain import Explanation, explanation_table
from vfl.core.files import check_writable_dir, json_bytes, write_files_atomic
from vfl.core.model import BoostedModel, read_model_json, require_content_hash
from vfl.core.objectives import check_sample_weight, get_objective
from vfl.core.params import DEFAULT_PREDICTION, Mode, Objective, TrainParams, check_monotone

__all__ = ["ActiveParty", "PassiveParty", "Federation", "TrainParams", "ScreenParams", "ScreenResult",
           "load_federation", "read_party_table", "federation_from_files"]


def _is_path(data) -> bool:
    return isinstance(data, (str, os.PathLike))


class Federation:
    """An in-process federation: one active party and any number of passive parties.

    Every message between them is serialized to bytes (``transport.bytes_sent``
    counts them per sender->receiver pair); no party touches another's objects.
    ``link_mbps``: the link the active party's cost model assumes between the parties when it
    weighs bytes against computation (default :data:`parties.channel.ASSUMED_LINK_MBPS`);
    memory is not slowed down to it.
    """

    def __init__(self, active: ActiveParty, passives: list[PassiveParty], record: bool = False,
                 link_mbps: float | None = None):
        names = [active.name] + [p.name for p in passives]
        if len(set(names)) != len(names):
            raise InputError(f"party names must be unique, got {names}")
        self.active = active
        self.passives = {p.name: p for p in passives}
        self.transport = InMemoryTransport(active.name, {p.name: frame_handler(p.handle) for p in passives},
                                           record=record)
        # memory is no link to measure: the cost model weighs bytes as over this one (nothing is slowed)
        if link_mbps is not None or active.link_mbps is None:
            active.link_mbps = ASSUMED_LINK_MBPS if link_mbps is None else link_mbps

    @property
    def model(self) -> BoostedModel | None:
        return self.active.model

    def fit(self, params: TrainParams | None = None, on_round=None, validation=None, observers=None,
            sample_weight=None, warm_start=None, **kwargs) -> BoostedModel:
        """Train; ``kwargs`` are :class:`TrainParams` fields (used when ``params`` is None).

        ``sample_weight``: one weight (>= 0) per row of the active party's frame (default: its
        ``weight_col``); the gradients are weighted before encryption.

        ``validation``: ``{party: DataFrame}`` of validation rows for every party (the active
        party's with the label), aligned by id like the training set; gives per-round
        metrics (``model.history``) and enables ``early_stopping_rounds``.
        ``observers``: :class:`vfl.core.rounds.RoundObserver` objects that receive every round's
        typed record (``on_round(round_idx, info)`` is the same as a plain function).
        ``warm_start``: continue a completed model with more rounds (like XGBoost's ``xgb_model``;
        ``n_estimators`` is the new total): this federation's current model (``fed.model``), a
        :class:`Federation` holding one, or the directory :meth:`save` wrote. The result is a new
        model that starts from its trees; with the same data and parameters, ``n`` rounds and then
        a warm start to ``n + m`` give the trees of ``n + m`` rounds at once (docs/learner.md)."""
        if params is None:
            params = TrainParams(**kwargs)
        elif kwargs:
            raise InputError("give either params or keyword hyperparameters, not both")
        val_active = None
        if validation is not None:
            if not isinstance(validation, dict):
                raise InputError("validation must be a dict {party name: DataFrame}")
            unknown = set(validation) - {self.active.name, *self.passives}
            missing = {self.active.name, *self.passives} - set(validation)
            if unknown or missing:
                raise InputError(f"validation data: unknown part(ies) {sorted(unknown)}, missing "
                                 f"{sorted(missing)}; give one DataFrame per party")
            for name, p in self.passives.items():
                p.load_validation_data(validation[name])
            val_active = validation[self.active.name]
        warm, warm_transport = self._warm_start(warm_start) if warm_start is not None else (None, None)
        return self.active.fit(self.transport, list(self.passives), params, on_round, validation=val_active,
                               observers=observers, sample_weight=sample_weight, warm_start=warm,
                               warm_transport=warm_transport)

    def _warm_start(self, base):
        """The model a warm start continues, each passive party told (locally: its own model) which
        model it may continue, and a transport to parties holding that model over their training
        rows (the saved model scores them before the first new round)."""
        if _is_path(base):
            base = Federation.load(base, self.active.id_col)
        if isinstance(base, Federation):
            model, dicts = base.model, {n: p.model_dict() for n, p in base.passives.items()}
        elif isinstance(base, BoostedModel):
            if self.model is None or base.model_id != self.model.model_id:
                raise InputError(f"warm_start: model {base.model_id!r} is not this federation's current model; "
                                 "give the directory it was saved to (Federation.save) or its Federation")
            model = base
            dicts = {n: p.model_dict() for n, p in self.passives.items() if p.model_id == base.model_id}
        else:
            raise InputError(f"warm_start must be a model directory, a Federation or this federation's model, "
                             f"got {type(base).__name__}")
        if model is None:
            raise InputError("warm_start: the federation given holds no trained model")
        missing = [n for n in model.passives if n not in dicts or n not in self.passives]
        if missing:
            raise InputError(f"warm_start: model {model.model_id!r} has no lookup table of party {missing[0]!r} "
                             "here (a warm start continues a model of the same parties)")
        handlers = {}
        for n in model.passives:
            self.passives[n].allow_warm_start(dicts[n], f"party {n!r}'s model")
            handlers[n] = frame_handler(self.passives[n].predicting_with(dicts[n], f"party {n!r}'s model").handle)
        return model, InMemoryTransport(self.active.name, handlers)

    def screen(self, params: ScreenParams | None = None, **kwargs) -> ScreenResult:
        """Screen every feature of every party before training (issue 33): per feature its bins, rows
        and events per bin, WOE per bin, IV and the share of missing values
        (:class:`parties.screen.ScreenResult`). Binary labels only. ``kwargs`` are
        :class:`parties.screen.ScreenParams` fields (``mode``, ``scheme``, ``key_bits``, ``max_bin``,
        ``monotone``, ``min_share``, ``dp_epsilon_per_feature``). Each passive party must grant it
        (``party.screen_allowed = True``; its ``screen_epsilon`` adds DP noise to its counts). The
        passive parties' feature names are filled in from the party objects this process holds; on
        the wire they never travel."""
        if params is None:
            params = ScreenParams(**kwargs)
        elif kwargs:
            raise InputError("give either params or keyword screening options, not both")
        with contextlib.ExitStack() as stack:       # the parties' trained model keeps predicting afterwards
            for p in self.passives.values():
                stack.enter_context(p.isolated_screening())
            return screen(self.active, self.transport, list(self.passives), params,
                          names={n: list(p.feature_names) for n, p in self.passives.items()})

    @classmethod
    def from_files(cls, active: tuple[str, str | os.PathLike], passives: dict[str, str | os.PathLike],
                   id_col: str = "id", label_col: str = "y", record: bool = False) -> "Federation":
        """A federation from the parties' tables: ``active=(name, path)`` (id, label, features) and
        ``passives={name: path}``; each path a CSV file, a Parquet file or a directory of Parquet
        files (:func:`read_party_table`)."""
        return federation_from_files(active, passives, id_col, label_col, record)

    def _load_frames(self, frames: dict | None):
        """Load the passive parties' prediction tables; return the active party's (a DataFrame or
        a path). A table may be a DataFrame or a path (CSV, Parquet file or directory)."""
        if frames is None:            # predict the training rows again
            for p in self.passives.values():
                p.clear_prediction_data()
            return None
        unknown = set(frames) - {self.active.name, *self.passives}
        if unknown:
            raise InputError(f"no party named {sorted(unknown)} in this federation")
        if self.active.name not in frames:
            raise InputError(f"prediction data for the active party {self.active.name!r} is required")
        for name, p in self.passives.items():
            if name not in frames:
                raise InputError(f"prediction data for passive party {name!r} is missing")
            data = frames[name]
            if _is_path(data):      # a Parquet table of numeric features is read per prediction session
                table = None if p.categories else open_piece_table(data, name, p.id_col)
                data = table if table is not None else read_party_table(data, name, p.id_col).frame
            p.load_prediction_data(data)
        return frames[self.active.name]

    def _active_batches(self, data, batch_rows: int | None):
        """``(frame, source)`` batches of the active party's prediction rows: one (the frame itself)
        unless ``batch_rows`` is given or the rows come from a file (then DEFAULT_BATCH_ROWS)."""
        name, id_col = self.active.name, self.active.id_col
        if _is_path(data):
            for pf in iter_party_batches(data, name, id_col, batch_rows=batch_rows or DEFAULT_BATCH_ROWS):
                yield pf.frame, pf.source
            return
        if batch_rows is None or not isinstance(data, pd.DataFrame):
            yield data, None
            return
        batch_rows = _check_int(batch_rows, "batch_rows", 1)
        if id_col in data.columns:        # ids checked once for the whole frame (duplicates across batches)
            validate_party_frame(PartyFrame(name, data[[id_col]], id_col), require_features=False)
        for start in range(0, max(len(data), 1), batch_rows):
            yield data.iloc[start:start + batch_rows], None

    def predict_raw(self, frames: dict | None = None, prediction: str | None = None,
                    align: str | None = None, batch_rows: int | None = None, drift: bool = False) -> np.ndarray:
        """Raw scores (see :meth:`predict_proba`)."""
        data = self._load_frames(frames)
        run = DriftRun(self.active._need_model()) if drift else None
        if data is None:
            raw = self.active.predict_raw(self.transport, None, prediction=prediction, align=align, drift_run=run)[1]
        else:
            parts = [self.active.predict_raw(self.transport, frame, source, prediction=prediction, align=align,
                                             drift_run=run, last=last)[1]
                     for (frame, source), last in with_last(self._active_batches(data, batch_rows))]
            raw = parts[0] if len(parts) == 1 else np.concatenate(parts)
        if run is not None:
            self.last_drift = run.report()
        return raw

    #: the drift report of the last prediction asked with ``drift=True`` (:meth:`predict_proba`)
    last_drift: dict | None = None

    def predict_proba(self, frames: dict | None = None, prediction: str | None = None,
                      align: str | None = None, batch_rows: int | None = None, drift: bool = False) -> np.ndarray:
        """Probability of class 1 per row of the active party's frame (federated routing);
        ``(n, K)`` class probabilities for multiclass, predictions for regression.

        ``drift``: every party also computes the PSI of its own inputs on these rows against its
        training counts (the active party that of the score too); the report, per party and
        feature with its flag, is then :attr:`last_drift` (see docs/model-report.md).

        ``frames``: ``{party: DataFrame or path}`` (a path: CSV, Parquet file or directory);
        ``prediction``: "one-round" (leaf masks; default) or "node" (node-by-node);
        ``align``: "hash" or "psi" (default: the training's alignment); ``batch_rows``: score the
        active party's rows that many at a time (one prediction session each; same result;
        default: all at once for a DataFrame, DEFAULT_BATCH_ROWS for a file)."""
        raw = self.predict_raw(frames, prediction, align, batch_rows, drift)
        return get_objective(self.active._need_model().objective).transform(raw)

    def predict(self, frames: dict | None = None, prediction: str | None = None,
                align: str | None = None, batch_rows: int | None = None, drift: bool = False) -> np.ndarray:
        """Class labels (binary 0/1, multiclass the original labels) or regression values."""
        raw = self.predict_raw(frames, prediction, align, batch_rows, drift)
        return self.active._need_model().output_to_prediction(raw)

    def evaluate(self, frames: dict, label_col: str, segment: str | None = None, drift: bool = False,
                 prediction: str | None = None, align: str | None = None, batch_rows: int | None = None) -> dict:
        """Score labelled rows and report ``{"credit": ..., "drift": ...}``: the credit metrics
        (:func:`vfl.core.credit_metrics.credit_report`) of the active party's DataFrame's column
        ``label_col`` (not a feature), per value of its column ``segment`` too; with ``drift``
        every party's PSI as in :meth:`predict_proba`. ``frames`` as in :meth:`predict_proba`."""
        model = self.active._need_model()
        if not isinstance(frames, dict) or not isinstance(frames.get(self.active.name), pd.DataFrame):
            raise InputError(f"evaluate needs {{party: DataFrame}} with the active party {self.active.name!r}'s "
                             "labelled rows as a DataFrame")
        own = frames[self.active.name]
        if label_col not in own.columns:
            raise InputError(f"the active party's rows have no label column {label_col!r}: they cannot be evaluated")
        if segment is not None:
            check_segment_column(own, segment, self.active.name)
        y = credit_metrics.encode_labels(model.objective, own[label_col].to_numpy(), model.classes,
                                         f"column {label_col!r}")
        output = self.predict_proba({**frames, self.active.name: own.drop(columns=[label_col])}, prediction, align,
                                    batch_rows, drift)
        return {"credit": credit_metrics.credit_report(model.objective, y, output, model.classes,
                                                      segments=None if segment is None else own[segment].to_numpy(),
                                                      segment_name=segment),
                "drift": self.last_drift if drift else None}

    def explanation(self, frames: dict | None = None, align: str | None = None,
                    batch_rows: int | None = None, passive_features=False) -> tuple[np.ndarray, Explanation]:
        """``(ids, explanation)``: grouped TreeSHAP attributions (:mod:`vfl.core.explain`) of the
        rows of ``frames`` (as in :meth:`predict_proba`; None: the training rows), one player per
        active feature and one per passive party. Each batch is a one-round prediction session:
        the passive parties answer exactly what they answer for prediction.

        ``passive_features`` (True, or a list of passive parties): each such party also splits
        its value among its own features, opt-in at the party (``PassiveParty.explain_features =
        True``, else it refuses), and keeps them: ``PassiveParty.feature_explanation()``; the
        active party sees none of them (docs/explanations.md)."""
        data = self._load_frames(frames)
        if data is None:
            return self.active.explain(self.transport, None, align=align, passive_features=passive_features)
        got = [self.active.explain(self.transport, frame, source, align=align, passive_features=passive_features)
               for frame, source in self._active_batches(data, batch_rows)]
        ids = np.concatenate([i for i, _ in got]) if got else np.zeros(0)
        ex = got[0][1]
        for _, more in got[1:]:
            ex = ex.concat(more)
        return ids, ex

    def explain(self, frames: dict | None = None, top: int | None = None, adverse: str = "high",
                align: str | None = None, batch_rows: int | None = None, passive_features=False) -> pd.DataFrame:
        """The explanation table (:func:`vfl.core.explain.explanation_table`): per row ``id``,
        ``base``, one column per active feature, one per passive party, ``margin`` (the raw score,
        ``base`` + the attributions); multiclass: one line per row and class. ``top`` K adds reason
        codes (the K players that pushed the score most towards the adverse side, ``adverse``
        "high": a larger score, e.g. the probability of default)."""
        ids, ex = self.explanation(frames, align, batch_rows, passive_features)
        model = self.active._need_model()
        return explanation_table(ex, ids, self.active.id_col, model.classes, top, adverse)

    def share_split_gains(self) -> dict[str, int]:
        """The active party tells each passive party the gains of its own splits (opt-in leakage:
        label-derived; see docs/learner.md), so each can compute gain importance locally."""
        return self.active.share_split_gains(self.transport)

    def feature_importance(self, kind: str = "split", share_gains: bool = False) -> dict[str, float]:
        """``{"party:feature": value}`` over every party's features (the active party's first),
        each party's part computed by that party itself from its own records: ``split`` (number of
        splits; the default, shares nothing) or ``gain`` (total gain). Names are prefixed by their
        party, so two parties' columns of one name stay apart (``bank:x0``, ``telco:x0``).

        ``gain`` needs each passive party to know the gains of its own splits, which only the
        active party knows: they must have been shared (:meth:`share_split_gains`, opt-in leakage,
        see docs/learner.md), or ``share_gains=True`` shares them first. Nothing is shared by
        default: without either, ``gain`` is refused."""
        if kind not in ("split", "gain"):
            raise InputError(f"importance kind must be 'split' or 'gain', got {kind!r}")
        model = self.active._need_model()
        n = model.default_rounds
        if kind == "gain":
            lacking = [name for name, p in self.passives.items() if not p.knows_split_gains()]
            if lacking and not share_gains:
                raise InputError(f"gain importance of the passive parties' features needs the gains of their splits, "
                                 f"which party(ies) {lacking} do not know: share them first "
                                 "(Federation.share_split_gains(), or feature_importance('gain', share_gains=True); "
                                 "opt-in leakage: label-derived, see docs/learner.md), or use kind='split'")
            if lacking:
                self.share_split_gains()
        out = {f"{self.active.name}:{f}": v for f, v in model.feature_importance(kind, n)["features"].items()}
        for name, p in self.passives.items():
            out.update({f"{name}:{f}": v for f, v in p.feature_importance(kind, n_rounds=n).items()})
        return out

    def unsafe_seed_dp_noise(self, seed: int) -> None:
        """NOT PRIVATE, tests and experiments only: in mode dp passive party ``i`` draws its noise
        from numpy seeded with ``[seed, i]`` (reproducible, invertible by anyone who knows the seed).
        By default every party draws cryptographic noise (:class:`vfl.core.dp_noise.SecureNoise`)."""
        for i, p in enumerate(self.passives.values()):
            p.dp_unsafe_noise_seed = [seed, i]

    def bytes_report(self) -> dict[str, int]:
        return self.transport.bytes_report()

    def save(self, directory) -> list[Path]:
        """One JSON model file per party (the active one holds no passive threshold) and a
        manifest, ``manifest.json``, naming them with their sha256. All are written in two phases
        (:func:`vfl.core.files.write_files_atomic`): a full disk changes nothing (the previous model
        stays whole), and the manifest is renamed into place last, so :meth:`load` never mixes two
        models. Returns the model files' paths (the manifest not included)."""
        if self.active.model is None:
            raise InputError(f"party {self.active.name!r} has no trained model to save")
        d = Path(directory)
        check_writable_dir(d, "model directory")
        files = [(d / f"{self.active.name}.json", json_bytes(self.active.model.file_dict()), "active",
                  self.active.name)]
        for name, p in self.passives.items():
            files.append((d / f"{name}.json", json_bytes(p.file_dict()), "passive", name))
        manifest = {"format": MANIFEST_FORMAT, "version": 1, "model_id": self.active.model.model_id,
                    "files": {f.name: {"party": party, "role": role, "sha256": hashlib.sha256(data).hexdigest()}
                              for f, data, role, party in files}}
        write_files_atomic([(f, data) for f, data, _, _ in files] + [(d / MANIFEST_FILE, json_bytes(manifest))])
        return [f for f, _, _, _ in files]

    def model_dicts(self) -> dict[str, dict]:
        """Every party's model as the JSON-ready dict its model file holds (``{party: dict}``, the
        active party first): what :meth:`save` writes, kept in memory (e.g. to pickle an estimator)."""
        out = {self.active.name: self.active._need_model().file_dict()}
        for name, p in self.passives.items():
            out[name] = p.file_dict()
        return out

    @classmethod
    def load(cls, directory, id_col: str = "id") -> "Federation":
        """The federation saved in ``directory`` by :meth:`save`: the files its manifest lists,
        each checked against its sha256 (a directory without a manifest, written before it
        existed, is read file by file). Every file is checked structurally; the passive models
        must belong to the active model (same model id)."""
        d = Path(directory)
        if not d.is_dir():
            raise InputError(f"model directory {d} does not exist")
        return cls._from_sources(list(_model_files(d)), id_col, f"model directory {d}")

    @classmethod
    def from_model_dicts(cls, contents, id_col: str = "id", where: str = "the model dicts") -> "Federation":
        """The federation of the parties' model dicts (:meth:`model_dicts` values, or model files' JSON);
        ``where`` names their origin in error messages."""
        return cls._from_sources([(where, c) for c in contents], id_col, where)

    @classmethod
    def _from_sources(cls, sources, id_col: str, where: str) -> "Federation":
        """``sources``: ``(file or origin, model dict)`` pairs."""
        active_model, passives = None, []
        for f, content in sources:
            role = content.get("role") if isinstance(content, dict) else None
            if role == "active":
                if active_model is not None:
                    raise InputError(f"{where} holds several active-party models; keep one per directory")
                active_model = BoostedModel.from_dict(require_content_hash(content, str(f)), str(f))
            elif role == "passive":
                passives.append((f, PassiveParty.from_model_dict(content, str(f))))
        if active_model is None:
            raise InputError(f"no active-party model file in {where}")
        for f, p in passives:
            if p.name in active_model.passives and p.model_id != active_model.model_id:
                raise InputError(f"{f} holds model {p.model_id!r} of party {p.name!r}, but the active party's model "
                                 f"is {active_model.model_id!r}: the directory mixes two models")
        have = {p.name for _, p in passives}
        missing = set(active_model.passives) - have
        if missing:
            raise InputError(f"{where} lacks the model file(s) of party {sorted(missing)}")
        for _, p in passives:
            p.id_col = id_col
            h = active_model.party_hashes.get(p.name)
            if h and p.name in active_model.passives:
                p.check_model_hash(h)
        return cls(ActiveParty.from_model(active_model, id_col),
                   [p for _, p in passives if p.name in active_model.passives])

MANIFEST_FILE = "manifest.json"
MANIFEST_FORMAT = "vfl-boost-manifest"


def _model_files(d: Path):
    """``(path, JSON object)`` of the model files of directory ``d``: those its manifest lists
    (checked against their sha256), or every ``*.json`` file but the manifest without one."""
    mpath = d / MANIFEST_FILE
    if not mpath.exists():
        for f in sorted(d.glob("*.json")):
            content = read_model_json(f)
            if content.get("role") in ("active", "passive"):
                yield f, content
        return
    man = read_model_json(mpath, "model manifest")
    files = man.get("files")
    if man.get("format") != MANIFEST_FORMAT or not isinstance(files, dict) or not files:
        raise InputError(f"{mpath} is not a model manifest of this toolkit (field files)")
    for name, entry in files.items():
        if not isinstance(name, str) or Path(name).name != name or not name.endswith(".json") \
                or not isinstance(entry, dict) or not isinstance(entry.get("sha256"), str):
            raise InputError(f"{mpath} is damaged: field files.{name}")
        f = d / name
        try:
            data = f.read_bytes()
        except OSError as exc:
            raise InputError(f"cannot read model file {f} (listed in {mpath}): {exc.strerror or exc}") from None
        if hashlib.sha256(data).hexdigest() != entry["sha256"]:
            raise InputError(f"{f} is not the file {mpath} lists (its sha256 differs): the model directory was "
                             "modified after it was saved, or mixes two models; save the model again")
        yield f, read_model_json(f)


def load_federation(directory, id_col: str = "id") -> Federation:
    return Federation.load(directory, id_col)


# --- simulation: the whole federation in one process (used by `vfl simulate`) ---
class SimulationResult(dict):
    """JSON-ready summary of one simulated training (a dict with attribute-free access)."""


def _owner(party_frames, column: str, what: str, weight_col: str | None = None) -> tuple[str, str]:
    """``(party, feature)`` of ``column``: a feature name held by exactly one party, or
    ``PARTY:FEATURE``."""
    party, sep, name = column.partition(":")
    if sep:
        for pf in party_frames:
            if pf.name == party:
                if name not in pf.feature_names or name == weight_col:
                    raise InputError(f"{what} {column!r}: party {party!r} has no feature column {name!r}")
                return party, name
    holders = [pf.name for pf in party_frames if column in pf.feature_names and column != weight_col]
    if not holders:
        raise InputError(f"{what} {column!r} is not a feature column of any party "
                         f"({', '.join(pf.name for pf in party_frames)})")
    if len(holders) > 1:
        raise InputError(f"{what} {column!r}: parties {holders} all have a feature of that name; write "
                         f"PARTY:{column}, e.g. {holders[-1]}:{column}")
    return holders[0], column


def split_constraints(party_frames, monotone: dict | None, weight_col: str | None = None) -> dict:
    """``{party name: {feature: +1 | -1}}``: each constraint of ``monotone`` (any party's features,
    ``PARTY:FEATURE`` where several parties use the name) goes to the party that holds the feature."""
    out: dict = {pf.name: {} for pf in party_frames}
    for column, c in (check_monotone(monotone) or {}).items():
        party, name = _owner(party_frames, column, "monotone constraint on", weight_col)
        out[party][name] = c
    return out


def split_dp_bins(party_frames, dp_bins: dict | None) -> dict:
    """``{party name: {feature: entry}}``: each public bounds/edges entry of ``dp_bins`` (any party's
    features, ``PARTY:FEATURE`` where several parties use the name) goes to the party that holds it."""
    out: dict = {pf.name: {} for pf in party_frames}
    for column, entry in (check_dp_bins(dp_bins, "parameter dp_bins") or {}).items():
        party, name = _owner(party_frames, column, "dp_bins on")
        out[party][name] = entry
    return out


def split_categorical(party_frames, categorical) -> dict:
    """``{party name: [its categorical columns]}`` of column names (``PARTY:FEATURE`` allowed)."""
    categorical = [] if categorical is None else ([categorical] if isinstance(categorical, str) else list(categorical))
    out: dict = {pf.name: [] for pf in party_frames}
    for column in categorical:
        party, name = _owner(party_frames, column, "categorical column")
        if name not in out[party]:
            out[party].append(name)
    return out


def federation_from_frames(party_frames, record: bool = False, link_mbps: float | None = None,
                           executor_for=None, categorical=None, monotone: dict | None = None,
                           weight_col: str | None = None, dp_bins: dict | None = None,
                           n_jobs: int | None = None) -> Federation:
    """Build a federation from ``datasets.PartyFrame`` objects (the first one holds the label).

    ``executor_for(name)`` (optional): each party's own executor (e.g. a Dask cluster per party);
    ``categorical``: column names (of any party; ``PARTY:COLUMN`` where several parties use the
    name) to treat as categorical; ``monotone``: ``{feature: +1 | -1}`` over the passive parties'
    features (``PARTY:FEATURE`` allowed), each goes to its party (the active party's come from
    ``TrainParams.monotone_constraints`` at fit, see :func:`simulate`); ``weight_col``: a column
    of the active party's frame holding sample weights; ``dp_bins``: public bounds/edges
    (:func:`vfl.core.dp_bins_file.check_dp_bins`) of the passive parties' features for ``--dp-model``
    (``PARTY:FEATURE`` allowed; the active party's come from ``TrainParams.dp_bins``); ``n_jobs``:
    every party's worker processes (None: each reads ``VFL_N_JOBS``, :class:`parties.settings.Settings`)."""
    if not party_frames:
        raise InputError("no party data given")
    first, rest = party_frames[0], party_frames[1:]
    if first.label_col is None:
        raise InputError(f"the first party ({first.name!r}) must hold the label column")
    cats = split_categorical(party_frames, categorical)
    per_party = split_constraints(party_frames, monotone, weight_col)
    if per_party[first.name]:
        raise InputError(f"monotone constraints on the active party's features {sorted(per_party[first.name])} "
                         "go in TrainParams.monotone_constraints")
    bins = split_dp_bins(party_frames, dp_bins)
    if bins[first.name]:
        raise InputError(f"dp_bins on the active party's features {sorted(bins[first.name])} go in TrainParams.dp_bins")
    ex = executor_for or (lambda name: None)
    active = ActiveParty(first.name, first.frame, first.id_col, first.label_col, first.source,
                         executor=ex(first.name), categorical=cats[first.name], weight_col=weight_col, n_jobs=n_jobs)
    passives = [PassiveParty(pf.name, pf.frame, pf.id_col, pf.source, executor=ex(pf.name), categorical=cats[pf.name],
                             n_jobs=n_jobs,
                             monotone=per_party[pf.name] or None, dp_bins=bins[pf.name] or None) for pf in rest]
    return Federation(active, passives, record=record, link_mbps=link_mbps)


def federation_from_files(active, passives, id_col: str = "id", label_col: str = "y",
                          record: bool = False) -> Federation:
    """See :meth:`Federation.from_files`."""
    if not (isinstance(active, tuple) and len(active) == 2):
        raise InputError("active must be a (name, path) pair")
    if not isinstance(passives, dict) or not passives:
        raise InputError("passives must be a non-empty dict {name: path}")
    frames = [read_party_table(active[1], active[0], id_col, label_col, allow_text_label=True)]
    frames += [read_party_table(path, name, id_col) for name, path in passives.items()]
    return federation_from_frames(frames, record=record)


def check_segment_column(frame: pd.DataFrame, segment: str, party: str) -> None:
    """``segment`` must be a column of the active party's table (a clear error naming its columns)."""
    if segment not in frame.columns:
        cols = [str(c) for c in frame.columns]
        raise InputError(f"segment column {segment!r} is not a column of the active party {party!r} (its columns: "
                         f"{', '.join(cols[:20])}{', ...' if len(cols) > 20 else ''})")
    n = frame[segment].nunique(dropna=False)
    if n > credit_metrics.MAX_SEGMENTS:         # refused before training, not after
        raise InputError(f"segment column {segment!r} has {n} distinct values, more than "
                         f"{credit_metrics.MAX_SEGMENTS}: segments are categories (a region, a product); "
                         "bin a numeric column")


def _test_metrics(model: BoostedModel, y_test, raw) -> dict:
    """Test-set metrics of the objective (``test_auc`` / ``test_accuracy`` / ``test_logloss`` /
    ``test_rmse`` / ``test_mae``; the others None)."""
    out = dict(test_auc=None, test_accuracy=None, test_logloss=None, test_rmse=None, test_mae=None)
    output = get_objective(model.objective).transform(raw)
    if model.objective == Objective.BINARY:
        y = np.asarray(y_test, dtype=np.float64)
        out.update(test_accuracy=1.0 - metrics.error(y, output), test_logloss=metrics.logloss(y, output))
        out["test_auc"] = metrics.auc(y, output) if len(np.unique(y)) == 2 else None
    elif model.objective == Objective.MULTICLASS:
        classes = model.classes or list(range(model.n_targets))
        index = {c: i for i, c in enumerate(classes)}
        y = [int(v) if isinstance(v, float) and v.is_integer() else v for v in np.asarray(y_test).tolist()]
        codes = np.array([index.get(v, -1) for v in y])
        out["test_accuracy"] = float(np.mean(np.argmax(output, axis=1) == codes))
        if (codes >= 0).all():      # a class never seen in training has no probability
            out["test_logloss"] = metrics.mlogloss(codes, output)
    else:
        y = np.asarray(y_test, dtype=np.float64)
        out.update(test_rmse=metrics.rmse(y, output), test_mae=metrics.mae(y, output))
    return out


def _simulation_executor(executor_for):
    """``executor_for`` whose executors' faults advise running the simulation again (it has no --resume)."""
    def make(name):
        ex = executor_for(name)
        if ex is not None and hasattr(ex, "advice"):
            ex.advice = "run the simulation again"
        return ex
    return make


def simulate(party_frames, params: TrainParams, test_size: float = 0.2, seed: int = 0,
             on_round=None, record: bool = False, prediction: str | None = None,
             validation_size: float | None = None, executor_for=None, link_mbps: float | None = None,
             categorical=None, weight_col: str | None = None, dp_ledger_dir=None,
             dp_lifetime_epsilon: float | None = None, n_jobs: int | None = None, segment: str | None = None,
             drift: bool = False, warm_start=None):
    """Split rows into train/test by the active party's ids, train, predict the test rows.

    The result's ``credit`` holds the credit metrics of the test rows
    (:func:`vfl.core.credit_metrics.credit_report`: KS, Gini, deciles, calibration), also per
    value of the active party's column ``segment`` when given; ``drift``: its ``drift`` is every
    party's PSI of its own inputs on the test rows against its training counts.

    ``categorical``: columns (of any party) to treat as categorical; ``weight_col``: the active
    party's column of sample weights; ``params.monotone_constraints`` may name any party's
    features: each party gets its own (the passive parties declare theirs to the active party
    as "feature j is increasing/decreasing").

    ``validation_size``: a fraction of the training rows held out as validation set
    (metric history, early stopping); ``executor_for(name)``: each party's executor (e.g.
    ``vfl simulate --dask local:2``: a private Dask cluster per party); ``link_mbps``: see
    :class:`Federation`; ``n_jobs``: every party's worker processes (None: ``VFL_N_JOBS``, else all
    cores). The result records the settings the training ran with (``settings``: n_jobs, overlap).
    ``warm_start``: a model directory to continue (:meth:`Federation.fit`): saved by a simulation with
    the same split (``test_size``, ``seed``), it continues on the same training rows.
    Returns ``(federation, result, test_ids, test_output)``
    where ``test_output`` is the probability of class 1 (binary), the class probabilities
    ``(n, K)`` (multiclass) or the predictions (regression).
    """
    if segment is not None:
        check_segment_column(party_frames[0].frame, segment, party_frames[0].name)
    train, test = train_test_split_parties(party_frames, test_size=test_size, seed=seed,
                                           what="test_size (--test-size, the share of rows held out for testing)")
    test = common_rows(test)        # the test rows every party holds (a partial overlap leaves others)
    validation = None
    if validation_size:
        train, val = train_test_split_parties(train, test_size=validation_size, seed=seed,
                                              what="validation_size (--validation-size, the share of the training "
                                                   "rows held out for validation)")
        validation = {pf.name: pf.frame for pf in common_rows(val, "validation")}
    per_party = split_constraints(party_frames, params.monotone_constraints, weight_col)
    bins = split_dp_bins(party_frames, params.dp_bins)
    active_params = TrainParams.from_dict({**params.to_dict(),
                                           "monotone_constraints": per_party[party_frames[0].name] or None,
                                           "dp_bins": bins[party_frames[0].name] or None})
    fed = federation_from_frames(train, record=record, link_mbps=link_mbps,
                                 executor_for=_simulation_executor(executor_for) if executor_for else None,
                                 categorical=categorical,
                                 monotone={f"{name}:{f}": c for name, cs in per_party.items()
                                           if name != party_frames[0].name for f, c in cs.items()},
                                 weight_col=weight_col,
                                 dp_bins={f"{name}:{f}": e for name, es in bins.items()
                                          if name != party_frames[0].name for f, e in es.items()},
                                 n_jobs=n_jobs)
    if validation is not None and weight_col is not None:
        validation[party_frames[0].name] = validation[party_frames[0].name].drop(columns=weight_col)
    user_params, params = params, active_params
    if params.dp_unsafe_noise_seed is not None:     # NOT PRIVATE: an explicit test option, never --seed
        fed.unsafe_seed_dp_noise(params.dp_unsafe_noise_seed)
    if dp_ledger_dir is not None:       # each passive party's lifetime privacy ledger (parties.dp_ledger)
        check_writable_dir(dp_ledger_dir, "--dp-ledger-dir")     # a read-only one named, not a raw [Errno 30]
        for name, p in fed.passives.items():
            p.dp_ledger_path = str(Path(dp_ledger_dir) / f"{name}.dp-ledger.json")
            p.dp_lifetime_epsilon = dp_lifetime_epsilon
    elif dp_lifetime_epsilon is not None:
        raise InputError("dp_lifetime_epsilon needs dp_ledger_dir (where each party counts its spending)")
    if params.min_iv is not None:       # the simulation holds every party: each grants the screening
        for p in fed.passives.values():
            p.screen_allowed = True
    t0 = time.perf_counter()
    fed.fit(params, on_round=on_round, validation=validation, warm_start=warm_start)
    train_seconds = time.perf_counter() - t0
    train_bytes = fed.transport.total_bytes()       # before prediction traffic
    test_frames = {pf.name: pf.frame for pf in test}
    test_frames[test[0].name] = test[0].frame.drop(columns=[c for c in (test[0].label_col, weight_col)
                                                            if c is not None])   # (may hold class names)
    t0 = time.perf_counter()
    raw = fed.predict_raw(test_frames, prediction=prediction, drift=drift)
    proba = get_objective(fed.model.objective).transform(raw)
    predict_seconds = time.perf_counter() - t0
    y_test = test[0].frame[test[0].label_col].to_numpy()
    scores = _test_metrics(fed.model, y_test, raw)
    auc = scores.pop("test_auc")
    model = fed.model
    result = SimulationResult(
        mode=params.mode, objective=params.objective, parties=[pf.name for pf in party_frames],
        n_train=int(len(train[0].frame)), n_test=int(len(test[0].frame)),
        train_seconds=train_seconds, predict_seconds=predict_seconds, test_auc=auc,
        bytes_sent=fed.bytes_report(), total_bytes=fed.transport.total_bytes(),
        alignment=fed.active.alignment_report, n_trees=sum(len(r) for r in fed.model.rounds),
        params=user_params.to_dict(), timings=fed.active.timings,
        crypto_seconds=fed.active.crypto_seconds(),
        **scores, n_validation=int(len(next(iter(validation.values())))) if validation else 0,
        n_rounds=model.n_rounds, best_iteration=model.best_iteration,
        eval_metric=model.params.get("eval_metric"), history=model.history, classes=model.classes,
        align=params.align, prediction=prediction or DEFAULT_PREDICTION,
    )
    result["train_bytes"] = train_bytes
    if drift:
        result["drift"] = fed.last_drift
    result["credit"] = credit_metrics.credit_report(
        model.objective, credit_metrics.encode_labels(model.objective, y_test, model.classes, "test labels"), proba,
        model.classes, segments=None if segment is None else test[0].frame[segment].to_numpy(), segment_name=segment)
    result["settings"] = dict(model.settings)         # the environment switches it trained with
    if weight_col is not None and model.objective != Objective.MULTICLASS:     # what the user weighted
        names = ("auc", "logloss", "error") if model.objective == Objective.BINARY else ("rmse", "mae")
        w_test = check_sample_weight(test[0].frame[weight_col].to_numpy(dtype=np.float64, na_value=np.nan),
                                     len(test[0].frame), party_frames[0].name, weight_col)
        result["test_weighted"] = metrics.weighted_metrics(names, y_test, proba, w_test)
    if params.mode == Mode.DP:     # privacy accounting: epsilon_per_feature, epsilon_per_party (by party)
        result.update(fed.active.dp_report)
    if model.dp_model is not None:   # --dp-model: mechanism, epsilon (delta), the per-tree budget split
        result["dp_model"] = model.dp_model
    screening = getattr(fed.active, "screening", None)
    if params.min_iv is not None and screening is not None:     # --min-iv: what the screening kept
        result["min_iv"] = {"cut": params.min_iv, "iv": screening.iv(), "kept": screening.kept(params.min_iv)}
    if model.history.get("warm_start"):
        result["warm_start"] = dict(model.history["warm_start"])
    return fed, result, test[0].frame[test[0].id_col].to_numpy(), proba
