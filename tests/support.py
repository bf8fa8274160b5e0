"""Small shared helpers of the test suite (fixtures are in conftest.py)."""
import contextlib
import copy
import logging
import math
import select
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
from hypothesis import settings
from hypothesis import strategies as st
from scipy import integrate

from protocols import messages as m
from protocols.serialization import BigInts
from vfl.core.tree import Node

KEY_BITS = 1024   # tests use 1024-bit keys unless they are about key size


def small_frames(n=120, seed=0):
    """A tiny three-party problem (active with 2 features, two passives with 2 each)."""
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 6))
    y = (X[:, 0] + X[:, 2] - X[:, 4] + 0.3 * rng.normal(size=n) > 0).astype(int)
    ids = np.arange(n)
    a = pd.DataFrame({"id": ids, "y": y, "a0": X[:, 0], "a1": X[:, 1]})
    b = pd.DataFrame({"id": ids, "b0": X[:, 2], "b1": X[:, 3]})
    c = pd.DataFrame({"id": ids, "c0": X[:, 4], "c1": X[:, 5]})
    return a, b, c


class ColumnReader:
    """A column reader over a matrix (``shape``, ``column(j)``: what
    :class:`datasets.loaders.DeferredColumns` is to :mod:`vfl.core.binning`); ``reads`` lists the
    columns read, in order."""

    def __init__(self, X):
        self.X, self.shape, self.reads = X, X.shape, []

    def column(self, j):
        self.reads.append(j)
        return self.X[:, j].copy()


def alive(pid: int) -> bool:
    """Whether process ``pid`` is still running (not gone, not a zombie)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] not in ("Z", "X")
    except FileNotFoundError:
        return False


# --- mutations of JSON documents (property tests of the file loaders) ------------------------------
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-(2 ** 70), 2 ** 70) | st.sampled_from([0, 1, -1, 2, 3, 99, 2 ** 40])
    | st.floats() | st.text(max_size=6) | st.sampled_from(["inf", "-inf", "nan", "a", "b", "c", "a0", "00"]),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=6)


def paths(doc, prefix=()):
    """Every position in a JSON document: ``(path, value)``."""
    yield prefix, doc
    if isinstance(doc, dict):
        for k, v in doc.items():
            yield from paths(v, prefix + (k,))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            yield from paths(v, prefix + (i,))


@st.composite
def mutated(draw, doc: dict):
    """``doc`` with one position replaced, deleted, emptied, duplicated or re-typed."""
    doc = copy.deepcopy(doc)
    where = draw(st.sampled_from([p for p, _ in paths(doc) if p]))
    parent = doc
    for k in where[:-1]:
        parent = parent[k]
    key = where[-1]
    action = draw(st.sampled_from(["replace", "replace", "delete", "number", "swap"]))
    if action == "delete":
        del parent[key]
    elif action == "number" and isinstance(parent[key], (int, float)) and not isinstance(parent[key], bool):
        parent[key] = parent[key] + draw(st.sampled_from([1, -1, 0.5, 10 ** 6, -(10 ** 6)]))
    elif action == "swap" and isinstance(parent, list) and len(parent) > 1:
        parent.append(copy.deepcopy(parent[0]))
    else:
        parent[key] = draw(JSON_VALUES)
    return doc, where, action
def streamed_gradients(messages) -> list:
    """The gradient rounds among ``messages`` (decoded requests to ONE passive party, in order),
    reassembled from their streams (``GradientsStart`` + ``GradientShard`` messages): a list of
    ``(start message, values)`` with ``values`` the ints in the one-message order (target group,
    shift, row), as a ``Gradients`` message would carry them."""
    out, cur = [], None
    for msg in messages:
        if isinstance(msg, m.GradientsStart):
            cur = (msg, [None] * (msg.groups * msg.shifts * msg.n_samples))
            out.append(cur)
        elif isinstance(msg, m.GradientShard):
            start, values = cur
            assert msg.round_idx == start.round_idx
            k = msg.stop - msg.start
            w = start.width
            vals = [int.from_bytes(msg.values[i:i + w], "big", signed=start.signed)
                    for i in range(0, len(msg.values), w)]
            assert len(vals) == start.groups * start.shifts * k
            for blk in range(start.groups * start.shifts):
                values[blk * start.n_samples + msg.start:blk * start.n_samples + msg.stop] = vals[blk * k:(blk + 1) * k]
    assert all(None not in values for _, values in out), "a gradient stream is incomplete"
    return out


def gradient_messages(messages) -> list:
    """The gradient rounds among ``messages`` (to one passive party) as the one-message form a
    ``Gradients`` message carries (reassembled from their streams, see :func:`streamed_gradients`)."""
    return [m.Gradients(start.round_idx, start.encrypted, start.layout, start.values_per_ciphertext,
                        BigInts(values), start.shifts) for start, values in streamed_gradients(messages)]


def cli_command(*args) -> list[str]:
    """The argv of ``vfl ARGS...`` in this interpreter (``python -m cli``)."""
    return [sys.executable, "-m", "cli", *map(str, args)]


def start_passive(children: list, tmp, name: str, *args, env=None, cwd=None) -> str:
    """Start ``vfl party passive --name NAME --listen 127.0.0.1:0 ARGS...`` (appended to ``children``,
    stderr in ``tmp/NAME.err``) and return the address it prints once it listens."""
    err_path = Path(tmp) / f"{name}.err"
    with open(err_path, "w") as err:
        p = subprocess.Popen(cli_command("party", "passive", "--name", name, "--listen", "127.0.0.1:0", *args),
                             cwd=cwd or Path(__file__).resolve().parents[1], stdout=subprocess.PIPE, stderr=err,
                             text=True, env=env)
    children.append(p)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        assert p.poll() is None, err_path.read_text()
        ready, _, _ = select.select([p.stdout], [], [], 0.2)
        if ready and "listening on" in (line := p.stdout.readline()):
            return line.strip().rsplit(" ", 1)[1]
    raise AssertionError(f"passive {name} did not start: {err_path.read_text()}")


def halving_levels(mech, root_hists, child_hists, offsets, tree=(0, 0)):
    """Grow the first two levels of one DP-model tree with ``mech`` (a ``TreeMechanisms``): the
    root's split and the bin indices its left and right children split at."""
    root = Node(0, 0)
    nodes = [root]
    split = mech.choose_split(root, root_hists, offsets, tree, nodes)
    root.left, root.right = 1, 2
    nodes += [Node(1, 1, parent=0), Node(2, 1, parent=0)]
    return (split, mech.choose_split(nodes[1], child_hists, offsets, tree, nodes).bin_idx,
            mech.choose_split(nodes[2], child_hists, offsets, tree, nodes).bin_idx)


def rnm_probs(u, scale: float) -> np.ndarray:
    """Exact selection probabilities of report-noisy-max with exponential noise of ``scale``
    (OpenDP's make_noisy_max under max divergence), by numerical integration (independent of the
    sampler): P(i) = int f_i(x) prod_{j != i} F_j(x) dx."""
    u = np.asarray(u, dtype=float)
    out = []
    for i in range(u.size):
        def f(x, i=i):
            rest = [1 - math.exp(-(x - u[j]) / scale) if x > u[j] else 0.0 for j in range(u.size) if j != i]
            return math.exp(-(x - u[i]) / scale) / scale * float(np.prod(rest))
        pts = sorted({float(v) for v in u if v > u[i]})
        out.append(integrate.quad(f, u[i], u[i] + 60 * scale, points=pts or None, limit=200)[0])
    return np.array(out)


def examples(n: int) -> int:
    """A property test's example count: ``n`` under the dev and ci hypothesis profiles, scaled with
    the profile in force (``thorough``: ten times; see tests/conftest.py)."""
    return max(1, round(n * settings().max_examples / 100))


@contextlib.contextmanager
def logs_of(caplog, name, level="WARNING"):
    """Capture logger ``name``'s records in ``caplog`` with its own handler: a CLI run earlier in
    the same process (``setup_logging``) may have stopped ``vfl`` propagating to the root logger,
    where ``caplog`` listens."""
    logger = logging.getLogger(name)
    logger.addHandler(caplog.handler)
    try:
        with caplog.at_level(level, logger=name):
            yield
    finally:
        logger.removeHandler(caplog.handler)
