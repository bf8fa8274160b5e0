"""Explanations (grouped TreeSHAP from the leaf masks) against shap's TreeExplainer, same run.

    python benchmarks/explain.py                        # default_credit, 50 rounds, depth 5, 10,000 rows
    python benchmarks/explain.py --rows 1000 --rounds 5 --depth 3 --train-rows 3000   # a quick check

default_credit (shared datasets, ``VFL_SHARED_DATASETS`` or ``../shared/datasets``): the bank (the
guest file) is the active party; the bureau's columns (the host file) are split between two
passive parties. A plain-mode model is trained on the first ``--train-rows`` rows in process;
the next ``--rows`` rows are explained:

* **in process**: ``Federation.explanation`` (one-round prediction + grouped TreeSHAP, the
  in-memory transport) beside ``Federation.predict_raw`` of the same rows (one-round), and
  ``shap.TreeExplainer(model, feature_perturbation="tree_path_dependent").shap_values`` on the same
  ensemble (given to shap as a custom tree model with the passive thresholds filled in, one
  player per feature) and rows. Target: ``explain_over_shap`` at most 3.
* **network** (unless ``--no-network``): the same model served by two ``vfl party passive``
  processes over mutual TLS on 127.0.0.1; ``vfl predict`` and ``vfl explain`` on the same rows,
  timed by their own summaries. Target: ``network_explain_seconds`` at most
  ``network_predict_seconds + inprocess_explain_seconds``.

Prints one JSON object (seconds, ratios, additivity error, the targets met).
"""
from __future__ import annotations

import argparse
import json
import select
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import shap  # noqa: E402  (the reference: a test/benchmark dependency, extra [test])

from benchmarks._common import cores  # noqa: E402
from datasets import load_shared  # noqa: E402
from datasets.frames import PartyFrame  # noqa: E402
from protocols.certs import make_certs  # noqa: E402
from vfl.api import federation_from_frames  # noqa: E402
from vfl.core.params import TrainParams  # noqa: E402


def cli(*args):
    return [sys.executable, "-m", "cli", *map(str, args)]


def parties(train_rows: int, rows: int):
    bank, bureau = load_shared("default_credit")[:2]
    cols = [c for c in bureau.frame.columns if c != bureau.id_col]
    half = len(cols) // 2
    frames = [bank, PartyFrame("bureau-a", bureau.frame[[bureau.id_col] + cols[:half]], bureau.id_col),
              PartyFrame("bureau-b", bureau.frame[[bureau.id_col] + cols[half:]], bureau.id_col)]
    n = len(bank.frame)
    if train_rows + rows > n:
        raise SystemExit(f"default_credit has {n} rows: --train-rows + --rows must not exceed it")
    train = [PartyFrame(pf.name, pf.frame.iloc[:train_rows], pf.id_col, pf.label_col) for pf in frames]
    new = {pf.name: pf.frame.iloc[train_rows:train_rows + rows] for pf in frames}
    new[bank.name] = new[bank.name].drop(columns=[bank.label_col])
    return train, new


def shap_model(fed):
    """The ensemble as shap's custom tree model over ``[active features..., each passive party's features...]``."""
    model = fed.model
    F, K = len(model.active_features), model.n_targets
    offset, start = {}, F
    for p in model.passives:
        offset[p] = start
        start += len(fed.passives[p]._state.feature_names)
    trees = []
    for k, tree in model._flat_trees(None):
        n = len(tree.nodes)
        cl, cr, cd = (np.full(n, -1, dtype=np.int64) for _ in range(3))
        feat, thr, val = np.full(n, -2, dtype=np.int64), np.zeros(n), np.zeros((n, K))
        cover = np.array([float(nd.n_samples) for nd in tree.nodes])
        for nd in tree.nodes:
            if nd.is_leaf:
                val[nd.node_id, k] = nd.value
                continue
            cl[nd.node_id], cr[nd.node_id] = nd.left, nd.right
            if nd.owner == model.active_party:
                feat[nd.node_id], t, dl = nd.feature_idx, nd.threshold, nd.default_left
            else:
                rec = fed.passives[nd.owner]._state.table.records[nd.record_id]
                feat[nd.node_id], t, dl = offset[nd.owner] + rec["feature_idx"], rec["threshold"], rec["default_left"]
            thr[nd.node_id] = t
            cd[nd.node_id] = nd.left if dl else nd.right
        for nd in reversed(tree.nodes):
            if not nd.is_leaf:
                wl, wr = cover[nd.left], cover[nd.right]
                val[nd.node_id] = (wl * val[nd.left] + wr * val[nd.right]) / (wl + wr)
        trees.append({"children_left": cl, "children_right": cr, "children_default": cd, "features": feat,
                      "thresholds": thr, "values": val, "node_sample_weight": cover})
    return {"trees": trees, "base_offset": np.asarray(model.base_score, dtype=np.float64)}


def full_matrix(fed, new):
    model = fed.model
    cols = [new[model.active_party][model.active_features].to_numpy(dtype=np.float64)]
    for p in model.passives:
        cols.append(new[p][fed.passives[p]._state.feature_names].to_numpy(dtype=np.float64))
    return np.column_stack(cols)


def start_passive(name, data, model_dir, tls, log_path):
    with open(log_path, "w") as err:
        p = subprocess.Popen(cli("party", "passive", "--name", name, "--listen", "127.0.0.1:0", "--data", data,
                                 "--model-dir", model_dir, "--tls-dir", tls, "--allow-client", "active"),
                             cwd=ROOT, stdout=subprocess.PIPE, stderr=err, text=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if p.poll() is not None:
            raise RuntimeError(f"passive {name} exited: {Path(log_path).read_text()}")
        if select.select([p.stdout], [], [], 0.2)[0]:
            line = p.stdout.readline()
            if "listening on" in line:
                return p, line.strip().rsplit(" ", 1)[1]
    p.kill()
    raise RuntimeError(f"passive {name} did not start")


def network(fed, new, work: Path) -> dict:
    """Serve the model from two passive processes (mutual TLS); `vfl predict` and `vfl explain`."""
    model = fed.model
    tls = work / "certs"
    make_certs(tls, ["active", *model.passives])
    (work / "ma").mkdir()
    model.save(work / "ma" / "active.json")
    new[model.active_party].to_csv(work / "active.csv", index=False)
    procs, peers = [], []
    try:
        for p in model.passives:
            (work / f"m_{p}").mkdir()
            (work / f"m_{p}" / f"{model.model_id}.json").write_text(json.dumps(fed.passives[p].file_dict()))
            new[p].to_csv(work / f"{p}.csv", index=False)
            proc, addr = start_passive(p, work / f"{p}.csv", work / f"m_{p}", tls, work / f"{p}.err")
            procs.append(proc)
            peers += ["--peer", f"{p}={addr}"]
        common = ["--model-dir", work / "ma", "--data", work / "active.csv", *peers, "--tls-dir", tls,
                  "--batch-rows", len(new[model.active_party])]
        out = {}
        for what in ("predict", "explain"):
            files = ["--out", work / f"{what}.csv", "--output-json", work / f"{what}.json"]
            r = subprocess.run(cli(what, *common, *files), cwd=ROOT, capture_output=True, text=True)
            if r.returncode:
                raise RuntimeError(f"vfl {what} failed:\n{r.stderr[-4000:]}")
            summary = json.loads((work / f"{what}.json").read_text())
            out[what] = summary[f"{what}_seconds"]
            out[f"{what}_bytes"] = summary["total_bytes"]
        table = pd.read_csv(work / "explain.csv")
        pred = pd.read_csv(work / "predict.csv")
        margin_gap = float(np.max(np.abs(1 / (1 + np.exp(-table["margin"].to_numpy())) - pred["proba"].to_numpy())))
        return {"network_predict_seconds": round(out["predict"], 3),
                "network_explain_seconds": round(out["explain"], 3),
                "network_predict_bytes": out["predict_bytes"], "network_explain_bytes": out["explain_bytes"],
                "network_max_proba_gap": margin_gap}
    finally:
        for p in procs:
            p.kill()
            p.wait(timeout=10)
            p.stdout.close()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=10_000, help="rows explained")
    ap.add_argument("--train-rows", type=int, default=20_000)
    ap.add_argument("--rounds", type=int, default=50)
    ap.add_argument("--depth", type=int, default=5)
    ap.add_argument("--no-network", action="store_true", help="skip the two-server mutual-TLS part")
    args = ap.parse_args()

    train, new = parties(args.train_rows, args.rows)
    fed = federation_from_frames(train)
    t0 = time.perf_counter()
    fed.fit(TrainParams(mode="plain", n_estimators=args.rounds, max_depth=args.depth))
    out = {"benchmark": "explain", "dataset": "default_credit", "n_rows": args.rows, "n_train": args.train_rows,
           "n_rounds": args.rounds, "depth": args.depth, "cores": cores(),
           "train_seconds": round(time.perf_counter() - t0, 2), "players": None}
    fed.predict_raw(new)                                    # warm-up: loads the passive parties' rows
    t0 = time.perf_counter()
    raw = fed.predict_raw(new)
    out["inprocess_predict_seconds"] = round(time.perf_counter() - t0, 3)
    t0 = time.perf_counter()
    _, ex = fed.explanation(new)
    out["inprocess_explain_seconds"] = round(time.perf_counter() - t0, 3)
    out["players"] = len(ex.players)
    out["additivity_error"] = ex.additivity_error()
    out["margin_equals_prediction"] = bool(np.array_equal(ex.margin, raw))
    # opt-in: every passive party also splits its value among its own features (issue 32, item 4)
    for p in fed.passives.values():
        p.explain_features = True
    t0 = time.perf_counter()
    _, ex_features = fed.explanation(new, passive_features=True)
    out["inprocess_explain_with_passive_features_seconds"] = round(time.perf_counter() - t0, 3)
    out["passive_features_over_explain"] = round(out["inprocess_explain_with_passive_features_seconds"]
                                                 / max(out["inprocess_explain_seconds"], 1e-9), 2)
    out["passive_features_max_sum_error"] = max(
        float(np.max(np.abs(p.feature_explanation().drop(columns=p.id_col).sum(axis=1).to_numpy()
                            - ex_features.values[:, 0, ex_features.players.index(name)])))
        for name, p in fed.passives.items())
    X = full_matrix(fed, new)
    explainer = shap.TreeExplainer(shap_model(fed), feature_perturbation="tree_path_dependent")
    t0 = time.perf_counter()
    sv = np.asarray(explainer.shap_values(X))
    out["shap_seconds"] = round(time.perf_counter() - t0, 3)
    out["shap_additivity_error"] = float(np.max(np.abs(sv.sum(axis=1) + float(np.ravel(explainer.expected_value)[0])
                                                      - raw[:, 0])))
    out["explain_over_shap"] = round(out["inprocess_explain_seconds"] / max(out["shap_seconds"], 1e-9), 2)
    out["explain_over_predict"] = round(out["inprocess_explain_seconds"]
                                        / max(out["inprocess_predict_seconds"], 1e-9), 2)
    out["target_explain_at_most_3x_shap"] = out["explain_over_shap"] <= 3.0
    if not args.no_network:
        with tempfile.TemporaryDirectory() as tmp:
            out.update(network(fed, new, Path(tmp)))
        out["target_network_explain_within_predict_plus_inprocess"] = (
            out["network_explain_seconds"] <= out["network_predict_seconds"] + out["inprocess_explain_seconds"])
    print(json.dumps(out))


if __name__ == "__main__":
    main()
