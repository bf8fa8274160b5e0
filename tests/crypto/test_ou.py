"""Okamoto-Uchiyama in the crypto floor: keys, round trips, homomorphic sums against a naive
twin, packing at the extremes of OU's smaller plaintext space, the kernels, the scheme seam."""
import warnings

import gmpy2
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from oracles import compressed_histogram, node_histograms, reference_histogram, sharded_histograms
from support import KEY_BITS

from crypto import ou, parallel, schemes
from crypto.compress import compress, shifted_plaintexts
from crypto.executor import InlineExecutor, LocalExecutor
from crypto.keys import WeakKeyWarning
from crypto.obfuscators import StockKeeper
from crypto.packing import PackingLayout, PackingOverflowError, decode_sums, pack, unpack
from vfl.core.errors import InputError


@pytest.fixture(scope="module")
def oukey():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", WeakKeyWarning)
        return ou.generate_keypair(KEY_BITS)


@pytest.fixture(scope="module")
def crypt(oukey):
    pub, priv = oukey
    return ou.Encryptor(pub, priv), ou.Decryptor(priv)


@pytest.mark.parametrize("bits", [1024, 2048, 3072])
def test_key_generation_sizes(bits):
    pub, priv = ou.generate_keypair(bits)
    assert pub.n.bit_length() == bits
    assert priv.p.bit_length() == ou.prime_bits(bits) and priv.p * priv.p * priv.q == pub.n
    assert gmpy2.is_prime(priv.p) and gmpy2.is_prime(priv.q) and priv.p != priv.q
    assert pow(pub.g, pub.n, pub.n) == pub.h
    assert gmpy2.gcd(priv.p, priv.q - 1) == 1 and gmpy2.gcd(priv.q, priv.p - 1) == 1
    # Coron-Naccache-Paillier: p - 1 has a prime factor t of twice the security level, h^t = 1 mod p^2
    assert gmpy2.is_prime(priv.t) and (priv.p - 1) % priv.t == 0 and (priv.q - 1) % priv.t
    assert priv.t.bit_length() == {1024: 160, 2048: 224, 3072: 256}[bits]
    assert pow(pub.h, priv.t, priv.p ** 2) == 1 and priv.exponent == priv.t
    ou.check_private_key(priv.p, priv.q, pub.g, pub.h, priv.t)
    assert pub.plain_bits == bits // 3 and pub.cipher_modulus == pub.n
    assert schemes.scheme_of(pub) == "ou" and schemes.cipher_modulus(pub) == pub.n
    ou.check_private_key(priv.p, priv.q, pub.g, pub.h)        # a generated key passes its own checks
    if bits == 3072:
        return
    enc, dec = ou.Encryptor(pub, priv), ou.Decryptor(priv)
    vals = [0, 1, -1, enc.max_int, -enc.max_int]
    assert dec.decrypt_signed(enc.encrypt(vals)) == vals


def test_exponent_length_is_twice_the_security_level(oukey):
    pub, priv = oukey
    assert ou.Encryptor(pub, priv).exponent_bits >= 160          # 1024 bits: 80-bit security
    pub2, _ = ou.generate_keypair(2048)
    assert ou.Encryptor(pub2).exponent_bits >= 224                # 2048 bits: 112-bit security


def test_wider_table_windows_keep_the_exponent_length(oukey):
    """12-bit windows at 2048 bits (20 windows, 240 bits of digits): the top digit keeps only the
    2 bits that make r uniform below 2^230, exactly the 10-bit-window exponent."""
    pub2, _ = ou.generate_keypair(2048)
    enc = ou.Encryptor(pub2)
    assert enc.exponent_bits == 230 and ou.ou_window(2048) == 12
    cols = enc._random_columns(4000)
    assert cols.shape == (20, 4000) and int(cols[:-1].max()) == 2 ** 12 - 1
    assert int(cols[-1].max()) == 3 and int(cols[-1].min()) == 0
    e = sum(int(d) << (12 * j) for j, d in enumerate(cols[:, 0]))
    assert enc.tables[0].pow_digits(cols[:, 0].tolist()) == gmpy2.powmod(enc.h, e, enc.n)


def test_a_shorter_exponent_only_on_request_and_only_within_bounds(oukey):
    """benchmarks/schemes.py measures our encryption at HEU's exponent length: the override sets the
    digits drawn (80 bits at 1024-bit keys: 10 windows of 8 bits), the default stays 2 x security,
    the worker state never carries it, and the ciphertexts still decrypt."""
    pub, priv = oukey
    short = ou.Encryptor(pub, priv, exponent_bits=80)
    assert short.exponent_bits == 80 and ou.Encryptor(pub, priv).exponent_bits == 160
    assert short.tables[0].n_windows == 10
    assert "exponent_bits" not in short.state()
    assert ou.Encryptor.from_state(short.state()).exponent_bits == 160
    vals = [0, 1, -1, 2 ** 200, -(2 ** 200)]
    assert ou.Decryptor(priv).decrypt_signed(short.encrypt(vals)) == vals
    for bad in (63, 161):
        with pytest.raises(ValueError, match="exponent_bits must be 64..160"):
            ou.Encryptor(pub, priv, exponent_bits=bad)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(min_value=-(2 ** 338) + 1, max_value=2 ** 338 - 1), min_size=1, max_size=12),
       st.sampled_from(["fast", "standard"]), st.booleans())
def test_round_trip(crypt, oukey, values, method, holder):
    pub, priv = oukey
    enc = ou.Encryptor(pub, priv if holder else None, method) if (method, holder) != ("fast", True) else crypt[0]
    dec = crypt[1]
    assert all(abs(v) <= enc.max_int for v in values)
    cts = enc.encrypt(values)
    assert all(0 < c < pub.n for c in cts)
    assert dec.decrypt_signed(cts) == values
    assert dec.decrypt(cts) == [v % priv.p for v in values]


@settings(max_examples=30, deadline=None)
@given(st.integers(min_value=-(2 ** 338) + 1, max_value=2 ** 338 - 1))
def test_the_key_holders_closed_form_message_part_is_in_gs_coset(crypt, oukey, m):
    """``G^m = 1 + p q ((m s / q) mod p)`` (no exponentiation) and the public ``g^m`` differ by an
    n-th power: the quotient decrypts to 0, ``G^m`` is 1 mod q and ``1 + m t p`` mod p^2."""
    enc, dec = crypt
    pub, priv = oukey
    holder = enc.message_part(m)
    public = pub.encryptor().message_part(m)
    assert dec.decrypt([holder * gmpy2.invert(public, pub.n) % pub.n]) == [0]
    assert dec.decrypt_signed([holder, public]) == [m, m]
    assert holder % priv.q == 1 and holder % priv.p ** 2 == (1 + (m * enc._s % priv.p) * priv.p) % priv.p ** 2


def test_decryption_raises_to_p_minus_1_whatever_t(crypt, oukey):
    """Decryption raises to p - 1 for both key kinds (issue 31): a passive party's reply carries its
    own y^n, whose (p-1)-part lies outside g's subgroup, so raising to t (Coron-Naccache-Paillier)
    would not remove it; the key holder's own ciphertexts decrypt the same either way."""
    enc, dec = crypt
    pub, priv = oukey
    textbook = ou.Decryptor(ou.OUPrivateKey(pub, priv.p, priv.q))
    assert textbook.e == priv.p - 1 and dec.e == priv.p - 1 and priv.t and priv.t != priv.p - 1
    c = enc.encrypt([41])[0]
    y_n = gmpy2.powmod(gmpy2.mpz(987654321), pub.n, pub.n)
    assert dec.decrypt_signed([c * y_n % pub.n]) == [41]
    p2 = gmpy2.mpz(priv.p) ** 2
    by_t = ((gmpy2.powmod(c * y_n % pub.n, priv.t, p2) - 1) // priv.p) * gmpy2.invert(
        ((gmpy2.powmod(pub.g, priv.t, p2) - 1) // priv.p) % priv.p, priv.p) % priv.p
    assert by_t != 41
    vals = [0, 5, -5, enc.max_int, -enc.max_int, 2 ** 200 + 3]
    cts = enc.encrypt(vals) + pub.encrypt(vals)
    assert textbook.decrypt_signed(cts) == dec.decrypt_signed(cts) == vals + vals
    # a textbook key (no t) encrypts and decrypts too, also through the worker state
    tb_enc = ou.Encryptor(pub, ou.OUPrivateKey(pub, priv.p, priv.q))
    assert tb_enc._e == priv.p - 1
    again = ou.Encryptor.from_state(tb_enc.state())
    assert again._e == priv.p - 1 and textbook.decrypt_signed(again.encrypt([-9, 9])) == [-9, 9]
    assert dec.decrypt_signed(tb_enc.encrypt([-9, 9])) == [-9, 9]


def test_randomized_and_rerandomized(crypt, oukey):
    enc, dec = crypt
    pub, _ = oukey
    a, b = enc.encrypt([7, 7])
    assert a != b
    c = pub.rerandomize([a])[0]
    assert c != a and dec.decrypt_signed([c]) == [7]
    d = enc.rerandomize([a])[0][0]
    assert d not in (a, c) and dec.decrypt_signed([d]) == [7]


def test_out_of_range_plaintext_refused(crypt):
    enc, _ = crypt
    with pytest.raises(OverflowError):
        enc.encrypt([enc.max_int + 1])
    with pytest.raises(OverflowError):
        enc.encrypt([-enc.max_int - 1])


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(min_value=-(2 ** 64), max_value=2 ** 64), min_size=1, max_size=30),
       st.integers(min_value=-1000, max_value=1000))
def test_homomorphic_sums_against_a_naive_twin(crypt, oukey, values, k):
    """Products mod n are sums; powers are multiples; the twin is plain integer arithmetic."""
    enc, dec = crypt
    pub, _ = oukey
    cts = enc.encrypt(values)
    acc = gmpy2.mpz(1)
    for c in cts:
        acc = pub.add(acc, c)
    assert dec.decrypt_signed([acc]) == [sum(values)]
    assert dec.decrypt_signed([pub.mul(cts[0], k)]) == [k * values[0]]
    # the stock path encrypts the same plaintexts
    enc.stock.fill(len(values))
    stocked, from_stock, on_spot = enc.encrypt_stocked(values)
    assert (from_stock, on_spot) == (len(values), 0)
    assert dec.decrypt_signed(stocked) == values


@settings(max_examples=25, deadline=None)
@given(st.integers(1, 4), st.integers(1, 2000), st.sampled_from([1, -1]), st.booleans(),
       st.floats(0.5, 8.0))
def test_packing_bounds_at_the_extremes(crypt, oukey, n_targets, max_rows, sign, weighted, scale):
    """Sums of max_rows extreme values (every sign, many targets, weights scale the bounds) fill
    OU's smaller plaintext space and still decode exactly after Horner compression."""
    enc, dec = crypt
    pub, _ = oukey
    g_bound = scale if weighted else 1.0
    layout = PackingLayout.for_bounds(g_bound, g_bound / 4, max_rows=max_rows, n_targets=n_targets)
    try:
        per = layout.values_per_plaintext(pub.plain_bits)
    except PackingOverflowError:
        assert layout.value_bits > pub.plain_bits - 2
        return
    assert per * layout.value_bits <= pub.plain_bits - 2
    assert per < layout.values_per_plaintext(pub.n.bit_length())    # fewer than Paillier would hold
    # per slots, each the sum of max_rows extreme rows (the sum's own encrypted form)
    g = np.full((1, n_targets), sign * layout.g_max, dtype=np.int64)
    h = np.full((1, n_targets), layout.h_max, dtype=np.int64)
    (one,) = pack(g, h, layout)
    cts = enc.encrypt([one])
    summed = pub.mul(cts[0], max_rows)
    packed = compress([summed] * per, layout.value_bits, per, pub.n)
    gs, hs = decode_sums(dec.decrypt_signed(packed), layout, per, per)
    assert gs.tolist() == [[sign * max_rows * layout.g_max] * n_targets] * per
    assert hs.tolist() == [[max_rows * layout.h_max] * n_targets] * per


def _problem(n=60, seed=0):
    rng = np.random.default_rng(seed)
    n_bins = np.array([4, 2, 5])
    bin_idx = np.stack([rng.integers(0, nb, n) for nb in n_bins], axis=1).astype(np.uint16)
    offsets = np.concatenate([[0], np.cumsum(n_bins)])
    node_rows = [np.arange(n), np.flatnonzero(rng.random(n) < 0.4), np.array([], dtype=np.int64)]
    return bin_idx, offsets, node_rows


@pytest.mark.parametrize("joint", [1, 2, 3])
def test_histogram_kernel_and_compression_mod_n(crypt, oukey, joint):
    """The joint-bins kernel and Horner compression, given OU's modulus, sum exactly."""
    enc, dec = crypt
    pub, _ = oukey
    rng = np.random.default_rng(2)
    layout = PackingLayout.for_bounds(1.0, 0.25, max_rows=60)
    g = rng.integers(-layout.g_max, layout.g_max, (60, 1))
    h = rng.integers(0, layout.h_max, (60, 1))
    plain = pack(g, h, layout)
    bin_idx, offsets, node_rows = _problem()
    expected = reference_histogram(plain, bin_idx, node_rows, offsets)
    cts = enc.encrypt(plain)
    got = node_histograms(cts, bin_idx, node_rows, offsets, modulus=gmpy2.mpz(pub.n), joint=joint)
    assert [dec.decrypt_signed(node) for node in got] == expected
    # the training's kernel (ShardSet.histograms on an executor) gives the same sums mod n
    assert sharded_histograms(InlineExecutor(), cts, bin_idx, node_rows, offsets, gmpy2.mpz(pub.n),
                              joint=joint) == got
    per = layout.values_per_plaintext(pub.plain_bits)
    flat = [v for node in got for v in node]
    packed = compressed_histogram(cts, bin_idx, node_rows, offsets, layout.value_bits, per, pub.n,
                                  executor=InlineExecutor())
    gs, hs = decode_sums(dec.decrypt_signed(packed), layout, per, len(flat))
    eg, eh = unpack([v for node in expected for v in node], layout)
    assert gs.tolist() == eg.tolist() and hs.tolist() == eh.tolist()
    # pre-shifted copies (no Horner) give the same sums
    shifted = enc.encrypt(shifted_plaintexts(plain, layout.value_bits, per))
    direct = compressed_histogram(shifted, bin_idx, node_rows, offsets, layout.value_bits, per, pub.n,
                                  shifts=per)
    gd, hd = decode_sums(dec.decrypt_signed(direct), layout, per, len(flat))
    assert gd.tolist() == eg.tolist() and hd.tolist() == eh.tolist()


def test_worker_state_round_trip(crypt, oukey):
    enc, dec = crypt
    e2 = schemes.encryptor_from_state(enc.state())
    d2 = schemes.decryptor_from_state(dec.state())
    assert isinstance(e2, ou.Encryptor) and isinstance(d2, ou.Decryptor)
    assert d2.decrypt_signed(e2.encrypt([-3, 4])) == [-3, 4]
    assert dec.decrypt_signed(e2.obfuscators(2)) == [0, 0]


@settings(max_examples=30, deadline=None)
@given(st.data())
def test_key_message_fields_round_trip(oukey, data):
    pub, _ = oukey
    f = schemes.public_key_fields(pub)
    back = schemes.public_key_from_fields(f["scheme"], int(f["n"], 16), int(f["g"], 16), int(f["h"], 16))
    assert back == pub
    # any tampering with g or h into something not a unit is refused
    bad = data.draw(st.sampled_from([0, 1, pub.n, pub.n + 5]))
    with pytest.raises(InputError, match="OU public key"):
        schemes.public_key_from_fields("ou", pub.n, bad, pub.h)


def test_bad_keys_refused_with_a_clear_error(oukey):
    pub, priv = oukey
    with pytest.raises(InputError, match="not acceptable"):
        ou.check_public_key(pub.n * 2, pub.g, pub.h)
    with pytest.raises(InputError, match="not acceptable"):
        ou.check_public_key(2 ** 511 + 1, 3, 5)
    with pytest.raises(InputError, match="perfect square"):
        ou.check_public_key((priv.p * priv.q) ** 2, pub.g, pub.h)
    with pytest.raises(InputError, match="shares a factor"):
        ou.check_public_key(pub.n, priv.p * 5, pub.h)
    with pytest.raises(InputError, match="not a prime"):     # p + 1 is even (p + 2 was prime ~1% of keys)
        ou.check_private_key(priv.p + 1, priv.q, pub.g, pub.h)
    with pytest.raises(InputError, match="must differ"):
        ou.check_private_key(priv.p, priv.p, pub.g, pub.h)
    with pytest.raises(InputError, match="h is not g"):
        ou.check_private_key(priv.p, priv.q, pub.g, pub.h * pub.g % pub.n)
    with pytest.raises(InputError, match="t must be a prime factor of p - 1"):
        ou.check_private_key(priv.p, priv.q, pub.g, pub.h, priv.t + 2)
    with pytest.raises(InputError, match="needs g and h"):
        schemes.public_key_from_fields("ou", pub.n)
    with pytest.raises(InputError, match="OU key sent as Paillier"):
        schemes.public_key_from_fields("paillier", pub.n, pub.g, pub.h)
    with pytest.raises(InputError, match="unknown encryption scheme"):
        schemes.check_scheme("rsa")
    with pytest.raises(InputError, match="at least 1024"):
        ou.generate_keypair(512)


def test_scheme_seam_sizes():
    assert schemes.plain_bits(2048, "ou") == 682 and schemes.plain_bits(2048, "paillier") == 2048
    assert schemes.cipher_bits(2048, "ou") == 2048 and schemes.cipher_bits(2048, "paillier") == 4096
    assert schemes.plain_bits(3072, "ou") == 1024
    assert 10 < schemes.encrypt_cost(2048, "ou") < schemes.encrypt_cost(3072, "ou") < 30
    layout = PackingLayout.for_bounds(1.0, 0.25, max_rows=100_000)
    assert layout.values_per_plaintext(schemes.plain_bits(2048, "ou")) \
        < layout.values_per_plaintext(schemes.plain_bits(2048, "paillier"))


def test_worker_processes_encrypt_decrypt_and_stock_ou(crypt, oukey, monkeypatch):
    """Batches spread over worker processes rebuild an OU encryptor/decryptor from its state."""
    enc, dec = crypt
    monkeypatch.setattr(parallel, "POLICY", parallel.ParallelPolicy.always())
    values = list(range(-20, 20))
    with LocalExecutor(2, "ou") as ex:
        cts = enc.encrypt(values, executor=ex)
        assert all(0 < c < oukey[0].n for c in cts)
        assert dec.decrypt_signed(cts, executor=ex) == values
        keeper = StockKeeper(ex, enc)
        ex.share(keeper.SLOT, enc, {"kind": "encryptor", "state": enc.state()})
        replies = ex.run_on([(i, ({"op": "obf_fill", "slot": keeper.SLOT, "count": 5, "target": 5}, []))
                             for i in range(ex.n_workers)])
        assert [h["added"] for h, _ in replies] == [5, 5]
