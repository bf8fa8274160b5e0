"""Online scoring under load: an open-loop load generator against `vfl serve` with two passive
servers, all on 127.0.0.1 (issue 35).

    python benchmarks/serve_load.py                 # default_credit, 100 rounds, depth 5, mutual TLS,
                                                    # 50..2400 req/s (several minutes on 2 cores)
    python benchmarks/serve_load.py --rows 3000 --rounds 5 --depth 3 --rates 20,50 --duration 3 \\
        --throughput-seconds 3                      # a quick check
    python benchmarks/serve_load.py --work-dir /tmp/serve-bench   # train once, reuse the model in later runs

The data set's passive columns are split between two passive parties (``passive1``,
``passive2``; default_credit has one passive file: its columns are cut in half). The model is
trained by `vfl party active` against two `vfl party passive` processes (``--mode plain`` by
default: he grows the same trees, and serving does not depend on how the model was trained).

* **open loop**: for each rate, single-applicant requests are *scheduled* at fixed times (rate per
  second, for ``--duration`` seconds) and sent by ``--clients`` concurrent client threads; a
  request's latency runs from its scheduled time to its answer (a late start counts: no
  coordinated omission). Reports p50/p95/p99 (ms), the achieved rate and errors per rate, and the
  highest rate held with p99 under ``--target-p99-ms`` and no error.
* **throughput** (the reference, measured in the same run): closed loop, ``--clients`` clients
  sending back to back, against the micro-batching service and against a second `vfl serve` with
  ``--batch-rows 1`` (one request per round trip); the ratio. Each service gets
  ``--throughput-seconds`` in all, in ``--throughput-rounds`` windows taken in turn (ABBA...: the
  shared machine's speed drifts by up to a third within a minute, and two back-to-back blocks
  measured the drift as much as the services); ``ratio`` is of the totals, ``ratio_by_round`` each
  round's. ``--throughput-clients 16,32,64`` measures both at each concurrency (batches grow with it).
* **highest_rate_p99_under_target**: the highest rate such that it and every lower rate measured held
  p99 under the target with no error (``rates_held_p99_under_target`` lists every rate that did);
  ``ceiling_reached`` is false when that is the highest rate measured (the service may hold more:
  give higher ``--rates``).

Prints one JSON object. The load generator runs on the same machine (its CPU use counts).
"""
from __future__ import annotations

import argparse
import contextlib
import gc
import json
import select
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from datasets import load_shared, train_test_split_parties  # noqa: E402
from datasets.frames import PartyFrame  # noqa: E402


def cli(*args):
    return [sys.executable, "-m", "cli", *map(str, args)]


def run(cmd, what):
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"{what} failed:\n{r.stderr[-4000:]}")
    return r


def start(args, log_path, ready_text, procs):
    err = open(log_path, "w")
    p = subprocess.Popen(cli(*args), cwd=ROOT, stdout=subprocess.PIPE, stderr=err, text=True)
    err.close()
    procs.append(p)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if p.poll() is not None:
            raise RuntimeError(f"{args[0]} exited: {Path(log_path).read_text()[-4000:]}")
        if select.select([p.stdout], [], [], 0.2)[0]:
            line = p.stdout.readline()
            if ready_text in line:
                return line.strip().rsplit(" ", 1)[1]
    raise RuntimeError(f"{args[0]} did not start: {Path(log_path).read_text()[-4000:]}")


def split_passives(parties):
    """Two passive parties: the data set's own two, or its one passive party's columns cut in half."""
    active, passives = parties[0], parties[1:]
    if len(passives) >= 2:
        return active, passives[:2]
    (p,) = passives
    feats = [c for c in p.frame.columns if c != p.id_col]
    half = (len(feats) + 1) // 2
    return active, [PartyFrame(name, p.frame[[p.id_col, *cols]].copy(), p.id_col, None)
                    for name, cols in (("passive1", feats[:half]), ("passive2", feats[half:]))]


def bodies(test_frame, id_col, label_col):
    feats = [c for c in test_frame.columns if c not in (id_col, label_col)]
    out = []
    for row in test_frame.itertuples(index=False):
        d = row._asdict()
        out.append(json.dumps({"id": int(d[id_col]) if isinstance(d[id_col], (int, np.integer)) else str(d[id_col]),
                               "features": {f: (None if d[f] != d[f] else float(d[f])) for f in feats}}).encode())
    return out


class Client:
    """One keep-alive HTTP/1.1 connection on a plain socket: the request's bytes are built once per
    payload, the answer read by its ``Content-Length``. The generator shares the machine's two cores
    with what it measures; ``http.client`` took 0.29 of a core at about 1,500 requests per second
    (16 threads under one GIL), a fifth of the machine's CPU per scored applicant; this takes 0.08."""

    _built: dict = {}       # (head, body) -> the request's bytes, shared by the clients (threads)

    def __init__(self, url):
        host, port = url.split("//", 1)[1].rsplit(":", 1)
        self.host, self.port = host, int(port)
        self.sock, self.buf = None, b""
        self._head = (f"POST /v1/score HTTP/1.1\r\nHost: {host}:{port}\r\n"
                      "Content-Type: application/json\r\nContent-Length: ").encode()

    def _request(self, body: bytes) -> bytes:
        key = (self._head, body)
        r = self._built.get(key)
        if r is None:
            r = self._built[key] = self._head + str(len(body)).encode() + b"\r\n\r\n" + body
        return r

    def _more(self, buf: bytes) -> bytes:
        chunk = self.sock.recv(65536)
        if not chunk:
            raise ConnectionError("the service closed the connection")
        return buf + chunk

    def _answer(self) -> int:
        buf = self.buf
        while (end := buf.find(b"\r\n\r\n")) < 0:
            buf = self._more(buf)
        head = buf[:end].split(b"\r\n")
        status = int(head[0].split(b" ", 2)[1])
        length = None
        for line in head[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        if length is None:
            raise ConnectionError("an answer without Content-Length")
        need = end + 4 + length
        while len(buf) < need:
            buf = self._more(buf)
        self.buf = buf[need:]
        return status

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None

    def post(self, body: bytes) -> int:
        for attempt in (0, 1):
            try:
                if self.sock is None:
                    self.sock = socket.create_connection((self.host, self.port), timeout=30)
                    self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                    self.buf = b""
                self.sock.sendall(self._request(body))
                return self._answer()
            except (OSError, ValueError, IndexError):
                self.close()
                if attempt:
                    return 599
        return 599


def open_loop(url, payloads, rate, duration, clients):
    """Requests scheduled at ``rate`` per second for ``duration`` s; latency from the schedule."""
    n = max(1, int(rate * duration))
    t0 = time.perf_counter() + 0.2
    lock, nxt = threading.Lock(), [0]
    lat, status = np.full(n, np.nan), np.zeros(n, dtype=np.int64)

    def worker():
        c = Client(url)
        while True:
            with lock:
                k = nxt[0]
                nxt[0] += 1
            if k >= n:
                c.close()
                return
            due = t0 + k / rate
            wait = due - time.perf_counter()
            if wait > 0:
                time.sleep(wait)
            status[k] = c.post(payloads[k % len(payloads)])
            lat[k] = time.perf_counter() - due

    threads = [threading.Thread(target=worker) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - t0
    ok = status == 200
    ms = lat[ok] * 1000
    q = (lambda p: round(float(np.percentile(ms, p)), 2)) if ms.size else (lambda p: None)
    return {"rate": rate, "requests": n, "achieved_rate": round(n / elapsed, 1), "errors": int((~ok).sum()),
            "p50_ms": q(50), "p95_ms": q(95), "p99_ms": q(99), "max_ms": round(float(ms.max()), 2) if ms.size else None}


def closed_loop(url, payloads, seconds, clients):
    """``clients`` connections sending back to back for ``seconds``: requests per second, errors
    and the requests answered (``ok``) over ``seconds_measured``."""
    stop, counts = time.perf_counter() + seconds, [0] * clients
    errors = [0] * clients

    def worker(i):
        c = Client(url)
        k = i
        while time.perf_counter() < stop:
            if c.post(payloads[k % len(payloads)]) == 200:
                counts[i] += 1
            else:
                errors[i] += 1
            k += clients
        c.close()

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(clients)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    took = time.perf_counter() - t0
    return {"requests_per_second": round(sum(counts) / took, 1), "errors": sum(errors), "ok": sum(counts),
            "seconds_measured": took}


def alternate(urls, payloads, seconds, rounds, clients):
    """Closed loop against each service of ``urls`` (two) for ``seconds`` in all, in ``rounds``
    windows taken in turn (AB, BA, AB, ...): ``{name: totals}`` and the per-round rates."""
    names = list(urls)
    per = {n: [] for n in names}
    for r in range(rounds):
        for n in (names if r % 2 == 0 else names[::-1]):
            per[n].append(closed_loop(urls[n], payloads, seconds / rounds, clients))
    return {n: {"requests_per_second": round(sum(w["ok"] for w in ws) / sum(w["seconds_measured"] for w in ws), 1),
                "errors": sum(w["errors"] for w in ws), "by_round": [w["requests_per_second"] for w in ws]}
            for n, ws in per.items()}


def sustained_rates(windows, target_p99_ms):
    """``rates_held_p99_under_target`` (every open-loop rate with no error and p99 under the target),
    ``highest_rate_p99_under_target`` (the highest such that it and every lower rate measured held:
    a rate held above one that was not is listed, not counted) and ``ceiling_reached`` (false when
    that is the highest rate measured: the service may hold more)."""
    held = [x["rate"] for x in windows if x["errors"] == 0 and x["p99_ms"] is not None and x["p99_ms"] <= target_p99_ms]
    sustained = None
    for x in sorted(windows, key=lambda x: x["rate"]):
        if x["rate"] not in held:
            break
        sustained = x["rate"]
    return {"rates_held_p99_under_target": held, "highest_rate_p99_under_target": sustained,
            "ceiling_reached": sustained != max(x["rate"] for x in windows)}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dataset", default="default_credit")
    ap.add_argument("--rows", type=int, default=0, help="Use only the first N rows (0: all).")
    ap.add_argument("--rounds", type=int, default=100)
    ap.add_argument("--depth", type=int, default=5)
    ap.add_argument("--mode", default="plain")
    ap.add_argument("--rates", default="50,100,200,400,600,800,1000,1200,1600,2000,2400",
                    help="Open-loop rates (requests per second).")
    ap.add_argument("--duration", type=float, default=10.0, help="Seconds per rate.")
    ap.add_argument("--clients", type=int, default=16, help="Concurrent client threads.")
    ap.add_argument("--target-p99-ms", type=float, default=25.0)
    ap.add_argument("--throughput-seconds", type=float, default=12.0,
                    help="Closed-loop seconds per service and client count, in all.")
    ap.add_argument("--throughput-rounds", type=int, default=4,
                    help="Windows per service, taken in turn with the other service's.")
    ap.add_argument("--throughput-clients", default=None,
                    help="Closed-loop client counts, comma-separated (default: --clients); the first is 'throughput', "
                         "all are in 'throughput_by_clients'.")
    ap.add_argument("--batch-rows", type=int, default=64)
    ap.add_argument("--batch-wait-ms", type=float, default=1.0, help="vfl serve's --batch-wait-ms (its default).")
    ap.add_argument("--deadline-ms", type=float, default=1000.0)
    ap.add_argument("--insecure", action="store_true", help="Plaintext instead of mutual TLS.")
    ap.add_argument("--work-dir", help="Keep the tables, certificates and model here and reuse them in a later run "
                                       "with the same data set, rows, rounds, depth, mode and security (no training "
                                       "then); default: a temporary folder.")
    args = ap.parse_args()

    parties = load_shared(args.dataset)
    if args.rows:
        keep = set(parties[0].frame[parties[0].id_col].iloc[: args.rows])
        for pf in parties:
            pf.frame = pf.frame[pf.frame[pf.id_col].isin(keep)].reset_index(drop=True)
    active, passives = split_passives(parties)
    train, test = train_test_split_parties([active, *passives], test_size=0.2, seed=0)
    procs = []
    out = {"dataset": args.dataset, "rows": int(len(active.frame)), "rounds": args.rounds, "depth": args.depth,
           "mode": args.mode, "tls": not args.insecure, "clients": args.clients, "batch_rows": args.batch_rows,
           "batch_wait_ms": args.batch_wait_ms, "target_p99_ms": args.target_p99_ms}
    settings = {k: out[k] for k in ("dataset", "rows", "rounds", "depth", "mode", "tls")}
    with contextlib.ExitStack() as stack:
        if args.work_dir:
            tmp = Path(args.work_dir)
            tmp.mkdir(parents=True, exist_ok=True)
        else:
            tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="vfl-bench-serve-")))
        kept = tmp / "settings.json"
        reuse = kept.exists() and json.loads(kept.read_text()) == settings and (tmp / "model").is_dir()
        sec = ["--insecure"] if args.insecure else ["--tls-dir", tmp / "certs"]
        try:
            if not reuse:
                for pf in passives:
                    pf.frame.to_csv(tmp / f"{pf.name}.csv", index=False)
                train[0].frame.to_csv(tmp / "train_active.csv", index=False)
                if not args.insecure:
                    run(cli("certs", "--out", tmp / "certs", "--party", active.name,
                            *sum([["--party", p.name] for p in passives], [])), "vfl certs")
            peers = []
            for pf in passives:
                addr = start(["party", "passive", "--name", pf.name, "--listen", "127.0.0.1:0", "--data",
                              tmp / f"{pf.name}.csv", "--model-dir", tmp / f"m_{pf.name}", *sec,
                              *([] if args.insecure else ["--allow-client", active.name]), "--reload-interval", 0],
                             tmp / f"{pf.name}.err", "listening on", procs)
                peers += ["--peer", f"{pf.name}={addr}"]
            if reuse:
                out["train_seconds"] = "reused"
            else:
                t0 = time.perf_counter()
                run(cli("party", "active", "--name", active.name, "--data", tmp / "train_active.csv", "--id-col",
                        active.id_col, "--label-col", active.label_col, *peers, "--model-dir", tmp / "model", *sec,
                        "--mode", args.mode, "--rounds", args.rounds, "--depth", args.depth, "--quiet", "--timeout",
                        3600), "vfl party active")
                out["train_seconds"] = round(time.perf_counter() - t0, 1)
                kept.write_text(json.dumps(settings))
            serve = ["serve", "--model-dir", tmp / "model", "--id-col", active.id_col, *peers, *sec, "--listen",
                     "127.0.0.1:0", "--deadline-ms", args.deadline_ms, "--log-level", "warning"]
            url = start([*serve, "--batch-rows", args.batch_rows, "--batch-wait-ms", args.batch_wait_ms],
                        tmp / "serve.err", "serving model", procs)
            payloads = bodies(test[0].frame, active.id_col, active.label_col)
            gc.freeze()     # the generator's own long-lived objects (the data, the payloads): no GC pause in its timing
            closed_loop(url, payloads, 1.0, 2)          # warm-up: connections, channels, first batches
            out["open_loop"] = [open_loop(url, payloads, float(r), args.duration, args.clients)
                                for r in args.rates.split(",")]
            out.update(sustained_rates(out["open_loop"], args.target_p99_ms))
            counts = [int(c) for c in (args.throughput_clients or str(args.clients)).split(",")]
            url1 = start([*serve, "--batch-rows", 1, "--batch-wait-ms", 0], tmp / "serve1.err", "serving model", procs)
            closed_loop(url1, payloads, 1.0, 2)
            by = []
            for c in counts:
                got = alternate({"micro_batched": url, "one_request_per_round_trip": url1}, payloads,
                                args.throughput_seconds, max(1, args.throughput_rounds), c)
                b, one = got["micro_batched"], got["one_request_per_round_trip"]
                by.append({"clients": c, **got,
                           "ratio": round(b["requests_per_second"] / max(one["requests_per_second"], 1e-9), 2),
                           "ratio_by_round": [round(x / max(y, 1e-9), 2)
                                              for x, y in zip(b["by_round"], one["by_round"])]})
            out["throughput"] = {k: v for k, v in by[0].items() if k != "clients"}
            out["throughput_clients"] = counts[0]
            if len(by) > 1:
                out["throughput_by_clients"] = by
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                p.wait(timeout=10)
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
