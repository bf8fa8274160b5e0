"""Test metrics of the federated learner next to XGBoost (``hist``) on the same split.

For each shared dataset (vehicle, student, dvisits, ionosphere, motor; plus
breast and the sklearn sets wine and diabetes) the rows are split 80/20 by the
active party's ids (the split of ``vfl simulate``), the federation is trained in
``plain`` mode (it grows the same trees as ``he``, see the tests) and XGBoost
is trained on the joined training rows with the same number of trees, depth,
learning rate, bins, lambda, min_child_weight and base score. Prints one JSON
object: per dataset both metrics and the difference.

    python benchmarks/learner_metrics.py [--rounds 20] [--depth 4] [--datasets vehicle,student]
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from datasets import BUNDLED, join_parties, load_named, load_shared, shared_datasets_dir  # noqa: E402
from datasets.split import train_test_split_parties  # noqa: E402
from vfl.api import simulate  # noqa: E402
from vfl.core import metrics  # noqa: E402
from vfl.core.params import TrainParams  # noqa: E402

TASKS = {"vehicle": "multiclass", "student": "regression", "dvisits": "regression",
         "ionosphere": "binary", "motor": "regression", "breast": "binary",
         "wine": "multiclass", "diabetes": "regression"}


def xgb_model(objective: str, p: TrainParams, y_train, n_classes: int | None = None):
    import xgboost as xgb
    common = dict(n_estimators=p.n_estimators, max_depth=p.max_depth, learning_rate=p.learning_rate,
                  max_bin=p.max_bin, reg_lambda=p.reg_lambda, min_child_weight=p.min_child_weight,
                  gamma=p.gamma, tree_method="hist", n_jobs=1, random_state=0)
    if objective == "binary":
        return xgb.XGBClassifier(objective="binary:logistic", base_score=float(np.mean(y_train)), **common)
    if objective == "multiclass":
        return xgb.XGBClassifier(objective="multi:softprob", **common)
    if objective == "pseudohuber":
        return xgb.XGBRegressor(objective="reg:pseudohubererror", huber_slope=p.huber_slope,
                                base_score=float(np.median(y_train)), **common)
    return xgb.XGBRegressor(objective="reg:squarederror", base_score=float(np.mean(y_train)), **common)


def score(objective, y, output) -> dict:
    if objective == "binary":
        return {"auc": metrics.auc(y, output), "accuracy": 1 - metrics.error(y, output),
                "logloss": metrics.logloss(y, output)}
    if objective == "multiclass":
        return {"accuracy": 1 - metrics.merror(y, output), "mlogloss": metrics.mlogloss(y, output)}
    return {"rmse": metrics.rmse(y, output), "mae": metrics.mae(y, output)}


def compare(parties, objective: str, params: TrainParams, seed: int = 0) -> dict:
    """Federated (plain; :func:`vfl.api.simulate`) and XGBoost metrics on the same 80/20 split."""
    fed, result, test_ids, out = simulate(parties, params, test_size=0.2, seed=seed)
    fed_seconds = result["train_seconds"]
    train, test = train_test_split_parties(parties, test_size=0.2, seed=seed)    # simulate's split
    Xtr, ytr, _ = join_parties(train)
    Xte, yte, ids_te = join_parties(test)
    # the federated predictions are in the active party's test row order; join_parties keeps it
    assert np.array_equal(ids_te, test_ids)
    if objective == "multiclass":
        classes = fed.model.classes
        index = {c: i for i, c in enumerate(classes)}
        ytr = np.array([index[int(v) if float(v).is_integer() else v] for v in ytr])
        yte = np.array([index[int(v) if float(v).is_integer() else v] for v in yte])
    else:
        ytr, yte = ytr.astype(np.float64), yte.astype(np.float64)
    model = xgb_model(objective, params, ytr)
    t0 = time.perf_counter()
    model.fit(Xtr, ytr)
    xgb_seconds = time.perf_counter() - t0
    if objective == "binary":
        xout = model.predict_proba(Xte)[:, 1]
    elif objective == "multiclass":
        xout = model.predict_proba(Xte)
    else:
        xout = model.predict(Xte)
    ours, ref = score(objective, yte, out), score(objective, yte, xout)
    return {"objective": objective, "n_train": len(ytr), "n_test": len(yte),
            "parties": [pf.name for pf in parties], "vfl_plain": ours, "xgboost_hist": ref,
            "difference": {k: ours[k] - ref[k] for k in ours},
            "seconds": {"vfl_plain": fed_seconds, "xgboost": xgb_seconds}}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--depth", type=int, default=4)
    ap.add_argument("--learning-rate", type=float, default=0.3)
    ap.add_argument("--max-bin", type=int, default=32)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--datasets", default="vehicle,student,dvisits,ionosphere,motor,wine,diabetes")
    args = ap.parse_args(argv)
    results = {}
    for name in args.datasets.split(","):
        objective = TASKS[name]
        if name in BUNDLED:
            parties = load_named(name)
        elif shared_datasets_dir() is None:
            results[name] = {"skipped": "../shared/datasets not found"}
            continue
        else:
            parties = load_shared(name)
        params = TrainParams(mode="plain", objective=objective, n_estimators=args.rounds, max_depth=args.depth,
                             learning_rate=args.learning_rate, max_bin=args.max_bin, seed=args.seed)
        results[name] = compare(parties, objective, params, args.seed)
    print(json.dumps({"benchmark": "learner_metrics", "n_rounds": args.rounds, "depth": args.depth,
                      "learning_rate": args.learning_rate, "max_bin": args.max_bin, "results": results},
                     indent=1))


if __name__ == "__main__":
    main()
