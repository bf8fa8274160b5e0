"""The active party's gradient channel: packs and encrypts each round's gradients once,
for every passive party, and decrypts the bin sums they send back.

It is a round observer (:class:`vfl.core.rounds.RoundObserver`): when a round starts
it turns the learner's fixed-point integers, bounds and precision
(:class:`vfl.core.rounds.RoundGradients`) into a packing layout
(:mod:`crypto.packing`), and the party's executor workers pack (g, h) pairs,
optionally pre-shift them (:mod:`crypto.compress`) and encrypt them, shard by
shard (:class:`crypto.shards.ShardedEncryption`: the values stay in the
workers). The round travels to each passive party as a stream
(:meth:`GradientChannel.messages`): one ``GradientsStart``, then one
``GradientShard`` per row shard, under the frame cap; the driver never holds the
whole vector. With overlap (the default, :class:`parties.settings.Settings` ``overlap``) the round is
cut into at least :data:`crypto.shards.STREAM_SHARDS` messages, each of a few encryption units
(:func:`crypto.shards.stream_plan`: four per worker over the round, the first message one per
worker), and a producer thread keeps a window of units in flight on every worker while the
earlier messages are on the wire (and while the passive parties start their first level on
them): :class:`crypto.shards.EncryptionStream`, each unit encrypted once for all passive
parties; without, the whole round is encrypted before the first shard is sent. Its seconds go
into the round's timing record (stages ``encrypt`` and ``decrypt``): ``encrypt`` counts only the encryption
on the critical path (the preparation, and the time a sender waited for a shard).

Whether to send pre-shifted copies (:func:`crypto.compress.choose_shifts`) weighs their
extra bytes by each passive party's link: the user's ``--link-mbps``, else the throughput
measured on the previous gradient stream, else :data:`ASSUMED_LINK_MBPS`.
"""
from __future__ import annotations

import time
from contextlib import nullcontext
from dataclasses import dataclass, replace

import numpy as np

from crypto import schemes
from crypto.compress import choose_shifts, shift_choices, squaring_seconds
from crypto.executor import Executor, InlineExecutor, LocalExecutor
from crypto.intcodec import int_width
from crypto.obfuscators import StockKeeper
from crypto.packing import PackingLayout, decode_sums
from crypto.parallel import resolve_workers
from crypto.shards import (
    EncryptionStream,
    ShardedEncryption,
    ShardSet,
    plain_width,
    plan_shards,
    stream_plan,
    stream_rows,
)
from datasets.errors import InputError
from parties.settings import Settings
from protocols import messages as m
from vfl.core.params import Mode
from vfl.core.rounds import RoundGradients, RoundObserver, RoundTiming

#: the link the cost model assumes before it has measured one (and what `vfl simulate` models)
ASSUMED_LINK_MBPS = 100.0


@dataclass
class RoundCrypto:
    """The gradient vector of one round, packed and encrypted once for all passive parties."""
    round_idx: int
    start: m.GradientsStart   # the stream's header
    values: ShardedEncryption  # the values, on the executor's workers
    layout: PackingLayout
    per: int                  # packed values per plaintext
    group_size: int           # targets per packed value (see m.Gradients)
    shifts: int               # pre-shifted copies per value (see m.Gradients)
    timing: RoundTiming
    stream: EncryptionStream | None = None    # overlap: encrypting while the shards are sent


class GradientChannel(RoundObserver):
    """Packs, encrypts (``he``) and decrypts for every remote source of one training."""

    #: bytes a gradient shard message may carry besides its values
    FRAME_MARGIN = 65536

    def __init__(self, mode: str, key_bits: int, encryption: str, settings: Settings | None = None,
                 n_samples: int | None = None, executor: Executor | None = None, name: str = "active",
                 scheme: str = schemes.DEFAULT_SCHEME):
        """``settings``: the training's (the active party read them once); default: all cores, overlap."""
        self.mode = mode
        self.settings = Settings() if settings is None else settings
        self.key_bits = key_bits
        self.scheme = schemes.check_scheme(scheme)
        # what the layout and the cost model ask of the scheme (crypto.schemes): the plaintext space
        # packed values may fill, the bytes of one ciphertext, one encryption in modular products
        self.plain_bits = schemes.plain_bits(key_bits, scheme)
        self.cipher_bytes = (schemes.cipher_bits(key_bits, scheme) + 7) // 8
        self.encrypt_cost = schemes.encrypt_cost(key_bits, scheme)
        self.public_key = self.private_key = None
        self.encryptor = self.decryptor = None
        self.own_executor = executor is None      # the caller's executor is used, never closed
        self.executor: Executor | None = executor
        if executor is None:
            if mode == Mode.HE and resolve_workers(self.settings.n_jobs) > 1:
                self.executor = LocalExecutor(self.settings.n_jobs, name=f"active:{name}")
                if n_samples is not None and n_samples >= 64:   # start up while the key is generated
                    self.executor.start()
            else:
                self.executor = InlineExecutor(name=f"active:{name}")
        self.stock: StockKeeper | None = None     # obfuscators made ahead on the workers (``he``)
        if mode == Mode.HE:
            try:
                self.public_key, self.private_key = schemes.generate_keypair(key_bits, scheme)
                self.encryptor = schemes.encryptor(self.public_key, self.private_key, method=encryption)
                self.decryptor = schemes.decryptor(self.private_key)
                self.stock = StockKeeper(self.executor, self.encryptor).start()
                if n_samples:       # before the first round: one value per row
                    bounds = plan_shards(n_samples, self.executor.n_workers)
                    self.stock.plan(self._per_worker(bounds, [k % self.executor.n_workers for k in range(len(bounds))],
                                                     None, 1, 1))
            except BaseException:
                self.close()
                raise
        self.current: RoundCrypto | None = None
        self.n_bins = 0          # histogram slots of one node, over all passive parties
        self.max_depth = 1
        self.preshift: str | bool = "auto"
        self.frame_cap: int | None = None
        self.passives: list[str] = []
        self.link_mbps: float | None = None           # given by the user: every peer's throughput
        self.measured: dict[str, float] = {}          # peer -> bytes per second of its last gradient message
        self._squaring: float | None = None
        #: the passive parties answer shuffled candidates (running sums of their bins): no pre-shifted copies
        self.candidates = False
        #: rounds before this one use the active party's features only: nothing to encrypt
        self.active_only_rounds = 0

    def group_size(self, layout: PackingLayout) -> int:
        """Targets packed per plaintext: all of them when they fit the key, else the most that fit."""
        fit = replace(layout, n_targets=1).values_per_plaintext(self.plain_bits)   # raises if none fits
        return min(layout.n_targets, fit)

    def plan(self, n_bins: int, max_depth: int, preshift: str | bool = "auto",
             frame_cap: int | None = None, passives: list[str] | None = None,
             link_mbps: float | None = None) -> None:
        """What the shifts decision needs: passive slots per node, tree depth, the policy
        (``"auto"``: cost model, ``True``/``False``: always/never send pre-shifted copies),
        the largest frame the transport and the peers accept (pre-shifted copies never
        make the gradient message exceed it), the passive parties and, if the user gave
        it, the throughput of their links (``link_mbps``; else measured, see
        :meth:`observe_send`)."""
        self.n_bins, self.max_depth, self.preshift = int(n_bins), int(max_depth), preshift
        self.frame_cap = frame_cap
        self.passives = list(passives or [])
        if link_mbps is not None and not (isinstance(link_mbps, (int, float)) and 0 < link_mbps < float("inf")):
            raise InputError(f"the link throughput must be a positive number of Mbit/s, got {link_mbps!r}")
        self.link_mbps = link_mbps

    def observe_send(self, peer: str, n_bytes: int, seconds: float) -> None:
        """A gradient message of ``n_bytes`` reached ``peer`` in ``seconds`` (acknowledged):
        its throughput for the next rounds' decision. Messages under 64 KiB measure
        latency more than throughput and are ignored."""
        if n_bytes >= 65536 and seconds > 0:
            self.measured[peer] = n_bytes / seconds

    def wire_seconds_per_byte(self) -> float:
        """Seconds per byte sent to every peer in turn: the user's ``link_mbps`` if given, else
        each peer's measured throughput, else :data:`ASSUMED_LINK_MBPS`."""
        if self.link_mbps is not None:
            return len(self.passives) * 8 / (self.link_mbps * 1e6)
        return sum(1 / self.measured.get(p, ASSUMED_LINK_MBPS * 1e6 / 8) for p in self.passives)

    def squaring_seconds(self) -> float:
        """One multiplication mod the cipher modulus (``n**2``, OU ``n``) on this machine (measured once)."""
        if self._squaring is None:
            self._squaring = squaring_seconds(self.encryptor.cipher_modulus)
        return self._squaring

    def public_key_message(self) -> m.PublicKey:
        """The key message every passive party receives (``he``)."""
        return m.PublicKey(**schemes.public_key_fields(self.public_key, self.private_key))

    def waiting(self):
        """A context in which the party waits for its peers: the workers fill their obfuscator
        stocks meanwhile (``he``; a no-op otherwise)."""
        return self.stock.waiting() if self.stock is not None else nullcontext()

    @staticmethod
    def _per_worker(bounds, workers, used, groups: int, shifts: int) -> list[int]:
        """Values each worker encrypts in a round of these shards."""
        out = [0] * (max(workers[:len(bounds)], default=0) + 1)
        for k, (a, b) in enumerate(bounds):
            rows = (b - a) if used is None else int(np.count_nonzero(used[a:b]))
            out[workers[k]] += rows * groups * shifts
        return out

    def close(self) -> None:
        """Stop the background obfuscators, the round's encryption stream and the worker processes
        (end of training); a caller's executor only forgets the round's shards and the key (with its
        workers' obfuscator stocks)."""
        self._end_stream()
        if self.stock is not None:
            self.stock.close()
        executor, self.executor = self.executor, None
        if executor is None:
            return
        if self.own_executor:
            executor.close()
        elif not executor.closed:
            try:
                executor.drop("grad/")
                executor.drop(StockKeeper.SLOT)
            except Exception:        # a lost worker: its slots are gone anyway
                pass

    def _shifts(self, n_samples: int, layout: PackingLayout, per: int, trees_per_round: int = 1,
                n_groups: int = 1, frame_rows: int | None = None) -> int:
        """How many pre-shifted copies of every value to send, 1..``per`` (see :mod:`crypto.compress`).

        ``n_samples`` rows are encrypted and summed; the message carries ``frame_rows``
        values per copy and group (all rows: unsampled ones as full-width placeholders).
        ``preshift`` True/False: all ``per`` copies / none; an integer ``k``: the largest useful
        count (:func:`crypto.compress.shift_choices`) not above ``k``; "auto": the cost model."""
        if self.mode != Mode.HE or per <= 1 or self.preshift is False or self.candidates:
            return 1
        if self.preshift is True:
            return per
        if isinstance(self.preshift, int):
            return max(k for k in shift_choices(per) if k <= max(1, self.preshift))
        return choose_shifts(n_samples, self.n_bins, per, layout.value_bits, self.max_depth,
                             encrypt_cost=self.encrypt_cost, trees_per_round=trees_per_round, n_groups=n_groups,
                             wire_seconds_per_byte=self.wire_seconds_per_byte(),
                             cipher_bytes=self.cipher_bytes, squaring_seconds=self.squaring_seconds())

    # -- the round ------------------------------------------------------------
    def round_started(self, gradients: RoundGradients) -> None:
        """Prepare the round (layout, shifts, shards, header) and start encrypting it, once for every
        passive party: with overlap (the settings' ``overlap``) shard by shard while the previous
        shards are on the wire (:class:`crypto.shards.EncryptionStream`), else all of it now."""
        self._end_stream()
        if gradients.round_idx < self.active_only_rounds:     # no passive party takes part in this round
            self.current = None
            return
        self.current = self._encrypt_round(gradients)

    def messages(self, round_idx: int):
        """The round's gradient stream: a ``GradientsStart``, then one ``GradientShard`` per row shard
        (encrypted, or fetched from its worker, only when the caller asks for it: send it, drop it)."""
        if self.current is None or self.current.round_idx != round_idx:
            raise RuntimeError(f"round {round_idx} was not encrypted: the channel must observe the booster")
        cur = self.current
        yield cur.start
        if cur.stream is None:
            for start, stop, data in cur.values.stream():
                yield m.GradientShard(round_idx, start, stop, data)
            return
        bounds = cur.values.shards.bounds
        for i, (k0, k1) in enumerate(cur.stream.messages):
            yield m.GradientShard(round_idx, bounds[k0][0], bounds[k1 - 1][1], cur.stream.take(i))

    def _end_stream(self) -> None:
        cur = getattr(self, "current", None)      # None: closed before the first round (or during __init__)
        if cur is not None and cur.stream is not None:
            cur.stream.close()

    def shard_rows(self, bytes_per_row: int) -> int | None:
        """The most rows one gradient shard message may carry under the frame cap (None: no cap)."""
        if self.frame_cap is None:
            return None
        room = 0.9 * self.frame_cap - self.FRAME_MARGIN
        return max(1, int(room // max(1, bytes_per_row)))

    def _encrypt_round(self, rg: RoundGradients) -> RoundCrypto:
        t0 = time.perf_counter()
        layout = PackingLayout.for_bounds(rg.g_bound, rg.h_bound, max_rows=rg.n_rows, n_targets=rg.n_targets,
                                          precision_bits=rg.precision_bits)
        K, G = layout.n_targets, self.group_size(layout)
        glayout = layout if G == K else replace(layout, n_targets=G)
        per = glayout.values_per_plaintext(self.plain_bits)
        n = rg.n_rows
        used = rg.in_any_sample
        n_used = n if used is None else int(np.count_nonzero(used))
        n_groups = -(-K // G)
        shifts = self._shifts(n_used, glayout, per, trees_per_round=K, n_groups=n_groups, frame_rows=n)
        he = self.mode == Mode.HE
        if he:
            width, signed = int_width(self.encryptor.cipher_modulus), False
            self.executor.share("encryptor", self.encryptor, {"kind": "encryptor", "state": self.encryptor.state()})
        else:
            width, signed = plain_width(glayout.value_bits, shifts), True
        max_rows = self.shard_rows(n_groups * shifts * width)
        if max_rows is not None and max_rows < 1:
            raise RuntimeError("the frame cap is too small for one row of gradients")
        overlap = self.settings.overlap
        messages = bounds = None
        if overlap:        # pieces small enough to overlap encryption, the wire and the passive party
            rows = stream_rows(n, self.executor.n_workers, n_groups * shifts * width)
            # messages under the frame cap, each cut into encryption units (a few per worker)
            msg_rows = rows if max_rows is None else min(max_rows, rows)
            bounds, messages = stream_plan(n, self.executor.n_workers, msg_rows)
        shards = ShardSet(self.executor, n, max_rows=max_rows, prefix="grad/", bounds=bounds)
        values = ShardedEncryption(shards, n_groups, shifts, width, signed)
        used = None if used is None else np.asarray(used, dtype=bool)
        if self.stock is not None:
            self.stock.timing = rg.timing        # background fill from now on counts for this round
        stock_plan = self._per_worker(shards.bounds, shards.workers, used, n_groups, shifts)

        def encrypted(counts: dict) -> None:     # every shard is encrypted: size the next stock
            if self.stock is not None:
                self.stock.note_round(counts)
                self.stock.plan(stock_plan)

        job = (np.asarray(rg.g), np.asarray(rg.h), used, glayout.to_dict(), G, he, glayout.value_bits, per)
        stream = None
        if overlap:
            rg.timing.add("encrypt", time.perf_counter() - t0)
            stream = EncryptionStream(values, job, consumers=max(1, len(self.passives)),
                                      on_wait=lambda sec: rg.timing.add("encrypt", sec), on_done=encrypted,
                                      messages=messages)
        else:
            encrypted(values.fill(*job))
            rg.timing.add("encrypt", time.perf_counter() - t0)      # on the critical path
        start = m.GradientsStart(rg.round_idx, he, glayout.to_dict(), per, shifts, n_groups, n, width, signed)
        return RoundCrypto(rg.round_idx, start, values, glayout, per, G, shifts, rg.timing, stream)

    def decode(self, values, total: int):
        """Decrypt (``he``) and unpack ``total`` bin sums of the current round."""
        t0 = time.perf_counter()
        if self.mode == Mode.HE:
            plain = self.decryptor.decrypt_signed(values, executor=self.executor)
        else:
            plain = [int(v) for v in values]
        self.current.timing.add("decrypt", time.perf_counter() - t0)
        return decode_sums(plain, self.current.layout, self.current.per, total)
