"""Overlapped rounds (issue 12, item 2): the active party encrypts shard k + 1 while shard k is on
the wire, the passive party sums the root level of the shards already in. Switched by
``VFL_OVERLAP`` (parties.settings.Settings, read once per training): on and off grow bit-identical models, in every
setting the eager root path meets (subsampling, GOSS, several trees a round, pre-shifted copies,
plain mode, two passive parties), and the passive party's partials are computed before (and
without delaying) the requests; a root request that does not match falls back."""
import threading

import numpy as np
import pytest
from oracles import node_histograms
from support import KEY_BITS, small_frames

from crypto.executor import InlineExecutor
from crypto.intcodec import int_width, ints_to_bytes
from crypto.keys import generate_keypair
from crypto.packing import PackingLayout
from crypto.paillier import Encryptor
from crypto.shards import (
    MAX_STREAM_SHARD_BYTES,
    MIN_STREAM_SHARD_BYTES,
    STREAM_SHARDS,
    EncryptionStream,
    ShardedEncryption,
    ShardSet,
    plain_width,
    plan_shards,
    stream_plan,
    stream_rows,
)
from crypto.sim_executor import SimCosts, SimulatedExecutor
from parties import passive_checks, passive_splits, passive_train
from parties.settings import ENVIRONMENT, Settings
from protocols import messages as m
from protocols.serialization import loads
from protocols.transport import frame_handler
from vfl.api import ActiveParty, Federation, PassiveParty, TrainParams

N = 600


def _frames(n=N, classes=2):
    a, b, c = small_frames(n)
    if classes > 2:
        a["y"] = (np.digitize(b["b0"] + a["a0"], [-0.7, 0.7])).astype(int)
    return a, b, c


OVERLAP_ENV = ENVIRONMENT["overlap"]


def _fit(monkeypatch, overlap, mode="he", classes=2, preshift="auto", wrap=None, **kw):
    monkeypatch.setenv(OVERLAP_ENV, "1" if overlap else "0")
    a, b, c = _frames(classes=classes)
    fed = Federation(ActiveParty("bank", a), [PassiveParty("telco", b), PassiveParty("shop", c)], record=True)
    fed.active.preshift = preshift
    if wrap is not None:
        real = fed.passives["telco"].handle
        fed.transport.handlers["telco"] = frame_handler(lambda req: wrap(fed, real, req))
    params = dict(mode=mode, n_estimators=3, max_depth=3, key_bits=KEY_BITS, learning_rate=0.5)
    model = fed.fit(TrainParams(**dict(params, **kw)))
    raw = fed.predict_raw({"bank": a, "telco": b, "shop": c})
    return fed, model, raw


def _structures(model):
    return [[t.structure() for t in rnd] for rnd in model.rounds]


def _stats(fed, party):
    return dict(fed.passives[party]._state.train.overlap)


def _shard_messages(fed, peer):
    return [loads(f) for _, r, f in fed.transport.log if r == peer and b"GradientShard" in f[:200]]


def test_the_switch_reads_the_environment(monkeypatch):
    monkeypatch.delenv(OVERLAP_ENV, raising=False)
    assert Settings.from_environ().overlap
    for off in ("0", "off", "No", "false"):
        monkeypatch.setenv(OVERLAP_ENV, off)
        assert not Settings.from_environ().overlap
    monkeypatch.setenv(OVERLAP_ENV, "1")
    assert Settings.from_environ().overlap
    # a streamed round is cut finer than the shards of one worker, at least STREAM_SHARDS pieces
    assert len(plan_shards(24_000, 1)) == 2 and len(plan_shards(24_000, 1, stream_rows(24_000))) == STREAM_SHARDS
    assert len(plan_shards(600, 1, stream_rows(600))) == 3          # but of MIN_SHARD_ROWS rows at least
    assert stream_rows(24_000, 1, 512) == 3000                          # 1.5 MB messages at 2048 bits
    assert stream_rows(2000, 1, 256) == MIN_STREAM_SHARD_BYTES // 256   # and of 1 MiB (a round trip each)
    assert stream_rows(100_000, 8) == 100_000 // 32                     # four per worker
    # and of at most 16 MiB: the drivers' message buffers do not grow with the rows
    assert stream_rows(2_000_000, 2, 284) == MAX_STREAM_SHARD_BYTES // 284
    assert len(plan_shards(2_000_000, 2, stream_rows(2_000_000, 2, 284))) == 34
    for n in (10**5, 10**6, 10**7):
        assert stream_rows(n, 2, 512) * 512 <= MAX_STREAM_SHARD_BYTES


@pytest.mark.slow
@pytest.mark.parametrize("mode,kw", [("he", {}), ("plain", {}), ("he", {"subsample": 0.6}),
                                     ("plain", {"goss": True, "top_rate": 0.3, "other_rate": 0.2}),
                                     ("he", {"objective": "multiclass", "classes": 3}),
                                     ("he", {"preshift": True})],
                         ids=["he", "plain", "he-subsample", "plain-goss", "he-multiclass", "he-preshifted"])
def test_overlap_on_and_off_grow_identical_models(monkeypatch, mode, kw):
    kw = dict(kw)
    classes, preshift = kw.pop("classes", 2), kw.pop("preshift", "auto")
    fed_off, model_off, raw_off = _fit(monkeypatch, False, mode, classes, preshift, **kw)
    fed_on, model_on, raw_on = _fit(monkeypatch, True, mode, classes, preshift, **kw)
    assert _structures(model_on) == _structures(model_off)
    assert np.array_equal(raw_on, raw_off)          # to the last bit
    for party in ("telco", "shop"):                 # two passive parties, each summed its roots early
        on, off = _stats(fed_on, party), _stats(fed_off, party)
        assert on["eager"] == 3 and on["fallback"] == 0 and on["partials"] >= 3 * 2
        assert off["eager"] == off["fallback"] == off["partials"] == 0
    assert len(_shard_messages(fed_on, "telco")) >= len(_shard_messages(fed_off, "telco")) >= 3 * 2
    starts = [loads(f) for _, r, f in fed_on.transport.log if r == "telco" and b"GradientsStart" in f[:200]]
    # pre-shifted copies: never with shuffled candidates (issue 31: running sums need every bin's own sum)
    assert len(starts) == 3 and all(s.shifts == 1 for s in starts)
    assert all(s.groups == 1 and s.layout["n_targets"] == (3 if classes == 3 else 1) for s in starts)


@pytest.mark.slow
def test_the_root_partials_are_ready_before_the_request_and_acks_do_not_wait(monkeypatch):
    """Every partial's computation is held back until the round's first HistogramRequest arrives:
    all GradientShard acknowledgements came back before (they do not wait for the partials, as
    long as no more than INTAKE_BACKLOG messages wait: then the next one waits, bounding what the
    driver holds);
    then, once the partials may run, they are all done before the request is answered, summed
    from the shards as they came in (the passive party's event log shows their order)."""
    gate = threading.Event()
    real_partial = ShardSet.root_partial

    def held(self, *a, **kw):
        assert gate.wait(60)
        return real_partial(self, *a, **kw)

    monkeypatch.setattr(ShardSet, "root_partial", held)
    monkeypatch.setattr(passive_train, "INTAKE_BACKLOG", 8)   # all of a round's messages may wait here
    acks_before_gate, orders, shard_counts = [], [], []

    def wrap(fed, real, req):
        t = fed.passives["telco"]._state.train
        if isinstance(req, m.HistogramRequest) and t.intake is not None and not t.intake.used:
            if not gate.is_set():
                acks_before_gate.append(sum(1 for _, r, f in fed.transport.log
                                            if r == "telco" and b"GradientShard" in f[:200]))
                gate.set()
            intake = t.intake
            shard_counts.append(len(intake.shards))    # read while the round is on (TrainEnd clears them)
            assert intake.idle.wait(60)            # the partials finish without the request
            reply = real(req)
            orders.append(list(intake.events))
            return reply
        return real(req)

    fed, model, raw = _fit(monkeypatch, True, wrap=wrap)
    assert acks_before_gate and acks_before_gate[0] >= 2       # every shard of round 0 was acknowledged
    assert len(orders) == 3 and len(shard_counts) == 3
    for events, n_shards in zip(orders, shard_counts):
        assert n_shards > 1                          # the round was streamed in several shards
        assert sorted(e[1] for e in events[:-1]) == list(range(n_shards))    # each shard's partial, once
        kinds = [e[0] for e in events]
        assert kinds[-1] == "request" and set(kinds[:-1]) == {"partial"} and len(kinds) >= 3
        assert events[-1][1] == len(kinds) - 1       # all partials were done when the request arrived
        assert [e[1] for e in events[:-1]] == sorted(e[1] for e in events[:-1])     # in row order
    stats = _stats(fed, "telco")
    assert stats["eager"] == 3 and stats["partials_before_request"] == stats["partials"] > 0
    monkeypatch.setattr(ShardSet, "root_partial", real_partial)
    _, model_off, raw_off = _fit(monkeypatch, False)
    assert _structures(model) == _structures(model_off) and np.array_equal(raw, raw_off)


def test_a_root_request_that_does_not_match_falls_back(monkeypatch):
    """The first request of every round moves the rows of even id out of the root of tree 0 (as
    riding rows): the partials, summed over every row carrying a gradient, no longer answer
    it, so the passive party uses the level path. Its replies equal, to the bit, those of the
    party without overlap that got the same requests, and differ from the replies to the
    unmodified requests (so the change did reach the sums); the models are equal too."""
    def recorder(modify):
        replies = []

        def wrap(fed, real, req):
            root = isinstance(req, m.HistogramRequest) and np.all(req.node_ids == 0)
            if root and modify:
                a = req.assignment.copy()
                st = fed.passives["telco"]._state
                even = st.ids[st.train.rows] % 2 == 0     # the same rows whatever the (salted) row order
                a[0, (a[0] == 0) & even] = -2  # riding at the root: not summed
                req = m.HistogramRequest(req.round_idx, req.tree_idx, req.node_ids, a)
            reply = real(req)
            if root:
                replies.append([int(v) for v in reply.values.values])
            return reply
        return wrap, replies

    # the candidates' order is random per request (parties.passive_splits): the same order in every run here,
    # so that equal sums give equal replies
    monkeypatch.setattr(passive_splits, "shuffle_rng", lambda: np.random.default_rng(7))
    # the modified root changes the round's sample between levels, which the protocol refuses
    # (passive_checks, rule 'fixed sample'): off here, this test is about the sums
    for name in ("histogram_request", "split_request", "record_split", "check_children"):
        monkeypatch.setattr(passive_checks.TrainingProtocol, name, lambda *a, **k: None)
    wrap_on, on = recorder(True)
    fed_on, model_on, raw_on = _fit(monkeypatch, True, mode="plain", wrap=wrap_on)
    wrap_off, off = recorder(True)
    _, model_off, raw_off = _fit(monkeypatch, False, mode="plain", wrap=wrap_off)
    wrap_plain, unmodified = recorder(False)
    fed_plain, _, _ = _fit(monkeypatch, True, mode="plain", wrap=wrap_plain)
    assert len(on) == 3 and on == off and on[0] != unmodified[0]
    assert _structures(model_on) == _structures(model_off) and np.array_equal(raw_on, raw_off)
    assert _stats(fed_on, "telco") == {"eager": 0, "fallback": 3, "partials": 0, "partials_before_request": 0}
    assert _stats(fed_on, "shop")["eager"] == 3         # the unmodified party still used its partials
    assert _stats(fed_plain, "telco")["eager"] == 3


def test_the_stream_encrypts_each_shard_once_for_several_senders_and_counts_only_waits():
    """Two senders, one far behind the other: each shard's pack_encrypt runs once; the late
    sender refetches evicted shards from the workers; the waits are what on_wait heard."""
    pk, sk = generate_keypair(KEY_BITS)
    enc = Encryptor(pk, sk)
    ex = InlineExecutor()
    ex.share("encryptor", enc, {"kind": "encryptor", "state": enc.state()})
    n = 3000
    rng = np.random.default_rng(1)
    g = rng.integers(-1000, 1000, size=(n, 1)).astype(np.int64)
    h = rng.integers(0, 1000, size=(n, 1)).astype(np.int64)
    layout = PackingLayout.for_bounds(1000, 1000, max_rows=n, n_targets=1, precision_bits=0)
    shards = ShardSet(ex, n, max_rows=300, prefix="grad/")
    values = ShardedEncryption(shards, 1, 1, int_width(enc.nsquare), False)
    calls = []
    real_run = ex.run_on

    def run_on(reqs):
        calls.extend(h["op"] for _, (h, _) in reqs)
        return real_run(reqs)

    ex.run_on = run_on
    waits = []
    done = []
    stream = EncryptionStream(values, (g, h, None, layout.to_dict(), 1, True, layout.value_bits), consumers=2,
                              on_wait=waits.append, on_done=done.append)
    first = [stream.take(k) for k in range(len(shards))]
    second = [stream.take(k) for k in range(len(shards))]
    stream.close()
    assert len(shards) == 10 and first == second
    assert calls.count("pack_encrypt") == 10                     # once per shard, for both senders
    assert len(stream.buf) == 0 and calls.count("get") > 10      # the late sender fetched evicted shards
    assert waits and all(w >= 0 for w in waits)
    assert len(done) == 1 and isinstance(done[0], dict)         # once, when the last wave is in


def test_messages_of_several_units_carry_the_values_in_message_order():
    """Issue 24: a message groups consecutive encryption units (a few per worker); its values are
    ordered (group, shift, row) over the message's rows, exactly as one shard of those rows would
    be; the stream keeps a window of at least one shard per worker in flight."""
    n, K, shifts = 3000, 2, 2
    rng = np.random.default_rng(4)
    g = rng.integers(-1000, 1000, size=(n, K)).astype(np.int64)
    h = rng.integers(0, 1000, size=(n, K)).astype(np.int64)
    layout = PackingLayout.for_bounds(1000, 1000, max_rows=n, n_targets=1, precision_bits=0)
    width = plain_width(layout.value_bits, 4)          # copies shifted over per = 4 slots
    ex = SimulatedExecutor(4, SimCosts(encrypt=0, add=0, move=0, decrypt=0))
    try:
        units, messages = stream_plan(n, ex.n_workers, 1000)
        assert len(messages) == 8 and all(k1 - k0 == 2 for k0, k1 in messages)    # two units per message
        assert [a for a, _ in units][1:] == [b for _, b in units][:-1] and units[-1][1] == n
        job = (g, h, None, layout.to_dict(), 1, False, layout.value_bits, 4)
        values = ShardedEncryption(ShardSet(ex, n, prefix="grad/", bounds=units), K, shifts, width, True)
        stream = EncryptionStream(values, job, messages=messages)
        assert stream.window >= ex.n_workers
        got = [stream.take(i) for i in range(len(messages))]
        stream.close()
        bounds = [(units[k0][0], units[k1 - 1][1]) for k0, k1 in messages]    # one shard per message
        whole = ShardedEncryption(ShardSet(ex, n, prefix="whole/", bounds=bounds), K, shifts, width, True)
        whole.fill(*job)
        assert got == [whole.shard_bytes(i) for i in range(len(bounds))]
        assert ex.units["encrypt"] == 2 * n * K * shifts      # each unit once in the stream, once whole
    finally:
        ex.close()


def test_the_intake_keeps_every_worker_busy_and_holds_at_most_two_messages_per_worker():
    """Issue 24: the intake writes messages and sums root partials on all workers at once, without
    waiting for each; a sender faster than the workers is held back at 2 x workers messages; the
    root partials then sum to the histogram of all rows."""
    n, W = 4000, 4
    rng = np.random.default_rng(7)
    bins = rng.integers(0, 4, size=(n, 2)).astype(np.uint8)
    vals = [int(v) for v in rng.integers(-1000, 1000, size=n)]
    layout = PackingLayout.for_bounds(1000, 1000, max_rows=n, n_targets=1, precision_bits=0)
    width = plain_width(layout.value_bits, 1)
    ex = SimulatedExecutor(W, SimCosts(encrypt=0, add=2e-5, move=5e-4, decrypt=0))
    try:
        shards = ShardSet(ex, n, max_rows=250, prefix="t/")
        shards.place_array("bins", bins)
        g = passive_train.ShardedGradients(0, False, layout, 1, 1, 1, width, True, np.zeros(n, dtype=bool))
        intake = passive_train.RoundIntake("telco", shards, g, None, [4, 4])
        held = []
        for start in range(0, n, 100):
            intake.put(start, start + 100, ints_to_bytes(vals[start:start + 100], width, signed=True))
            held.append(intake.held)
        intake.finish()
        assert intake.budget == 2 * W and max(held) == intake.budget     # bounded, and the bound was reached
        assert intake.partials.all() and np.array_equal(intake.ident[0], np.array(vals) == 0)   # 0: identity
        assert max(ex.busy) < 1.5 * min(ex.busy)                          # every worker took its share
        sums, _ = shards.root_histograms(g, [0], [4, 4], None)
        assert sums == node_histograms(vals, bins, [np.arange(n)], [0, 4, 8])[0]
    finally:
        ex.close()
