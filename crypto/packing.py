"""Packing gradient/hessian pairs into one Paillier plaintext.

A packed value is a stream of *signed digits* of ``pair_bits`` bits each::

    value = sum_k (g_k * 2**h_bits + h_k) * 2**(k * pair_bits)

with one digit per target ``k`` (one target for binary and regression, one per
class for multiclass). ``g`` may be negative, ``h`` must be non-negative. The
widths are sized from ``max_rows`` so that the sum over *any* subset of at
most ``max_rows`` samples still decodes exactly: every digit of such a sum stays
below ``2**(pair_bits-1)`` in magnitude, which is what makes a signed-digit
stream decodable. The same argument lets a passive party concatenate many
bin sums into one ciphertext (see :mod:`crypto.compress`).

Values outside the declared bounds raise :class:`PackingOverflowError`; no sum
can wrap silently.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

#: fractional bits of a fixed-point value when a layout is built without saying
DEFAULT_PRECISION_BITS = 32


class PackingOverflowError(OverflowError):
    """A value or a sum would not fit the packing layout."""


def _ceil_fixed(bound: float, precision_bits: int) -> int:
    return int(np.ceil(np.ldexp(float(bound), precision_bits)))


@dataclass(frozen=True)
class PackingLayout:
    """How (g, h) pairs are laid out in one integer; all sizes in bits."""

    precision_bits: int
    n_targets: int
    max_rows: int
    g_max: int       # largest |g| as a fixed-point integer
    h_max: int       # largest h as a fixed-point integer
    g_bits: int      # signed width of a gradient sum
    h_bits: int      # width of a hessian sum

    @classmethod
    def for_bounds(cls, g_bound: float, h_bound: float, max_rows: int, n_targets: int = 1,
                   precision_bits: int = DEFAULT_PRECISION_BITS) -> "PackingLayout":
        if max_rows < 1:
            raise ValueError("max_rows must be at least 1")
        if not (g_bound >= 0 and h_bound >= 0 and np.isfinite(g_bound) and np.isfinite(h_bound)):
            raise PackingOverflowError(f"gradient bounds must be finite, got g={g_bound}, h={h_bound}")
        g_max = max(_ceil_fixed(g_bound, precision_bits), 1)
        h_max = max(_ceil_fixed(h_bound, precision_bits), 1)
        g_bits = (max_rows * g_max).bit_length() + 1
        h_bits = (max_rows * h_max).bit_length()
        return cls(precision_bits, int(n_targets), int(max_rows), g_max, h_max, g_bits, h_bits)

    @property
    def pair_bits(self) -> int:
        return self.g_bits + self.h_bits

    @property
    def value_bits(self) -> int:
        """Bits of one packed sample (all targets)."""
        return self.pair_bits * self.n_targets

    def values_per_plaintext(self, modulus_bits: int) -> int:
        """How many packed values (e.g. bin sums) fit one plaintext of a ``modulus_bits`` key."""
        per = (modulus_bits - 2) // self.value_bits
        if per < 1:
            raise PackingOverflowError(
                f"a {modulus_bits}-bit key cannot hold one packed value of {self.value_bits} bits "
                f"({self.n_targets} target(s), {self.max_rows} rows, {self.precision_bits} fractional bits): "
                "use a larger key or fewer rows")
        return per

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "PackingLayout":
        layout = cls(**{k: int(d[k]) for k in cls.__dataclass_fields__})
        if layout.g_bits > 4096 or layout.h_bits > 4096 or layout.n_targets > 1024:
            raise PackingOverflowError("packing layout is out of range")
        return layout


def pack(g_int: np.ndarray, h_int: np.ndarray, layout: PackingLayout) -> list[int]:
    """Pack fixed-point integers ``g_int``/``h_int`` of shape (n_samples, n_targets) into ints."""
    g = np.asarray(g_int, dtype=np.int64).reshape(len(g_int), -1)
    h = np.asarray(h_int, dtype=np.int64).reshape(len(h_int), -1)
    if g.shape != h.shape or g.shape[1] != layout.n_targets:
        raise ValueError(f"gradients of shape {g.shape} and hessians {h.shape} do not match "
                         f"a layout with {layout.n_targets} target(s)")
    if len(g) > layout.max_rows:
        raise PackingOverflowError(f"{len(g)} rows exceed the layout's max_rows={layout.max_rows}")
    if g.size and int(np.max(np.abs(g))) > layout.g_max:
        raise PackingOverflowError(f"a gradient of magnitude {int(np.max(np.abs(g)))} exceeds the "
                                   f"layout bound {layout.g_max}")
    if h.size and (int(np.min(h)) < 0 or int(np.max(h)) > layout.h_max):
        raise PackingOverflowError(f"hessians must lie in [0, {layout.h_max}], got "
                                   f"[{int(np.min(h))}, {int(np.max(h))}]")
    hb, pb = layout.h_bits, layout.pair_bits
    gl, hl = g.tolist(), h.tolist()
    if layout.n_targets == 1:
        return [(gi[0] << hb) + hi[0] for gi, hi in zip(gl, hl)]
    out = []
    for grow, hrow in zip(gl, hl):
        v = 0
        for k in range(layout.n_targets - 1, -1, -1):
            v = (v << pb) + (grow[k] << hb) + hrow[k]
        out.append(v)
    return out


def split_digits(value: int, digit_bits: int, n_digits: int) -> list[int]:
    """Split a signed-digit stream into ``n_digits`` signed digits (lowest first)."""
    mask = (1 << digit_bits) - 1
    half = 1 << (digit_bits - 1)
    full = 1 << digit_bits
    digits = []
    v = int(value)
    for _ in range(n_digits):
        d = v & mask
        if d >= half:
            d -= full
        digits.append(d)
        v = (v - d) >> digit_bits
    if v != 0:
        raise PackingOverflowError("packed value has more digits than declared (overflow)")
    return digits


def unpack(values, layout: PackingLayout) -> tuple[np.ndarray, np.ndarray]:
    """Inverse of :func:`pack` for sums: returns object arrays (n, n_targets) of exact ints."""
    hb = layout.h_bits
    hmask = (1 << hb) - 1
    K = layout.n_targets
    g = np.empty((len(values), K), dtype=object)
    h = np.empty((len(values), K), dtype=object)
    for i, v in enumerate(values):
        for k, d in enumerate(split_digits(v, layout.pair_bits, K)):
            hk = d & hmask
            g[i, k] = (d - hk) >> hb
            h[i, k] = hk
    return g, h


def decode_sums(plain_values, layout: PackingLayout, per: int, total: int) -> tuple[np.ndarray, np.ndarray]:
    """Decode (decrypted, centred) compressed sums: ``per`` packed values per input value,
    ``total`` values in all. Returns exact int object arrays ``(total, n_targets)`` for g and h."""
    K = layout.n_targets
    hb, pb = layout.h_bits, layout.pair_bits
    hmask = (1 << hb) - 1
    g = np.empty(total * K, dtype=object)
    h = np.empty(total * K, dtype=object)
    pos = 0
    for i, v in enumerate(plain_values):
        count = min(per, total - i * per)
        if count <= 0:
            raise PackingOverflowError("more compressed values than declared")
        for d in split_digits(v, pb, count * K):
            hk = d & hmask
            g[pos] = (d - hk) >> hb
            h[pos] = hk
            pos += 1
    if pos != total * K:
        raise PackingOverflowError(f"decoded {pos // max(K, 1)} sums, expected {total}")
    return g.reshape(total, K), h.reshape(total, K)
