"""What a passive party allows any training or prediction of its data (issue 31, Build 2, 3, 5).

The passive party owns these limits; nothing a requester states in ``TrainSetup`` sets them. They
come from the party's own entry of the federation file (``[parties.NAME]``, see
docs/federation.md), else the defaults below, and every refusal names its rule:

* ``rounds x depth cap``: a ``TrainSetup`` asking more than ``max_rounds`` rounds, a deeper
  tree than ``max_depth``, or more than ``max_rounds_x_depth`` levels in all (rounds x depth: the
  most split answers a row can get in one training) is refused;
* ``lifetime trainings``, ``lifetime split answers``, ``lifetime prediction decisions``: the
  lifetime budget of the dataset across sessions and restarts (:mod:`parties.reveal_budget`);
* ``dp unbounded``: a DP-only training (mode dp) without a data-independent domain (no noise:
  epsilon = inf, its bins the data's quantiles) only where ``dp_allow_unbounded = true``;
* ``training rows``: prediction over rows this party trained a model on only where
  ``predict_training_rows = true``;
* ``dp_lifetime_epsilon``: the default cap of the DP ledger on what DP releases of the dataset
  spend in all (an explicit ``--dp-lifetime-epsilon`` replaces it, and then also refuses any
  training without DP).

A party run as a library object (:class:`parties.passive.PassiveParty`, simulations: one owner
plays every party) has no limits unless given some; ``vfl party passive`` always has them.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, fields

from datasets.errors import InputError, ProtocolError

#: the defaults of a passive party's limits (``vfl party passive``), documented in docs/federation.md
DEFAULT_MAX_ROUNDS = 1000
DEFAULT_MAX_DEPTH = 10
DEFAULT_MAX_ROUNDS_X_DEPTH = 6000
DEFAULT_LIFETIME_TRAININGS = 200
DEFAULT_LIFETIME_SPLIT_ANSWERS_PER_ROW = 200_000
DEFAULT_LIFETIME_PREDICTION_DECISIONS_PER_ROW = 1_000_000
DEFAULT_DP_LIFETIME_EPSILON = 10.0

_INTS = {"max_rounds": 1 << 20, "max_depth": 30, "max_rounds_x_depth": 30 << 20, "lifetime_trainings": 1 << 40,
         "lifetime_split_answers_per_row": (1 << 32) - 1, "lifetime_prediction_decisions_per_row": 1 << 40}
_BOOLS = ("predict_training_rows", "dp_allow_unbounded")
KEYS = frozenset({*_INTS, *_BOOLS, "dp_lifetime_epsilon"})


@dataclass(frozen=True)
class Limits:
    """One passive party's limits (see the module docstring)."""
    max_rounds: int = DEFAULT_MAX_ROUNDS
    max_depth: int = DEFAULT_MAX_DEPTH
    max_rounds_x_depth: int = DEFAULT_MAX_ROUNDS_X_DEPTH
    lifetime_trainings: int = DEFAULT_LIFETIME_TRAININGS
    lifetime_split_answers_per_row: int = DEFAULT_LIFETIME_SPLIT_ANSWERS_PER_ROW
    lifetime_prediction_decisions_per_row: int = DEFAULT_LIFETIME_PREDICTION_DECISIONS_PER_ROW
    predict_training_rows: bool = False
    dp_allow_unbounded: bool = False
    dp_lifetime_epsilon: float = DEFAULT_DP_LIFETIME_EPSILON

    def check_setup(self, party: str, n_rounds: int, max_depth: int) -> None:
        """Refuse a ``TrainSetup`` beyond this party's rounds x depth caps (rule 'rounds x depth cap')."""
        why = None
        if n_rounds > self.max_rounds:
            why = f"{n_rounds} rounds, this party allows at most {self.max_rounds} (max_rounds)"
        elif max_depth > self.max_depth:
            why = f"max_depth {max_depth}, this party allows at most {self.max_depth} (max_depth)"
        elif n_rounds * max_depth > self.max_rounds_x_depth:
            why = (f"{n_rounds} rounds x depth {max_depth} = {n_rounds * max_depth} levels, this party allows at "
                   f"most {self.max_rounds_x_depth} (max_rounds_x_depth)")
        if why is not None:
            raise ProtocolError(f"party {party!r} refuses TrainSetup: rule 'rounds x depth cap': {why} "
                                "(its own limits, docs/federation.md)")


def parse_limits(table: dict, err) -> Limits:
    """The limits of a party's federation entry (``table``: its keys; ``err(key, message)`` makes the
    error naming the file, table and key); absent keys keep their defaults."""
    got = {}
    for key, top in _INTS.items():
        if key in table:
            v = table[key]
            if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= top:
                raise err(key, f"expected an integer 1..{top}, got {v!r}")
            got[key] = int(v)
    for key in _BOOLS:
        if key in table:
            if not isinstance(table[key], bool):
                raise err(key, f"expected true or false, got {table[key]!r}")
            got[key] = table[key]
    if "dp_lifetime_epsilon" in table:
        v = table["dp_lifetime_epsilon"]
        if isinstance(v, bool) or not isinstance(v, (int, float)) or math.isnan(v) or not 0 < v < math.inf:
            raise err("dp_lifetime_epsilon", f"expected a finite number > 0, got {v!r}")
        got["dp_lifetime_epsilon"] = float(v)
    limits = Limits(**got)
    if limits.max_rounds_x_depth < 1 or limits.max_depth > limits.max_rounds_x_depth:
        raise err("max_rounds_x_depth", f"{limits.max_rounds_x_depth} is below max_depth {limits.max_depth}")
    return limits


def limit_fields() -> list[str]:
    return [f.name for f in fields(Limits)]


def check_limits(value) -> Limits | None:
    if value is not None and not isinstance(value, Limits):
        raise InputError(f"a passive party's limits must be a parties.passive_limits.Limits, got {value!r}")
    return value
