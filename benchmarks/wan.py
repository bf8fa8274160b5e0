"""Training between two organisations: the active and one passive party as separate processes,
one core each (``--cores-per-party N``: N cores and N worker processes each), talking gRPC
(mutual TLS) through an emulated link.

    python benchmarks/wan.py --dataset default_credit --rounds 10 --depth 4 --bits 2048 \\
        --profiles lan,1gbit-1ms,100mbit-10ms,10mbit-50ms
    python benchmarks/wan.py --dataset breast                     # the defaults of `vfl simulate`
    python benchmarks/wan.py --rows 2000 --rounds 2 --bits 1024 --profiles lan,10mbit-50ms   # quick

Each profile (:data:`linkemu.PROFILES`: rate and one-way delay) shapes both directions of
every connection between the parties (:class:`linkemu.ShapedLink`, a user-space relay on
loopback). The active party runs on core 0 and the passive party on core 1
(``sched_setaffinity``; ``VFL_N_JOBS=1`` so neither starts worker processes on another core);
with ``--cores-per-party N`` on cores ``0..N-1`` and ``N..2N-1`` with ``N`` workers each.

Prints one JSON object ``{"runs": [...]}``, one entry per profile:

* ``wall_seconds``: the active party's training (``train_seconds`` of its summary: from the
  connection to the finished model); ``seconds_per_tree``: that over the trees grown
  (``n_trees``: one per round, one per class and round for multiclass; ``n_rounds``: the rounds).
* ``bytes_sent`` / ``bytes_received``: bytes on the active party's sockets during training,
  as the relay counted them (TLS, HTTP/2 and gRPC framing included).
* ``active_wait_seconds`` / ``passive_wait_seconds``: the training's wall time minus the CPU
  seconds each party spent in it (the active party's own count, ``train_cpu_seconds``; the
  passive party's process tree read from ``/proc`` before and after), i.e. how long each
  party sat idle waiting for the other or for the link.
* ``encrypt_critical_seconds``: seconds the active party spent encrypting gradients while
  the passive party had nothing to work on (the ``encrypt`` stage of its per-round timings);
  ``encrypt_background_seconds``: seconds its executor spent making obfuscators ahead while it
  waited for the passive party (stage ``obfuscate_bg``: off the critical path).
* ``auc``: test AUC of ``vfl predict`` on the held-out rows (split as ``vfl simulate`` does).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from linkemu import PROFILES, ShapedLink  # noqa: E402
from network import auc, cli, run, start_passive  # noqa: E402

from datasets import load_shared, train_test_split_parties  # noqa: E402

_TICK = os.sysconf("SC_CLK_TCK")


def _tree(pid: int) -> list[int]:
    """``pid`` and its live descendants."""
    children: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                stat = Path(f"/proc/{d}/stat").read_text()
            except OSError:
                continue
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            children.setdefault(ppid, []).append(int(d))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo += children.get(p, [])
    return out


def cpu_seconds(pid: int) -> float:
    """CPU seconds (user + system, reaped children included) of ``pid``'s process tree."""
    total = 0
    for p in _tree(pid):
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += sum(int(x) for x in fields[11:15])       # utime stime cutime cstime
    return total / _TICK


def pinned(cores):
    cores = {cores} if isinstance(cores, int) else set(cores)

    def _pin():
        os.sched_setaffinity(0, cores)
    return _pin


def party_cores(per_party: int) -> tuple[list[int], list[int], bool]:
    """The cores of the active and of the passive party (``per_party`` each, disjoint while the
    machine has enough; else they wrap around and share), and whether they share any."""
    avail = sorted(os.sched_getaffinity(0))
    k = max(1, int(per_party))
    active = [avail[i % len(avail)] for i in range(k)]
    passive = [avail[(k + i) % len(avail)] for i in range(k)]
    return sorted(set(active)), sorted(set(passive)), bool(set(active) & set(passive))


def one_run(profile: str, args, files: dict, sec: list, params: list, tmp: Path, labels) -> dict:
    env = dict(os.environ, VFL_N_JOBS=str(args.cores_per_party))
    active_core, passive_core, _ = party_cores(args.cores_per_party)
    run_dir = tmp / profile
    run_dir.mkdir()
    served = sec if args.insecure else [*sec, "--allow-client", files["active_name"]]     # deny by default
    passive, port = start_passive(files["passive_name"], files["passive"], run_dir / "m_passive", served,
                                  run_dir / "passive.err", preexec_fn=pinned(passive_core), env=env)
    link = ShapedLink.profile(profile, ("127.0.0.1", port))
    try:
        peer = ["--peer", f"{files['passive_name']}=127.0.0.1:{link.port}"]
        out_json = run_dir / "active.json"
        p_cpu0 = cpu_seconds(passive.pid)
        up0, down0 = link.up, link.down
        t0 = time.perf_counter()
        active = subprocess.Popen(cli("party", "active", "--name", files["active_name"], "--data", files["active"],
                                      "--id-col", files["id_col"], "--label-col", files["label_col"], *peer,
                                      "--model-dir", run_dir / "m_active", *sec, *params,
                                      "--timeout", args.timeout, "--quiet", "--log-level", "warning",
                                      "--output-json", out_json),
                                  cwd=ROOT, env=env, preexec_fn=pinned(active_core),
                                  stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        _, status, usage = os.wait4(active.pid, 0)
        process_wall = time.perf_counter() - t0
        p_cpu = cpu_seconds(passive.pid) - p_cpu0
        up, down = link.up - up0, link.down - down0
        if os.waitstatus_to_exitcode(status) != 0:
            raise RuntimeError(f"vfl party active failed ({profile}):\n{active.stderr.read()[-4000:]}")
        summary = json.loads(out_json.read_text())
        a_cpu = usage.ru_utime + usage.ru_stime
        train = float(summary["train_seconds"])
        # the process also started Python and read its CSV before training: CPU-bound, counted in a_cpu
        start_up = process_wall - train
        pred = run_dir / "pred.csv"
        run(cli("predict", "--model-dir", run_dir / "m_active", "--data", files["active_test"],
                "--id-col", files["id_col"], *peer, *sec, "--out", pred, "--timeout", args.timeout,
                "--log-level", "warning"), "vfl predict")
        score, _ = auc(pred, labels)
    finally:
        passive.terminate()
        try:
            passive.wait(timeout=10)
        except subprocess.TimeoutExpired:
            passive.kill()
        link.close()
    n_trees = int(summary["n_trees"])
    encrypt = sum(float(t.get("encrypt", 0.0)) for t in summary["timings"])
    background = sum(float(t.get("obfuscate_bg", 0.0)) for t in summary["timings"])
    return {
        "profile": profile, "rate_mbps": PROFILES[profile][0], "delay_ms": PROFILES[profile][1],
        "wall_seconds": round(train, 3), "seconds_per_tree": round(train / max(n_trees, 1), 3),
        "bytes_sent": up, "bytes_received": down,
        "active_wait_seconds": round(max(0.0, train - float(summary["train_cpu_seconds"])), 3),
        "passive_wait_seconds": round(max(0.0, train - min(p_cpu, train)), 3),
        "encrypt_critical_seconds": round(encrypt, 3), "encrypt_background_seconds": round(background, 3),
        "encrypt_share_of_tree": round(encrypt / train, 4) if train else None,
        "auc": score, "n_rounds": int(summary["n_rounds"]), "n_trees": n_trees, "active_cpu_seconds": round(a_cpu, 3),
        "passive_cpu_seconds": round(p_cpu, 3), "active_start_up_seconds": round(start_up, 3),
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dataset", default="default_credit")
    ap.add_argument("--rows", type=int, default=0, help="Use only the first N rows (0: all).")
    ap.add_argument("--rounds", type=int, default=None, help="default: vfl's default")
    ap.add_argument("--depth", type=int, default=None, help="default: vfl's default")
    ap.add_argument("--bits", type=int, default=2048)
    ap.add_argument("--profiles", default="lan,1gbit-1ms,100mbit-10ms,10mbit-50ms")
    ap.add_argument("--test-size", type=float, default=0.2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--insecure", action="store_true", help="Plaintext instead of mutual TLS.")
    ap.add_argument("--timeout", type=float, default=1800.0)
    ap.add_argument("--cores-per-party", type=int, default=1,
                    help="cores (and worker processes) of each party (default 1; disjoint cores while the "
                         "machine has 2 x N, else they share)")
    args = ap.parse_args()
    if args.cores_per_party < 1:
        ap.error("--cores-per-party must be at least 1")
    profiles = [p.strip() for p in args.profiles.split(",") if p.strip()]
    unknown = [p for p in profiles if p not in PROFILES]
    if unknown:
        ap.error(f"unknown profile(s) {', '.join(unknown)}; known: {', '.join(PROFILES)}")
    parties = load_shared(args.dataset)
    if len(parties) != 2:
        ap.error(f"{args.dataset} has {len(parties)} parties; this benchmark runs one active and one passive")
    if args.rows:
        keep = set(parties[0].frame[parties[0].id_col].iloc[: args.rows])
        for pf in parties:
            pf.frame = pf.frame[pf.frame[pf.id_col].isin(keep)].reset_index(drop=True)
    train, test = train_test_split_parties(parties, test_size=args.test_size, seed=args.seed)
    act, pas = parties
    params = ["--key-bits", args.bits, "--seed", args.seed]
    params += ["--rounds", args.rounds] if args.rounds else []
    params += ["--depth", args.depth] if args.depth else []
    runs = []
    with tempfile.TemporaryDirectory(prefix="vfl-bench-wan-") as tmp:
        tmp = Path(tmp)
        files = {"active_name": act.name, "passive_name": pas.name, "id_col": act.id_col,
                 "label_col": act.label_col, "active": tmp / "train_active.csv",
                 "active_test": tmp / "test_active.csv", "passive": tmp / "passive.csv"}
        train[0].frame.to_csv(files["active"], index=False)
        test[0].frame.drop(columns=[act.label_col]).to_csv(files["active_test"], index=False)
        pas.frame.to_csv(files["passive"], index=False)     # train and test rows: alignment keeps the train rows
        labels = test[0].frame[[act.id_col, act.label_col]]
        if args.insecure:
            sec = ["--insecure"]
        else:
            run(cli("certs", "--out", tmp / "certs", "--party", act.name, "--party", pas.name), "vfl certs")
            sec = ["--tls-dir", tmp / "certs"]
        for profile in profiles:
            runs.append(one_run(profile, args, files, sec, params, tmp, labels))
            print(json.dumps(runs[-1]), file=sys.stderr)
    base = runs[0]["wall_seconds"] if runs and runs[0]["profile"] == "lan" else None
    for r in runs:
        r["wall_over_lan"] = round(r["wall_seconds"] / base, 3) if base else None
    a_cores, p_cores, shared = party_cores(args.cores_per_party)
    print(json.dumps({"benchmark": "wan", "dataset": args.dataset, "bits": args.bits, "n_rounds": args.rounds,
                      "cores_per_party": args.cores_per_party, "active_cores": a_cores, "passive_cores": p_cores,
                      "cores_shared": shared,
                      "depth": args.depth, "rows": args.rows or None,
                      "security": "insecure" if args.insecure else "mutual TLS", "runs": runs}, indent=1))


if __name__ == "__main__":
    main()
