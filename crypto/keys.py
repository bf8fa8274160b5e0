"""Paillier key pairs (phe) with the toolkit's key-size policy.

The active party (label holder) generates the key pair and keeps the private
key; passive parties only ever receive the modulus ``n``.
"""
from __future__ import annotations

import sys
import sysconfig
import warnings
from pathlib import Path

import phe

from datasets.errors import InputError

MIN_KEY_BITS = 1024
DEFAULT_KEY_BITS = 2048
MAX_KEY_BITS = 8192


class WeakKeyWarning(UserWarning):
    """A 1024-bit key: fine for tests and benchmarks, below current guidance for real data.

    Issued once per process and message (a grid search generates a key per fit), at the
    caller's line: the first frame outside this toolkit, the standard library and installed
    packages (your script or notebook cell). An "always" filter that matches it
    (``warnings.simplefilter("always", WeakKeyWarning)``, ``pytest.warns``) issues it every time."""


#: the weak-key messages issued so far in this process
_ISSUED: set[str] = set()

#: the toolkit's own packages and the installed/standard library code: not "the caller"
_TOOLKIT = Path(__file__).resolve().parent.parent
_NOT_CALLERS = tuple(str(p) for p in (*(_TOOLKIT / d for d in ("crypto", "protocols", "vfl", "parties", "datasets")),
                                      _TOOLKIT / "cli.py")) + tuple(
    {str(Path(sysconfig.get_paths()[k]).resolve()) for k in ("stdlib", "platstdlib", "purelib", "platlib")})


def _caller_stacklevel() -> int:
    """``stacklevel`` (for a warning issued by this function's caller) of the first frame outside
    the toolkit, the standard library and installed packages; the outermost frame if none is."""
    frame, level, last = sys._getframe(2), 2, 2
    while frame is not None:
        name = frame.f_code.co_filename
        path = name if name.startswith("<") else str(Path(name).resolve())
        if not (path.startswith(_NOT_CALLERS) or path.startswith("<frozen")):
            return level
        frame, level, last = frame.f_back, level + 1, level
    return last


def _always(text: str) -> bool:
    """Whether the first warnings filter matching a WeakKeyWarning of ``text`` says "always"."""
    for action, msg, category, _module, _lineno in warnings.filters:
        if issubclass(WeakKeyWarning, category) and (msg is None or msg.match(text)):
            return action == "always"
    return False


def _warn_weak(text: str) -> None:
    """Issue ``text`` as a WeakKeyWarning at the caller, once per process (see WeakKeyWarning)."""
    if text in _ISSUED and not _always(text):
        return
    _ISSUED.add(text)
    warnings.warn(text, WeakKeyWarning, stacklevel=_caller_stacklevel())


def check_key_bits(bits: int, scheme: str = "Paillier") -> int:
    """Validate a key size (``scheme`` names the key in messages): refuse < 1024 bits, warn at < 2048 bits."""
    try:
        bits = int(bits)
    except (TypeError, ValueError):
        raise InputError(f"key size must be an integer number of bits, got {bits!r}") from None
    if bits < MIN_KEY_BITS:
        raise InputError(
            f"key size {bits} bits is refused: {scheme} keys must have at least {MIN_KEY_BITS} bits "
            f"(default {DEFAULT_KEY_BITS})")
    if bits > MAX_KEY_BITS:
        raise InputError(f"key size {bits} bits is larger than the supported maximum {MAX_KEY_BITS}")
    if bits % 8:
        raise InputError(f"key size must be a multiple of 8 bits, got {bits}")
    if bits < DEFAULT_KEY_BITS:
        _warn_weak(f"{bits}-bit {scheme} keys offer about 80-bit security: use {DEFAULT_KEY_BITS} bits or more "
                   "for real data")
    return bits


def generate_keypair(bits: int = DEFAULT_KEY_BITS):
    """Return ``(public_key, private_key)`` as phe objects, after the key-size policy."""
    bits = check_key_bits(bits)
    return phe.paillier.generate_paillier_keypair(n_length=bits)


def public_key_from_n(n: int) -> phe.PaillierPublicKey:
    """Rebuild a public key from the modulus received from the key holder."""
    n = int(n)
    if n.bit_length() < MIN_KEY_BITS - 8 or n % 2 == 0:
        raise InputError(f"received Paillier modulus of {n.bit_length()} bits is not acceptable")
    return phe.PaillierPublicKey(n)


def security_bits(key_bits: int) -> int:
    """Symmetric-equivalent security of an RSA-type modulus (NIST SP 800-57 table)."""
    if key_bits >= 7680:
        return 192
    if key_bits >= 3072:
        return 128
    if key_bits >= 2048:
        return 112
    return 80
