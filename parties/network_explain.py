"""Explanations over the network (``vfl explain`` against running passive servers).

The active party explains its rows batch by batch; each batch is one ordinary one-round
prediction session (:meth:`parties.active.ActiveParty.explain`): the passive servers see a
prediction, answer it under their prediction rules and limits, and nothing else is asked of them.
"""
from __future__ import annotations

import contextlib
import logging
import time

from datasets.errors import InputError
from datasets.loaders import DEFAULT_BATCH_ROWS, iter_party_batches
from parties.active import ActiveParty
from parties.explain_features import chosen_parties
from parties.network import check_peers, load_active_model
from protocols.grpc_client import GrpcTransport
from protocols.grpc_wire import DEFAULT_MAX_FRAME_BYTES, DEFAULT_TIMEOUT
from vfl.core.explain import Explanation, explanation_table
from vfl.core.files import atomic_text_writer
from vfl.core.params import ALIGNMENTS

log = logging.getLogger("vfl.active")


def explain_active(model_dir, data, id_col: str, peers: dict[str, str], security, out=None,
                   timeout: float = DEFAULT_TIMEOUT, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
                   connect_timeout: float | None = None, align: str | None = None,
                   batch_rows: int = DEFAULT_BATCH_ROWS, top: int | None = None,
                   adverse: str = "high", passive_features=False) -> tuple[Explanation | None, dict]:
    """Explain the rows of ``data`` (the active party's columns: CSV, Parquet file or directory)
    with the model in ``model_dir``; each batch's table (:func:`vfl.core.explain.explanation_table`)
    is appended to ``out`` (written atomically at the end). Returns ``(explanation of every row,
    summary)``: the summary has the global view (mean |attribution| per player), the timing and
    the bytes sent. ``passive_features``: the passive parties (True: all) that also split their
    value among their own features and keep it (opt-in at each; :mod:`parties.explain_features`)."""
    if align is not None and align not in ALIGNMENTS:
        raise InputError(f"--align must be one of {ALIGNMENTS}, got {align!r}")
    model = load_active_model(model_dir)
    check_peers(model, peers)
    chosen_parties(model, passive_features)         # unknown names are refused before connecting
    batches = iter_party_batches(data, model.active_party, id_col, batch_rows=batch_rows,
                                 categorical=list(model.categories))
    first = next(batches)            # the whole id column is checked here, before connecting
    active = ActiveParty.from_model(model, id_col)
    transport = GrpcTransport(model.active_party, {p: peers[p] for p in model.passives}, security,
                              timeout=timeout, max_frame_bytes=max_frame_bytes)
    total, n_batches = None, 0
    try:
        transport.connect(timeout=connect_timeout if connect_timeout is not None else timeout)
        t0 = time.perf_counter()
        with atomic_text_writer(out) if out is not None else contextlib.nullcontext() as fh:
            for pf in _chain(first, batches):
                ids, ex = active.explain(transport, pf.frame, pf.source, align=align,
                                         passive_features=passive_features)
                if fh is not None:
                    table = explanation_table(ex, ids, id_col, model.classes, top, adverse)
                    fh.write(table.to_csv(index=False, header=n_batches == 0))
                total = ex if total is None else total.concat(ex)
                n_batches += 1
        seconds = time.perf_counter() - t0
    finally:
        transport.close()
    summary = {"model_id": model.model_id, "explain_seconds": seconds, "n_batches": n_batches,
               "batch_rows": batch_rows, "align": align or model.params.get("align", "hash"),
               "players": total.players if total is not None else [],
               **(total.summary(model.classes) if total is not None else {"n_rows": 0}),
               "passive_features": (total.feature_splits or {}) if total is not None else {},
               "bytes_sent": transport.bytes_report(), "total_bytes": transport.total_bytes()}
    log.info("%s: explained %d rows in %d batch(es) with model %s in %.2f s", model.active_party,
             summary["n_rows"], n_batches, model.model_id, seconds)
    return total, summary


def _chain(first, rest):
    yield first
    yield from rest


__all__ = ["explain_active"]
