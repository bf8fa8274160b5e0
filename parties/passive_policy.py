"""A passive party's own limits, checked when it starts (issue 36, items 2 and 6).

``vfl party passive`` used to keep a limit only when it was truthy, so ``0`` meant "no limit",
and it checked the numbers and the ledger file only when a remote training reached them. Here
every limit is kept when it is given (``0`` is the tightest limit, never none) and refused at
start-up, with the option named, when it cannot be honoured: a negative or NaN epsilon, a ledger
that is not a ledger, too large to be one, or in a directory the party cannot write.
"""
from __future__ import annotations

import math
from pathlib import Path

from datasets.errors import InputError
from parties.dp_ledger import PrivacyLedger
from vfl.core.files import check_writable_dir

#: a ledger larger than this is not one (a ledger grows by ~200 bytes per training)
MAX_LEDGER_BYTES = 64 * 2 ** 20


def _limit(value, option: str) -> float | None:
    """An epsilon limit: a number >= 0 or inf (0: nothing may be spent); NaN and negatives refused."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value) or value < 0:
        raise InputError(f"{option} must be a number >= 0 (0: refuse every release), got {value!r}")
    return float(value)


def check_ledger_file(path, option: str = "--dp-ledger") -> str:
    """The ledger file, refused up front when the party could not keep it: a directory, a file
    too large to be a ledger (refused from its size, unread), a file that is not a ledger, a
    directory the party cannot write its new versions to."""
    p = Path(path)
    if p.exists():
        if not p.is_file():
            raise InputError(f"{option} {str(p)!r} is not a file")
        size = p.stat().st_size
        if size > MAX_LEDGER_BYTES:
            raise InputError(f"{option} {str(p)!r} is not a DP ledger: {size} bytes (a ledger is at most "
                             f"{MAX_LEDGER_BYTES} bytes)")
        PrivacyLedger(p).read()         # names the file and what is wrong with it
    check_writable_dir(p.parent if str(p.parent) else Path("."), f"{option} {str(p)!r}: its directory")
    return str(p)


def passive_policy(allowed_align=(), allowed_prediction=(), dp_max_epsilon_per_feature=None, dp_ledger=None,
                   dp_lifetime_epsilon=None) -> dict:
    """The :class:`parties.server.PassiveServer` policy of ``vfl party passive``'s options, checked:
    every limit given is kept (``0`` included), empty choices mean the defaults."""
    policy = {"allowed_align": tuple(allowed_align), "allowed_prediction": tuple(allowed_prediction),
              "dp_max_epsilon_per_feature": _limit(dp_max_epsilon_per_feature, "--dp-max-epsilon-per-feature"),
              "dp_lifetime_epsilon": _limit(dp_lifetime_epsilon, "--dp-lifetime-epsilon"),
              "dp_ledger_path": check_ledger_file(dp_ledger) if dp_ledger is not None else None}
    return {k: v for k, v in policy.items() if v is not None and v != ()}
