"""Hot-path kernels: joint bins, executor, compression variants, fast encryption, decryption.

Every fast path is checked against the naive plaintext oracle, exactly.
"""
import os
import signal

import gmpy2
import numpy as np
import pytest
from oracles import compressed_histogram, node_histograms, reference_histogram, sharded_histograms
from support import alive

from crypto import parallel
from crypto.compress import (
    choose_shifts,
    compress,
    direct_block,
    shift_choices,
    shifted_plaintexts,
    stride_for,
)
from crypto.executor import Executor, LocalExecutor, WorkerError, reduce_slices
from crypto.histogram import block_sums, plan_groups
from crypto.intcodec import bytes_to_ints, ints_to_bytes
from crypto.packing import PackingLayout, decode_sums, pack, unpack
from crypto.paillier import Decryptor, Encryptor, FixedBaseTable
from crypto.parallel import resolve_workers
from datasets.errors import InputError
from vfl.core.fixedpoint import encode_fixed


@pytest.fixture(scope="module")
def executor():
    with LocalExecutor(2, "test") as ex:
        yield ex


def _problem(n=700, seed=0, n_bins=(5, 33, 2, 17, 33, 33, 9, 3)):
    """Packed gradients, bins with a missing-value bin in use, and nodes of every size."""
    rng = np.random.default_rng(seed)
    nb = np.array(n_bins)
    bins = np.stack([rng.integers(0, b, n) for b in nb], axis=1).astype(np.uint16)
    bins[rng.random(n) < 0.1, 1] = nb[1] - 1          # missing values: the last bin
    offsets = np.concatenate([[0], np.cumsum(nb)])
    layout = PackingLayout.for_bounds(1.0, 0.25, max_rows=n)
    g = encode_fixed(rng.uniform(-1, 1, (n, 1)), 32)
    h = encode_fixed(rng.uniform(0, 0.25, (n, 1)), 32)
    plain = pack(g, h, layout)
    nodes = [np.arange(n), np.flatnonzero(rng.random(n) < 0.35), np.array([], dtype=np.int64),
             np.array([3, 5, 7]), np.flatnonzero(rng.random(n) < 0.7)]
    return plain, bins, offsets, nodes, layout


@pytest.fixture(scope="module")
def enc_problem(keypair):
    pub, priv = keypair
    plain, bins, offsets, nodes, layout = _problem()
    enc = Encryptor(pub, priv)
    return enc, Decryptor(priv), gmpy2.mpz(pub.nsquare), plain, enc.encrypt(plain), bins, offsets, nodes, layout


# --- joint bins ---------------------------------------------------------------
@pytest.mark.parametrize("joint", ["auto", 1, 2, 3])
def test_joint_bin_histograms_equal_the_reference_in_plaintext(joint):
    plain, bins, offsets, nodes, _ = _problem()
    expected = reference_histogram(plain, bins, nodes, offsets)
    assert node_histograms(plain, bins, nodes, offsets, joint=joint) == expected


@pytest.mark.parametrize("joint", ["auto", 2, 3])
def test_joint_bin_histograms_decrypt_to_the_plaintext_sums(enc_problem, joint):
    enc, dec, n2, plain, cts, bins, offsets, nodes, _ = enc_problem
    expected = reference_histogram(plain, bins, nodes, offsets)
    got = node_histograms(cts, bins, nodes, offsets, n2, joint=joint)
    assert [dec.decrypt_signed(h) for h in got] == expected
    assert got[2] == [1] * int(offsets[-1])            # an empty node: identities


def test_plan_picks_joint_cells_for_big_nodes_and_plain_bins_for_small_ones():
    rng = np.random.default_rng(0)
    big = rng.integers(0, 33, (5000, 6))
    groups = plan_groups(big, [33] * 6)
    assert all(len(g) == 2 for g in groups)            # (n + C2)/2 ~ 0.6 n per feature beats n
    small = rng.integers(0, 33, (40, 6))
    assert plan_groups(small, [33] * 6) == [(f,) for f in range(6)]
    # cells are counted exactly: two identical features have only 33 joint cells -> triples pay off
    same = np.repeat(rng.integers(0, 33, (3000, 1)), 6, axis=1)
    assert all(len(g) == 3 for g in plan_groups(same, [33] * 6))
    # groups cover every feature once, in order
    assert [f for g in plan_groups(big[:, :5], [33] * 5) for f in g] == list(range(5))
    # a code space above MAX_JOINT_CELLS stays feature by feature
    wide = rng.integers(0, 257, (5000, 3))
    assert plan_groups(wide, [257] * 3, joint=3) == [(0,), (1,), (2,)]
    assert plan_groups(wide, [257] * 3, joint=2) == [(0, 1), (2,)]         # 66049 cells: allowed
    assert plan_groups(wide, [257] * 3) == [(0,), (1,), (2,)]              # but n=5000 < C: no gain
    with pytest.raises(ValueError):
        plan_groups(big, [33] * 6, joint=4)


def test_block_sums_joint_cells_cover_rare_and_missing_bins():
    # every row in one joint cell except one: the marginals must still see that row
    n = 300
    bins = np.zeros((n, 2), dtype=np.uint16)
    bins[7] = [32, 1]
    vals = list(range(1, n + 1))
    sums = block_sums(vals, bins, [33, 2], None, joint=2)
    assert sums[0] == sum(vals) - 8 and sums[32] == 8 and sums[33] == sum(vals) - 8 and sums[34] == 8
    assert sum(sums[:33]) == sum(sums[33:]) == sum(vals)


# --- the training's kernel on the executor ------------------------------------------
@pytest.mark.parametrize("joint", ["auto", 1])
@pytest.mark.parametrize("max_rows", [None, 90])
def test_sharded_histograms_on_the_workers_equal_the_inline_kernel(enc_problem, executor, always_parallel, joint,
                                                                   max_rows):
    """ShardSet.histograms (what training runs: one task per worker over its shards, the partials
    summed in slices on the workers) equals the inline kernel, exactly, with empty nodes."""
    enc, dec, n2, plain, cts, bins, offsets, nodes, _ = enc_problem
    expected = reference_histogram(plain, bins, nodes, offsets)
    got = sharded_histograms(executor, cts, bins, nodes, offsets, n2, joint=joint, max_rows=max_rows)
    assert got == node_histograms(cts, bins, nodes, offsets, n2, joint=joint)
    assert [dec.decrypt_signed(h) for h in got] == expected
    assert got[2] == [1] * int(offsets[-1])


def test_a_level_ships_only_node_codes_and_one_task_per_worker(enc_problem, always_parallel):
    """Per level the workers get the rows' node codes (a few bits per row), never the ciphertexts,
    in one task per worker; the reduction then sums one partial per worker, in slices."""
    enc, dec, n2, plain, cts, bins, offsets, nodes, _ = enc_problem
    with LocalExecutor(2, "codes") as p:
        sent = []
        real = p.submit_on

        def counting(requests):
            sent.extend((wi, h["op"], sum(len(b) for b in blobs)) for wi, (h, blobs) in requests)
            return real(requests)

        p.submit_on = counting
        sharded_histograms(p, cts, bins, nodes[:2], offsets, n2, max_rows=100)
        level = [s for s in sent if s[1] == "shards_hist"]
        assert sorted(wi for wi, _, _ in level) == [0, 1]             # one task per worker
        n = len(plain)
        assert sum(b for _, _, b in level) <= 2 * (n // 8 + 8 * 8)      # two trees of 1-bit codes per row
        assert sum(b for _, op, b in sent if op == "fill") >= n * 256     # the values went in once, at fill


def test_reductions_are_cut_into_slices_for_every_worker():
    for n, w in ((1, 4), (7, 4), (100, 1), (100, 4), (10_000, 16)):
        cuts = reduce_slices(n, w)
        assert cuts[0][0] == 0 and cuts[-1][1] == n and all(b > a for a, b in cuts)
        assert all(x[1] == y[0] for x, y in zip(cuts, cuts[1:]))
        assert len(cuts) <= 2 * w
    assert len(reduce_slices(10_000, 16)) == 32


def test_int_bytes_round_trip():
    vals = [0, 1, 2 ** 2047 + 5, 12345]
    assert bytes_to_ints(ints_to_bytes(vals, 256), 256) == vals
    signed = [-5, 0, 2 ** 100, -(2 ** 1000)]
    assert bytes_to_ints(ints_to_bytes(signed, 130, signed=True), 130, signed=True) == signed


def test_worker_errors_are_reported_and_a_dead_worker_does_not_hang():
    p = LocalExecutor(2, "errors")
    try:
        with pytest.raises(WorkerError, match="unknown slot kind"):
            p.broadcast({"op": "put", "slot": "x", "kind": "nonsense"})
        assert p.closed                                  # a failed executor is closed, not half-used
        with pytest.raises(WorkerError, match="closed"):
            p.broadcast({"op": "ping"})
    finally:
        p.close()
    p = LocalExecutor(2, "dies")
    try:
        p.broadcast({"op": "ping"})
        pids = p.pids
        os.kill(pids[0], signal.SIGKILL)
        with pytest.raises(WorkerError, match="died"):       # (a map may finish on the live worker)
            p.broadcast({"op": "ping"})
    finally:
        p.close()
    for pid in pids:                                     # nothing left running
        assert not alive(pid)


def test_executor_close_is_idempotent_and_stops_workers():
    p = LocalExecutor(2, "close")
    assert not p.started                                 # processes start at first use
    replies = p.broadcast({"op": "ping"})
    pids = [h["pid"] for h, _ in replies]
    assert sorted(pids) == sorted(p.pids) and len(set(pids)) == 2
    p.close()
    p.close()
    assert not any(alive(pid) for pid in pids)


def test_resolve_workers_reads_no_environment(monkeypatch):
    """The crypto floor is handed its worker count (parties.settings reads VFL_N_JOBS, once per
    training): None and 0 are all cores whatever the environment says."""
    monkeypatch.setenv("VFL_N_JOBS", "3")
    assert resolve_workers(2) == 2
    assert resolve_workers(None) == resolve_workers(0) == len(os.sched_getaffinity(0))
    for bad in (-1, 2.5, True, "2", 10_000):
        with pytest.raises(InputError, match="n_jobs must be an integer from 0"):
            resolve_workers(bad)


# --- the executor interface (every implementation must pass these) ---------------------
#: executors under test; a cluster executor (issue 11) adds its factory here
EXECUTORS = {"local": lambda name: LocalExecutor(2, name)}


class _Spy:
    """Counts the requests an executor receives, without changing what it does."""

    def __init__(self, ex):
        self.ex, self.shared, self.mapped = ex, [], 0
        real_broadcast, real_map = ex.broadcast, ex.map

        def broadcast(header, blobs=()):
            if header.get("op") == "put":
                self.shared.append(header["slot"])
            return real_broadcast(header, blobs)

        def mapping(requests):
            self.mapped += len(requests)
            return real_map(requests)

        ex.broadcast, ex.map = broadcast, mapping
        ex.spy = self


@pytest.mark.parametrize("make", EXECUTORS.values(), ids=list(EXECUTORS))
def test_an_executor_shares_once_maps_requests_and_matches_the_inline_kernels(make, enc_problem,
                                                                              always_parallel):
    enc, dec, n2, plain, cts, bins, offsets, nodes, layout = enc_problem
    with make("iface") as ex:
        assert isinstance(ex, Executor) and ex.n_workers == 2
        spy = _Spy(ex)
        # named shared state: a slot holds one local object; the same object is not sent again
        token = object()
        assert not ex.holds("x", token)
        ex.share("x", token, {"kind": "ints", "width": 2, "signed": False}, [ints_to_bytes([1, 2], 2)])
        ex.share("x", token, {"kind": "ints", "width": 2, "signed": False}, [ints_to_bytes([1, 2], 2)])
        encoded = []
        ex.share_lazy("x", token, lambda: encoded.append(1) or ({}, []))
        assert ex.holds("x", token) and spy.shared == ["x"] and encoded == []
        # requests over the shared state: replies in request order, whoever runs them
        replies = ex.map([({"op": "ping"}, ()) for _ in range(5)])
        assert len(replies) == 5 and {h["pid"] for h, _ in replies} <= set(ex.pids)
        assert len(ex.broadcast({"op": "ping"})) == ex.n_workers
        # every kernel: on the workers == inline
        assert sharded_histograms(ex, cts, bins, nodes, offsets, n2) == node_histograms(cts, bins, nodes, offsets, n2)
        w, per = layout.value_bits, 5
        flat = [v for h in node_histograms(cts, bins, nodes, offsets, n2) for v in h]
        assert compress(flat[:200], w, per, n2, executor=ex) == compress(flat[:200], w, per, n2)
        shifted = enc.encrypt(shifted_plaintexts(plain, w, per), executor=ex)
        assert sharded_histograms(ex, shifted, bins, nodes, offsets, n2, layout=layout, shifts=per, per=per) == \
            compressed_histogram(shifted, bins, nodes, offsets, w, per, n2, shifts=per)
        assert dec.decrypt_signed(cts[:50], executor=ex) == dec.decrypt_signed(cts[:50]) == list(plain[:50])
        assert spy.mapped > 0 and ex.cpu_seconds > 0
        peaks = ex.worker_peaks()
        assert sorted(p["pid"] for p in peaks) == sorted(ex.pids)
    assert ex.closed and not ex.started
    with pytest.raises(WorkerError, match="closed"):
        ex.map([({"op": "ping"}, ())])


def test_closed_local_executors_keep_their_worker_peaks_for_the_benchmarks():
    with LocalExecutor(2, "peaks") as ex:
        pids = sorted(h["pid"] for h, _ in ex.broadcast({"op": "ping"}))
    mine = [p for p in LocalExecutor.closed_peaks() if p["pool"] == "peaks" and p["pid"] in pids]
    assert sorted(p["pid"] for p in mine) == pids
    assert all(p["peak_kb"] and p["peak_kb"] > 0 for p in mine)
    assert sorted(p["pid"] for p in ex.worker_peaks()) == pids


# --- the parallelism policy: one object decides inline or on the workers --------------
def test_the_default_policy_keeps_the_measured_thresholds():
    pol = parallel.POLICY
    assert (pol.histogram, pol.compress, pol.encrypt, pol.decrypt, pol.reduce) == (60_000, 40_000, 256, 16, 8_000)
    with LocalExecutor(2, "policy") as ex:
        assert not parallel.on_workers(ex, "histogram", 59_999) and parallel.on_workers(ex, "histogram", 60_000)
        assert not parallel.on_workers(ex, "reduce", 7_999) and parallel.on_workers(ex, "reduce", 8_000)
        assert not parallel.on_workers(ex, "encrypt", 255) and parallel.on_workers(ex, "encrypt", 256)
        assert not parallel.on_workers(None, "decrypt", 10 ** 9)
        assert not ex.started                               # deciding starts nothing
    assert not parallel.on_workers(LocalExecutor(1, "one"), "decrypt", 10 ** 9)   # one job: in process


@pytest.mark.parametrize("switch", [False, True])
def test_one_switch_sends_tiny_batches_to_the_workers_with_equal_results(request, enc_problem, switch):
    if switch:
        request.getfixturevalue("always_parallel")
    enc, dec, n2, plain, cts, bins, offsets, nodes, layout = enc_problem
    with LocalExecutor(2, "switch") as executor:
        spy = _Spy(executor)
        _tiny_batches(executor, enc, dec, n2, plain, cts, bins, offsets, nodes)
    counts = spy.counts
    assert all(c > 0 for c in counts) if switch else counts == [0, 0, 0, 0]


def _tiny_batches(executor, enc, dec, n2, plain, cts, bins, offsets, nodes):
    """One tiny batch per kernel; records in ``spy.counts`` the requests each sent to the workers."""
    spy = executor.spy
    w2 = (int(n2).bit_length() + 7) // 8
    combine = {"op": "combine", "modulus": format(int(n2), "x"), "width": w2}
    parts = [ints_to_bytes(cts[:3], w2), ints_to_bytes(cts[3:6], w2)]       # a tiny reduction
    assert bytes_to_ints(executor.sum_parts(parts, combine), w2) == [a * b % n2 for a, b in zip(cts[:3], cts[3:6])]
    after_hist = spy.mapped
    assert compress(cts[:4], 40, 2, n2, executor=executor) == compress(cts[:4], 40, 2, n2)
    after_compress = spy.mapped
    assert dec.decrypt_signed(cts[:3], executor=executor) == list(plain[:3])
    after_decrypt = spy.mapped
    got = enc.encrypt([1, -2, 3], executor=executor)
    assert dec.decrypt_signed(got) == [1, -2, 3]
    spy.counts = [after_hist, after_compress - after_hist, after_decrypt - after_compress,
                  spy.mapped - after_decrypt]


# --- compression ------------------------------------------------------------------
def _flat_expected(plain, bins, offsets, nodes):
    return [v for h in reference_histogram(plain, bins, nodes, offsets) for v in h]


def test_compressed_histograms_decrypt_to_the_plaintext_sums_both_ways(enc_problem, executor, always_parallel):
    enc, dec, n2, plain, cts, bins, offsets, nodes, layout = enc_problem
    per = layout.values_per_plaintext(1024)
    assert per >= 10
    flat = _flat_expected(plain, bins, offsets, nodes)
    eg, eh = unpack(flat, layout)
    w = layout.value_bits

    def check(packed):
        assert len(packed) == -(-len(flat) // per)     # >= 10x fewer ciphertexts than bins
        g, h = decode_sums(dec.decrypt_signed(packed), layout, per, len(flat))
        assert g.tolist() == eg.tolist() and h.tolist() == eh.tolist()

    check(compressed_histogram(cts, bins, nodes, offsets, w, per, n2))                # Horner, inline
    check(compressed_histogram(cts, bins, nodes, offsets, w, per, n2, executor=executor))     # Horner, workers
    shifted = enc.encrypt(shifted_plaintexts(plain, w, per), executor=executor)
    check(compressed_histogram(shifted, bins, nodes, offsets, w, per, n2, shifts=per))             # direct
    check(sharded_histograms(executor, shifted, bins, nodes, offsets, n2, layout=layout, shifts=per,
                             per=per))                                                        # direct, workers
    # plaintext mode follows the same slot layout
    direct_plain = compressed_histogram(shifted_plaintexts(plain, w, per), bins, nodes, offsets, w, per,
                                        shifts=per)
    assert direct_plain == compress(flat, w, per)
    with pytest.raises(ValueError):
        compressed_histogram(cts, bins, nodes, offsets, w, per, n2, shifts=2)


def test_compress_on_the_workers_equals_inline(enc_problem, executor, always_parallel):
    enc, dec, n2, plain, cts, *_ = enc_problem
    vals = cts[:95]
    assert compress(vals, 40, 7, n2, executor=executor) == compress(vals, 40, 7, n2)


def test_direct_block_partials_merge_across_row_ranges():
    plain, bins, offsets, nodes, layout = _problem(n=200)
    per, w = 6, 50
    shifted = shifted_plaintexts(plain, w, per)
    rows = nodes[0]
    nb = np.diff(offsets).tolist()
    c0, whole = direct_block(shifted, 200, rows, bins[rows], 0, nb, per)
    a0, first = direct_block(shifted, 200, rows[:77], bins[rows[:77]], 0, nb, per)
    b0, second = direct_block(shifted, 200, rows[77:], bins[rows[77:]], 0, nb, per)
    assert c0 == a0 == b0 == 0 and [x + y for x, y in zip(first, second)] == whole


def test_choose_shifts_prefers_copies_for_small_data_and_horner_for_large():
    # breast-like: 455 rows, 660 passive slots per node, depth 4, 12 sums per ciphertext: some copies
    # (a few remove most squarings; all 12 only when encryption is cheap enough)
    assert choose_shifts(455, 660, 12, 81, 4) == 6
    assert choose_shifts(455, 660, 12, 81, 4, encrypt_cost=1) == 12
    # default_credit-like: 24,000 rows, 330 slots, depth 3
    assert choose_shifts(24_000, 330, 10, 93, 3) == 1
    assert choose_shifts(455, 660, 1, 81, 4) == 1


# --- histogram subtraction --------------------------------------------------------
def test_subtracted_histograms_decrypt_to_exactly_the_directly_built_ones(enc_problem):
    """The active party builds the smaller child and takes parent - child in plaintext
    after decryption: exactly the sibling's own histogram, to the last fixed-point unit."""
    enc, dec, n2, plain, cts, bins, offsets, _, layout = enc_problem
    rng = np.random.default_rng(5)
    parent = np.arange(len(plain))
    left = np.flatnonzero(rng.random(len(plain)) < 0.3)
    right = np.setdiff1d(parent, left)
    per = layout.values_per_plaintext(1024)
    total = int(offsets[-1])
    hp, hl, hr = (decode_sums(dec.decrypt_signed(compressed_histogram(cts, bins, [rows], offsets,
                                                                      layout.value_bits, per, n2)),
                              layout, per, total) for rows in (parent, left, right))
    assert (hp[0] - hl[0]).tolist() == hr[0].tolist()      # gradient sums
    assert (hp[1] - hl[1]).tolist() == hr[1].tolist()      # hessian sums
    # and the float64 view the boosting loop subtracts is exact as well
    scale = 2.0 ** layout.precision_bits
    f = lambda a: np.array([float(v) for v in a[:, 0]]) / scale  # noqa: E731
    assert np.array_equal(f(hp[0]) - f(hl[0]), f(hr[0])) and np.array_equal(f(hp[1]) - f(hl[1]), f(hr[1]))


# --- encryption and decryption --------------------------------------------------
def test_fixed_base_table_matches_powmod(keypair):
    pub, _ = keypair
    n2 = gmpy2.mpz(pub.nsquare)
    base = gmpy2.mpz(123456789) ** 20 % n2
    for window, bits in ((11, 160), (8, 160), (5, 7)):
        t = FixedBaseTable(base, n2, bits, window)
        assert t.n_windows == -(-bits // window) and t.exponent_bits >= bits
        digits = t.random_digits(30)
        assert all(len(d) == t.n_windows and all(0 <= x < 2 ** window for x in d) for d in digits)
        for d in digits:
            e = sum(x << (window * j) for j, x in enumerate(d))
            assert t.pow_digits(d) == gmpy2.powmod(base, e, n2)
        top = [2 ** window - 1] * t.n_windows
        assert t.pow_digits([0] * t.n_windows) == 1
        assert t.pow_digits(top) == gmpy2.powmod(base, 2 ** t.exponent_bits - 1, n2)
    # the random digits use every value of the window (uniform, not biased to a subrange)
    t = FixedBaseTable(base, n2, 8, 4)
    seen = {x for d in t.random_digits(500) for x in d}
    assert seen == set(range(16))


@pytest.mark.parametrize("method", ["fast", "standard"])
def test_encryption_on_the_workers_decrypts_with_phe_and_is_randomized(keypair, executor, always_parallel, method):
    pub, priv = keypair
    enc = Encryptor(pub, priv, method=method)
    vals = [0, 1, -1, 7, 7, 7, -(2 ** 300), int(pub.n) // 2 - 1] * 5
    cts = enc.encrypt(vals, executor=executor)
    assert len(set(int(c) for c in cts)) == len(cts)    # fresh randomness per value, per worker
    assert all(priv.raw_decrypt(int(c)) == v % pub.n for c, v in zip(cts, vals))
    dec = Decryptor(priv)
    assert dec.decrypt_signed(cts, executor=executor) == vals == dec.decrypt_signed(cts)
    with pytest.raises(OverflowError):
        enc.encrypt([int(pub.n) // 2 + 1], executor=executor)


def test_fast_encryption_short_exponents_are_fresh_and_full_length(keypair):
    pub, priv = keypair
    enc = Encryptor(pub, priv, "fast")
    assert enc.exponent_bits == 160 and enc.tables[0].n_windows == 20   # 2 * 80 bits
    r = [enc.obfuscator() for _ in range(50)]
    assert len(set(int(x) for x in r)) == 50
    # every obfuscator is an n-th power: it decrypts to zero
    assert Decryptor(priv).decrypt(r) == [0] * 50
    # the worker's copy of the key encrypts with the same hs (its table comes from the same state)
    twin = Encryptor.from_state(enc.state())
    assert twin.hs == enc.hs and Decryptor(priv).decrypt_signed(twin.encrypt([5, -5])) == [5, -5]


def test_joint_bins_perform_fewer_additions_than_the_textbook_count():
    rng = np.random.default_rng(1)
    n, F = 20000, 6
    bins = rng.integers(0, 33, (n, F)).astype(np.uint16)
    offsets = np.arange(F + 1) * 33
    vals = [int(v) for v in rng.integers(1, 1000, n)]
    textbook = n * F - sum(int(np.count_nonzero(np.bincount(bins[:, f]))) for f in range(F))
    one, auto = {}, {}
    assert node_histograms(vals, bins, [np.arange(n)], offsets, joint=1, stats=one) == \
        node_histograms(vals, bins, [np.arange(n)], offsets, stats=auto)
    assert one["additions"] == textbook
    # pairs: n - C + 2 (C - 33) per pair instead of 2 (n - 33)
    assert auto["additions"] < 0.6 * textbook


@pytest.mark.parametrize("per", [6, 7])
def test_fewer_copies_then_horner_equal_one_copy_per_slot(per):
    """``k`` copies with stride ``s``: rows go into ``s`` accumulators per output, Horner joins them;
    the outputs equal those of a copy per slot (and of no copy at all), for every useful ``k``,
    at any slot offset of the request."""
    plain, bins, offsets, nodes, layout = _problem(n=200)
    w = 50
    rows = nodes[0]
    nb = np.diff(offsets).tolist()
    for slot0 in (0, 5, 2 * per + 3):
        c_ref, ref = direct_block(shifted_plaintexts(plain, w, per), 200, rows, bins[rows], slot0, nb, per)
        for k in shift_choices(per):
            s = stride_for(per, k)
            copies = shifted_plaintexts(plain, w, k, s)
            c0, accs = direct_block(copies, 200, rows, bins[rows], slot0, nb, per, None, s)
            assert c0 == c_ref and len(accs) == len(ref) * s
            assert compress(accs, w, s) == ref
