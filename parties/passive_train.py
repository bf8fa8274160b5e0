"""The passive party's training handlers: one training session, round by round.

``TrainSetup`` -> ``BinningInfo`` (bins of the aligned rows, cut into row shards that stay on the
party's executor workers: :mod:`crypto.shards`), ``PublicKey`` -> ``Ack``, then per round
``GradientsStart`` and a stream of ``GradientShard`` -> ``Ack`` (each shard's bytes go straight
to the workers holding those rows; the driver keeps none; the one-message ``Gradients`` is still
understood), ``HistogramRequest`` -> ``HistogramResponse`` (the ciphertext
kernels of :mod:`crypto`), ``SplitRequest`` -> ``SplitResponse`` (records added to the lookup
table, rows sent left), and at the end ``TrainEnd`` -> ``Ack``. A resumed training
(``TrainResume``, answered by :mod:`parties.server`) keeps the records of the finished rounds.
"""
from __future__ import annotations

import logging
import math
import queue
import threading
import time
from collections import deque

import gmpy2
import numpy as np

from crypto import schemes
from crypto.compress import check_shifts
from crypto.executor import WorkerError
from crypto.intcodec import ints_to_bytes
from crypto.obfuscators import ReplyRandomizer
from crypto.packing import PackingLayout
from crypto.shards import ShardedGradients, ShardSet, stream_rows, value_width
from datasets.errors import InputError, ProtocolError
from datasets.pieces import PieceTable
from parties import dp, reveal_budget
from parties.passive_checks import TrainingProtocol
from parties.passive_splits import _check_round, new_exchange
from parties.passive_state import PassiveState, unsafe_seed
from parties.settings import Settings
from parties.shard_ops import ShardReader
from protocols import messages as m
from vfl.core.binning import Binner
from vfl.core.dp import ReleaseDomain
from vfl.core.dp_bins import DPBinner
from vfl.core.dp_bins_file import public_columns
from vfl.core.dp_noise import noise_source
from vfl.core.params import Mode

log = logging.getLogger("vfl.passive")

#: gradient shard messages the passive party's intake holds at least (issue 12): queued, or on their
#: way to the workers; with more workers it holds two per worker (issue 24: every worker has a
#: message to write and a root partial to sum), then the next message's acknowledgement waits
INTAKE_BACKLOG = 2
#: bytes of gradient shard messages the intake holds at most beyond :data:`INTAKE_BACKLOG` messages
INTAKE_WINDOW_BYTES = 256 << 20
#: in mode plain there is no key: the largest plaintext a layout may fill, in bits
MAX_PLAIN_BITS = 16384
#: target groups (blocks of gradient values) one round's gradients may carry
MAX_GROUPS = 1024
#: a Parquet table read by the workers in mode plain: own worker processes (bounded driver) from this
#: many aligned values (rows x features, 64 MB as float64), below it the party's own process
PLAIN_WORKERS_FROM = 1 << 23


def setup(s: PassiveState, req: m.TrainSetup) -> m.BinningInfo:
    rows = s.aligned_rows()
    if req.mode not in Mode.values():
        raise ProtocolError(f"unknown mode {req.mode!r}")
    floor, key = s.min_node_rows, "min_node_rows"      # a DP model's own floor never lowers the others' (issue 31)
    if req.dp_binning is not None and s.dp_model_min_node_rows is not None:
        floor, key = s.dp_model_min_node_rows, "dp_model_min_node_rows"
    if req.mode != Mode.DP and req.min_node_rows < floor:
        raise ProtocolError(f"party {s.name!r} refuses TrainSetup: rule 'min_node_rows': the setup agrees "
                            f"{req.min_node_rows} rows per node, this party requires at least {floor} "
                            f"(its federation's {key})")
    if req.mode != Mode.DP and req.active_only_rounds < s.require_active_only_rounds:
        raise ProtocolError(f"party {s.name!r} refuses TrainSetup: rule 'active-only rounds': the setup grows "
                            f"{req.active_only_rounds} first round(s) on the active party's features only, this "
                            f"party requires at least {s.require_active_only_rounds} (its federation entry's "
                            "require_active_only_rounds; --active-only-rounds)")
    reveal_budget.on_setup(s, req)      # its own limits and lifetime budget (issue 31)
    s.close_executor()                  # shards of an earlier session
    t = s.train
    t.settings = Settings.from_environ().for_party(s.n_jobs)      # once per training
    t.mode = req.mode
    t.scheme = req.scheme
    t.nsquare = t.public_key = t.plain_bits = None     # a new training waits for its own key
    t.candidates = None
    t.protocol = TrainingProtocol(s.name, req.n_rounds, req.max_depth, req.min_node_rows,
                                  candidates=req.mode != Mode.DP and req.dp_binning is None,
                                  first_round=req.active_only_rounds if req.mode != Mode.DP else 0)
    s.max_depth = int(req.max_depth)        # recorded in the model file: node-by-node prediction's budget
    s.model_id = req.model_id
    s.table.records = []
    pieces = s.X if isinstance(s.X, PieceTable) and req.mode != Mode.DP and req.dp_binning is None else None
    X = s.X[rows] if pieces is None else None       # a Parquet table: its shards' workers read their rows
    categorical = np.array([f in s.categories for f in s.feature_names], dtype=bool)
    monotone = np.array([s.monotone.get(f, 0) for f in s.feature_names], dtype=np.int8)
    if req.mode == Mode.DP and (categorical.any() or monotone.any()):
        kind = "categorical features" if categorical.any() else "monotone constraints"
        raise InputError(f"party {s.name!r}: {kind} are not supported in mode dp (its noisy release "
                         "buckets every feature as numeric); use mode he or plain")
    if req.dp_binning is not None and (categorical.any() or monotone.any()):
        raise InputError(f"party {s.name!r}: categorical features and monotone constraints are not supported "
                         "with a DP released model (--dp-model)")
    t.data_digest = None
    t.dp_domain, t.dp_X, t.dp_edges = None, None, {}
    s.dp_training_ids = None
    if req.mode == Mode.DP and req.dp_binning is not None:
        return _dp_domain(s, req, X)
    if req.mode != Mode.DP:     # the ledger: the active party sees exact sums and split answers in modes he and
        # plain, whatever the released model's DP (it protects the model, not the exchange): unbounded (issue 31)
        dp.charge(s, float("inf"), "no-dp", mode=req.mode, **({"labelled": "dp-model"} if req.dp_binning else {}))
    if pieces is not None:              # bounded driver: rows, edges and bins stay on the workers
        values = len(rows) * len(s.feature_names)     # mode plain: own workers only for a large table
        executor = s.get_executor(work=values if t.mode == Mode.HE or values >= PLAIN_WORKERS_FROM else -1)
        t.shards = ShardSet(executor, len(rows), prefix=f"train-{req.model_id}/")
        reader = ShardReader(t.shards, pieces, s.name)
        reader.read(rows)
        t.data_digest = reader.fingerprint()
        t.binner = reader.fit_binner(req.max_bin)
        reader.bin(t.binner)
        t.reader, t.bin_idx = reader, None
        t.candidates = new_exchange(s, req, monotone)
        return m.BinningInfo(t.binner.n_bins, np.zeros(0, dtype=bool),
                             monotone if monotone.any() else np.zeros(0, dtype=np.int8))
    t.binner = (_binner(req, s) if req.dp_binning is not None else
                Binner(req.max_bin, categorical if categorical.any() else None, req.max_cat)).fit(X)
    t.bin_idx = t.binner.transform(X)
    if t.mode != Mode.DP:               # the rows' shards stay on the workers for the whole training
        # plain sums are cheap: own worker processes only for ciphertexts (a caller's executor always)
        executor = s.get_executor(work=len(rows) * X.shape[1] if t.mode == Mode.HE else -1)
        t.shards = ShardSet(executor, len(rows), prefix=f"train-{req.model_id}/",
                            max_rows=stream_rows(len(rows), executor.n_workers) if t.settings.overlap else None)
        t.shards.place_array("bins", t.bin_idx)
        t.candidates = new_exchange(s, req, monotone)
        if t.candidates is not None and s.categorical_ordered:     # categorical features as ordered bins
            categorical = np.zeros_like(categorical)
    return m.BinningInfo(t.binner.n_bins, categorical if categorical.any() else np.zeros(0, dtype=bool),
                         monotone if monotone.any() else np.zeros(0, dtype=np.int8),
                         t.binner.report() if isinstance(t.binner, DPBinner) else None)


def _dp_domain(s: PassiveState, req: m.TrainSetup, X) -> m.BinningInfo:
    """Mode dp with noise: the release domain (:class:`vfl.core.dp.ReleaseDomain`): bucket counts from
    ``max_bin`` and this party's public bins, edges from those or from a DP histogram per feature
    charged to ``req.dp_binning`` (``{"epsilon": the party's edge budget}`` or
    ``{"epsilon_per_feature": per feature without public bins}``). The rows' raw values stay here."""
    spec = req.dp_binning
    key = "epsilon" if "epsilon" in spec else "epsilon_per_feature"
    val, total = spec.get(key), spec.get(f"training_{key}")
    if set(spec) - {f"training_{key}"} != {key} or any(
            isinstance(v, bool) or not isinstance(v, (int, float)) or not v >= 0 or not math.isfinite(v)
            for v in (val, 0.0 if total is None else total)):
        raise ProtocolError(f"mode dp: dp_binning must be {{'epsilon' or 'epsilon_per_feature': a finite number "
                            f">= 0, and optionally 'training_' + that key}}, got {spec!r}")
    public = public_columns(s.dp_bins, s.feature_names, s.name)
    n_dp = len(s.feature_names) - len(public)
    eps = float(val) if key == "epsilon" else float(val) * n_dp
    planned = None if total is None else float(total) * (1 if key == "epsilon" else len(s.feature_names))
    dp.charge(s, eps if n_dp else 0.0, "dp-edges", planned, dp_features=n_dp)
    t = s.train
    t.dp_domain = ReleaseDomain(req.max_bin, eps, noise_source(unsafe_seed(s, "edges")), public, s.name).fit(X)
    t.dp_X = np.asarray(X, dtype=np.float64)
    t.binner = t.bin_idx = None
    nb = t.dp_domain.n_bins
    return m.BinningInfo(nb, np.zeros(0, dtype=bool), np.zeros(0, dtype=np.int8), t.dp_domain.report())


def _binner(req: m.TrainSetup, s: PassiveState | None = None) -> Binner:
    """Exact quantile bins, or DP bin edges with the budget the active party gave (``--dp-model``),
    except on the features this party gave public bounds or edges for (``s.dp_bins``: no budget)."""
    if req.dp_binning is None:
        return Binner(req.max_bin)
    eps = req.dp_binning.get("epsilon")
    if set(req.dp_binning) - {"training_epsilon"} != {"epsilon"} or isinstance(eps, bool) \
            or not isinstance(eps, (int, float)) \
            or not eps > 0:      # NaN fails too
        raise ProtocolError(f"dp_binning must be {{'epsilon': a number > 0}}, got {req.dp_binning!r}")
    if s is None:
        return DPBinner(req.max_bin, float(eps))
    return DPBinner(req.max_bin, float(eps), noise_source(unsafe_seed(s, "bins")),
                    public=public_columns(s.dp_bins, s.feature_names, s.name), party=s.name)


def public_key(s: PassiveState, req: m.PublicKey) -> m.Ack:
    """The key holder's public key, of the scheme its ``TrainSetup`` announced (a key of another
    scheme is refused: the packing layout and the ciphertext modulus follow the scheme)."""
    t = s.train
    s.need("setup", t.mode)
    if req.scheme != t.scheme:
        raise ProtocolError(f"PublicKey: a {req.scheme!r} key for a training set up with scheme {t.scheme!r} "
                            "(TrainSetup.scheme) is refused")
    try:
        pk = schemes.public_key_from_fields(req.scheme, *req.numbers(),
                                            proof=req.proof if req.scheme == schemes.PAILLIER else None)
    except InputError as exc:
        raise ProtocolError(f"PublicKey from the active party: {exc}") from None
    t.public_key = pk
    t.plain_bits = schemes.plain_bits(pk)
    t.nsquare = gmpy2.mpz(schemes.cipher_modulus(pk))
    if t.randomizer is not None:
        t.randomizer.close()
    # every ciphertext this party returns is re-randomised with fresh obfuscators of this key made from its
    # own uniform randomness (Paillier r^n, OU y^n: no base the key holder chose), from a stock filled while
    # it waits (issue 31)
    t.randomizer = ReplyRandomizer(schemes.reply_encryptor(pk)).start()
    return m.Ack()


def _start_round(s: PassiveState, round_idx: int, encrypted: bool, layout: dict, per: int, shifts: int,
                 n_values: int | None, groups: int | None) -> ShardedGradients:
    """Check a round's gradient header; the round's (empty) received-gradients record."""
    t = s.train
    s.need("setup", t.binner)
    shards = s.need("setup", t.shards)
    if t.protocol is not None:
        t.protocol.check_open("gradients")
        t.protocol.check_round_open("gradients", int(round_idx))
    t.end_intake()
    n = len(t.rows)
    if encrypted != (t.mode == Mode.HE):
        raise ProtocolError(f"mode {t.mode!r} does not match encrypted={encrypted}")
    if encrypted:
        s.need("the public key", t.nsquare)
    if per < 1:
        raise ProtocolError("values_per_ciphertext must be positive")
    if shifts < 1 or (n_values is not None and (n_values == 0 or n_values % (shifts * n))):
        raise ProtocolError(f"got {n_values} gradient values for {n} samples (shifts={shifts})")
    why = check_shifts(shifts, per)
    if why is not None:
        raise ProtocolError(why)
    if shifts > 1 and t.candidates is not None:
        raise ProtocolError(f"party {s.name!r}: gradients with {shifts} pre-shifted copies; its shuffled candidates "
                            "are running sums of the bins, which need them without (shifts=1)")
    groups = n_values // (shifts * n) if groups is None else int(groups)
    if groups < 1:
        raise ProtocolError(f"the gradients must hold at least one target group, got {groups}")
    try:
        lay = PackingLayout.from_dict(layout)
    except (KeyError, TypeError, ValueError) as exc:
        raise ProtocolError(f"bad packing layout: {exc}") from None
    # sizes against what this session allows: sums of at most n rows, slots that fit the key
    space = t.plain_bits if encrypted else MAX_PLAIN_BITS      # the key's plaintext space (crypto.schemes)
    if lay.max_rows > n:
        raise ProtocolError(f"Gradients.layout: max_rows={lay.max_rows} but the training has {n} rows")
    if per * lay.value_bits > space - 2:
        raise ProtocolError(f"Gradients.layout: {per} values of {lay.value_bits} bits per ciphertext do not "
                            f"fit the key's {space}-bit plaintext space")
    if groups > MAX_GROUPS:
        raise ProtocolError(f"Gradients: more than {MAX_GROUPS} target groups")
    width, signed = value_width(t.nsquare if encrypted else None, lay.value_bits, per if shifts > 1 else 1)
    if shards.executor.closed:
        raise ProtocolError(f"party {s.name!r} lost its workers; restart the training (--resume)")
    t.grads = ShardedGradients(int(round_idx), bool(encrypted), lay, int(per), int(shifts), groups, width, signed,
                               np.zeros(n, dtype=bool))
    t.round_idx = round_idx
    return t.grads


class RoundIntake:
    """The passive party's side of the overlap (issue 12): a round's gradient shards are taken in
    while the first level is already being summed.

    The handler of a ``GradientShard`` only checks it (:meth:`crypto.shards.ShardSet.accept`) and
    queues it, so its acknowledgement does not wait; a background thread starts each message's
    writes into the workers holding its rows and, once a shard of this party's rows is complete,
    that shard's partial root histogram over all its rows (:meth:`crypto.shards.ShardSet.submit_root_partial`,
    after the writes on the same worker), without waiting for either (issue 24: every worker writes
    and sums at once), and takes their replies in as they finish.
    Rows no tree of the round samples carry placeholders that add nothing (``1`` / ``0``), so the
    sums over all rows are the sums over the sampled rows; the partial's reply says which rows hold
    such an identity value. At most two messages per worker (:data:`INTAKE_BACKLOG` at least,
    :data:`INTAKE_WINDOW_BYTES` at most) wait or are on their way to the workers (a slower party
    slows the sender down instead of holding the round).

    The first ``HistogramRequest`` of the round waits for the thread (:meth:`finish`), then
    :meth:`root_groups` decides whether the partials answer it: every node is a root (node 0),
    and for every tree asked about, each row not at the root holds an identity value (so the sum
    over the root's rows is the sum over all rows; this covers subsampling and GOSS, whose
    unsampled rows are placeholders, and the multi-tree rounds of several targets: one partial
    per target group). Else (another assignment, e.g. trees of one round sampling different
    rows, or a later request), today's path answers it. With pre-shifted copies the compressed
    output depends on the position of each node in the request: the partials are for the root of
    every target of every group in order, and another request falls back. The one-message
    ``Gradients``, mode ``dp`` and ``VFL_OVERLAP=0`` (:class:`parties.settings.Settings`) do not use
    the intake. Joint bins, plain mode and any executor (local pool, Dask) work as in
    :meth:`crypto.shards.ShardSet.histograms`: the same kernel, over all rows."""

    def __init__(self, party: str, shards: ShardSet, g: ShardedGradients, modulus, n_bins: list[int]):
        self.party, self.shards, self.g = party, shards, g
        self.modulus = modulus
        self.mhex = format(int(modulus), "x") if modulus is not None else None
        self.n_bins = [int(x) for x in n_bins]
        self.n_nodes = g.groups * g.layout.n_targets      # the roots the partials are for (shifts > 1)
        self.filled = np.zeros(len(shards), dtype=np.int64)
        self.ident = np.zeros((g.groups, shards.n_rows), dtype=bool)
        self.partials = np.zeros(len(shards), dtype=bool)
        self.events: list[tuple] = []          # ("partial", shard, seconds), ("request", ...): their order
        self.error: BaseException | None = None
        self.used = False
        self.budget = max(INTAKE_BACKLOG, 2 * shards.executor.n_workers)   # messages held at once
        self.held = 0                          # messages queued or being written to the workers
        self.held_bytes = 0                    # ... and their bytes
        self.room = threading.Condition()
        self.queue: queue.SimpleQueue = queue.SimpleQueue()    # messages, wake-ups, None: finish
        self.fills: deque = deque()            # Pending fills, in order
        self.roots: deque = deque()            # (shard, Pending root partial), in row order
        self.idle = threading.Event()
        self.idle.set()
        self.thread = threading.Thread(target=self._run, name=f"vfl-intake-{party}", daemon=True)
        self.thread.start()

    def put(self, start: int, stop: int, data: bytes) -> None:
        """Check and queue one gradient shard message (an earlier message's failure is raised here).
        Waits while :attr:`budget` messages, or :data:`INTAKE_WINDOW_BYTES`, are held (queued, or not
        yet written to their workers; :data:`INTAKE_BACKLOG` messages always may): a slower party
        slows the sender down instead of holding the round."""
        self._raise()
        self.shards.accept(self.g, start, stop, data)
        with self.room:
            while self.held >= INTAKE_BACKLOG and (self.held >= self.budget or
                                                   self.held_bytes + len(data) > INTAKE_WINDOW_BYTES) \
                    and self.error is None and self.thread.is_alive():
                self.room.wait(1.0)
            self.held += 1
            self.held_bytes += len(data)
        self.idle.clear()
        self.queue.put((start, stop, data))

    def _release(self, size: int) -> None:
        with self.room:
            self.held -= 1
            self.held_bytes -= size
            self.room.notify_all()
        self.queue.put(())             # wake the intake thread: something finished

    def _run(self) -> None:
        finishing = False
        while True:
            item = self.queue.get()
            if item is None:
                finishing = True
            elif item and self.error is None:
                try:
                    self._take(*item)
                except BaseException as exc:       # raised to the next handler
                    self.error = exc
            elif item:
                self._release(len(item[2]))        # a message after a failure: dropped
            item = None
            self._collect(wait=finishing)
            if finishing:
                self.idle.set()
                with self.room:
                    self.room.notify_all()
                return
            if self.queue.empty() and not self.fills and not self.roots:
                self.idle.set()

    def _take(self, start: int, stop: int, data: bytes) -> None:
        """Start one message's fills and, for every shard it completes, its root partial: the
        workers write and sum while the next messages arrive (one task per shard, on the worker
        holding it, each after the fills sent before it)."""
        size = len(data)
        try:
            pending = self.shards.submit_fill(self.g, start, stop, data, self.mhex)
        except BaseException:
            self._release(size)
            raise
        data = None
        left = [len(pending.futures)]
        lock = threading.Lock()

        def one_done(_fut):
            with lock:
                left[0] -= 1
                last = left[0] == 0
            if last:
                self._release(size)
        for fut in pending.futures:
            fut.add_done_callback(one_done)
        self.fills.append(pending)
        for k, lo, hi in self.shards.pieces(start, stop):
            self.filled[k] += hi - lo
            a, b = self.shards.bounds[k]
            if self.filled[k] == b - a:
                root = self.shards.submit_root_partial(self.g, k, self.n_bins, self.modulus, n_nodes=self.n_nodes)
                for fut in root.futures:
                    fut.add_done_callback(lambda _f: self.queue.put(()))
                self.roots.append((k, root))

    def _collect(self, wait: bool) -> None:
        """Take in the finished fills and root partials (all of them with ``wait``), in order."""
        try:
            while self.fills and (wait or self.fills[0].done()):
                self.fills.popleft().result()
            while self.roots and (wait or self.roots[0][1].done()):
                k, root = self.roots.popleft()
                a, b = self.shards.bounds[k]
                self.ident[:, a:b] = self.shards.root_ident(self.g, k, root.result())
                self.partials[k] = True
                self.events.append(("partial", k, time.perf_counter()))
                log.debug("party %s, round %d: root partial of shard %d ready", self.party, self.g.round_idx, k)
        except BaseException as exc:
            if self.error is None:
                self.error = exc
            self.fills.clear()
            self.roots.clear()

    def _raise(self) -> None:
        if self.error is not None:
            exc = self.error
            if isinstance(exc, WorkerError) and "out of range" in str(exc):
                raise ProtocolError("a ciphertext is out of range") from None
            raise exc

    def finish(self) -> None:
        """Wait until every queued message is in the workers (and their partials are summed)."""
        if self.thread.is_alive():
            self.queue.put(None)
            self.thread.join()
        self._raise()

    def close(self) -> None:
        """Stop (the round is over or abandoned); errors are forgotten."""
        if self.thread.is_alive():
            self.error = self.error or ProtocolError("round abandoned")
            self.queue.put(None)
            self.thread.join()

    def root_groups(self, tree_idx: np.ndarray, node_ids: np.ndarray, assignment: np.ndarray):
        """The target group of each request node when the partials answer this request, else None
        (with the reason logged); only the round's first request may use them."""
        g = self.g
        first, self.used = not self.used, True
        if not first:
            return None
        why = None
        if not self.partials.all():
            why = "not every shard's partial is ready"
        elif node_ids.size == 0 or np.any(node_ids != 0):
            why = "the request is not the root level"
        elif g.shifts > 1 and not np.array_equal(tree_idx, np.arange(self.n_nodes)):
            why = f"with pre-shifted copies the partials are for trees 0..{self.n_nodes - 1} in order"
        groups = (tree_idx // g.layout.n_targets) if g.groups > 1 else np.zeros(len(tree_idx), dtype=np.int64)
        if why is None:
            for t, j in zip(tree_idx.tolist(), groups.tolist()):
                if not self.ident[j][assignment[t] != 0].all():
                    why = f"tree {t}: a row outside the root carries a gradient"
                    break
        if why is not None:
            log.debug("party %s, round %d: root partials not used (%s)", self.party, g.round_idx, why)
            return None
        return groups.tolist()


def _modulus_hex(s: PassiveState):
    t = s.train
    return format(int(t.nsquare), "x") if t.mode == Mode.HE else None


def gradients(s: PassiveState, req: m.Gradients) -> m.Ack:
    """The whole round in one message (the form before gradient streams): forwarded to the shards
    like a stream of one shard."""
    g = _start_round(s, req.round_idx, req.encrypted, req.layout, int(req.values_per_ciphertext), int(req.shifts),
                     len(req.values), None)
    if req.encrypted:
        n2 = s.train.nsquare
        if any(not (0 < v < n2) for v in req.values):
            raise ProtocolError("a ciphertext is out of range")
    try:
        data = ints_to_bytes(req.values.values, g.width, g.signed)
    except OverflowError:
        raise ProtocolError("a gradient value does not fit the packing layout") from None
    s.train.shards.forward(g, 0, len(s.train.rows), data, _modulus_hex(s))
    return m.Ack()


def gradients_start(s: PassiveState, req: m.GradientsStart) -> m.Ack:
    n = len(s.need("alignment", s.train.rows))
    if req.n_samples != n:
        raise ProtocolError(f"gradients for {req.n_samples} samples, party {s.name!r} aligned {n}")
    g = _start_round(s, req.round_idx, req.encrypted, req.layout, int(req.values_per_ciphertext), int(req.shifts),
                     None, req.groups)
    if (req.width, req.signed) != (g.width, g.signed):
        raise ProtocolError(f"gradient values of {req.width} bytes (signed={req.signed}), expected {g.width} "
                            f"(signed={g.signed})")
    t = s.train
    if t.settings.overlap:          # the first level starts as the shards arrive
        t.intake = RoundIntake(s.name, t.shards, g, t.nsquare if t.mode == Mode.HE else None,
                               np.diff(t.binner.bin_offsets).tolist())
    return m.Ack()


def gradient_shard(s: PassiveState, req: m.GradientShard) -> m.Ack:
    g = s.need("gradients", s.train.grads)
    _check_round(s, req.round_idx)
    if s.train.protocol is not None:
        s.train.protocol.check_open("GradientShard")
    if s.train.intake is not None and s.train.intake.g is g:
        s.train.intake.put(int(req.start), int(req.stop), req.values)
        return m.Ack()
    try:
        s.train.shards.forward(g, int(req.start), int(req.stop), req.values, _modulus_hex(s))
    except WorkerError as exc:
        if "out of range" in str(exc):
            raise ProtocolError("a ciphertext is out of range") from None
        raise
    return m.Ack()


def train_end(s: PassiveState, req: m.TrainEnd) -> m.Ack:
    if req.model_id != s.model_id:
        raise ProtocolError("TrainEnd for an unknown model")
    s.completed = bool(req.completed)
    s.train.grads = None
    s.close_executor()
    if s.eval_session is not None:      # the validation session ends with training
        s.sessions.pop(s.eval_session, None)
        s.eval_session = None
    return m.Ack({"n_records": len(s.table)})
