"""A party's work on Dask (issue 11): the same model on the local pool, an in-process LocalCluster
and a real cluster started as separate processes; gradient shards under a small frame cap; no
driver holding a round's whole ciphertext vector; a killed worker and --resume."""
import gc
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import gmpy2
import numpy as np
import pytest
from support import KEY_BITS, small_frames

from crypto.cluster import dask_executor
from crypto.executor import WorkerError
from crypto.shards import pack_codes, plan_shards, unpack_codes
from datasets.errors import InputError, PeerError
from parties.server import PassiveServer
from protocols import messages as m
from protocols.certs import make_certs
from protocols.serialization import loads
from protocols.transport import InMemoryTransport, frame_handler
from vfl.api import ActiveParty, Federation, PassiveParty, TrainParams

distributed = pytest.importorskip("distributed")
from crypto.dask_executor import LEAN_CONFIG, DaskExecutor, lean_environment, parse_spec, security_from_dir  # noqa: E402,I001
from dask_support import Cluster, dask_env, free_port  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
PARAMS = dict(n_estimators=2, max_depth=3, key_bits=KEY_BITS)


def _structures(model):
    return [[t.structure() for t in rnd] for rnd in model.rounds]


@pytest.fixture(scope="module")
def real_cluster():
    c = Cluster(2).wait(2)
    yield c
    c.stop()


@pytest.fixture(scope="module")
def local_cluster():
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                                  dashboard_address=None, silence_logs=40,
                                  scheduler_kwargs={"dashboard": False, "dashboard_address": "127.0.0.1:0"}) as c:
        yield c


def _fed(executors=(None, None, None), n=200, record=False, n_jobs=None):
    a, b, c = small_frames(n)
    return Federation(ActiveParty("bank", a, executor=executors[0], n_jobs=n_jobs),
                      [PassiveParty("telco", b, executor=executors[1], n_jobs=n_jobs),
                       PassiveParty("shop", c, executor=executors[2], n_jobs=n_jobs)], record=record)


def _fit(fed, mode, **kw):
    model = fed.fit(TrainParams(mode=mode, **dict(PARAMS, **kw)))
    a, b, c = small_frames(200)
    return model, fed.predict_raw({"bank": a, "telco": b, "shop": c})


# --- units --------------------------------------------------------------------------
def test_node_codes_round_trip_bit_packed():
    rng = np.random.default_rng(0)
    for n_codes in (1, 2, 3, 5, 17, 300):
        for n in (0, 1, 7, 8, 9, 1000):
            codes = rng.integers(0, n_codes, n)
            bits, data = pack_codes(codes, n_codes)
            assert len(data) == bits * ((n + 7) // 8) and bits == max(1, (n_codes - 1).bit_length())
            assert np.array_equal(unpack_codes(data, bits, n), codes)


def test_shards_cover_the_rows_a_few_per_worker_and_under_a_row_cap():
    assert plan_shards(10, 2) == [(0, 10)]                         # small data: one shard
    got = plan_shards(100_000, 2)
    assert len(got) == 4 and got[0][0] == 0 and got[-1][1] == 100_000
    assert all(a[1] == b[0] for a, b in zip(got, got[1:]))
    capped = plan_shards(100_000, 2, max_rows=7_000)
    assert max(b - a for a, b in capped) <= 7_000 and capped[-1][1] == 100_000


def test_dask_specs_and_the_insecure_guard():
    assert parse_spec("local:3") == ("local", 3)
    with pytest.raises(InputError, match="local:N"):
        parse_spec("local:x")
    with pytest.raises(InputError, match="not TLS"):
        DaskExecutor("tcp://127.0.0.1:1", name="p")
    with pytest.raises(InputError, match="TLS needs certificates"):
        DaskExecutor("tls://127.0.0.1:1", name="p")
    with pytest.raises(InputError, match="ca.pem"):
        dask_executor("tls://127.0.0.1:1", "p", tls_dir="/nonexistent")
    DaskExecutor("tcp://127.0.0.1:1", name="p", insecure=True).close()      # allowed, never connected


def test_a_scheduler_that_is_not_there_is_a_clear_error():
    ex = DaskExecutor(f"tcp://127.0.0.1:{free_port()}", name="passive:telco", insecure=True, timeout=2)
    with pytest.raises(WorkerError, match="passive:telco.*cannot connect"):
        ex.start()
    ex.close()


# --- the same model everywhere ----------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("mode", ["plain", "he"])
def test_same_model_on_local_pool_local_cluster_and_real_cluster(mode, always_parallel, local_cluster, real_cluster):
    ref_model, ref_raw = _fit(_fed(n_jobs=2), mode)
    for address in (local_cluster.scheduler_address, real_cluster.address):
        # payloads and results go to the workers directly, or (telco) through the scheduler
        executors = [DaskExecutor(address, name=n, insecure=True, direct=n != "telco")
                     for n in ("bank", "telco", "shop")]
        try:
            model, raw = _fit(_fed(executors), mode)
            assert all(ex.n_workers == 2 for ex in executors)
            assert [ex.client.direct_to_workers for ex in executors] == [True, False, True]
        finally:
            for ex in executors:
                ex.close()
        assert _structures(model) == _structures(ref_model)
        assert np.array_equal(raw, ref_raw)            # to the last bit
    owners = {n.owner for rnd in ref_model.rounds for t in rnd for n in t.nodes if not n.is_leaf}
    assert {"telco", "shop"} <= owners


@pytest.mark.slow
def test_okamoto_uchiyama_on_a_dask_cluster_grows_the_plain_model(always_parallel, local_cluster):
    """``scheme="ou"``: the Dask workers rebuild the OU encryptor from its state, encrypt, sum mod n
    and the key holder decrypts with p: the trees of plain, to the last bit."""
    ref_model, ref_raw = _fit(_fed(n_jobs=2), "plain")
    executors = [DaskExecutor(local_cluster.scheduler_address, name=n, insecure=True)
                 for n in ("bank", "telco", "shop")]
    try:
        model, raw = _fit(_fed(executors), "he", scheme="ou")
    finally:
        for ex in executors:
            ex.close()
    assert _structures(model) == _structures(ref_model)
    assert np.array_equal(raw, ref_raw)


# --- the frame cap and the driver's memory ---------------------------------------------
def _ciphertext_lists(min_len: int, n: int) -> list[int]:
    """Lengths of the lists in this process holding at least ``min_len`` ciphertexts (> n)."""
    found = []
    for obj in gc.get_objects():
        if isinstance(obj, list) and len(obj) >= min_len:
            head = obj[:8]
            if all(type(v) is type(gmpy2.mpz(0)) and v > n for v in head) and \
                    sum(1 for v in obj if type(v) is type(gmpy2.mpz(0)) and v > n) >= min_len:
                found.append(len(obj))
    return found


@pytest.mark.slow
@pytest.mark.parametrize("where", ["local", "dask"])
def test_no_message_and_no_driver_holds_the_whole_ciphertext_vector(where, always_parallel, local_cluster):
    """Both drivers run in this process (in-memory transport): at every histogram request nothing
    here holds even half of a round's ciphertexts; they live in the workers' shards. The scan
    finds a whole vector when one exists (so it can fail)."""
    n = 900
    executors = [DaskExecutor(local_cluster.scheduler_address, name=p, insecure=True)
                 for p in ("bank", "telco", "shop")] if where == "dask" else [None] * 3
    fed = _fed(executors, n=n, record=True, n_jobs=2)
    real = fed.passives["telco"].handle
    seen = []

    def handle(request):
        if isinstance(request, m.HistogramRequest):
            nn = int(fed.active.channel.public_key.n)
            seen.append(_ciphertext_lists(n // 2, nn))
        return real(request)

    fed.transport.handlers["telco"] = frame_handler(handle)
    try:
        fed.fit(TrainParams(mode="he", n_estimators=2, max_depth=2, key_bits=KEY_BITS))
    finally:
        for ex in executors:
            if ex is not None:
                ex.close()
    assert len(seen) >= 4 and all(s == [] for s in seen)
    shards = [loads(f) for _, r, f in fed.transport.log if r == "telco" and b"GradientShard" in f[:200]]
    assert len(shards) >= 2 * 2 and all(msg.stop - msg.start <= n // 2 for msg in shards)
    whole = [gmpy2.mpz(10 ** 300) + i for i in range(n)]     # a whole vector would be found
    assert _ciphertext_lists(n // 2, 10 ** 299) == [len(whole)]


def test_gradient_shards_respect_a_small_frame_cap(always_parallel):
    ref = _fed(n_jobs=2)
    ref_model = ref.fit(TrainParams(mode="he", **PARAMS))
    fed = _fed(n_jobs=2, record=True)
    cap = 12_000
    fed.transport.max_frame_bytes = cap
    model = fed.fit(TrainParams(mode="he", **PARAMS))
    grads = [len(f) for _, _, f in fed.transport.log if b"GradientShard" in f[:200]]
    assert len(grads) > 2 * 2 * 4 and max(grads) <= cap          # many shards per round and party
    assert _structures(model) == _structures(ref_model)


# --- faults -----------------------------------------------------------------------------
@pytest.mark.slow
def test_a_killed_worker_names_party_and_worker_and_resume_gives_the_same_model(tmp_path):
    a, b, c = small_frames(200)
    params = TrainParams(mode="he", n_estimators=3, max_depth=2, key_bits=KEY_BITS)

    def servers(root, executor=None):
        return {"b": PassiveServer("b", b, "id", root / "b", executor=executor),
                "c": PassiveServer("c", c, "id", root / "c")}

    def fit(srv, **kw):
        t = InMemoryTransport("a", {n: s.handle_frame for n, s in srv.items()})
        return ActiveParty("a", a).fit(t, list(srv), params, **kw)

    full = fit(servers(tmp_path / "full"))
    cluster = Cluster(2).wait(2)
    try:
        ex = DaskExecutor(cluster.address, name="passive:b", insecure=True)
        srv = servers(tmp_path / "run", ex)
        saved = []

        def on_round(r, info):
            if r == 0:          # after the first tree: the worker holding b's (first) shard dies
                addr = ex.addresses[0]
                pid = ex.client.run(os.getpid, workers=[addr])[addr]
                os.kill(pid, signal.SIGKILL)
                next(p for p in cluster.workers if p.pid == pid).wait()

        with pytest.raises(PeerError, match=r"party 'b'.*Dask worker tcp://127\.0\.0\.1:\d+ of 'passive:b' is gone"):
            fit(srv, checkpoint=saved.append, on_round=on_round)
        assert saved and saved[-1].n_rounds == 1
        cluster.workers.append(cluster.add_worker())           # a new worker; resume on the same server
        with distributed.Client(cluster.address, timeout=30) as cl:
            deadline = time.monotonic() + 60
            while len(cl.nthreads()) < 2 and time.monotonic() < deadline:
                time.sleep(0.2)
        resumed = fit(srv, resume=saved[-1])
        ex.close()
    finally:
        cluster.stop()
    assert _structures(resumed) == _structures(full)


@pytest.mark.slow
def test_a_party_on_a_tls_cluster_with_the_certificates_of_vfl_certs(tmp_path):
    pytest.importorskip("cryptography")
    make_certs(tmp_path / "certs", ["telco"], hosts=("127.0.0.1", "localhost"))
    d = tmp_path / "certs"
    tls = ["--tls-ca-file", str(d / "ca.pem"), "--tls-cert", str(d / "telco.pem"), "--tls-key", str(d / "telco.key")]
    cluster = Cluster(1, tls=tls)
    try:
        cluster.wait(1, security=security_from_dir(d, "telco"))
        ex = dask_executor(cluster.address, "passive:telco", tls_dir=d)
        ref = _fed().fit(TrainParams(mode="plain", n_estimators=1, max_depth=2))
        model = _fed((None, ex, None)).fit(TrainParams(mode="plain", n_estimators=1, max_depth=2))
        assert ex.addresses[0].startswith("tls://127.0.0.1:")
        ex.close()
    finally:
        cluster.stop()
    assert _structures(model) == _structures(ref)


# --- the command line --------------------------------------------------------------------
@pytest.mark.slow
def test_vfl_simulate_with_a_local_cluster_per_party_equals_the_local_pool(tmp_path):
    def run(*extra):
        out = tmp_path / f"p{len(extra)}.csv"
        proc = subprocess.run([sys.executable, "-m", "cli", "simulate", "--rounds", "1", "--depth", "2",
                               "--mode", "plain", "--quiet", "--predictions", str(out), *extra],
                              cwd=ROOT, env=dask_env(), capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stderr[-3000:]
        return out.read_text()

    assert run("--dask", "local:1") == run()


def test_party_commands_refuse_a_plain_dask_scheduler_without_the_flag(tmp_path):
    data = tmp_path / "b.csv"
    _, b, _ = small_frames(20)
    b.to_csv(data, index=False)
    proc = subprocess.run([sys.executable, "-m", "cli", "party", "passive", "--name", "b", "--data", str(data),
                           "--model-dir", str(tmp_path / "m"), "--insecure", "--dask-scheduler",
                           "tcp://127.0.0.1:1"], cwd=ROOT, env=dask_env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1 and "is not TLS" in proc.stderr and "--dask-insecure" in proc.stderr


# --- Parquet pieces read on the workers (bounded passive drivers) ------------------------
@pytest.mark.slow
def test_dask_workers_read_the_parquet_pieces_of_a_passive_party(tmp_path, monkeypatch, real_cluster):
    """The real cluster's workers (separate processes sharing this filesystem) read telco's Parquet
    pieces, bin them and answer its splits: the model and predictions equal the in-memory frame's."""
    pytest.importorskip("pyarrow")
    from datasets.pieces import PieceTable
    from protocols import alignment
    monkeypatch.setattr(alignment, "new_salt", lambda: bytes(range(16)))
    a, b, c = small_frames(700)
    b = b.iloc[np.random.default_rng(5).permutation(len(b))].reset_index(drop=True)    # another row order
    d = tmp_path / "telco"
    d.mkdir()
    for i, part in enumerate(np.array_split(np.arange(len(b)), 3)):
        b.iloc[part].to_parquet(d / f"part-{i}.parquet", index=False, row_group_size=90)
    params = TrainParams(mode="he", n_estimators=2, max_depth=3, key_bits=KEY_BITS, seed=1)
    ref = Federation(ActiveParty("bank", a), [PassiveParty("telco", b), PassiveParty("shop", c)])
    ref_model = ref.fit(params)
    ex = DaskExecutor(real_cluster.address, name="passive:telco", insecure=True)
    try:
        telco = PassiveParty.from_file("telco", d, executor=ex)
        assert isinstance(telco._state.X, PieceTable)
        fed = Federation(ActiveParty("bank", a), [telco, PassiveParty("shop", c)])
        model = fed.fit(params)
        assert ex.n_workers == 2
    finally:
        ex.close()
    assert _structures(model) == _structures(ref_model)
    assert [(r["feature"], r["threshold"]) for r in telco.records] == \
        [(r["feature"], r["threshold"]) for r in ref.passives["telco"].records]
    pred = {"bank": a.drop(columns="y"), "telco": b, "shop": c}
    assert np.array_equal(fed.predict_raw({**pred, "telco": d}), ref.predict_raw(pred))


def _settings():
    import dask
    return {k: dask.config.get(k) for k in LEAN_CONFIG}


def _tick_ms(dask_scheduler):
    return dask_scheduler.periodic_callbacks["tick"].callback_time


def test_lean_dask_settings_reach_the_workers_of_a_local_and_a_real_cluster(real_cluster):
    import dask
    assert dask.config.collect_env(lean_environment()) == dask.config.expand_environment_variables(
        {"distributed": {"worker": {"profile": {"enabled": False}},
                         "admin": {"tick": {"interval": "200ms"}, "system_monitor": {"interval": "2s"}}}})
    ex = DaskExecutor("local:2", name="lean")
    try:
        ex.start()
        got = ex.client.run(_settings)
        assert len(got) == 2 and all(v == LEAN_CONFIG for v in got.values()), got
        # the scheduler lives in this process: its watchdog was set up with the lean interval
        assert ex.client.run_on_scheduler(_tick_ms) == 200
    finally:
        ex.close()
    with distributed.Client(real_cluster.address, timeout=60) as c:
        for key, want in LEAN_CONFIG.items():       # (a module the workers can import: dask's own)
            got = c.run(dask.config.get, key)
            assert len(got) == 2 and set(got.values()) == {want}, (key, got)


def test_pinned_tasks_sent_without_waiting_run_in_order_on_their_worker(local_cluster):
    """Issue 24: submit_on returns before the tasks ran (the stream and the intake keep many in
    flight), and a worker's pinned tasks still run in the order they were sent: each write is
    seen by the read sent right after it, without waiting in between."""
    ex = DaskExecutor(local_cluster.scheduler_address, name="order", insecure=True)
    try:
        pendings = []
        for k in range(12):
            wi = k % ex.n_workers
            ints = np.arange(k, k + 50, dtype=np.int64)
            pendings.append(ex.submit_on([
                (wi, ({"op": "put", "slot": "s", "kind": "array", "dtype": ints.dtype.str, "shape": [50]},
                      [ints.tobytes()])),
                (wi, ({"op": "fill", "slot": "v", "size": 50, "width": 8, "signed": True,
                       "segments": [[0, 50]], "modulus": None, "round": k}, [ints.tobytes()])),
                (wi, ({"op": "get", "slots": ["v"], "width": 8, "signed": True}, ()))]))
        for k, pending in enumerate(pendings):
            replies = pending.result()
            assert np.frombuffer(replies[-1][1][0], dtype=np.int64).tolist() == list(range(k, k + 50))
    finally:
        ex.close()


def test_a_lost_scheduler_is_told_in_words_whichever_way_it_shows():
    """A killed scheduler shows as the client's lost connection or as every task cancelled (Dask's
    FuturesCancelledError, a line per future), depending on timing: either way one line naming the
    scheduler, without Dask's exception class."""
    from types import SimpleNamespace

    from distributed.client import FuturesCancelledError
    ex = SimpleNamespace(name="passive:passive", spec="tcp://127.0.0.1:1", advice=DaskExecutor.advice)
    cancelled = DaskExecutor._scheduler_gone(ex, FuturesCancelledError([]))
    lost = DaskExecutor._scheduler_gone(ex, OSError("Timed out trying to connect"))
    for err in (cancelled, lost):
        assert str(err).startswith("the Dask scheduler of 'passive:passive' at tcp://127.0.0.1:1 "
                                   "is gone or unreachable")
        assert "\n" not in str(err) and "CancelledError" not in str(err)
    assert "its tasks were cancelled" in str(cancelled) and "OSError: Timed out" in str(lost)
