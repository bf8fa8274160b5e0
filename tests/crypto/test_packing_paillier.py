"""Encoding, packing, Paillier kernels, histogram and compression: exact round trips."""
import gmpy2
import numpy as np
import pytest

from crypto.compress import compress
from crypto.histogram import histogram, reference_histogram
from crypto.keys import WeakKeyWarning, check_key_bits, generate_keypair
from crypto.packing import PackingLayout, PackingOverflowError, decode_sums, pack, split_digits, unpack
from crypto.paillier import Decryptor, Encryptor
from vfl.core.errors import InputError
from vfl.core.fixedpoint import decode_fixed, encode_fixed


def test_fixed_point_round_trip_and_range():
    x = np.array([-1.0, -0.3, 0.0, 1e-9, 0.25, 1.0])
    ints = encode_fixed(x, 32)
    assert ints.dtype == np.int64
    assert np.allclose(decode_fixed(ints, 32), x, atol=2 ** -33)
    assert encode_fixed([0.5], 32)[0] == 2 ** 31
    with pytest.raises(OverflowError):
        encode_fixed([2.0 ** 22], 32)
    with pytest.raises(InputError):
        encode_fixed([np.nan], 32)


def test_packing_round_trip_negative_gradients():
    layout = PackingLayout.for_bounds(1.0, 0.25, max_rows=100)
    rng = np.random.default_rng(0)
    g = encode_fixed(rng.uniform(-1, 1, 100), 32)[:, None]
    h = encode_fixed(rng.uniform(0, 0.25, 100), 32)[:, None]
    packed = pack(g, h, layout)
    assert any(v < 0 for v in packed)          # negative g gives negative packed values
    gu, hu = unpack(packed, layout)
    assert [int(v) for v in gu[:, 0]] == g[:, 0].tolist()
    assert [int(v) for v in hu[:, 0]] == h[:, 0].tolist()


@pytest.mark.parametrize("sign", [1, -1])
def test_sum_at_the_packing_limit_decodes_exactly(sign):
    n = 1000
    layout = PackingLayout.for_bounds(1.0, 0.25, max_rows=n, n_targets=2)
    g = np.full((n, 2), sign * layout.g_max, dtype=np.int64)
    h = np.full((n, 2), layout.h_max, dtype=np.int64)
    total = sum(pack(g, h, layout))
    gs, hs = unpack([total], layout)
    assert [int(v) for v in gs[0]] == [sign * n * layout.g_max] * 2
    assert [int(v) for v in hs[0]] == [n * layout.h_max] * 2


def test_overflow_is_detected_not_wrapped():
    layout = PackingLayout.for_bounds(1.0, 0.25, max_rows=10)
    with pytest.raises(PackingOverflowError):
        pack(np.full((1, 1), layout.g_max + 1), np.zeros((1, 1), dtype=np.int64), layout)
    with pytest.raises(PackingOverflowError):
        pack(np.zeros((1, 1), dtype=np.int64), np.full((1, 1), -1), layout)
    with pytest.raises(PackingOverflowError):
        pack(np.zeros((11, 1), dtype=np.int64), np.zeros((11, 1), dtype=np.int64), layout)
    # a sum over more rows than the layout allows no longer decodes: detected
    g = np.full((11, 1), layout.g_max, dtype=np.int64)
    over = sum(pack(g[:10], g[:10] * 0, layout)) * 2
    with pytest.raises(PackingOverflowError):
        split_digits(over, layout.pair_bits, 1)
    with pytest.raises(PackingOverflowError):
        PackingLayout.for_bounds(1.0, 0.25, max_rows=10 ** 6, n_targets=30).values_per_plaintext(1024)


def test_key_size_policy():
    with pytest.raises(InputError, match="at least 1024"):
        check_key_bits(512)
    with pytest.warns(WeakKeyWarning):
        check_key_bits(1024)
    assert check_key_bits(2048) == 2048
    with pytest.raises(InputError):
        generate_keypair(768)


@pytest.mark.parametrize("method", ["fast", "standard"])
def test_raw_encryption_decrypts_with_phe_and_crt(keypair, method):
    pub, priv = keypair
    enc = Encryptor(pub, priv, method=method)
    values = [0, 1, -1, 12345678901234567890, -(2 ** 200), int(pub.n) // 2 - 1]
    cts = enc.encrypt(values)
    assert len(set(int(c) for c in cts)) == len(cts)
    dec = Decryptor(priv)
    assert dec.decrypt_signed(cts) == values
    for v, c in zip(values, cts):   # phe's own private key agrees
        assert priv.raw_decrypt(int(c)) == v % pub.n
    # the same plaintext twice gives different ciphertexts (randomized)
    a, b = enc.encrypt([7, 7])
    assert a != b
    # public-key-only encryption (no CRT) also decrypts
    enc_pub = Encryptor(pub, None, method=method)
    assert dec.decrypt_signed(enc_pub.encrypt([-5, 5])) == [-5, 5]


def test_homomorphic_sum_of_packed_values(keypair):
    pub, priv = keypair
    layout = PackingLayout.for_bounds(1.0, 0.25, max_rows=50)
    rng = np.random.default_rng(1)
    g = encode_fixed(rng.uniform(-1, 1, (50, 1)), 32)
    h = encode_fixed(rng.uniform(0, 0.25, (50, 1)), 32)
    cts = Encryptor(pub, priv).encrypt(pack(g, h, layout))
    n2 = gmpy2.mpz(pub.nsquare)
    acc = gmpy2.mpz(1)
    for c in cts:
        acc = acc * c % n2
    (total,) = Decryptor(priv).decrypt_signed([acc])
    gs, hs = unpack([total], layout)
    assert int(gs[0, 0]) == int(g.sum()) and int(hs[0, 0]) == int(h.sum())


def _problem(n=60, n_features=3, seed=0):
    rng = np.random.default_rng(seed)
    n_bins = np.array([4, 2, 5])[:n_features]
    bin_idx = np.stack([rng.integers(0, nb, n) for nb in n_bins], axis=1).astype(np.uint16)
    offsets = np.concatenate([[0], np.cumsum(n_bins)])
    node_rows = [np.arange(n), np.flatnonzero(rng.random(n) < 0.4), np.array([], dtype=np.int64)]
    return bin_idx, offsets, node_rows


def test_encrypted_histogram_equals_plaintext_histogram(keypair):
    pub, priv = keypair
    layout = PackingLayout.for_bounds(1.0, 0.25, max_rows=60)
    rng = np.random.default_rng(2)
    g = encode_fixed(rng.uniform(-1, 1, (60, 1)), 32)
    h = encode_fixed(rng.uniform(0, 0.25, (60, 1)), 32)
    plain = pack(g, h, layout)
    cts = Encryptor(pub, priv).encrypt(plain)
    bin_idx, offsets, node_rows = _problem()
    expected = reference_histogram(plain, bin_idx, node_rows, offsets)
    assert histogram(plain, bin_idx, node_rows, offsets) == expected
    enc = histogram(cts, bin_idx, node_rows, offsets, modulus=gmpy2.mpz(pub.nsquare))
    dec = Decryptor(priv)
    assert [dec.decrypt_signed(node) for node in enc] == expected
    assert expected[2] == [0] * int(offsets[-1])          # an empty node sums to zero
    assert sum(expected[0][:4]) == sum(plain)               # every row lands in one bin per feature


def test_compressed_histogram_decrypts_to_exact_sums(keypair):
    pub, priv = keypair
    layout = PackingLayout.for_bounds(1.0, 0.25, max_rows=60)
    rng = np.random.default_rng(3)
    g = encode_fixed(rng.uniform(-1, 1, (60, 1)), 32)
    h = encode_fixed(rng.uniform(0, 0.25, (60, 1)), 32)
    plain = pack(g, h, layout)
    bin_idx, offsets, node_rows = _problem()
    n2 = gmpy2.mpz(pub.nsquare)
    flat_plain = [v for node in reference_histogram(plain, bin_idx, node_rows, offsets) for v in node]
    flat_enc = [v for node in histogram(Encryptor(pub, priv).encrypt(plain), bin_idx, node_rows, offsets, n2)
                for v in node]
    per = layout.values_per_plaintext(pub.n.bit_length())
    assert per >= 10                                      # >= 10x fewer decryptions at 1024 bits
    packed = compress(flat_enc, layout.value_bits, per, n2)
    assert len(packed) == -(-len(flat_enc) // per)
    gs, hs = decode_sums(Decryptor(priv).decrypt_signed(packed), layout, per, len(flat_enc))
    eg, eh = unpack(flat_plain, layout)
    assert gs.tolist() == eg.tolist() and hs.tolist() == eh.tolist()
    # plaintext compression follows the same path
    gp, hp = decode_sums(compress(flat_plain, layout.value_bits, per), layout, per, len(flat_plain))
    assert gp.tolist() == eg.tolist() and hp.tolist() == eh.tolist()
