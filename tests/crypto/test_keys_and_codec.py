"""The key-size policy's refusals, the Paillier modulus a passive party accepts, and the integer
codec: gmpy2's native bytes and the pure-Python fallback (older gmpy2) write the same bytes."""
import gmpy2
import pytest
from hypothesis import given
from hypothesis import strategies as st

from crypto import intcodec
from crypto.keys import MAX_KEY_BITS, check_key_bits, public_key_from_n, security_bits
from vfl.core.errors import InputError


@pytest.mark.parametrize("bits, message", [
    ("big", "key size must be an integer number of bits, got 'big'"),
    (None, "key size must be an integer number of bits, got None"),
    (MAX_KEY_BITS + 8, f"key size {MAX_KEY_BITS + 8} bits is larger than the supported maximum {MAX_KEY_BITS}"),
    (2052, "key size must be a multiple of 8 bits, got 2052"),
    (512, "key size 512 bits is refused: OU keys must have at least 1024 bits"),
])
def test_the_key_size_policy(bits, message):
    with pytest.raises(InputError, match=message):
        check_key_bits(bits, "OU")


def test_security_levels_and_a_received_modulus():
    assert [security_bits(b) for b in (1024, 2048, 3072, 7680, 8192)] == [80, 112, 128, 192, 192]
    with pytest.raises(InputError, match="received Paillier modulus of 512 bits is not acceptable"):
        public_key_from_n((1 << 511) + 1)
    with pytest.raises(InputError, match="received Paillier modulus of 1024 bits is not acceptable"):
        public_key_from_n(1 << 1023)                 # even
    assert public_key_from_n((1 << 1023) + 1).n == (1 << 1023) + 1


@given(st.lists(st.integers(min_value=-(2 ** 63), max_value=2 ** 63 - 1), max_size=20), st.booleans())
def test_the_fallback_codec_writes_and_reads_what_the_native_one_does(values, signed):
    if not signed:
        values = [abs(v) for v in values]
    width = 9
    native = intcodec.ints_to_bytes(values, width, signed)
    try:
        intcodec._NATIVE_BYTES = False
        fallback = intcodec.ints_to_bytes(values, width, signed)
        back = intcodec.bytes_to_ints(native, width, signed)
    finally:
        intcodec._NATIVE_BYTES = True
    assert fallback == native and len(native) == width * len(values)
    assert back == values and all(isinstance(v, type(gmpy2.mpz(0))) for v in back)
    assert intcodec.bytes_to_ints(native, width, signed) == values


def test_too_wide_a_value_is_refused_by_both_codecs():
    for native in (True, False):
        intcodec._NATIVE_BYTES = native
        try:
            with pytest.raises(OverflowError):
                intcodec.ints_to_bytes([1 << 80], 9)
        finally:
            intcodec._NATIVE_BYTES = True
