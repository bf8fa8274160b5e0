"""The environment switches of a training: one object, parsed strictly, read once per training.

Two environment variables change how a party trains, never what it learns:

* ``VFL_N_JOBS``: worker processes for the ciphertext work of a party not given ``n_jobs``
  (an integer from 0 to 256; 0, the default: all the cores this process may run on).
* ``VFL_OVERLAP``: overlap a round's encryption, the wire and the passive party's first level
  (issue 12): ``1``, ``true``, ``on`` or ``yes`` (the default), ``0``, ``false``, ``off`` or ``no``.

:meth:`Settings.from_environ` reads them, once per training: the active party when ``fit``
starts, a passive party when ``TrainSetup`` arrives; the kernels below (:mod:`crypto`) are handed
the values and read no environment. Any other value is an :class:`datasets.errors.InputError`
naming the variable (``VFL_OVERLAP=disable`` is refused, not taken as "on"). The active party
records its settings in the model (``BoostedModel.settings``) and :func:`vfl.api.simulate` in its
report (``settings``). Nothing in the toolkit writes ``os.environ``.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, replace
from typing import Mapping

from crypto.parallel import MAX_WORKERS, check_n_jobs
from datasets.errors import InputError

#: the variable of each setting
ENVIRONMENT = {"n_jobs": "VFL_N_JOBS", "overlap": "VFL_OVERLAP"}
_TRUE, _FALSE = ("1", "true", "on", "yes"), ("0", "false", "off", "no")


@dataclass(frozen=True)
class Settings:
    """How a party trains: ``n_jobs`` worker processes (0: all cores) and ``overlap``."""

    n_jobs: int = 0
    overlap: bool = True

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] | None = None) -> "Settings":
        """The settings of ``environ`` (default ``os.environ``); unset or empty: the default."""
        env = os.environ if environ is None else environ
        values = {}
        raw = env.get(ENVIRONMENT["n_jobs"], "").strip()
        if raw:
            try:
                n = int(raw)
            except ValueError:
                n = None
            if n is None or not 0 <= n <= MAX_WORKERS:
                raise InputError(f"environment variable {ENVIRONMENT['n_jobs']} must be an integer from 0 "
                                 f"(all cores) to {MAX_WORKERS}, got {raw!r}")
            values["n_jobs"] = n
        raw = env.get(ENVIRONMENT["overlap"], "").strip()
        if raw:
            word = raw.lower()
            if word not in _TRUE + _FALSE:
                raise InputError(f"environment variable {ENVIRONMENT['overlap']} must be one of "
                                 f"{', '.join(_TRUE)} (overlap on) or {', '.join(_FALSE)} (off), got {raw!r}")
            values["overlap"] = word in _TRUE
        return cls(**values)

    def for_party(self, n_jobs: int | None) -> "Settings":
        """These settings for a party given ``n_jobs`` (None: the environment's): the party's wins."""
        n_jobs = check_n_jobs(n_jobs)
        return self if n_jobs is None else replace(self, n_jobs=n_jobs)

    def to_dict(self) -> dict:
        return {"n_jobs": self.n_jobs, "overlap": self.overlap}
