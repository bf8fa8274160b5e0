"""Network mode against `vfl simulate`: training time and bytes on the wire.

    python benchmarks/network.py                                  # default_credit, 10 trees, 2048 bits
                                                                  # (several minutes on 2 cores)
    python benchmarks/network.py --rows 2000 --rounds 2 --key-bits 1024   # a quick check

The data set is split into train/test exactly as ``vfl simulate`` does
(``--test-size``, ``--seed``). Then, on 127.0.0.1:

* **network**: one ``vfl party passive`` process per passive party's file and one
  ``vfl party active`` process (mutual TLS unless ``--insecure``), then
  ``vfl predict`` on the test rows. Each connection goes through a counting
  TCP relay in this script, so ``wire_bytes`` are the real bytes on the
  sockets (TLS records, HTTP/2 and gRPC framing included); ``frame_bytes``
  are the protocol frames the active party counted during training (the
  passive parties' files also hold the test rows, so their alignment messages
  are slightly larger than in ``vfl simulate``).
* **reference**: ``vfl simulate`` (one process, in-memory transport) on the
  same files with the same parameters.

Prints one JSON object: both runs' training seconds (``train_seconds``: the
fit itself; ``wall_seconds``: the whole command, process start included),
bytes, test AUC, the ratios, and the largest difference between the two runs'
test predictions (expected ~0: same trees).
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

import pandas as pd  # noqa: E402
from linkemu import ShapedLink  # noqa: E402
from sklearn.metrics import roc_auc_score  # noqa: E402

from datasets import load_shared, train_test_split_parties  # noqa: E402


def cli(*args):
    return [sys.executable, "-m", "cli", *map(str, args)]


def start_passive(name, data, model_dir, security, log_path, **popen):
    err = open(log_path, "w")
    p = subprocess.Popen(cli("party", "passive", "--name", name, "--listen", "127.0.0.1:0", "--data", data,
                             "--model-dir", model_dir, *security),
                         cwd=ROOT, stdout=subprocess.PIPE, stderr=err, text=True, **popen)
    err.close()
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if p.poll() is not None:
            raise RuntimeError(f"passive {name} exited: {Path(log_path).read_text()}")
        if select.select([p.stdout], [], [], 0.2)[0]:
            line = p.stdout.readline()
            if "listening on" in line:
                return p, int(line.strip().rsplit(":", 1)[1])
    p.kill()
    raise RuntimeError(f"passive {name} did not start")


def run(cmd, what):
    t0 = time.perf_counter()
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if r.returncode != 0:
        raise RuntimeError(f"{what} failed:\n{r.stderr[-4000:]}")
    return wall


def auc(path, labels):
    p = pd.read_csv(path)
    y = labels.set_index(labels.columns[0]).loc[p.iloc[:, 0]].iloc[:, 0].to_numpy()
    return float(roc_auc_score(y, p["proba"])), p


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dataset", default="default_credit")
    ap.add_argument("--rows", type=int, default=0, help="Use only the first N rows (0: all).")
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--depth", type=int, default=4)
    ap.add_argument("--key-bits", type=int, default=2048)
    ap.add_argument("--mode", default="he")
    ap.add_argument("--test-size", type=float, default=0.2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--insecure", action="store_true", help="Plaintext instead of mutual TLS.")
    ap.add_argument("--timeout", type=float, default=600.0)
    args = ap.parse_args()
    parties = load_shared(args.dataset)
    if args.rows:
        keep = set(parties[0].frame[parties[0].id_col].iloc[: args.rows])
        for pf in parties:
            pf.frame = pf.frame[pf.frame[pf.id_col].isin(keep)].reset_index(drop=True)
    train, test = train_test_split_parties(parties, test_size=args.test_size, seed=args.seed)
    active, passives = parties[0], parties[1:]
    params = ["--mode", args.mode, "--rounds", args.rounds, "--depth", args.depth, "--key-bits", args.key_bits,
              "--seed", args.seed]
    procs, relays = [], []
    with tempfile.TemporaryDirectory(prefix="vfl-bench-net-") as tmp:
        tmp = Path(tmp)
        # the same files for both runs
        full = {pf.name: tmp / f"full_{pf.name}.csv" for pf in parties}
        for pf in parties:
            pf.frame.to_csv(full[pf.name], index=False)
        train[0].frame.to_csv(tmp / "train_active.csv", index=False)
        test[0].frame[[active.id_col, *[c for c in test[0].frame.columns
                                       if c not in (active.id_col, active.label_col)]]].to_csv(
            tmp / "test_active.csv", index=False)
        labels = test[0].frame[[active.id_col, active.label_col]]

        # reference: vfl simulate (in memory) on the same files, same split
        sim_json, sim_pred = tmp / "sim.json", tmp / "sim_pred.csv"
        passive_files = sum([["--passive", full[h.name]] for h in passives], [])
        sim_wall = run(cli("simulate", "--active", full[active.name], *passive_files,
                           "--id-col", active.id_col, "--label-col", active.label_col, "--test-size", args.test_size,
                           *params, "--quiet", "--output-json", sim_json, "--predictions", sim_pred), "vfl simulate")
        sim = json.loads(sim_json.read_text())

        # network: passive processes (their files hold train and test rows), relays, active, predict
        if args.insecure:
            sec = ["--insecure"]
        else:
            named = sum([["--party", h.name] for h in passives], [])
            run(cli("certs", "--out", tmp / "certs", "--party", active.name, *named), "vfl certs")
            sec = ["--tls-dir", tmp / "certs"]
        try:
            peers = []
            for h in passives:
                served = sec if args.insecure else [*sec, "--allow-client", active.name]     # deny by default
                p, port = start_passive(h.name, full[h.name], tmp / f"m_{h.name}", served, tmp / f"{h.name}.err")
                procs.append(p)
                relay = ShapedLink(("127.0.0.1", port))  # unshaped: counts bytes
                relays.append(relay)
                peers += ["--peer", f"{h.name}=127.0.0.1:{relay.port}"]
            net_json = tmp / "net.json"
            net_wall = run(cli("party", "active", "--name", active.name, "--data", tmp / "train_active.csv",
                               "--id-col", active.id_col, "--label-col", active.label_col, *peers,
                               "--model-dir", tmp / "m_active", *sec, *params, "--timeout", args.timeout,
                               "--quiet", "--log-level", "warning", "--output-json", net_json), "vfl party active")
            wire_train = {"up": sum(r.up for r in relays), "down": sum(r.down for r in relays)}
            net = json.loads(net_json.read_text())
            pred_json, net_pred = tmp / "pred.json", tmp / "net_pred.csv"
            pred_wall = run(cli("predict", "--model-dir", tmp / "m_active", "--data", tmp / "test_active.csv",
                                "--id-col", active.id_col, *peers, *sec, "--out", net_pred, "--timeout", args.timeout,
                                "--log-level", "warning", "--output-json", pred_json), "vfl predict")
            pred = json.loads(pred_json.read_text())
        finally:
            for p in procs:
                p.terminate()
            for p in procs:
                try:
                    p.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    p.kill()
            for r in relays:
                r.close()

        net_auc, net_p = auc(net_pred, labels)
        sim_p = pd.read_csv(sim_pred)
        merged = net_p.merge(sim_p, on=net_p.columns[0], suffixes=("_net", "_sim"))
        max_diff = float((merged["proba_net"] - merged["proba_sim"]).abs().max()) if len(merged) else None
        frame_bytes = net["total_bytes"]
        wire = wire_train["up"] + wire_train["down"]
        out = {
            "benchmark": "network", "dataset": args.dataset, "n_train": net["n_train"], "n_test": int(len(labels)),
            "parties": [pf.name for pf in parties], "mode": args.mode, "key_bits": args.key_bits,
            "n_rounds": args.rounds, "depth": args.depth, "security": "insecure" if args.insecure else "mutual TLS",
            "network": {"train_seconds": net["train_seconds"], "wall_seconds": net_wall, "timings": net["timings"],
                        "frame_bytes": frame_bytes, "bytes_sent": net["bytes_sent"],
                        "wire_bytes": wire, "wire_bytes_up": wire_train["up"], "wire_bytes_down": wire_train["down"],
                        "test_auc": net_auc, "predict_seconds": pred["predict_seconds"],
                        "predict_wall_seconds": pred_wall, "predict_frame_bytes": pred["total_bytes"]},
            "simulate": {"train_seconds": sim["train_seconds"], "wall_seconds": sim_wall, "timings": sim["timings"],
                         "frame_bytes": sim["train_bytes"], "frame_bytes_train_and_predict": sim["total_bytes"],
                         "bytes_sent_train_and_predict": sim["bytes_sent"], "test_auc": sim["test_auc"]},
            "train_time_ratio_network_over_simulate": net["train_seconds"] / sim["train_seconds"],
            # the network passive parties also hash their test rows at alignment (their files hold both)
            "frame_bytes_ratio_network_over_simulate": frame_bytes / sim["train_bytes"],
            "wire_overhead_over_frames": wire / frame_bytes if frame_bytes else None,
            "max_abs_prediction_difference": max_diff,
        }
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
