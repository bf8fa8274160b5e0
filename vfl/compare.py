"""Compare training modes on the same data: plain, HE and DP at several epsilons.

API layer (like :mod:`vfl.api`, it wires parties together through
:func:`vfl.api.simulate`). ``vfl compare`` and ``benchmarks/compare_modes.py``
both call :func:`run_comparison`.

For every data set and seed (the seed picks the train/test split and the DP
noise) it trains, with the same trees/depth/learning rate/bins everywhere:

* ``plain``: the SecureBoost protocol without encryption (grows the same
  trees as HE, bit for bit);
* ``he``: SecureBoost with Paillier -- deterministic given the data, and
  expensive, so only for the first ``he_seeds`` seeds;
* ``dp``: the DP-only mode at each epsilon (``epsilon_scope`` says whether an
  epsilon is each passive party's total or per feature);
* ``local``: the active party alone on its own features (what federation
  must beat);
* ``xgboost``: centralized XGBoost on all features in one place (the
  non-private ceiling), when ``xgboost`` is installed.

It writes ``compare_runs.csv`` and ``compare_runs.json`` (every run: data
set, mode, epsilon, seed, test AUC, train seconds, bytes sent in training
and in all, the boosting rounds ``n_rounds`` and the trees grown ``n_trees``, ...; the JSON
also holds the settings, a summary per data set and notes) and, with
matplotlib, two PNG figures per data set: ``<dataset>_auc_vs_epsilon.png``
and ``<dataset>_cost.png``. The plain model of seed 0 is also explained on its test rows
(:mod:`vfl.core.explain`): its run holds ``explanations`` (the mean |attribution| per player, in
the JSON) and, with matplotlib, ``<dataset>_explanations.png`` is its summary plot.
"""
from __future__ import annotations

import csv
import io
import json
import math
import time
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import pandas as pd

from crypto.keys import WeakKeyWarning, check_key_bits
from datasets import SHARED_DATASETS, SHARED_TASKS, load_active_passive, load_named, shared_datasets_dir
from datasets.errors import InputError
from datasets.split import join_parties, train_test_split_parties
from protocols.units import format_bytes
from vfl.api import simulate
from vfl.core.credit_metrics import credit_report
from vfl.core.dp import check_epsilon, json_epsilon
from vfl.core.explain import summary_plot
from vfl.core.files import REPORT_MODE, write_bytes_atomic, write_text_atomic
from vfl.core.params import Mode, TrainParams, Vocabulary

INF = float("inf")
DEFAULT_EPSILONS = (0.5, 1.0, 2.0, 4.0, 8.0, INF)


class Arm(Vocabulary):
    """One arm of the comparison: the three training modes (:class:`vfl.core.params.Mode`) and two
    references, the active party alone and centralized XGBoost (not training modes)."""
    PLAIN = "plain"
    HE = "he"
    DP = "dp"
    LOCAL = "local"
    XGBOOST = "xgboost"
    DP_OLD = "dp_old"          # the mechanism before issue 13: 32 (max_bin) buckets, no debiasing
    DP_SELECT = "dp_select"    # dp with --dp-select (CompareConfig.dp_select features per passive party)
    DP_MODEL = "dp-model"    # plain (= he) training of a DP released model (vfl.core.dp_model), per epsilon
    DP_ALL = "dp_all"          # dp releasing every feature (--dp-select none; the default before issue 13's follow-up)


class EpsilonScope(Vocabulary):
    """Whether a swept epsilon is each passive party's total or the budget per feature."""
    PARTY = "party"
    FEATURE = "feature"


ARMS = Arm.values()
#: the arms that train in mode dp (one run per epsilon)
DP_ARMS = (Arm.DP.value, Arm.DP_OLD.value, Arm.DP_SELECT.value, Arm.DP_ALL.value)
DEFAULT_ARMS = tuple(a for a in ARMS if a != Arm.DP_MODEL)    # `vfl compare --dp-model` adds it
#: the hyperparameters of the dp-model arm that differ from the shared ones (see docs/dp.md)
DP_MODEL_SETTINGS = {"max_depth": 3, "learning_rate": 0.5}     # dp_trees, dp_budget: TrainParams' defaults
EPSILON_SCOPES = EpsilonScope.values()
COMPARE_KEY_BITS = 1024     # the HE arm's keys: a benchmark of cost, not a deployment (TrainParams: 2048)
CSV_COLUMNS = ["dataset", "mode", "epsilon", "epsilon_scope", "seed", "test_auc", "test_gini", "test_ks",
               "test_ks_threshold", "test_brier", "train_seconds",
               "predict_seconds", "train_bytes", "total_bytes", "n_train", "n_test", "n_rounds", "n_trees",
               "key_bits", "epsilon_per_feature", "epsilon_per_party"]


def default_datasets() -> tuple[str, ...]:
    """``breast_cancer`` (bundled), plus ``default_credit`` and ``give_credit`` when
    ``../shared/datasets`` is there."""
    return ("breast_cancer",) + (("default_credit", "give_credit") if shared_datasets_dir() else ())


def parse_epsilons(text) -> tuple[float, ...]:
    """``"0.5,1,2,inf"`` (or a sequence) -> validated epsilons."""
    items = [s.strip() for s in text.split(",")] if isinstance(text, str) else list(text)
    items = [s for s in items if s != ""]
    if not items:
        raise InputError("give at least one epsilon (e.g. 0.5,1,2,4,8,inf)")
    out = []
    for s in items:
        try:
            v = float(s) if isinstance(s, str) and s.lower() not in ("inf", "infinity") else s
        except ValueError:
            raise InputError(f"epsilon {s!r} is not a number (use e.g. 0.5,1,2,4,8,inf)") from None
        out.append(check_epsilon(v, "epsilon"))
    return tuple(out)


def format_epsilons(epsilons) -> str:
    """Epsilons as ``vfl compare --epsilons`` takes them: ``"0.5,1,2,4,8,inf"``."""
    return ",".join("inf" if math.isinf(e) else f"{e:g}" for e in epsilons)


@dataclass
class CompareConfig:
    """The settings of a comparison; the shared hyperparameters default to :class:`TrainParams`'."""
    datasets: tuple = ()                  # () -> default_datasets()
    modes: tuple = DEFAULT_ARMS           # the arms to run (``vfl compare --modes``)
    epsilons: tuple = DEFAULT_EPSILONS
    epsilon_scope: str = EpsilonScope.PARTY.value   # "party": each passive party's total; "feature": per feature
    seeds: int = 3
    he_seeds: int = 1
    n_estimators: int = TrainParams.default("n_estimators")
    max_depth: int = TrainParams.default("max_depth")
    learning_rate: float = TrainParams.default("learning_rate")
    max_bin: int = TrainParams.default("max_bin")
    key_bits: int = COMPARE_KEY_BITS
    test_size: float = 0.2
    plots: bool = True
    dp_select: int | str = "auto"         # arm dp_select: features released per passive party
    extra: dict = field(default_factory=dict)   # further TrainParams fields
    dp_model: dict = field(default_factory=lambda: dict(DP_MODEL_SETTINGS))   # dp-model arm's own settings
    #: your own tables instead of named data sets: {"name", "active", "passives", "id_col", "label_col"}
    #: (``vfl compare --active FILE --passive FILE ...``; see :func:`tables_entry`)
    tables: dict | None = None

    def validate(self) -> "CompareConfig":
        if self.tables is not None:
            self.tables = tables_entry(**self.tables)
            if self.datasets and tuple(self.datasets) != (self.tables["name"],):
                raise InputError("give either data set names (--dataset) or your own tables (--active/--passive), "
                                 "not both")
            self.datasets = (self.tables["name"],)
        self.datasets = tuple(self.datasets) or default_datasets()
        self.modes = tuple(self.modes)
        bad = [x for x in self.modes if x not in ARMS]
        if bad or not self.modes:
            raise InputError(f"unknown mode(s) {bad} for compare; choose from {', '.join(ARMS)}")
        self.epsilons = parse_epsilons(self.epsilons)
        if self.epsilon_scope not in EPSILON_SCOPES:
            raise InputError(f"epsilon_scope must be 'party' or 'feature', got {self.epsilon_scope!r}")
        for name, lo in (("seeds", 1), ("he_seeds", 0)):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < lo:
                raise InputError(f"{name} must be an integer >= {lo}, got {v!r}")
        if not (isinstance(self.test_size, (int, float)) and 0 < self.test_size < 1):
            raise InputError(f"test_size must be strictly between 0 and 1, got {self.test_size!r}")
        self.train_params(Mode.PLAIN, None, 0)       # validates the shared hyperparameters
        if Arm.DP_SELECT in self.modes:
            self.train_params(Arm.DP_SELECT.value, 1.0, 0)      # ... and the dp_select arm's k
        if Arm.DP_MODEL in self.modes:
            self.train_params(Arm.DP_MODEL, 1.0, 0)
        if Arm.HE in self.modes and self.he_seeds:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                check_key_bits(self.key_bits)
        return self

    def train_params(self, mode: str, epsilon: float | None, seed: int) -> TrainParams:
        """The TrainParams of one run; ``mode`` is a training mode or a DP arm (``dp_old``: the
        old mechanism, ``max_bin`` buckets and no debiasing; ``dp_select``: ``--dp-select``)."""
        dp = {}
        if mode == Arm.DP_MODEL:
            shared = dict(n_estimators=self.n_estimators, max_depth=self.max_depth,
                          learning_rate=self.learning_rate, max_bin=self.max_bin, key_bits=self.key_bits)
            return TrainParams(**(shared | dict(self.extra) | dict(self.dp_model)),
                               mode=Mode.PLAIN.value, seed=seed, dp_model=epsilon)
        if mode in DP_ARMS:
            dp = {"epsilon": epsilon} if self.epsilon_scope == EpsilonScope.PARTY else {"epsilon_per_feature": epsilon}
            if mode == Arm.DP_OLD:
                dp.update(dp_buckets=self.max_bin, dp_debias=False, dp_select=None)
            elif mode == Arm.DP_SELECT:
                dp.update(dp_select=self.dp_select)
            elif mode == Arm.DP_ALL:
                dp.update(dp_select=None)
            mode = Mode.DP.value
        return TrainParams(n_estimators=self.n_estimators, max_depth=self.max_depth,
                           learning_rate=self.learning_rate, max_bin=self.max_bin, mode=mode,
                           key_bits=self.key_bits, seed=seed, **dp, **self.extra)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["epsilons"] = [json_epsilon(e) for e in self.epsilons]
        return d


def dataset_names() -> list[str]:
    return ["breast_cancer"] + [n for n in sorted({*SHARED_DATASETS, "give_credit", "a9a"})
                                if SHARED_TASKS.get(n) == "binary"]


def tables_entry(active, passives, name: str | None = None, id_col: str = "id", label_col: str = "y") -> dict:
    """The ``tables`` of a :class:`CompareConfig`: the active party's table (ids, a binary label,
    features) and the passive parties' (ids, features), each a CSV file, a Parquet file or a
    directory of Parquet files, as ``vfl simulate --active/--passive`` takes them; ``name`` names
    the data set in the outputs (default: the active table's file name without its suffix)."""
    passives = [passives] if isinstance(passives, (str, Path)) else list(passives or ())
    if not active or not passives:
        raise InputError("your own tables need the active party's table and at least one passive party's "
                         "(--active FILE --passive FILE ...)")
    name = name or Path(str(active)).stem
    if not isinstance(name, str) or not name or any(c in name for c in "/\\:") or name.startswith("."):
        raise InputError(f"data set name {name!r} cannot name the output files (--name)")
    return {"name": name, "active": str(active), "passives": [str(p) for p in passives], "id_col": str(id_col),
            "label_col": str(label_col)}


def load_tables(tables: dict):
    """The party frames of your own tables (:func:`tables_entry`); the label must be binary (AUC)."""
    frames = load_active_passive(tables["active"], tables["passives"], id_col=tables["id_col"],
                                 label_col=tables["label_col"])
    labels = np.unique(frames[0].frame[tables["label_col"]].to_numpy())
    if len(labels) != 2:
        raise InputError(f"compare needs a binary label (test AUC): column {tables['label_col']!r} of "
                         f"{tables['active']} has {len(labels)} distinct value(s)")
    return frames


def load_dataset(name: str):
    """``breast_cancer`` (bundled, 2 parties) or a binary data set of the shared datasets directory
    (``$VFL_SHARED_DATASETS``, else ``../shared/datasets`` next to the source tree)."""
    if name not in dataset_names():
        raise InputError(f"compare needs a binary data set (AUC); {name!r} is not one of "
                         f"{', '.join(dataset_names())}")
    return load_named(name)


def require_matplotlib():
    try:
        import matplotlib
    except ImportError:
        raise InputError("plots need matplotlib, which is not installed: pip install 'vfl-boost[plot]' "
                         "(or pass --no-plots)") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def _xgboost_available() -> bool:
    try:
        import xgboost  # noqa: F401
    except ImportError:
        return False
    return True


# --- single runs ---------------------------------------------------------------
def _run_federated(frames, dataset, mode, epsilon, seed, cfg: CompareConfig) -> dict:
    params = cfg.train_params("plain" if mode == "local" else mode, epsilon, seed)
    dp_arm = mode in DP_ARMS
    if mode == Arm.DP_MODEL and math.isinf(epsilon):
        params.dp_model = math.inf      # epsilon inf: the non-private training with the dp-model settings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", WeakKeyWarning)     # 1024-bit keys: benchmark only
        fed, res, _, _ = simulate(frames[:1] if mode == "local" else frames, params,
                                  test_size=cfg.test_size, seed=seed)
    extra = {}
    if mode == "plain" and seed == 0:       # the global view of the plain model: its test rows explained
        _, test = train_test_split_parties(frames, test_size=cfg.test_size, seed=seed)
        rows = {pf.name: pf.frame for pf in test}
        rows[test[0].name] = test[0].frame.drop(columns=[test[0].label_col])
        _, ex = fed.explanation(rows)
        extra = {"explanations": ex.summary(fed.model.classes), "_explanation": ex}
    return extra | {"dataset": dataset, "mode": mode, "epsilon": epsilon,
            "epsilon_scope": cfg.epsilon_scope if dp_arm else None, "seed": seed,
            "test_auc": res["test_auc"], **_credit_columns(res["credit"]), "train_seconds": res["train_seconds"],
            "predict_seconds": res["predict_seconds"], "train_bytes": res["train_bytes"],
            "total_bytes": res["total_bytes"],
            "n_train": res["n_train"], "n_test": res["n_test"], "n_rounds": res["n_rounds"],
            "n_trees": res["n_trees"],
            "key_bits": cfg.key_bits if mode == "he" else None,
            "epsilon_per_feature": res.get("epsilon_per_feature"),
            "epsilon_per_party": res.get("epsilon_per_party")}


def _credit_columns(credit: dict) -> dict:
    """A run's credit metrics (binary models; None otherwise): Gini, KS and its threshold, Brier."""
    o = credit.get("overall", {})
    return {"test_gini": o.get("gini"), "test_ks": o.get("ks"), "test_ks_threshold": o.get("ks_threshold"),
            "test_brier": o.get("brier")}


def _centralized(parts):
    """All parties' features of the same rows in one table (the active party's row order)."""
    X, y, _ = join_parties(parts)
    return X, pd.to_numeric(pd.Series(y)).to_numpy(dtype=np.float64)


def _run_xgboost(frames, dataset, seed, cfg: CompareConfig) -> dict:
    import xgboost as xgb  # optional extra (the xgboost arm only)
    from sklearn.metrics import roc_auc_score  # (only this arm needs it: keeps `vfl` start-up light)

    train, test = train_test_split_parties(frames, test_size=cfg.test_size, seed=seed)
    Xtr, ytr = _centralized(train)
    Xte, yte = _centralized(test)
    p = cfg.train_params("plain", None, seed)
    model = xgb.XGBClassifier(n_estimators=p.n_estimators, max_depth=p.max_depth, learning_rate=p.learning_rate,
                              max_bin=p.max_bin, reg_lambda=p.reg_lambda, min_child_weight=p.min_child_weight,
                              gamma=p.gamma, tree_method="hist", objective="binary:logistic", n_jobs=1,
                              random_state=seed)
    t0 = time.perf_counter()
    model.fit(Xtr, ytr)
    seconds = time.perf_counter() - t0
    t0 = time.perf_counter()
    proba = model.predict_proba(Xte)[:, 1]
    predict_seconds = time.perf_counter() - t0
    auc = float(roc_auc_score(yte, proba))
    credit = credit_report("binary", yte, proba, curves=False)
    return {"dataset": dataset, "mode": "xgboost", "epsilon": None, "epsilon_scope": None, "seed": seed,
            "test_auc": auc, **_credit_columns(credit), "train_seconds": seconds, "predict_seconds": predict_seconds,
            "train_bytes": 0, "total_bytes": 0, "n_train": int(len(ytr)), "n_test": int(len(yte)),
            "n_rounds": int(model.get_booster().num_boosted_rounds()),
            "n_trees": len(model.get_booster().get_dump()),
            "key_bits": None, "epsilon_per_feature": None, "epsilon_per_party": None}


# --- summary -------------------------------------------------------------------
def _key(run) -> tuple:
    return (run["mode"], run["epsilon"] if run["mode"] in DP_ARMS or run["mode"] == Arm.DP_MODEL else None)


def _per_feature(rs: list[dict]):
    """The runs' shared epsilon per feature, or one per run (seed order) when they differ (``--dp-select
    auto``: the pilot picks how many features share a party's budget, seed by seed)."""
    values = [r["epsilon_per_feature"] for r in sorted(rs, key=lambda r: r["seed"])]
    return values[0] if all(v == values[0] for v in values) else values


def _mean_of(runs: list[dict], key: str) -> float | None:
    values = [r[key] for r in runs if r.get(key) is not None]
    return float(np.mean(values)) if values else None


def summarize(runs: list[dict]) -> dict:
    """Per data set: one entry per (mode, epsilon) with AUC mean/std/min/max, seconds, bytes."""
    out: dict[str, list] = {}
    for ds in dict.fromkeys(r["dataset"] for r in runs):
        groups: dict[tuple, list] = {}
        for r in runs:
            if r["dataset"] == ds:
                groups.setdefault(_key(r), []).append(r)
        entries = []
        for (mode, eps), rs in groups.items():
            auc = np.array([r["test_auc"] for r in rs if r["test_auc"] is not None], dtype=float)
            entries.append({
                "mode": mode, "epsilon": json_epsilon(eps) if eps is not None else None, "n_runs": len(rs),
                "auc_mean": float(auc.mean()) if auc.size else None,
                "auc_std": float(auc.std(ddof=1)) if auc.size > 1 else 0.0,
                "auc_min": float(auc.min()) if auc.size else None,
                "auc_max": float(auc.max()) if auc.size else None,
                "gini_mean": _mean_of(rs, "test_gini"), "ks_mean": _mean_of(rs, "test_ks"),
                "brier_mean": _mean_of(rs, "test_brier"),
                "train_seconds_mean": float(np.mean([r["train_seconds"] for r in rs])),
                "train_bytes_mean": float(np.mean([r["train_bytes"] for r in rs])),
                "total_bytes_mean": float(np.mean([r["total_bytes"] for r in rs])),
                "epsilon_per_feature": _per_feature(rs)})
        # HE grows plain's trees bit for bit: check it on the seeds where both ran
        he = {r["seed"]: r["test_auc"] for r in runs if r["dataset"] == ds and r["mode"] == "he"}
        plain = {r["seed"]: r["test_auc"] for r in runs if r["dataset"] == ds and r["mode"] == "plain"}
        both = sorted(set(he) & set(plain))
        out[ds] = {"entries": entries,
                   "he_equals_plain": all(he[s] == plain[s] for s in both) if both else None}
    return out


def format_table(summary: dict) -> str:
    """The summary as a text table per data set, every column as wide as its widest cell (the mode
    left-aligned, the numbers right-aligned), bytes in IEC units."""
    header = ["mode", "epsilon", "runs", "AUC mean", "+-std", "min", "max", "train s", "train bytes"]
    lines = []
    for ds, s in summary.items():
        rows = []
        for e in s["entries"]:
            rows.append([e["mode"], "" if e["epsilon"] is None else format_epsilons([check_epsilon(e["epsilon"])]),
                         str(e["n_runs"]),
                         "n/a" if e["auc_mean"] is None else f"{e['auc_mean']:.4f}", f"{e['auc_std']:.4f}",
                         "n/a" if e["auc_min"] is None else f"{e['auc_min']:.4f}",
                         "n/a" if e["auc_max"] is None else f"{e['auc_max']:.4f}", f"{e['train_seconds_mean']:.2f}",
                         format_bytes(e["train_bytes_mean"]) if e["train_bytes_mean"] else "0"])
        widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
        lines.append(f"{ds}:")
        for r in [header, *rows]:
            cells = [c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))]
            lines.append("  " + " ".join(cells))
        if s["he_equals_plain"] is not None:
            lines.append(f"  HE AUC == plain AUC on the same split: {s['he_equals_plain']}")
    return "\n".join(lines)


# --- output --------------------------------------------------------------------
def _csv_value(v):
    if v is None:
        return ""
    if isinstance(v, float) and math.isinf(v):
        return "inf"
    if isinstance(v, dict):
        return json.dumps(v, sort_keys=True)
    return v


def _json_run(r: dict) -> dict:
    d = dict(r)
    if d["epsilon"] is not None:
        d["epsilon"] = json_epsilon(d["epsilon"])
    return d


def write_runs(runs: list[dict], out_dir: Path, cfg: CompareConfig, notes: list[str]) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    csv_path, json_path = out_dir / "compare_runs.csv", out_dir / "compare_runs.json"
    text = io.StringIO(newline="")
    w = csv.DictWriter(text, fieldnames=CSV_COLUMNS)
    w.writeheader()
    for r in runs:
        w.writerow({k: _csv_value(r.get(k)) for k in CSV_COLUMNS})
    write_text_atomic(csv_path, text.getvalue(), REPORT_MODE)
    write_text_atomic(json_path, json.dumps({"settings": cfg.to_dict(), "notes": notes, "summary": summarize(runs),
                                             "runs": [_json_run(r) for r in runs]}, indent=1), REPORT_MODE)
    return [csv_path, json_path]


def dp_curves(cfg: CompareConfig) -> tuple:
    """``(arm, colour, style, legend label)`` of each DP arm's curve. With ε per feature nothing
    is selected (the default arm then releases every feature, as ``dp_all`` does)."""
    default = ("DP default (auto buckets, debiased, --dp-select auto)" if cfg.epsilon_scope == EpsilonScope.PARTY
               else "DP default (auto buckets, debiased; ε per feature: no selection)")
    same = cfg.epsilon_scope == EpsilonScope.PARTY and str(cfg.dp_select) == "auto"     # the default's own
    select = "DP, dp_select arm (the default's settings)" if same else f"DP, --dp-select {cfg.dp_select}"
    return ((Arm.DP_OLD.value, "tab:purple", "s--", "DP, old mechanism (32 buckets, no debiasing)"),
            (Arm.DP_ALL.value, "tab:orange", "v-", "DP, every feature (auto buckets, debiased)"),
            (Arm.DP.value, "tab:blue", "o-", default),
            (Arm.DP_SELECT.value, "tab:green", "^-", select))


def _legend_below(ax) -> None:
    """The legend under the axes, never over the curves and their error bars (the figure grows
    to hold it when saved: ``bbox_inches="tight"``)."""
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=2, frameon=False)


def plot_dataset(dataset: str, runs: list[dict], cfg: CompareConfig, out_dir: Path, notes: list[str]) -> list[Path]:
    """``<dataset>_auc_vs_epsilon.png`` and ``<dataset>_cost.png``."""
    plt = require_matplotlib()
    rs = [r for r in runs if r["dataset"] == dataset]
    by = {}
    for r in rs:
        by.setdefault(_key(r), []).append(r)

    def mean_auc(mode):
        v = [r["test_auc"] for r in by.get((mode, None), []) if r["test_auc"] is not None]
        return (float(np.mean(v)), len(v)) if v else (None, 0)

    paths = []
    fig, ax = plt.subplots(figsize=(6.4, 4.2), dpi=100)
    dp_eps = sorted({e for m, e in by if m in DP_ARMS})
    finite = [e for e in dp_eps if e != INF]
    x_inf = (max(finite) if finite else 1.0) * 4
    for arm, color, fmt, label in dp_curves(cfg):
        arm_eps = [e for e in dp_eps if (arm, e) in by]
        if not arm_eps:
            continue
        xs = [x_inf if e == INF else e for e in arm_eps]
        aucs = [np.array([r["test_auc"] for r in by[(arm, e)]], dtype=float) for e in arm_eps]
        mean = np.array([a.mean() for a in aucs])
        std = np.array([a.std(ddof=1) if a.size > 1 else 0.0 for a in aucs])
        if arm == Arm.DP.value:
            lo, hi = np.array([a.min() for a in aucs]), np.array([a.max() for a in aucs])
            ax.fill_between(xs, lo, hi, color=color, alpha=0.15, lw=0, label="DP min-max over seeds")
        ax.errorbar(xs, mean, yerr=std, fmt=fmt, color=color, capsize=3,
                    label=f"{label}, mean ± std, {max(len(a) for a in aucs)} seeds")
    # HE grows plain's trees bit for bit (checked per seed in the summary), so the HE line is the
    # plain runs' mean over every seed when there are plain runs
    he_src = "plain" if mean_auc("plain")[0] is not None else "he"
    he_label = "HE = plain protocol (lossless)" if he_src == "plain" else "HE (lossless)"
    for mode, style, label in ((he_src, dict(color="tab:red", ls="-"), he_label),
                               ("xgboost", dict(color="black", ls="--"), "centralized XGBoost"),
                               ("local", dict(color="tab:gray", ls="-."), "active party alone")):
        v, n = mean_auc(mode)
        if v is not None:
            ax.axhline(v, lw=1.3, label=f"{label}, {n} seed{'s' if n > 1 else ''}", **style)
    ax.set_xscale("log")
    if dp_eps:
        ticks = [x_inf if e == INF else e for e in dp_eps]
        ax.set_xticks(ticks)
        ax.set_xticklabels(["∞" if e == INF else f"{e:g}" for e in dp_eps])
        ax.minorticks_off()
    scope = "each passive party's total" if cfg.epsilon_scope == "party" else "per feature"
    ax.set_xlabel(f"ε ({scope}; ∞ = no noise)")
    ax.set_ylabel("test AUC")
    ax.set_title(f"{dataset}: AUC vs privacy budget "
                 f"({cfg.n_estimators} trees, depth {cfg.max_depth}, {cfg.max_bin} bins)", fontsize=10)
    ax.grid(alpha=0.3)
    _legend_below(ax)
    if "xgboost" in cfg.modes and ("xgboost", None) not in by:
        ax.text(0.01, 0.01, "centralized XGBoost line omitted: xgboost not installed",
                transform=ax.transAxes, fontsize=7, color="gray")
    fig.tight_layout()
    paths.append(out_dir / f"{dataset}_auc_vs_epsilon.png")
    _save_figure(fig, paths[-1])
    plt.close(fig)

    # cost: training seconds and bytes per mode (DP: every epsilon pooled; the cost does not depend on it)
    order = [m for m in ("he", "plain", "dp", "local", "xgboost") if any(k[0] == m for k in by)]
    names = {"he": f"HE ({cfg.key_bits}-bit)", "plain": "plain", "dp": "DP", "local": "active\nalone",
             "xgboost": "central.\nXGBoost"}
    secs = [np.mean([r["train_seconds"] for r in rs if r["mode"] == m]) for m in order]
    byts = [np.mean([r["train_bytes"] for r in rs if r["mode"] == m]) for m in order]
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(7.2, 3.4), dpi=100)
    colors = {"he": "tab:red", "plain": "tab:orange", "dp": "tab:blue", "local": "tab:gray", "xgboost": "black"}
    sent = [(m, b) for m, b in zip(order, byts) if b > 0]       # the non-federated runs send nothing
    for ax, modes, vals, title, fmt in (
            (a1, order, secs, "training time (s, log)", "{:.2g}"),
            (a2, [m for m, _ in sent], [b for _, b in sent], "bytes sent in training, all parties (log)", None)):
        xs = np.arange(len(modes))
        ax.bar(xs, [max(v, 1e-4) for v in vals], color=[colors[m] for m in modes])
        ax.set_yscale("log")
        ax.set_xticks(xs)
        ax.set_xticklabels([names[m] for m in modes], fontsize=8)
        ax.set_title(title, fontsize=9)
        for x, v in zip(xs, vals):
            txt = fmt.format(v) if fmt else ("0" if v <= 0 else format_bytes(v))
            ax.text(x, max(v, 1e-4), txt, ha="center", va="bottom", fontsize=7)
        ax.margins(y=0.25)
    fig.suptitle(f"{dataset}: cost per training run ({cfg.n_estimators} trees, depth {cfg.max_depth})",
                 fontsize=10)
    fig.tight_layout()
    paths.append(out_dir / f"{dataset}_cost.png")
    _save_figure(fig, paths[-1])
    plt.close(fig)
    return paths


def plot_dp_model(dataset: str, runs: list[dict], cfg: CompareConfig, out_dir: Path) -> list[Path]:
    """``<dataset>_dp_model_auc_vs_epsilon.png``: test AUC of the DP released model against its total
    epsilon, with the non-private (plain = he) and active-party-alone lines."""
    plt = require_matplotlib()
    rs = [r for r in runs if r["dataset"] == dataset]
    eps = sorted({r["epsilon"] for r in rs if r["mode"] == Arm.DP_MODEL})
    if not eps:
        return []
    finite = [e for e in eps if e != INF]
    x_inf = (max(finite) if finite else 1.0) * 4
    fig, ax = plt.subplots(figsize=(6.4, 4.2), dpi=100)
    xs = [x_inf if e == INF else e for e in eps]
    aucs = [np.array([r["test_auc"] for r in rs if r["mode"] == Arm.DP_MODEL and r["epsilon"] == e], dtype=float)
            for e in eps]
    mean = np.array([a.mean() for a in aucs])
    std = np.array([a.std(ddof=1) if a.size > 1 else 0.0 for a in aucs])
    ax.fill_between(xs, [a.min() for a in aucs], [a.max() for a in aucs], color="tab:green", alpha=0.15, lw=0,
                    label="DP model min-max over seeds")
    ax.errorbar(xs, mean, yerr=std, fmt="o-", color="tab:green", capsize=3,
                label=f"DP released model (--dp-model), mean ± std, {max(a.size for a in aucs)} seeds")
    for mode, style, label in (("plain", dict(color="tab:red", ls="-"), "non-private (plain = HE)"),
                               ("local", dict(color="tab:gray", ls="-."), "active party alone (non-private)")):
        v = [r["test_auc"] for r in rs if r["mode"] == mode and r["test_auc"] is not None]
        if v:
            ax.axhline(float(np.mean(v)), lw=1.3, label=f"{label}, {len(v)} seed{'s' if len(v) > 1 else ''}",
                       **style)
    ax.set_xscale("log")
    ax.set_xticks(xs)
    ax.set_xticklabels(["∞" if e == INF else f"{e:g}" for e in eps])
    ax.minorticks_off()
    ax.set_xlabel("total ε of the released model (per training row; ∞ = no noise)")
    ax.set_ylabel("test AUC")
    s = cfg.dp_model
    ax.set_title(f"{dataset}: DP released model, AUC vs ε ({cfg.n_estimators} trees, depth "
                 f"{s.get('max_depth', cfg.max_depth)}, lr {s.get('learning_rate', cfg.learning_rate)})", fontsize=10)
    ax.grid(alpha=0.3)
    _legend_below(ax)
    fig.tight_layout()
    path = out_dir / f"{dataset}_dp_model_auc_vs_epsilon.png"
    _save_figure(fig, path)         # the one atomic 0600 writer, like every other file
    plt.close(fig)
    return [path]


def replot(out_dir) -> list[Path]:
    """Redraw the PNG figures from ``out_dir/compare_runs.json`` (no training)."""
    out_dir = Path(out_dir)
    try:
        doc = json.loads((out_dir / "compare_runs.json").read_text())
        cfg = CompareConfig(**{k: v for k, v in doc["settings"].items()
                               if k in CompareConfig.__dataclass_fields__}).validate()
    except (OSError, json.JSONDecodeError, KeyError, TypeError) as exc:
        raise InputError(f"cannot read a comparison from {out_dir}: {exc}") from None
    runs = [{**r, "epsilon": None if r["epsilon"] is None else check_epsilon(r["epsilon"])} for r in doc["runs"]]
    paths = []
    for ds in dict.fromkeys(r["dataset"] for r in runs):
        paths += plot_dataset(ds, runs, cfg, out_dir, doc.get("notes", []))
        if Arm.DP_MODEL in cfg.modes:
            paths += plot_dp_model(ds, runs, cfg, out_dir)
    return paths


# --- the whole comparison ------------------------------------------------------
def run_comparison(cfg: CompareConfig, out_dir, progress: Callable[[str], None] | None = None) -> dict:
    """Run every (data set, seed, mode, epsilon); write CSV/JSON (and PNGs); return the JSON document."""
    cfg.validate()
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)    # the explanations plot is written after the first run
    if cfg.plots:
        require_matplotlib()                       # fail before hours of training, not after
    say = progress or (lambda s: None)
    notes = []
    modes = list(cfg.modes)
    if "xgboost" in modes and not _xgboost_available():
        modes.remove("xgboost")
        notes.append("xgboost is not installed: no centralized XGBoost reference (pip install xgboost)")
    if "he" in modes and cfg.key_bits < 2048:
        notes.append(f"HE runs use {cfg.key_bits}-bit Paillier keys: fine for timing, below the "
                     f"2048-bit default for deployments")
    runs: list[dict] = []
    pngs: list[Path] = []
    data = ({cfg.tables["name"]: load_tables(cfg.tables)} if cfg.tables is not None      # a missing file fails
            else {ds: load_dataset(ds) for ds in cfg.datasets})                          # before any training
    for ds, frames in data.items():
        for seed in range(cfg.seeds):
            todo = []
            if "plain" in modes:
                todo.append(("plain", None))
            if "he" in modes and seed < cfg.he_seeds:
                todo.append(("he", None))
            for arm in DP_ARMS:
                if arm in modes:
                    todo += [(arm, e) for e in cfg.epsilons]
            if "local" in modes:
                todo.append(("local", None))
            if Arm.DP_MODEL in modes:
                todo += [(Arm.DP_MODEL.value, e) for e in cfg.epsilons]
            for mode, eps in todo:
                run = _run_federated(frames, ds, mode, eps, seed, cfg)
                ex = run.pop("_explanation", None)
                if ex is not None and cfg.plots:
                    path = out_dir / f"{ds}_explanations.png"
                    summary_plot(ex, path, title=f"{ds}: plain model, {ex.n_rows} test rows explained",
                                 mode=REPORT_MODE)
                    pngs.append(path)
                runs.append(run)
                say(f"[{ds}] seed {seed} {mode}{'' if eps is None else f' eps={eps:g}'}: "
                    f"AUC {run['test_auc']:.4f}, {run['train_seconds']:.2f} s, {run['train_bytes']} bytes in training")
            if "xgboost" in modes:
                run = _run_xgboost(frames, ds, seed, cfg)
                runs.append(run)
                say(f"[{ds}] seed {seed} centralized xgboost: AUC {run['test_auc']:.4f}")
            write_runs(runs, out_dir, cfg, notes)     # keep partial results
        if cfg.plots:
            pngs += plot_dataset(ds, runs, cfg, out_dir, notes)
            if Arm.DP_MODEL in modes:
                pngs += plot_dp_model(ds, runs, cfg, out_dir)
    files = write_runs(runs, out_dir, cfg, notes) + pngs
    doc = json.loads((out_dir / "compare_runs.json").read_text())
    doc["files"] = [str(f) for f in files]
    return doc


def _save_figure(fig, path: Path) -> None:
    """A figure through the one atomic writer (rendered in memory first; mode 0644: meant to be
    shared, it holds no secret)."""
    buf = io.BytesIO()
    fig.savefig(buf, format=path.suffix.lstrip(".") or "png", bbox_inches="tight")
    write_bytes_atomic(path, buf.getvalue(), REPORT_MODE)
