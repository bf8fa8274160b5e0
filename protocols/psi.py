"""ECDH private set intersection over X25519: the protocol's math, no parties.

Each party maps every id to a point of Curve25519, ``P(id)``, by hashing
(SHA-256 of a domain tag, the session salt and the id, with a counter: the
first candidate x-coordinate that lies on the curve, not on its twist). It
then *blinds* points with its own secret scalar ``a`` (X25519, i.e. the
x-coordinate of ``[a]P``). Scalar multiplication commutes, so

    X25519(b, X25519(a, P)) == X25519(a, X25519(b, P))

and an id held by both parties ends up with the same *double-blinded* value on
both sides, while a value blinded once by the other party cannot be matched to
an id without that party's scalar (Diffie-Hellman assumption on Curve25519,
the hash modelled as a random oracle). The flow (see ``parties/psi_align.py``):

1. the active party sends its blinded ids ``[a]P(x)`` in a secret random order;
2. each passive party returns them blinded again, ``[b][a]P(x)``, in the same
   order, plus its own blinded ids ``[b]P(y)`` in a secret random order;
3. the active party computes ``[a][b]P(y)`` and compares: it learns which of
   its own ids each passive party holds; the intersection across all parties is
   the ids every passive party holds;
4. it tells each passive party only the *positions* (in that party's list from
   step 2) of the intersection, in the canonical order.

Clamped X25519 scalars are multiples of the cofactor 8, so every value sent
lies in the prime-order subgroup. Scalars are fresh per session and never
leave their party. ``cryptography`` (an optional dependency: the ``net``
extra) provides X25519; it is imported only when PSI is used.
"""
from __future__ import annotations

import hashlib
import secrets

import gmpy2
import numpy as np

from datasets.errors import InputError, ProtocolError
from protocols.alignment import normalize_ids

POINT_BYTES = 32
P25519 = 2 ** 255 - 19
_A = 486662                       # Curve25519: v^2 = u^3 + A u^2 + u
_MASK255 = (1 << 255) - 1
DOMAIN = b"vfl-boost/psi-x25519/v1"
MIN_SALT_BYTES = 16


def _x25519():
    try:
        from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
    except ImportError:
        raise InputError("psi alignment needs the 'cryptography' package (X25519); install it with "
                         "pip install 'vfl-boost[net]' or use --align hash") from None
    return X25519PrivateKey, X25519PublicKey


def require_backend() -> None:
    """Raise a clear :class:`InputError` now if X25519 is not available."""
    _x25519()


def _on_curve(u: int) -> bool:
    """Is ``u`` the x-coordinate of a point of Curve25519 itself (not of its twist)?"""
    rhs = (u * u * u + _A * u * u + u) % P25519
    return gmpy2.legendre(rhs, P25519) == 1


def hash_to_points(ids, salt: bytes) -> np.ndarray:
    """``(n, 32)`` uint8: the curve point (little-endian x-coordinate) of every id.

    Ids are normalized like the hash alignment's (``3.0`` -> ``"3"``). The
    mapping is deterministic given ``salt``: both parties compute the same
    point for the same id.
    """
    if not isinstance(salt, bytes) or len(salt) < MIN_SALT_BYTES:
        raise ProtocolError(f"the PSI salt must have at least {MIN_SALT_BYTES} bytes")
    keys = normalize_ids(ids)
    prefix = hashlib.sha256(DOMAIN + len(salt).to_bytes(2, "big") + salt)
    out = bytearray(POINT_BYTES * len(keys))
    for i, k in enumerate(keys):
        base = prefix.copy()
        base.update(k.encode("utf-8"))
        for counter in range(256):
            h = base.copy()
            h.update(b"\x00" + counter.to_bytes(1, "big"))
            u = int.from_bytes(h.digest(), "little") & _MASK255
            if u < P25519 and _on_curve(u):
                out[i * POINT_BYTES:(i + 1) * POINT_BYTES] = u.to_bytes(POINT_BYTES, "little")
                break
        else:  # probability 2^-256
            raise ProtocolError(f"could not map id number {i} to a curve point")
    return np.frombuffer(bytes(out), dtype=np.uint8).reshape(len(keys), POINT_BYTES).copy()


def check_points(points, what: str) -> np.ndarray:
    """``points`` as a contiguous ``(n, 32)`` uint8 array, or a :class:`ProtocolError` naming ``what``."""
    if not isinstance(points, np.ndarray) or points.dtype != np.uint8 or points.ndim != 2 \
            or points.shape[1] != POINT_BYTES:
        shape = getattr(points, "shape", None)
        dtype = getattr(points, "dtype", type(points).__name__)
        raise ProtocolError(f"{what} must be an (n, {POINT_BYTES}) uint8 array, got shape {shape} "
                            f"of {dtype}")
    return np.ascontiguousarray(points)


def point_keys(points: np.ndarray) -> list[bytes]:
    return [bytes(row) for row in np.ascontiguousarray(points, dtype=np.uint8)]


class BlindingKey:
    """A party's secret X25519 scalar for one PSI session; it never leaves the party."""

    def __init__(self):
        priv_cls, pub_cls = _x25519()
        self._priv = priv_cls.generate()
        self._pub_cls = pub_cls

    def blind(self, points, what: str = "points") -> np.ndarray:
        """``X25519(scalar, u)`` of every row of ``points`` (an ``(n, 32)`` uint8 array)."""
        pts = check_points(points, what)
        exchange, from_bytes = self._priv.exchange, self._pub_cls.from_public_bytes
        out = bytearray(POINT_BYTES * len(pts))
        buf = pts.tobytes()
        for i in range(len(pts)):
            try:
                out[i * POINT_BYTES:(i + 1) * POINT_BYTES] = exchange(
                    from_bytes(buf[i * POINT_BYTES:(i + 1) * POINT_BYTES]))
            except ValueError:
                # a point of small order: its blinded value would be all zeros
                raise ProtocolError(f"{what}: value number {i} is not a valid point "
                                    "(small order)") from None
        return np.frombuffer(bytes(out), dtype=np.uint8).reshape(len(pts), POINT_BYTES).copy()


def secret_permutation(n: int) -> np.ndarray:
    """A uniformly random permutation of ``range(n)`` from the OS's randomness."""
    rng = np.random.Generator(np.random.PCG64(secrets.randbits(128)))
    return rng.permutation(n).astype(np.int64)


def check_distinct(points: np.ndarray, what: str) -> list[bytes]:
    keys = point_keys(points)
    if len(set(keys)) != len(keys):
        raise ProtocolError(f"{what} contains {len(keys) - len(set(keys))} repeated values "
                            "(duplicate ids, or a malformed message)")
    return keys


def match(own_double: np.ndarray, their_double: np.ndarray, what: str = "peer values") -> np.ndarray:
    """For every row of ``own_double``, its index in ``their_double`` or -1 (not held there)."""
    index = {k: i for i, k in enumerate(check_distinct(their_double, what))}
    return np.array([index.get(k, -1) for k in point_keys(own_double)], dtype=np.int64)


def check_positions(positions, n_values: int, what: str = "positions") -> np.ndarray:
    """Distinct indices into a list of ``n_values`` values, or a :class:`ProtocolError`."""
    if not isinstance(positions, np.ndarray) or positions.ndim != 1 or positions.dtype.kind not in "iu":
        raise ProtocolError(f"{what} must be a 1-d integer array")
    pos = positions.astype(np.int64)
    if pos.size and (pos.min() < 0 or pos.max() >= n_values):
        raise ProtocolError(f"{what} out of range for {n_values} values")
    if len(np.unique(pos)) != len(pos):
        raise ProtocolError(f"{what} repeat a value")
    return pos
