"""Talk to several passive parties at once.

Every level the boosting loop asks *all* histogram sources the same thing
(``start_round``, then ``build``), through a ``map`` step (see
:class:`vfl.boosting.Booster`). When the transport can run calls concurrently
(``transport.concurrent``, e.g. gRPC) and there are two or more passive
parties, that step runs in threads, so no party waits for the previous one's
ciphertext work. Splits stay sequential (they go to one owner each and are
cheap). Nothing changes for the in-memory transport.
"""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor


def source_map(transport, sources: list):
    """A threaded ``map(fn, sources)`` for the booster, or None (sequential)."""
    from parties.active import RemoteSource

    remote = [s for s in sources if isinstance(s, RemoteSource)]
    if not getattr(transport, "concurrent", False) or len(remote) < 2:
        return None

    def thread_map(fn, items):
        with ThreadPoolExecutor(max_workers=len(items), thread_name_prefix="vfl-fanout") as pool:
            return list(pool.map(fn, items))

    return thread_map
