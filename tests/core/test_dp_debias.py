"""DP-only mode, the active party's estimator (vfl.core.dp_debias) and --dp-buckets / --dp-select:
unbiasedness by simulation, the variance correction, the automatic bucket rule, coarse buckets,
split scoring, the --dp-select accounting and what reaches the active party, bad input."""
import json
import math

import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner
from support import small_frames

from cli import main
from parties.active import ActiveParty
from parties.dp import (
    MIN_PILOT_ROWS_PER_FEATURE,
    PILOT_FRACTION,
    buckets_at,
    pilot_rows,
    pilot_size,
    selected_count,
)
from parties.passive import PassiveParty
from protocols import messages as m
from protocols.serialization import loads
from vfl.api import Federation
from vfl.core.binning import Binner
from vfl.core.dp import randomized_response
from vfl.core.dp_debias import (
    DebiasedBucketSource,
    auto_buckets,
    auto_select,
    coarse_buckets,
    debias,
    prefix_variance,
    root_gains,
    rr_channel,
    split_signal,
)
from vfl.core.dp_noise import SeededNoise
from vfl.core.errors import InputError
from vfl.core.params import TrainParams

INF = float("inf")


def _simulate(q=6, eps=1.0, n=3000, reps=1500, seed=0):
    """Many releases of one fixed column with known gradients: per release the debiased
    per-bucket sums, the debiased prefix sums and their variance estimates."""
    rng = np.random.default_rng(seed)
    true = rng.integers(0, q, size=n)
    g = rng.normal(size=n) + 0.8 * (true >= q // 2)           # gradients depend on the bucket
    _, r, lam = rr_channel(eps, q)
    G_true = np.bincount(true, g, minlength=q)
    noisy_hists = np.empty((reps, q))
    sq_hists = np.empty((reps, q))
    for i in range(reps):
        noisy = randomized_response(true, q, eps, SeededNoise(rng))
        noisy_hists[i] = np.bincount(noisy, g, minlength=q)
        sq_hists[i] = np.bincount(noisy, g * g, minlength=q)
    return true, g, r, lam, G_true, noisy_hists, sq_hists


def test_debiasing_is_unbiased_and_a_wrong_channel_is_not():
    q, eps = 6, 1.0
    true, g, r, lam, G_true, noisy, _ = _simulate(q, eps)
    total = g.sum()
    est = debias(noisy, total, r, lam)
    mean, se = est.mean(axis=0), est.std(axis=0, ddof=1) / math.sqrt(len(est))
    assert np.all(np.abs(mean - G_true) < 4 * se + 1e-9)
    # the raw noisy histogram is biased (shrunk towards the mean) ...
    raw_mean = noisy.mean(axis=0)
    assert np.max(np.abs(raw_mean - G_true) / se) > 20
    # ... and so is a debiasing with the wrong channel: r and lambda of q+1 buckets (an
    # off-by-one domain), or lambda = p (forgetting the r of the staying bucket)
    p = r + lam
    _, r2, lam2 = rr_channel(eps, q + 1)
    for rr, ll in ((r2, lam2), (r, p)):
        wrong = debias(noisy, total, rr, ll).mean(axis=0)
        assert np.max(np.abs(wrong - G_true) / se) > 6


def test_variance_correction_matches_the_empirical_variance():
    q, eps = 6, 1.0
    true, g, r, lam, G_true, noisy, sq = _simulate(q, eps, reps=2000, seed=3)
    total, a2_total = g.sum(), (g * g).sum()
    for size in (1, 2, 3, 5):
        GL = debias(noisy[:, :size].sum(axis=1), total, r * size, lam)
        assert abs(GL.mean() - G_true[:size].sum()) < 4 * GL.std() / math.sqrt(len(GL))
        V = prefix_variance(sq[:, :size].sum(axis=1), a2_total, size, r, lam)
        empirical = GL.var(ddof=1)
        assert V.mean() == pytest.approx(empirical, rel=0.08)
        # E[G^_L^2] - Var = G_L^2: the corrected square is unbiased
        corrected = GL ** 2 - V
        se = corrected.std(ddof=1) / math.sqrt(len(corrected))
        assert abs(corrected.mean() - G_true[:size].sum() ** 2) < 4 * se
        # without the correction the square is biased upwards by the variance (measurable where the
        # variance is large next to G_L^2: not for the 5-bucket prefix, where the bias is ~3 se)
        if size <= 3:
            assert (GL ** 2).mean() - G_true[:size].sum() ** 2 > 10 * se


def test_channel_formulas():
    for eps, k in ((0.5, 2), (1.0, 8), (4.0, 33)):
        p, r, lam = rr_channel(eps, k)
        assert p == pytest.approx(math.exp(eps) / (math.exp(eps) + k - 1))
        assert r == pytest.approx(1 / (math.exp(eps) + k - 1))
        assert lam == pytest.approx(p - r) and p + (k - 1) * r == pytest.approx(1)
    assert rr_channel(INF, 32) == (1.0, 0.0, 1.0)
    assert rr_channel(1e5, 4) == (1.0, 0.0, 1.0)
    assert rr_channel(2.0, 1) == (1.0, 0.0, 1.0)


def test_auto_buckets_rule():
    # argmax over q of lambda(q) * (1 - 1/q)
    def rule(eps, top):
        qs = range(2, top + 1)
        return max(qs, key=lambda q: rr_channel(eps, q)[2] * (1 - 1 / q))
    for eps in (0.1, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, 8.0):
        assert auto_buckets(eps, 256) == rule(eps, 256)
    assert auto_buckets(0.5, 100) == 2
    assert auto_buckets(1.0, 100) in (2, 3)
    assert auto_buckets(2.0, 100) in (4, 5)
    assert 8 <= auto_buckets(4.0, 100) <= 16
    qs = [auto_buckets(e, 1000) for e in (0.25, 0.5, 1, 2, 4, 8)]
    assert qs == sorted(qs)                                  # more budget, more buckets
    # never more buckets than values: a binary feature keeps its two values
    assert auto_buckets(8.0, 2) == 2 and auto_buckets(4.0, 5) == 5 and auto_buckets(4.0, 1) == 1
    with pytest.raises(InputError, match="finite epsilon"):
        auto_buckets(INF, 10)
    with pytest.raises(InputError, match="at least one value"):
        auto_buckets(1.0, 0)


def test_coarse_buckets_equal_frequency_never_empty_never_cut():
    counts = np.array([10, 10, 10, 10, 10, 10, 10, 10])
    assert coarse_buckets(counts, 4).tolist() == [0, 0, 1, 1, 2, 2, 3, 3]
    assert coarse_buckets(counts, 8).tolist() == list(range(8))
    assert coarse_buckets(counts, 20).tolist() == list(range(8))
    # a heavy tie stays one bucket; no bucket is empty; numbering has no gaps
    g = coarse_buckets(np.array([5, 60, 5, 5, 5, 5, 5, 10]), 4)
    assert g[1] != g[0] or g[1] != g[2]
    assert set(g.tolist()) == set(range(g.max() + 1)) and np.all(np.diff(g) >= 0)
    assert g.max() + 1 <= 4
    # empty fine bins join a neighbour
    g = coarse_buckets(np.array([0, 10, 0, 10, 10, 0]), 2)
    assert g.tolist() == sorted(g.tolist()) and g.max() == 1


def _source(true, q, eps, rng, g, h):
    noisy = randomized_response(true, q, eps, SeededNoise(rng))[:, None]
    src = DebiasedBucketSource("b", noisy, np.array([q + 1]), np.array([q]), eps, lambda f, b, d: f)
    src._g, src._h = g[:, None], h[:, None]
    src._gu, src._hu, src._g2 = src._g, src._h, src._g ** 2
    return src


def test_split_scoring_finds_the_signal_and_refuses_pure_noise():
    rng = np.random.default_rng(0)
    n, q = 4000, 4
    true = rng.integers(0, q, size=n)
    y = rng.random(n) < np.where(true >= 2, 0.8, 0.2)
    g, h = (0.5 - y).astype(float), np.full(n, 0.25)
    params = TrainParams(mode="dp", epsilon=1.0)
    assignment = np.zeros((1, n), dtype=np.int32)
    src = _source(true, q, 1.0, rng, g, h)
    sg, sh = src.build(0, np.array([0]), np.array([0]), assignment)
    best = src.best_split(sg[0], sh[0], g.sum(), h.sum(), params, 0)
    assert best is not None and best.bin_idx == 1 and best.gain > 0
    # a column carrying no signal: the confidence bound refuses every split (the LCB <= 0)
    noise_col = rng.integers(0, q, size=n)
    src = _source(noise_col, q, 0.3, rng, g, h)
    sg, sh = src.build(0, np.array([0]), np.array([0]), assignment)
    assert src.best_split(sg[0], sh[0], g.sum(), h.sum(), params, 0) is None
    # ... whereas the undebiased gain (z = 0 and no variance correction) of noise is positive
    src.lam[:] = 1.0
    src.r[:] = 0.0
    sg, sh = src.build(0, np.array([0]), np.array([0]), assignment)
    assert src.best_split(sg[0], sh[0], g.sum(), h.sum(), params, 0, z=0.0).gain > 0


def test_root_gains_rank_the_informative_feature_first():
    rng = np.random.default_rng(1)
    n, q = 3000, 3
    X = rng.integers(0, q, size=(n, 3))
    y = rng.random(n) < np.where(X[:, 1] == 2, 0.85, 0.15)
    g, h = (0.5 - y).astype(float), np.full(n, 0.25)
    eps = 1.0
    noisy = np.column_stack([randomized_response(X[:, j], q, eps, SeededNoise(rng)) for j in range(3)])
    gains = root_gains(noisy, np.full(3, q + 1), np.full(3, q), eps, g, h, TrainParams(mode="dp", epsilon=1.0))
    assert int(np.argmax(gains)) == 1 and gains[1] > 10 * max(gains[0], gains[2], 1e-9)


# --- in a federation ---------------------------------------------------------------
def _fed(frames, record=False, seeds=(11, 12)):
    a, b, c = frames
    fed = Federation(ActiveParty("a", a, label_col="y"), [PassiveParty("b", b), PassiveParty("c", c)],
                     **({"record": True} if record else {}))
    fed.passives["b"].dp_unsafe_noise_seed, fed.passives["c"].dp_unsafe_noise_seed = seeds
    return fed


@pytest.fixture
def frames():
    return small_frames(400, seed=3)


def test_dp_select_accounting_adds_up(frames):
    fed = _fed(frames, record=True)
    eps = 2.0
    fed.fit(TrainParams(mode="dp", epsilon=eps, dp_select=1, n_estimators=3, max_depth=3))
    for name in ("b", "c"):
        info = fed.passives[name].dp_release_info()
        *pilots, main = info["releases"]
        n = info["n_samples"]
        # the pilot: one group of rows per feature, each releasing that one feature at the whole budget
        assert [r["features"] for r in pilots] == [[0], [1]]
        rel = eps - info["releases"][0]["edge_epsilon"]          # what the edges leave (0.9 eps)
        assert rel == pytest.approx(0.9 * eps)
        assert all(r["n_features"] == 1 and r["epsilon_per_feature"] == rel for r in pilots)
        assert sum(r["n_samples"] for r in pilots) == len(pilot_rows(n, 0))
        # the main release: k = 1 feature at rel / k, on the other rows
        assert main["n_features"] == 1 and main["epsilon_per_feature"] == rel / 1
        assert n == len(frames[0])                  # every aligned row released exactly once (below)
        # every row's loss is eps: the releases' row sets are disjoint (parallel composition)
        assert all(r["epsilon_per_party"] == pytest.approx(eps) for r in info["releases"])
        assert info["epsilon_per_party"] == pytest.approx(eps)
    by_peer = {}
    for s_, r, f in fed.transport.log:
        x = loads(f)
        if s_ == "a" and isinstance(x, m.DPReleaseRequest):
            by_peer.setdefault(r, []).append(x)
    assert set(by_peer) == {"b", "c"}
    for name, reqs in by_peer.items():
        assert len(reqs) == 3                                   # two pilot groups and the release
        rows = np.concatenate([q.rows for q in reqs])
        assert np.array_equal(np.sort(rows), np.arange(len(frames[0])))
        assert all(q.features.size == 1 for q in reqs)
    # a further release of any row is refused
    with pytest.raises(Exception, match="already released"):
        fed.transport.call("b", m.DPReleaseRequest(fed.model.model_id, 1.0, None, np.array([0]), None))


def test_dp_select_report_and_no_raw_value_reaches_the_active_party(frames):
    a, b, c = frames
    fed = _fed(frames, record=True)
    fed.fit(TrainParams(mode="dp", epsilon=4.0, dp_select=1, n_estimators=2, max_depth=3, max_bin=8))
    rep = fed.active.dp_report
    assert rep["epsilon_per_party"] == {"b": 4.0, "c": 4.0}
    assert rep["epsilon_per_feature"] == {"b": 3.6, "c": 3.6}          # one feature released at 4 - 0.4
    for name in ("b", "c"):
        sel = rep["dp_select"][name]
        assert sel["k"] == 1 and len(sel["features"]) == 1 and sel["pilot_epsilon_per_feature"] == 3.6
        # per row, the release's part (the edges' 0.4 comes on top: 4 per row in all)
        assert sel["pilot_epsilon_per_row"] == sel["release_epsilon_per_row"] == 3.6
    json.dumps(rep)                                                     # JSON-safe
    secrets_ = {"b": b[["b0", "b1"]].to_numpy(), "c": c[["c0", "c1"]].to_numpy()}
    thresholds = {k: np.concatenate(Binner(8).fit(X).thresholds_) for k, X in secrets_.items()}
    for s, r, f in fed.transport.log:
        if r != "a":
            continue
        msg = loads(f)
        assert type(msg).__name__ in {"IdHashes", "AlignAck", "BinningInfo", "DPRelease", "DPSplitRecords",
                                      "Ack", "RouteResponse", "LeafMaskResponse"}
        for name, v in vars(msg).items():
            if isinstance(v, np.ndarray):
                assert v.dtype.kind in "biu", (type(msg).__name__, name)
            elif isinstance(v, (dict, str)):
                blob = json.dumps(v) if isinstance(v, dict) else v
                for x in np.concatenate([secrets_[s].ravel(), thresholds[s]]):
                    assert repr(float(x)) not in blob
    # the model predicts through the passive parties' true thresholds
    p = fed.predict_proba({k: f.assign(id=f["id"] + 10 ** 6) for k, f in zip("abc", (a, b, c))})
    assert p.shape[0] == len(a) and np.all((p >= 0) & (p <= 1))


def test_inf_with_auto_buckets_and_select_is_plain_training_exactly(frames):
    a, b, c = frames
    plain = _fed(frames)
    plain.fit(TrainParams(mode="plain", n_estimators=3, max_depth=3, max_bin=8))
    for extra in ({}, {"dp_select": 1}, {"dp_buckets": "auto", "dp_debias": True}):
        fed = _fed(frames)
        fed.fit(TrainParams(mode="dp", epsilon=INF, n_estimators=3, max_depth=3, max_bin=8, **extra))
        new = {"a": a, "b": b, "c": c}
        assert np.array_equal(fed.predict_proba(new), plain.predict_proba(new))
        assert "dp_select" not in fed.active.dp_report        # at inf nothing is selected: no noise


def test_explicit_buckets_keep_the_old_mechanism(frames):
    fed = _fed(frames)
    fed.fit(TrainParams(mode="dp", epsilon=2.0, n_estimators=1, max_depth=2, dp_buckets=32, dp_debias=False))
    rep = fed.active.dp_report
    assert rep["dp_debias"] is False
    n_bins = {p: fed.passives[p].dp_release_info()["n_buckets"] for p in ("b", "c")}
    assert rep["dp_buckets"] == n_bins and all(v == 32 for vs in n_bins.values() for v in vs)
    fed = _fed(frames)
    fed.fit(TrainParams(mode="dp", epsilon=2.0, n_estimators=1, max_depth=2, dp_buckets=3))
    assert all(v == 3 for vs in fed.active.dp_report["dp_buckets"].values() for v in vs)


@pytest.mark.parametrize("kw, msg", [
    ({"dp_select": 0}, "dp_select must be .auto., .none. or an integer >= 1"),
    ({"dp_select": 1.5}, "dp_select must be .auto., .none. or an integer >= 1"),
    ({"dp_buckets": 1}, "dp_buckets must be 'auto' or an integer in"),
    ({"dp_buckets": "many"}, "dp_buckets must be 'auto' or an integer in"),
    ({"dp_debias": "yes"}, "dp_debias must be True or False"),
])
def test_bad_dp_options(kw, msg):
    with pytest.raises(InputError, match=msg):
        TrainParams(mode="dp", epsilon=1.0, **kw)


def test_dp_select_more_than_a_party_has(frames):
    fed = _fed(frames)
    with pytest.raises(InputError, match=r"dp_select=3 releases 3 features per passive party, but party 'b' has 2"):
        fed.fit(TrainParams(mode="dp", epsilon=1.0, dp_select=3, n_estimators=1))


def test_cli_dp_options(tmp_path):
    rng = np.random.default_rng(0)
    n = 300
    X = rng.normal(size=(n, 5))
    y = (X[:, 0] + X[:, 2] > 0).astype(int)
    pd.DataFrame({"id": np.arange(n), "y": y, "a0": X[:, 0], "a1": X[:, 1]}).to_csv(tmp_path / "g.csv", index=False)
    pd.DataFrame({"id": np.arange(n), "h0": X[:, 2], "h1": X[:, 3], "h2": X[:, 4]}).to_csv(tmp_path / "h.csv",
                                                                                          index=False)
    base = ["simulate", "--active", str(tmp_path / "g.csv"), "--passive", str(tmp_path / "h.csv"), "--mode", "dp",
            "--epsilon", "3", "--rounds", "2", "--depth", "2", "--quiet"]
    out = tmp_path / "r.json"
    res = CliRunner().invoke(main, [*base, "--dp-select", "1", "--dp-buckets", "auto", "--output-json", str(out)])
    assert res.exit_code == 0, res.output
    doc = json.loads(out.read_text())
    assert doc["dp_select"]["passive1"]["k"] == 1 and len(doc["dp_select"]["passive1"]["features"]) == 1
    assert doc["epsilon_per_party"] == {"passive1": 3.0}
    assert doc["epsilon_per_feature"] == {"passive1": pytest.approx(2.7)}
    assert doc["params"]["dp_select"] == 1 and doc["params"]["dp_buckets"] == "auto"
    res = CliRunner().invoke(main, [*base, "--no-dp-debias", "--dp-buckets", "32", "--output-json", str(out)])
    assert res.exit_code == 0, res.output
    assert json.loads(out.read_text())["dp_debias"] is False
    res = CliRunner().invoke(main, [*base, "--dp-select", "5"])
    assert res.exit_code != 0 and "dp_select=5" in res.output and "'passive1' has 3" in res.output
    res = CliRunner().invoke(main, [*base, "--dp-select", "none", "--output-json", str(out)])
    assert res.exit_code == 0, res.output
    doc = json.loads(out.read_text())
    assert "dp_select" not in doc and doc["params"]["dp_select"] is None
    assert doc["epsilon_per_feature"] == {"passive1": pytest.approx(0.9)}  # every feature at (3 - 0.3) / 3
    res = CliRunner().invoke(main, [*base, "--output-json", str(out)])  # the default: auto (pilot too small)
    assert res.exit_code == 0 and json.loads(out.read_text())["params"]["dp_select"] == "auto"
    res = CliRunner().invoke(main, [*base, "--dp-buckets", "x"])
    assert res.exit_code != 0 and "dp_buckets must be 'auto'" in res.output


def test_dp_select_auto_rule():
    """auto leaves K to the pilot (selected_count says AUTO); an explicit k, none and inf as before."""
    assert [selected_count("auto", 10, e) for e in (0.5, 1, 2, 8, 40)] == ["auto"] * 5
    assert selected_count(2, 10, 1.0) == 2 and selected_count(None, 10, 1.0) is None
    assert selected_count("auto", 10, INF) is None and selected_count(2, 10, INF) is None   # no noise
    assert TrainParams(mode="dp", epsilon=1.0, dp_select="AUTO").dp_select == "auto"
    assert TrainParams(mode="dp", epsilon=1.0, dp_select="3").dp_select == 3


def test_split_signal_is_the_auto_bucket_criterion():
    for eps in (0.5, 1.0, 2.0, 4.0, 8.0):
        lam = {q: rr_channel(eps, q)[2] for q in range(2, 33)}
        assert all(split_signal(eps, q) == pytest.approx(lam[q] * (1 - 1 / q)) for q in lam)
        q = auto_buckets(eps, 32)
        assert split_signal(eps, q) == max(split_signal(eps, x) for x in range(2, 33))
    assert split_signal(3.0, 1) == 0.0                              # one bucket: no split
    assert split_signal(INF, 4) == pytest.approx(0.75)               # no noise: lambda = 1


def _auto_select_by_hand(gains, q_at, eps):
    """S(K) = sum over the top K features of max(gain, 0) * lambda(eps/K, q) * (1 - 1/q), by hand."""
    g = np.maximum(np.asarray(gains, float), 0)
    order = sorted(range(len(g)), key=lambda f: (-g[f], f))
    out = []
    for k in range(1, len(g) + 1):
        e = eps / k
        total = 0.0
        for f in order[:k]:
            q = int(q_at(e)[f])
            p_stay = math.exp(e) / (math.exp(e) + q - 1)
            r = 1 / (math.exp(e) + q - 1)
            total += g[f] * (p_stay - r) * (1 - 1 / q)
        out.append(total)
    return out


@pytest.mark.parametrize("gains, eps, k", [
    ([1561, 27, 32, 5, 84, 1179, 903, 819, 516, 545], 8.0, 3),   # default_credit's pilot at 8, seed 0
    ([1561, 27, 32, 5, 84, 1179, 903, 819, 516, 545], 4.0, 2),
    ([1561, 27, 32, 5, 84, 1179, 903, 819, 516, 545], 1.0, 1),   # a small budget: one feature
    ([100, 100, 100, 100], 40.0, 4),                              # equal signal, a large budget: all
    ([-3.0, 0.0, -1.0], 8.0, 1),                                  # no positive gain: one feature
])
def test_auto_select_follows_its_formula(gains, eps, k):
    n_bins = np.array([82, 3, 8, 5, 57, 12, 12, 12, 12, 11][:len(gains)]) if len(gains) == 10 \
        else np.full(len(gains), 33)
    q_at = lambda e: buckets_at(n_bins, e, "auto")          # noqa: E731
    got_k, scores = auto_select(gains, q_at, eps)
    want = _auto_select_by_hand(gains, q_at, eps)
    assert scores == pytest.approx(want, rel=1e-12)
    assert got_k == k
    if max(want) > 0:
        assert got_k == 1 + int(np.argmax(want))


def test_auto_select_bad_input():
    with pytest.raises(InputError, match="finite gain per feature"):
        auto_select([1.0, float("nan")], lambda e: np.array([4, 4]), 2.0)
    with pytest.raises(InputError, match="2 bucket counts for 3 features"):
        auto_select([1.0, 2.0, 3.0], lambda e: np.array([4, 4]), 2.0)
    with pytest.raises(InputError, match="needs a finite epsilon"):
        auto_select([1.0, 2.0], lambda e: np.array([4, 4]), INF)     # no noise: nothing to select


def test_buckets_at_is_what_the_release_asks_for():
    n_bins = np.array([33, 12, 3, 2])                # 32, 11, 2 and 1 values (+ the missing slot)
    assert buckets_at(n_bins, 2.0, "auto").tolist() == [4, 4, 2, 1]
    assert buckets_at(n_bins, 8.0, "auto").tolist() == [32, 11, 2, 1]
    assert buckets_at(n_bins, INF, "auto").tolist() == [32, 11, 2, 1]
    assert buckets_at(n_bins, 2.0, 16).tolist() == [16, 11, 2, 1]


def test_dp_select_auto_is_the_default_and_needs_a_pilot_that_can_rank():
    """auto selects only when its pilot has MIN_PILOT_ROWS_PER_FEATURE rows per feature of the
    party; an explicit k always selects; 'none' (or None) releases every feature."""
    assert TrainParams(mode="dp", epsilon=1.0).dp_select == "auto"
    assert TrainParams(mode="dp", epsilon=1.0, dp_select="none").dp_select is None
    assert TrainParams(mode="dp", epsilon=1.0, dp_select=None).dp_select is None
    assert pilot_size(24000) == round(24000 * PILOT_FRACTION)
    need = MIN_PILOT_ROWS_PER_FEATURE * 10                       # pilot rows a 10-feature party needs
    n_ok = int(math.ceil(need / PILOT_FRACTION))
    assert pilot_size(n_ok) >= need and pilot_size(n_ok - 10) < need
    assert selected_count("auto", 10, 8.0, n_ok) == "auto" and selected_count("auto", 10, 8.0, n_ok - 10) is None
    assert selected_count(2, 10, 8.0, 100) == 2                  # an explicit k is the user's choice
    assert selected_count("auto", 15, 8.0, 455) is None          # breast cancer: 91 pilot rows for 15
    assert selected_count("auto", 1, 8.0, 10 ** 6) is None       # one feature: nothing to rank


def test_default_dp_on_a_small_table_releases_every_feature():
    """Breast cancer (455 training rows, 15 passive features): the default --dp-select auto finds the
    pilot too small, so every feature is released at eps/15 and no pilot release is made."""
    from datasets import breast_cancer_parties
    from vfl.api import simulate
    fed, res, _, _ = simulate(breast_cancer_parties(2), TrainParams(mode="dp", epsilon=8.0, n_estimators=1,
                                                                    max_depth=2))
    assert "dp_select" not in res
    assert res["epsilon_per_feature"]["passive1"] == pytest.approx(0.9 * 8.0 / 15)
    info = fed.passives["passive1"].dp_release_info()
    assert "releases" not in info and info["n_features"] == 15 and info["epsilon_per_party"] == pytest.approx(8.0)


def test_pilot_is_drawn_in_the_active_party_own_row_order():
    """The same seed picks and groups the same own rows whatever the alignment's (salted) order."""
    rng = np.random.default_rng(5)
    own = rng.permutation(1000)                       # own row of each aligned position
    perm = rng.permutation(1000)                      # another salt: the same rows, another order
    a, b = pilot_rows(1000, 3, own), pilot_rows(1000, 3, own[perm])
    assert np.array_equal(own[a], own[perm][b])       # the same own rows, in the same order
    assert len(a) == pilot_size(1000) and len(set(a.tolist())) == len(a)
    assert not np.array_equal(own[a], own[pilot_rows(1000, 4, own)])


def test_dp_select_training_is_reproducible_in_simulation():
    from datasets import breast_cancer_parties
    from vfl.api import simulate
    frames = breast_cancer_parties(2)
    p = TrainParams(mode="dp", epsilon=4.0, n_estimators=2, max_depth=2, dp_select=2, dp_unsafe_noise_seed=5)
    _, r1, _, pr1 = simulate(frames, p)
    _, r2, _, pr2 = simulate(frames, p)
    assert r1["dp_select"] == r2["dp_select"] and np.array_equal(pr1, pr2)
    assert r1["privacy"].startswith("NOT PRIVATE") and r1["params"]["dp_unsafe_noise_seed"] == 5


def test_seed_never_reaches_the_privacy_noise():
    """--seed fixes the split and the pilot, never the noise: two runs of the same seed release
    different buckets (issue 23, finding 3), and nothing says NOT PRIVATE."""
    from datasets import breast_cancer_parties
    from vfl.api import simulate
    frames = breast_cancer_parties(2)
    p = TrainParams(mode="dp", epsilon=4.0, n_estimators=1, max_depth=2, dp_select=None, seed=3)
    releases = []
    for _ in range(2):
        fed, res, _, _ = simulate(frames, p, record=True)
        rel = [msg for msg in (loads(f) for _, _, f in fed.transport.log) if isinstance(msg, m.DPRelease)]
        releases.append(rel[0].buckets)
        assert "privacy" not in res and "privacy" not in fed.active.model.params
        assert all("privacy" not in r and "urandom" in r["noise"] for p_ in fed.passives.values()
                   for r in p_.dp_releases)
    assert releases[0].shape == releases[1].shape and not np.array_equal(releases[0], releases[1])


def test_auto_select_on_a_pilot_picks_k_by_its_scores_and_the_accounting_adds_up():
    """Default --dp-select auto on a table large enough for the pilot: K = argmax of the reported
    scores (the informative feature alone here: b0 and c0 carry the signal, b1 and c1 are noise),
    and every row is released exactly once at the party's epsilon."""
    frames = small_frames(2500, seed=4)
    fed = _fed(frames, record=True)
    eps = 4.0
    fed.fit(TrainParams(mode="dp", epsilon=eps, n_estimators=2, max_depth=2))
    rep = fed.active.dp_report
    for name in ("b", "c"):
        sel = rep["dp_select"][name]
        assert sel["k_rule"] == "auto" and len(sel["k_score"]) == 2
        assert sel["k"] == 1 + int(np.argmax(sel["k_score"])) == 1 and sel["features"] == [0]
        assert sel["pilot_root_gain_per_row"][0] > 3 * max(sel["pilot_root_gain_per_row"][1], 0)
        assert rep["epsilon_per_feature"][name] == pytest.approx(0.9 * eps / sel["k"])
        info = fed.passives[name].dp_release_info()
        assert info["epsilon_per_party"] == pytest.approx(eps) and info["n_samples"] == 2500
        assert sum(r["n_samples"] for r in info["releases"]) == 2500
        assert all(r["epsilon_per_party"] == pytest.approx(eps) for r in info["releases"])
    json.dumps(rep)


def test_auto_select_of_every_feature_still_releases_the_pilot_rows_once(monkeypatch):
    """When the pilot's scores favour every feature (K = d), the main release holds every feature
    of the non-pilot rows only: the pilot rows were released already."""
    import parties.dp as pdp
    monkeypatch.setattr(pdp, "auto_select", lambda gains, q_at, eps: (len(gains), np.ones(len(gains))))
    frames = small_frames(2500, seed=4)
    fed = _fed(frames)
    fed.fit(TrainParams(mode="dp", epsilon=4.0, n_estimators=2, max_depth=2))
    rep = fed.active.dp_report
    for name in ("b", "c"):
        assert rep["dp_select"][name]["k"] == 2 and rep["dp_select"][name]["features"] == [0, 1]
        assert rep["epsilon_per_feature"][name] == pytest.approx(1.8)
        *pilots, main = fed.passives[name].dp_release_info()["releases"]
        assert main["n_features"] == 2 and main["epsilon_per_party"] == pytest.approx(4.0)
        assert main["n_samples"] == 2500 - pilot_size(2500) == 2500 - sum(r["n_samples"] for r in pilots)
    p = fed.predict_proba({k: f.assign(id=f["id"] + 10 ** 6) for k, f in zip("abc", frames)})
    assert p.shape == (2500,)
