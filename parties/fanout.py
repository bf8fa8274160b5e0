"""Talk to several passive parties at once.

The boosting loop asks its histogram sources one after the other; with
passive parties in other processes that would make each party wait for the
previous one's ciphertext work. Every level, however, asks *all* remote
sources the same thing (same round, same nodes). So when the transport can
run calls concurrently (``transport.concurrent``, e.g. gRPC), the remote
sources are wrapped in a group: the first ``start_round``/``build`` call of a
level runs that call for every member in parallel threads; the other members
then return their already computed results. Splits stay sequential (they go
to one owner each and are cheap). Nothing changes for the in-memory transport.
"""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np

from vfl.boosting import HistogramSource


def fan_out(transport, sources: list) -> list:
    """Wrap the remote sources of ``sources`` (if ``transport`` is concurrent and there are 2+)."""
    from parties.active import RemoteSource

    remote = [s for s in sources if type(s) is RemoteSource]
    if not getattr(transport, "concurrent", False) or len(remote) < 2:
        return sources
    group = _Group(remote)
    return [_Member(s, group) if type(s) is RemoteSource else s for s in sources]


class _Group:
    def __init__(self, members):
        self.members = members
        self._key = None
        self._results: dict = {}

    def _run_all(self, method: str, args: tuple) -> dict:
        def one(src):
            try:
                return True, getattr(src, method)(*args)
            except BaseException as exc:   # handed to the member that asks for it
                return False, exc

        with ThreadPoolExecutor(max_workers=len(self.members), thread_name_prefix="vfl-fanout") as pool:
            futures = [(s.party, pool.submit(one, s)) for s in self.members]
            return {party: f.result() for party, f in futures}

    def get(self, member, method: str, key, args: tuple):
        full = (method, key)
        if full != self._key or member.party not in self._results:
            if method == "start_round":    # pack and encrypt once, before the threads start
                channel = getattr(self.members[0], "channel", None)
                if channel is not None and hasattr(channel, "gradients"):
                    channel.gradients(*args)
            self._key = full
            self._results = self._run_all(method, args)
        ok, value = self._results.pop(member.party)
        if not ok:
            raise value
        return value


class _Member(HistogramSource):
    """A remote source whose per-level calls are run together with the other members'."""

    def __init__(self, inner, group: _Group):
        self.inner, self.group = inner, group
        self.party = inner.party
        self.bin_offsets = inner.bin_offsets

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def start_round(self, round_idx, g_int, h_int, layout):
        return self.group.get(self.inner, "start_round", (round_idx,), (round_idx, g_int, h_int, layout))

    def build(self, round_idx, depth, tree_idx, node_ids, assignment):
        key = (round_idx, depth, np.asarray(tree_idx).tobytes(), np.asarray(node_ids).tobytes())
        return self.group.get(self.inner, "build", key, (round_idx, depth, tree_idx, node_ids, assignment))

    def split(self, round_idx, tree_idx, node_ids, feature_idx, bin_idx, default_left, assignment):
        return self.inner.split(round_idx, tree_idx, node_ids, feature_idx, bin_idx, default_left, assignment)
