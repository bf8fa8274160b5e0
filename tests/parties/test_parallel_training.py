"""The hot path inside a federation: lossless with every fast path on, no leaked processes,
per-tree breakdown, subtraction checked against direct builds."""
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from support import KEY_BITS, alive, small_frames, streamed_gradients

import parties.active as active_mod
import parties.passive as passive_mod
from crypto.paillier import Decryptor
from parties import passive_splits
from protocols import messages as m
from protocols.serialization import BigInts, loads
from vfl.api import ActiveParty, Federation, PassiveParty, TrainParams
from vfl.core.errors import InputError, ProtocolError

pytestmark = pytest.mark.slow   # real party processes / worker pools, multi-second
#: pre-shifted gradient copies serve the per-bin exchange, which only a DP released model keeps (issue 31: the
#: shuffled candidates of every other training are running sums of the bins, which need every bin's own sum);
#: a large epsilon and a fixed noise seed (NOT PRIVATE: tests only) keep these trainings deterministic
PER_BIN = dict(dp_model=1e6, dp_unsafe_noise_seed=1)

ROOT = Path(__file__).resolve().parents[2]



def _federation(n=160, record=False, n_jobs=2, seed=0):
    a, b, c = small_frames(n, seed=seed)
    return Federation(ActiveParty("bank", a, n_jobs=n_jobs),
                      [PassiveParty("telco", b, n_jobs=n_jobs), PassiveParty("shop", c, n_jobs=n_jobs)],
                      record=record)


def _structures(model):
    return [t.structure() for rnd in model.rounds for t in rnd]


@pytest.mark.parametrize("preshift, scheme", [(3, "paillier"), (3, "ou")])
def test_every_fast_path_on_two_passive_pools_starts_and_stops_its_workers(always_parallel, started_pids, preshift,
                                                                          scheme, monkeypatch):
    """(he == plain on pools for every pre-shift setting: tests/test_he_equals_plain.py,
    small-3p-binary-*-pool2*)"""
    monkeypatch.setattr(ActiveParty, "preshift", preshift)
    fed = _federation()
    m_he = fed.fit(TrainParams(mode="he", scheme=scheme, n_estimators=2, max_depth=3, key_bits=KEY_BITS, **PER_BIN))
    cur = fed.active.channel.current    # an intermediate number of copies: some Horner on the passive side too
    assert 1 < cur.shifts < cur.per and cur.shifts <= 3
    owners = {n.owner for rnd in m_he.rounds for t in rnd for n in t.nodes if not n.is_leaf}
    assert {"telco", "shop"} & owners
    # the active party and both passive parties ran their own worker processes, all stopped now
    assert len(started_pids) == 6
    assert not any(alive(p) for p in started_pids)
    assert fed.active.channel.executor is None
    assert all(p._state.executor is None for p in fed.passives.values())


def test_every_sibling_a_passive_party_derives_equals_a_direct_build(always_parallel, monkeypatch):
    """Derived histograms (the parent's minus the smaller child's, homomorphically at the passive party:
    issue 31) decrypt to exactly what building the node directly gives."""
    checked = []
    real = passive_splits.candidates

    def spy(s, req, g, a, tree_idx, bin_sums):
        ex = s.train.candidates
        sizes = {t: dict(zip(*np.unique(a[t][a[t] >= 0], return_counts=True))) for t in np.unique(tree_idx).tolist()}
        prev = (ex.level, ex.prev, ex.round, ex.picks)
        _, derive = ex.plan(int(req.round_idx), a, tree_idx, np.asarray(req.node_ids, dtype=np.int64), sizes)
        ex.level, ex.prev, ex.round, ex.picks = prev
        out = real(s, req, g, a, tree_idx, bin_sums)
        total = int(ex.offsets[-1])
        for t, nid, _, _ in derive:          # the derived node, built directly
            flat, _ = bin_sums(np.array([t]), np.array([nid]))
            checked.append((ex.level[(t, nid)], flat[:total]))
        return out

    monkeypatch.setattr(passive_splits, "candidates", spy)
    a, b, _ = small_frames(300, seed=3)
    fed = Federation(ActiveParty("bank", a, n_jobs=2), [PassiveParty("telco", b, n_jobs=2)])
    fed.fit(TrainParams(mode="he", key_bits=KEY_BITS, n_estimators=2, max_depth=4))
    dec = fed.active.channel.decryptor
    assert len(checked) > 6
    for derived, direct in checked:
        assert dec.decrypt(derived) == dec.decrypt(direct)


def test_no_worker_survives_a_failed_training(always_parallel, started_pids):
    fed = _federation()

    def boom(r, info):
        raise RuntimeError("stop here")

    with pytest.raises(RuntimeError, match="stop here"):
        fed.fit(TrainParams(mode="he", key_bits=KEY_BITS, n_estimators=3, max_depth=2), on_round=boom)
    assert started_pids and not any(alive(p) for p in started_pids)


def test_per_tree_breakdown_from_the_python_api(always_parallel):
    fed = _federation()
    fed.fit(TrainParams(mode="he", key_bits=KEY_BITS, n_estimators=3, max_depth=3))
    timings = fed.active.timings
    assert len(timings) == 3
    for t in timings:
        for stage in ("encrypt", "histogram", "compress", "decrypt", "split_search", "total"):
            assert isinstance(t[stage], float) and t[stage] >= 0
        assert t["encrypt"] > 0 and t["histogram"] > 0 and t["decrypt"] > 0
        assert t["encrypt"] + t["decrypt"] < t["total"]
        assert isinstance(t["bytes_sent"], int) and t["bytes_sent"] > 0
    # every byte of the rounds is counted once: rounds + setup + TrainEnd = all bytes
    rounds = sum(t["bytes_sent"] for t in timings)
    assert rounds < fed.transport.total_bytes()
    assert fed.transport.total_bytes() - rounds < 0.2 * fed.transport.total_bytes()


def test_simulate_verbose_prints_the_breakdown():
    out = subprocess.run([sys.executable, "-m", "cli", "simulate", "--rounds", "2", "--depth", "2",
                          "--key-bits", "1024", "--verbose", "--quiet"],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    lines = [ln for ln in (out.stdout + out.stderr).splitlines() if ln.startswith("round ")]
    assert len(lines) == 2
    for ln in lines:
        for word in ("encrypt", "histogram", "compress", "decrypt", "split_search", "total", "sent"):
            assert word in ln
        assert "bytes_sent" not in ln


def test_preshifted_gradients_are_fresh_ciphertexts_of_every_shift(monkeypatch):
    monkeypatch.setattr(ActiveParty, "preshift", True)
    fed = _federation(record=True)
    fed.fit(TrainParams(mode="he", key_bits=KEY_BITS, n_estimators=1, max_depth=2, **PER_BIN))
    ((g, vals),) = streamed_gradients(loads(f) for s, r, f in fed.transport.log if r == "telco")
    n = int(fed.active.channel.public_key.n)
    n_rows = fed.passives["telco"].n_aligned
    assert g.shifts == g.values_per_ciphertext > 1 and len(vals) == g.shifts * n_rows
    assert all(n < v < n * n for v in vals) and len(set(vals)) == len(vals)
    # copy s of row i decrypts to row i's packed value shifted by s slots
    dec = Decryptor(fed.active.channel.private_key)
    w = fed.active.channel.current.layout.value_bits
    first = dec.decrypt_signed([vals[s * n_rows] for s in range(g.shifts)])
    assert first[0] != 0 and all(first[s] == first[0] << (s * w) for s in range(g.shifts))


def test_passive_refuses_inconsistent_shifts():
    a, b, _ = small_frames(40)
    p = PassiveParty("telco", b)
    fed = Federation(ActiveParty("bank", a), [p])
    fed.fit(TrainParams(mode="plain", n_estimators=1, max_depth=1))
    n = p.n_aligned
    layout = fed.active.channel.current.layout.to_dict()
    p.handle(m.TrainSetup("plain", 32, "y"))          # shuffled candidates: no pre-shifted copies at all
    with pytest.raises(ProtocolError, match="4 pre-shifted copies; its shuffled candidates"):
        p.handle(m.Gradients(0, False, layout, 4, BigInts([1] * (4 * n)), 4))
    p.handle(m.TrainSetup("plain", 32, "x", {"epsilon": 1e6}))      # per-bin sums (a DP released model)
    with pytest.raises(ProtocolError, match="shifts"):
        p.handle(m.Gradients(0, False, layout, 4, BigInts([1] * (3 * n)), 3))
    with pytest.raises(ProtocolError, match="gradient values"):
        p.handle(m.Gradients(0, False, layout, 4, BigInts([1] * n), 4))
    assert isinstance(p.handle(m.Gradients(0, False, layout, 4, BigInts([1] * (4 * n)), 4)), m.Ack)


def test_n_jobs_is_validated_with_a_clear_error(monkeypatch):
    a, b, _ = small_frames(40)
    for bad in (-1, "2", 2.5, True, 10_000):
        with pytest.raises(InputError, match="n_jobs"):
            ActiveParty("bank", a, n_jobs=bad)
        with pytest.raises(InputError, match="n_jobs"):
            PassiveParty("telco", b, n_jobs=bad)
    monkeypatch.setenv("VFL_N_JOBS", "many")        # the environment is read when training starts
    fed = _federation()
    with pytest.raises(InputError, match="environment variable VFL_N_JOBS must be an integer .* got 'many'"):
        fed.fit(TrainParams(mode="plain", n_estimators=1, max_depth=1))


def test_one_job_keeps_all_work_in_process(always_parallel, started_pids):
    fed = _federation(n_jobs=1)
    fed.fit(TrainParams(mode="he", key_bits=KEY_BITS, n_estimators=1, max_depth=2))
    assert started_pids == []


@pytest.mark.parametrize("preshift", [True, False], ids=["preshifted", "one-copy"])
@pytest.mark.parametrize("cap,peer_cap", [(None, None), (10 ** 9, 150_000), (150_000, None)],
                         ids=["no-cap", "peer-cap", "transport-cap"])
def test_preshifted_copies_respect_the_frame_cap_of_transport_and_peers(monkeypatch, preshift, cap, peer_cap):
    """Pre-shifted copies multiply the gradient bytes; the stream cuts them into shard messages
    under the smallest cap of the transport and the peers (issue 11: no longer by dropping the
    copies): a cap never decides whether there are copies, the party's setting does."""
    monkeypatch.setattr(ActiveParty, "preshift", preshift)
    fed = _federation(record=True)
    if cap is not None:
        fed.transport.max_frame_bytes = cap
    if peer_cap is not None:
        fed.transport.peer_info = {"telco": {"max_frame_bytes": peer_cap}}
    fed.fit(TrainParams(mode="he", key_bits=KEY_BITS, n_estimators=1, max_depth=1, **PER_BIN))
    sizes = [len(f) for s, r, f in fed.transport.log if b"GradientShard" in f[:200]]
    shifts = fed.active.channel.current.shifts
    assert (shifts > 1) == preshift
    if cap is not None or peer_cap is not None:
        assert max(sizes) < 150_000                     # each shard under the smallest cap
        assert sum(sizes) > 2 * 150_000 or not preshift     # the copies' bytes: many shards


def test_a_refused_key_size_leaves_no_worker(started_pids):
    fed = _federation()
    with pytest.raises(InputError, match="key size"):
        fed.fit(TrainParams(mode="he", key_bits=512, n_estimators=1, max_depth=1))
    assert len(started_pids) == 2 and not any(alive(p) for p in started_pids)


@pytest.mark.parametrize("preshift", [False, True])
def test_multiclass_target_groups_with_preshift_and_pools(always_parallel, monkeypatch, preshift):
    """Four classes in two gradient groups (as when the targets do not fit one plaintext), each
    group pre-shifted or not, histograms over the workers (he == plain here:
    tests/test_he_equals_plain.py, multiclass4-two-groups-paillier-pool2-*)."""
    monkeypatch.setattr(ActiveParty, "preshift", preshift)
    monkeypatch.setattr(active_mod.GradientChannel, "group_size", lambda self, layout: 2)
    a, b, c = small_frames(200, seed=4)
    a = a.assign(y=(b["b0"] > 0).astype(int) + 2 * (c["c0"] > 0.3).astype(int))
    fed = Federation(ActiveParty("bank", a, n_jobs=2),
                     [PassiveParty("telco", b, n_jobs=2), PassiveParty("shop", c, n_jobs=2)], record=True)
    fed.fit(TrainParams(mode="he", key_bits=KEY_BITS, objective="multiclass", n_estimators=2, max_depth=3, **PER_BIN))
    ((g, values), *_) = streamed_gradients(loads(f) for s, r, f in fed.transport.log if r == "telco")
    assert g.layout["n_targets"] == 2 and g.groups == 2
    assert len(values) == 2 * g.shifts * 200 and (g.shifts > 1) == preshift
    owners = {n.owner for rnd in fed.model.rounds for t in rnd for n in t.nodes if not n.is_leaf}
    assert {"telco", "shop"} & owners


def test_preshift_frame_cap_counts_every_row_of_a_sampled_round():
    """Unsampled rows still travel (as full-width placeholders): the shards under the cap count them."""
    from crypto.packing import PackingLayout
    from parties.channel import GradientChannel
    from parties.settings import Settings
    from protocols.serialization import dumps
    from vfl.core.fixedpoint import encode_fixed
    from vfl.core.rounds import RoundGradients, RoundTiming

    n = 400
    ch = GradientChannel("he", KEY_BITS, "fast", Settings(n_jobs=1))
    rng = np.random.default_rng(0)
    g = encode_fixed(rng.uniform(-1, 1, (n, 1)), 20)
    h = encode_fixed(rng.uniform(0, .25, (n, 1)), 20)
    layout = PackingLayout.for_bounds(1, .25, n, 1, 20)
    per = layout.values_per_plaintext(KEY_BITS)
    cap = int((n * per * 256 + 65536) / 0.9 * 0.75)     # room for copies of half the rows, not all
    ch.plan(100, 3, True, cap)
    ch.round_started(RoundGradients(0, g, h, 1.0, 0.25, 20, np.arange(n) < n // 2, RoundTiming()))
    rc = ch.current
    frames = [dumps(msg) for msg in ch.messages(0)]
    # every row travels (placeholders too), with its copies, in several shards each under the cap
    assert rc.shifts == per > 1 and len(frames) > 2 and max(len(f) for f in frames) <= cap
    assert sum(len(f) for f in frames) > n * per * 128
    ch.close()


def test_workers_and_passives_are_released_when_setup_fails(monkeypatch):
    """An error between starting the active party's pool and the first round closes the pool
    and still tells the passive parties that training ended unfinished."""
    a, b, _ = small_frames(160)
    telco = PassiveParty("telco", b, n_jobs=1)
    fed = Federation(ActiveParty("bank", a, n_jobs=2), [telco])

    def refuse(state, req):
        raise InputError("refuses the key")

    monkeypatch.setitem(passive_mod.HANDLERS, m.PublicKey, refuse)
    with pytest.raises(InputError, match="refuses the key"):
        fed.fit(TrainParams(mode="he", key_bits=KEY_BITS, n_estimators=1, max_depth=1))
    assert fed.active.channel.executor is None                  # closed, workers gone
    assert telco.completed is False and telco._state.train.grads is None   # TrainEnd(completed=False) arrived
