"""DP-only mode: the randomized-response mechanism, accounting, exactness at eps=inf,
what each party receives, and bad input."""
import json
import math

import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner
from support import small_frames

from cli import main
from crypto.packing import PackingLayout
from parties.active import ActiveParty
from parties.passive import PassiveParty
from protocols import alignment
from protocols import messages as m
from protocols.serialization import BigInts, dumps, loads
from vfl.api import Federation
from vfl.core.binning import Binner
from vfl.core.boosting import Booster
from vfl.core.dp import (
    bucketize,
    check_epsilon,
    epsilon_budget,
    randomized_response,
    release_buckets,
    stay_probability,
)
from vfl.core.dp_debias import auto_buckets
from vfl.core.dp_noise import SeededNoise
from vfl.core.errors import InputError, PeerError
from vfl.core.objectives import get_objective
from vfl.core.params import TrainParams
from vfl.core.sources import LocalSource

INF = float("inf")


# --- the mechanism ---------------------------------------------------------------
def test_stay_probability_formula():
    for eps, q in [(0.5, 2), (1.0, 8), (4.0, 33), (0.1, 256)]:
        assert stay_probability(eps, q) == pytest.approx(math.exp(eps) / (math.exp(eps) + q - 1), rel=1e-12)
    assert stay_probability(INF, 32) == 1.0
    assert stay_probability(1e6, 32) == 1.0          # no overflow
    assert stay_probability(1e-9, 4) == pytest.approx(0.25)


def test_randomized_response_stays_with_p_and_moves_uniformly():
    from scipy.stats import chisquare
    q, eps, n = 8, 1.0, 400_000
    rng = np.random.default_rng(12345)
    true = rng.integers(0, q, size=n)
    noisy = randomized_response(true, q, eps, SeededNoise(7))
    p = math.exp(eps) / (math.exp(eps) + q - 1)            # 0.2797
    stay = float(np.mean(noisy == true))
    tol = 5 * math.sqrt(p * (1 - p) / n)                    # ~0.0036
    assert abs(stay - p) < tol
    # the tolerance separates p from plausible mistakes: e^eps/(e^eps+q) (off by one),
    # and "redraw uniformly over all q buckets" (stay = p + (1-p)/q)
    for wrong in (math.exp(eps) / (math.exp(eps) + q), p + (1 - p) / q):
        assert abs(stay - wrong) > 3 * tol
    # every move lands on one of the q-1 other buckets uniformly, from every source bucket
    moved = noisy != true
    counts = np.zeros((q, q))
    np.add.at(counts, (true[moved], noisy[moved]), 1)
    assert np.all(np.diag(counts) == 0)
    for b in range(q):
        row = np.delete(counts[b], b)
        assert chisquare(row).pvalue > 1e-4
    # a skewed mover fails the same test (the test can fail)
    skew = noisy.copy()
    skew[moved & (true == 0) & (rng.random(n) < 0.2)] = 1
    counts2 = np.zeros((q, q))
    np.add.at(counts2, (true[skew != true], skew[skew != true]), 1)
    assert chisquare(np.delete(counts2[0], 0)).pvalue < 1e-4


def test_randomized_response_inf_is_identity_and_seeded():
    b = np.random.default_rng(0).integers(0, 5, 1000)
    assert np.array_equal(randomized_response(b, 5, INF, SeededNoise(1)), b)
    r1 = randomized_response(b, 5, 1.0, SeededNoise(3))
    r2 = randomized_response(b, 5, 1.0, SeededNoise(3))
    assert np.array_equal(r1, r2) and not np.array_equal(r1, b)


def equal_frequency_buckets(X, n_buckets):
    """The DP release's buckets: the Binner's bins (the same as HE and plain modes use)."""
    binner = Binner(n_buckets).fit(X)
    return binner, binner.transform(X)


def test_equal_frequency_buckets_and_missing_bucket():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(1000, 2))
    X[:50, 1] = np.nan
    binner, B = equal_frequency_buckets(X, 10)
    assert list(binner.n_bins) == [11, 11]            # 10 value buckets + the missing slot
    sizes = np.bincount(B[:, 0], minlength=11)
    assert sizes[:10].min() >= 98 and sizes[:10].max() <= 102 and sizes[10] == 0
    sizes1 = np.bincount(B[:, 1], minlength=11)
    assert sizes1[10] == 50 and sizes1[:10].min() >= 93 and sizes1[:10].max() <= 97
    # ties never straddle a boundary: a 3-valued column gets 3 buckets
    _, B3 = equal_frequency_buckets(np.repeat([[1.0], [2.0], [3.0]], 10, axis=0), 8)
    assert sorted(np.unique(B3)) == [0, 1, 2]


def test_release_randomizes_missing_only_where_present():
    rng = np.random.default_rng(1)
    X = rng.normal(size=(20000, 2))
    X[rng.random(20000) < 0.1, 1] = np.nan
    binner, B = equal_frequency_buckets(X, 4)
    noisy, domain = release_buckets(B, binner.n_bins, 1.0, SeededNoise(2))
    assert list(domain) == [4, 5]
    assert not np.any(noisy[:, 0] == 4)                # no missing bucket where nothing is missing
    was_missing = B[:, 1] == 4
    # missingness is randomized like any value: kept with p(k=5), reported elsewhere otherwise
    p5 = stay_probability(1.0, 5)
    assert abs(np.mean(noisy[was_missing, 1] == 4) - p5) < 0.05
    assert abs(np.mean(noisy[~was_missing, 1] == 4) - (1 - p5) / 4) < 0.02
    assert abs(np.mean(noisy[:, 0] == B[:, 0]) - stay_probability(1.0, 4)) < 0.02
    # a constant column (one bucket) is released as is
    nc, dc = release_buckets(np.zeros((10, 1), dtype=np.uint8), np.array([2]), 0.5, SeededNoise(0))
    assert list(dc) == [1] and not nc.any()


# --- accounting ------------------------------------------------------------------
def test_epsilon_budget_accounting():
    b = epsilon_budget({"telco": 3, "shop": 5}, epsilon=3)
    assert b["epsilon_per_feature"] == {"telco": 1.0, "shop": 0.6}
    assert b["epsilon_per_party"] == {"telco": 3.0, "shop": 3.0}
    b = epsilon_budget({"telco": 3}, epsilon_per_feature=0.5)
    assert b == {"epsilon_per_feature": {"telco": 0.5}, "epsilon_per_party": {"telco": 1.5}}
    assert epsilon_budget({"telco": 3}, epsilon=INF)["epsilon_per_feature"] == {"telco": INF}
    for kw in ({}, {"epsilon": 1, "epsilon_per_feature": 1}):
        with pytest.raises(InputError, match="exactly one of epsilon"):
            epsilon_budget({"telco": 3}, **kw)


def _write_three_feature_passive(tmp_path, n=200):
    rng = np.random.default_rng(0)
    X = rng.normal(size=(n, 5))
    y = (X[:, 0] + X[:, 2] > 0).astype(int)
    g = pd.DataFrame({"id": np.arange(n), "y": y, "a0": X[:, 0], "a1": X[:, 1]})
    h = pd.DataFrame({"id": np.arange(n), "h0": X[:, 2], "h1": X[:, 3], "h2": X[:, 4]})
    g.to_csv(tmp_path / "g.csv", index=False)
    h.to_csv(tmp_path / "h.csv", index=False)
    return str(tmp_path / "g.csv"), str(tmp_path / "h.csv")


def test_cli_accounting_three_feature_party(tmp_path):
    g, h = _write_three_feature_passive(tmp_path)
    out = tmp_path / "out.json"
    r = CliRunner().invoke(main, ["simulate", "--active", g, "--passive", h, "--mode", "dp", "--epsilon", "3",
                                  "--rounds", "3", "--quiet", "--output-json", str(out)])
    assert r.exit_code == 0, r.output
    d = json.loads(out.read_text())
    assert d["epsilon_per_feature"] == {"passive1": pytest.approx(0.9)}     # (3 - edges 0.3) / 3
    assert d["epsilon_per_party"] == {"passive1": 3.0} and d["edge_epsilon"] == {"passive1": pytest.approx(0.3)}
    assert d["params"]["epsilon"] == 3.0 and d["params"]["epsilon_per_feature"] is None
    assert "privacy passive1: epsilon 3.0" in r.output and "0.9" in r.output
    r = CliRunner().invoke(main, ["simulate", "--active", g, "--passive", h, "--mode", "dp",
                                  "--epsilon-per-feature", "inf", "--rounds", "2", "--quiet",
                                  "--output-json", str(out)])
    assert r.exit_code == 0, r.output
    d = json.loads(out.read_text())                   # strict JSON: infinity is the string "inf"
    assert d["epsilon_per_feature"] == {"passive1": "inf"} and d["epsilon_per_party"] == {"passive1": "inf"}
    assert d["params"]["epsilon_per_feature"] == "inf"


# --- bad input -------------------------------------------------------------------
@pytest.mark.parametrize("eps, msg", [(0, "must be > 0"), (-1.5, "must be > 0"), (float("nan"), "got NaN"),
                                      ("abc", "must be a number"), (True, "must be a number")])
def test_bad_epsilon(eps, msg):
    with pytest.raises(InputError, match=msg):
        check_epsilon(eps)
    with pytest.raises(InputError, match="epsilon.*" + msg):
        TrainParams(mode="dp", epsilon=eps)
    with pytest.raises(InputError, match="epsilon_per_feature.*" + msg):
        TrainParams(mode="dp", epsilon_per_feature=eps)
    with pytest.raises(InputError, match=msg):
        randomized_response(np.zeros(3, dtype=int), 4, eps, SeededNoise(0))


def test_bad_dp_params():
    with pytest.raises(InputError, match="exactly one of epsilon"):
        TrainParams(mode="dp")
    with pytest.raises(InputError, match="exactly one of epsilon"):
        TrainParams(mode="dp", epsilon=1, epsilon_per_feature=1)
    with pytest.raises(InputError, match="applies to mode 'dp' only"):
        TrainParams(mode="he", epsilon=1)
    for q in (1, 0, 1.5):
        with pytest.raises(InputError, match=r"n_buckets \(q\) must be an integer >= 2"):
            randomized_response(np.zeros(3, dtype=int), q, 1.0, SeededNoise(0))
        with pytest.raises(InputError, match="must be an integer >= 2"):
            stay_probability(1.0, q)
    with pytest.raises(InputError, match="max_bin must be >= 2"):
        TrainParams(mode="dp", epsilon=1, max_bin=1)
    with pytest.raises(InputError, match=r"bucket indices must be integers in \[0, 4\)"):
        randomized_response(np.array([0, 4]), 4, 1.0, SeededNoise(0))
    # the params round-trip through JSON with inf
    p = TrainParams(mode="dp", epsilon=INF)
    assert TrainParams.from_dict(json.loads(json.dumps(p.to_dict()))).epsilon == INF


@pytest.mark.parametrize("args, msg", [(["--epsilon", "0"], "must be > 0"),
                                       (["--epsilon", "nan"], "got NaN"),
                                       (["--epsilon-per-feature", "-2"], "must be > 0"),
                                       ([], "exactly one of epsilon"),
                                       (["--epsilon", "1", "--max-bin", "1"], "max_bin must be >= 2")])
def test_cli_bad_dp_input(args, msg):
    r = CliRunner().invoke(main, ["simulate", "--mode", "dp", "--rounds", "1", "--quiet", *args])
    assert r.exit_code != 0
    assert msg in r.output and "Traceback" not in r.output


# --- eps = inf is plaintext training on the same buckets, exactly -------------------
def _aligned_rows(fed, frames):
    salt = bytes.fromhex(fed.model.salt)
    hashes = {name: alignment.hash_ids(df["id"].to_numpy(), salt) for name, df in frames.items()}
    common = alignment.intersect(hashes)
    return {name: alignment.positions(h, common, name) for name, h in hashes.items()}


def fresh_ids(frames: dict) -> dict:
    """The same values under new ids: rows the passive parties never released."""
    return {k: f.assign(id=f["id"] + 10 ** 6) for k, f in frames.items()}


def _fed(frames, **kw):
    a, b, c = frames
    return Federation(ActiveParty("a", a, label_col="y"),
                      [PassiveParty("b", b), PassiveParty("c", c)], **kw)


def test_inf_epsilon_reproduces_plaintext_training_exactly():
    a, b, c = small_frames(300, seed=3)
    b = b.copy()
    b.loc[::7, "b1"] = np.nan                         # a missing bucket on one passive feature
    params = dict(n_estimators=4, max_depth=3, max_bin=16)
    fed = _fed((a, b, c))
    fed.fit(TrainParams(mode="dp", epsilon=INF, **params))
    # reference: the Booster over plain LocalSources built on the TRUE buckets of every party
    rows = _aligned_rows(fed, {"a": a, "b": b, "c": c})
    y = a["y"].to_numpy()[rows["a"]].astype(float)
    sources = [LocalSource(name, df.drop(columns=[x for x in ("id", "y") if x in df]).to_numpy(float)[rows[name]],
                           [x for x in df.columns if x not in ("id", "y")], 16)
               for name, df in (("a", a), ("b", b), ("c", c))]
    p = TrainParams(mode="plain", **params)
    _, ref_rounds, ref_raw = Booster(sources, get_objective("binary"), p).fit(y)
    n_passive_splits = 0
    for rnd, ref in zip(fed.model.rounds, ref_rounds):
        for t, rt in zip(rnd, ref):
            assert len(t.nodes) == len(rt.nodes)
            for n1, n2 in zip(t.nodes, rt.nodes):
                assert (n1.is_leaf, n1.value, n1.gain, n1.owner, n1.n_samples, n1.left, n1.right) == \
                       (n2.is_leaf, n2.value, n2.gain, n2.owner, n2.n_samples, n2.left, n2.right)
                n_passive_splits += (not n1.is_leaf and n1.owner != "a")
    assert n_passive_splits > 0
    # and it predicts exactly like federated plain (and hence HE) mode
    fed_plain = _fed((a, b, c))
    fed_plain.fit(TrainParams(mode="plain", **params))
    assert np.array_equal(fed.predict_raw(), fed_plain.predict_raw())
    ref_pred = np.asarray(ref_raw)[np.argsort(rows["a"])]
    assert np.allclose(fed.predict_raw(), ref_pred, rtol=0, atol=1e-12)


# --- what each party receives ------------------------------------------------------
def test_active_never_receives_raw_values_or_boundaries():
    a, b, c = small_frames(400, seed=1)
    fed = _fed((a, b, c), record=True)
    fed.fit(TrainParams(mode="dp", epsilon=2.0, n_estimators=3, max_depth=3, max_bin=8, dp_buckets=8))
    new = fresh_ids({"a": a, "b": b, "c": c})      # the training rows themselves are refused (below)
    p1 = fed.predict_proba(new, prediction="one-round")
    p2 = fed.predict_proba(new, prediction="node")
    assert np.array_equal(p1, p2)
    secrets_ = {"b": b[["b0", "b1"]].to_numpy(), "c": c[["c0", "c1"]].to_numpy()}
    # the passive parties' bucket edges (DP histograms, never sent)
    edges = {name: fed.passives[name]._state.train.dp_edges for name in secrets_}
    thresholds = {name: np.concatenate([edges[name][j] for j in sorted(edges[name])]) for name in secrets_}
    to_active = [(s, loads(f)) for s, r, f in fed.transport.log if r == "a"]
    to_passive = [loads(f) for s, r, f in fed.transport.log if r != "a"]
    assert {type(x).__name__ for _, x in to_active} <= {
        "IdHashes", "AlignAck", "BinningInfo", "DPRelease", "DPSplitRecords", "Ack", "RouteResponse",
        "LeafMaskResponse"}
    assert not {type(x).__name__ for x in to_passive} & {"Gradients", "HistogramRequest", "SplitRequest",
                                                         "PublicKey"}
    releases = {s: x for s, x in to_active if isinstance(x, m.DPRelease)}
    assert set(releases) == {"b", "c"}
    for sender, msg in to_active:
        for name, v in vars(msg).items():
            if isinstance(v, np.ndarray):
                assert v.dtype.kind in "biu", (type(msg).__name__, name)     # no float array at all
            elif isinstance(v, float):
                assert (type(msg).__name__, name) == ("DPRelease", "epsilon_per_feature")
            elif isinstance(v, (dict, str)):
                blob = json.dumps(v) if isinstance(v, dict) else v
                for x in np.concatenate([secrets_[sender].ravel(), thresholds[sender]]):
                    assert repr(float(x)) not in blob
            assert not isinstance(v, BigInts)
    # the release is noisy: per feature, the share of unchanged buckets matches p
    for name, X in secrets_.items():
        Xa = X[_aligned_rows(fed, {"a": a, "b": b, "c": c})[name]]
        true = np.column_stack([bucketize(Xa[:, j], edges[name][j]) for j in range(2)])
        rel = releases[name]
        assert rel.epsilon_per_feature == pytest.approx(0.9)       # (2 - the edges' 10%) / 2 features
        assert list(rel.n_bins) == [9, 9] and list(rel.rr_domain) == [9, 9]    # 8 buckets + missing, always
        same = np.mean(rel.buckets == true)
        p = stay_probability(1.0, int(rel.rr_domain[0]))
        assert abs(same - p) < 0.08 and same < 0.6
    # the passive parties keep the thresholds: the active model has none for their nodes
    for rnd in fed.model.rounds:
        for t in rnd:
            for nd in t.nodes:
                if not nd.is_leaf and nd.owner != "a":
                    assert nd.threshold is None and nd.feature_idx == -1 and nd.record_id >= 0


def test_passive_refuses_what_would_leak_its_true_buckets():
    a, b, c = small_frames(150)
    fed = _fed((a, b, c))
    fed.fit(TrainParams(mode="dp", epsilon_per_feature=1.0, n_estimators=2, max_depth=2))
    t, mid = fed.transport, fed.model.model_id
    n = len(a)
    for req in (m.SplitRequest(0, np.zeros(1, np.int32), np.zeros(1, np.int32), np.zeros(1, np.int32),
                               np.zeros(1, np.int32), np.zeros(1, bool)),
                m.HistogramRequest(0, np.zeros(1, np.int32), np.zeros(1, np.int32), np.zeros((1, n), np.int32)),
                m.Gradients(0, False, PackingLayout.for_bounds(1.0, 0.25, n).to_dict(), 1, BigInts([1] * n))):
        with pytest.raises(PeerError, match="trains in mode 'dp' and answers no"):
            t.call("b", req)
    with pytest.raises(PeerError, match="already released"):
        t.call("b", m.DPReleaseRequest(mid, 1.0))
    with pytest.raises(PeerError, match="released no bucket 0 of feature 5"):
        t.call("b", m.DPSplitRegister(mid, np.array([5], np.int32), np.zeros(1, np.int32), np.zeros(1, bool)))
    # no release outside mode dp, and a passive party's own cap on epsilon
    fed2 = _fed((a, b, c))
    fed2.fit(TrainParams(mode="plain", n_estimators=1, max_depth=2))
    with pytest.raises(PeerError, match="not training in mode 'dp'"):
        fed2.transport.call("b", m.DPReleaseRequest(fed2.model.model_id, 1.0))
    fed3 = _fed((a, b, c))
    fed3.passives["c"].dp_max_epsilon_per_feature = 0.5
    with pytest.raises(InputError, match="party 'c' releases at most epsilon_per_feature=0.5"):
        fed3.fit(TrainParams(mode="dp", epsilon=2.0, n_estimators=1))   # 2 features: 1.0 each


def test_dp_model_predicts_saves_and_loads(tmp_path):
    a, b, c = small_frames(300, seed=5)
    c = c.copy()
    c.loc[::5, "c0"] = np.nan
    fed = _fed((a, b, c))
    fed.passives["b"].dp_unsafe_noise_seed = 1
    fed.passives["c"].dp_unsafe_noise_seed = 2
    fed.fit(TrainParams(mode="dp", epsilon=8.0, n_estimators=5, max_depth=3))
    new = fresh_ids({"a": a.iloc[:40], "b": b.iloc[:40], "c": c.iloc[:40]})
    proba = fed.predict_proba(new)
    fed.save(tmp_path)
    passive_file = json.loads((tmp_path / "c.json").read_text())
    assert passive_file["dp_release"]["epsilon_per_feature"] == pytest.approx(3.6)   # (8 - 0.8) / 2
    assert passive_file["dp_release"]["epsilon_per_party"] == pytest.approx(8.0)
    # automatic buckets at epsilon 3.6 per feature (the most auto_buckets finds under max_bin: 7 value
    # buckets, whatever the data); every feature has its missing slot
    assert passive_file["dp_release"]["n_buckets"] == [7, 7] == [auto_buckets(3.6, 32)] * 2
    assert passive_file["dp_release"]["rr_domain"] == [8, 8]
    nodes = [nd for rnd in json.loads((tmp_path / "a.json").read_text())["rounds"] for t in rnd
             for nd in t["nodes"] if not nd["is_leaf"] and nd["owner"] != "a"]
    assert nodes and all(nd["threshold"] is None and nd["record_id"] >= 0 for nd in nodes)
    fed2 = Federation.load(tmp_path)
    assert np.array_equal(fed2.predict_proba(new), proba)
    assert fed2.passives["c"].dp_release_info()["epsilon_per_party"] == pytest.approx(8.0)


def test_dp_training_is_reproducible_in_simulation_and_noisy():
    from datasets import breast_cancer_parties
    from vfl.api import simulate
    frames = breast_cancer_parties(2)
    p = TrainParams(mode="dp", epsilon=4.0, n_estimators=3, max_depth=3, dp_unsafe_noise_seed=0)
    _, r1, _, pr1 = simulate(frames, p)
    _, r2, _, pr2 = simulate(frames, p)
    assert np.array_equal(pr1, pr2) and r1["test_auc"] == r2["test_auc"]
    # the noise follows the (NOT PRIVATE) noise seed (at 3.6/15 per feature no noisy split of breast
    # cancer's passive party passes the confidence bound, so the seeds are compared at 4 per feature)
    old = dict(mode="dp", epsilon_per_feature=4.0, n_estimators=3, max_depth=3)
    _, _, _, pr3 = simulate(frames, TrainParams(**old, dp_unsafe_noise_seed=0))
    _, _, _, pr4 = simulate(frames, TrainParams(**old, dp_unsafe_noise_seed=1))
    assert not np.array_equal(pr3, pr4)
    assert r1["epsilon_per_party"] == {"passive1": 4.0}
    assert r1["epsilon_per_feature"]["passive1"] == pytest.approx(0.9 * 4.0 / 15)
    # automatic buckets at 0.24 per feature: two per feature, kept with probability e^eps/(e^eps+1)
    assert r1["dp_buckets"]["passive1"] == [2] * 15
    # ... over 3 slots: the 2 buckets and the missing slot every feature has (breast cancer has no NaN)
    e = 0.9 * 4 / 15
    assert r1["rr_stay_probability"]["passive1"] == pytest.approx([math.exp(e) / (math.exp(e) + 2)] * 15)
    # a DP run sends far fewer bytes than the plain protocol: one release, a few registrations
    _, rp, _, _ = simulate(frames, TrainParams(mode="plain", n_estimators=3, max_depth=3))
    assert r1["train_bytes"] < rp["train_bytes"] / 3


def test_release_with_256_buckets_uses_wide_indices():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(3000, 1))
    X[::10, 0] = np.nan
    binner, B = equal_frequency_buckets(X, 256)
    assert binner.n_bins[0] == 257
    noisy, domain = release_buckets(B, binner.n_bins, 2.0, SeededNoise(1))
    assert noisy.dtype == np.uint16 and domain[0] == 257 and noisy.max() == 256
    assert dumps(m.DPRelease(noisy, binner.n_bins.astype(np.int32), domain, 2.0))


def test_dp_mode_with_psi_alignment_matches_hash_alignment():
    a, b, c = small_frames(150, seed=2)
    preds = []
    for align in ("hash", "psi"):
        fed = _fed((a, b, c))
        fed.fit(TrainParams(mode="dp", epsilon=INF, align=align, n_estimators=2, max_depth=2))
        preds.append(fed.predict_raw({"a": a, "b": b, "c": c}))
    assert np.array_equal(preds[0], preds[1])


# --- the noise source (issue 23: no seeded privacy noise) -------------------------------
def test_secure_noise_is_unseeded_and_randomized_response_keeps_at_most_p():
    from vfl.core.dp_noise import SecureNoise, noise_source, threshold_u64
    assert isinstance(noise_source(), SecureNoise) and noise_source().private
    assert not noise_source(3).private and "NOT PRIVATE" in noise_source(3).label()
    # the keep threshold never exceeds p * 2^64 (the realized ratio stays within e^eps)
    for eps, k in ((0.1, 2), (1.0, 3), (4.0, 9), (8.0, 33)):
        p = math.exp(eps) / (math.exp(eps) + k - 1)
        t = threshold_u64(p)
        assert t < p * 2 ** 64 and t > (p - 1e-12) * 2 ** 64
        p_real = t / 2 ** 64
        assert p_real * (k - 1) / (1 - p_real) <= math.exp(eps)
    b = np.zeros(200_000, dtype=np.int64)
    noisy = randomized_response(b, 4, 1.0, SecureNoise())
    p = math.e / (math.e + 3)
    assert abs(float(np.mean(noisy == 0)) - p) < 5 * math.sqrt(p * (1 - p) / b.size)
    counts = np.bincount(noisy, minlength=4)[1:]
    assert counts.min() > 0.9 * counts.mean()          # the moves are uniform over the others
    again = randomized_response(b, 4, 1.0, SecureNoise())
    assert not np.array_equal(noisy, again)


def test_randbelow_is_exactly_uniform_on_small_ranges():
    from scipy.stats import chisquare
    draws = SeededNoise(1).randbelow(np.array([3] * 30_000 + [7] * 30_000), 60_000)
    assert draws[:30_000].max() == 2 and draws[30_000:].max() == 6 and draws.min() == 0
    assert chisquare(np.bincount(draws[:30_000])).pvalue > 1e-4
    assert chisquare(np.bincount(draws[30_000:])).pvalue > 1e-4


def test_unsafe_noise_seed_is_checked_and_printed(tmp_path):
    with pytest.raises(InputError, match="dp_unsafe_noise_seed"):
        TrainParams(mode="dp", epsilon=1.0, dp_unsafe_noise_seed=-1)
    g, h = _write_three_feature_passive(tmp_path)
    path = tmp_path / "out.json"
    out = CliRunner().invoke(main, ["simulate", "--active", g, "--passive", h, "--mode", "dp", "--epsilon", "2",
                                    "--rounds", "1", "--quiet", "--dp-unsafe-noise-seed", "4",
                                    "--output-json", str(path)])
    assert out.exit_code == 0, out.output
    assert "WARNING: NOT PRIVATE" in out.output
    d = json.loads(path.read_text())
    assert d["privacy"].startswith("NOT PRIVATE") and d["params"]["dp_unsafe_noise_seed"] == 4


# --- a data-independent release domain (issue 23, findings 1 and 2) ----------------------
def _setup_messages(fed):
    return [loads(f) for _, r, f in fed.transport.log if r == "a" and isinstance(loads(f), m.BinningInfo)]


def test_what_the_active_party_is_told_does_not_depend_on_the_data():
    """Bucket slots, randomized-response domains and the missing slot depend on max_bin and epsilon
    only: a table with no NaN and two distinct values is told the same as one with NaN and many."""
    a, b, c = small_frames(300, seed=7)
    told = []
    for variant in range(2):
        b2, c2 = b.copy(), c.copy()
        if variant:
            b2["b0"] = (b2["b0"] > 0).astype(float)       # two distinct values
            c2.loc[::3, "c1"] = np.nan                     # missing values
        fed = _fed((a, b2, c2), record=True)
        fed.fit(TrainParams(mode="dp", epsilon=4.0, n_estimators=1, max_depth=2, max_bin=16, dp_select=None))
        infos = _setup_messages(fed)
        rel = [loads(f) for _, r, f in fed.transport.log if r == "a" and isinstance(loads(f), m.DPRelease)]
        told.append(([i.n_bins.tolist() for i in infos], [(x.n_bins.tolist(), x.rr_domain.tolist()) for x in rel]))
    assert told[0] == told[1]
    assert told[0][0] == [[17, 17], [17, 17]]                     # max_bin value slots + the missing slot
    for n_bins, domain in told[0][1]:
        assert n_bins == domain                                    # the missing slot is always randomized


def test_public_bins_spend_nothing_and_set_the_edges(tmp_path):
    a, b, c = small_frames(300, seed=8)
    fed = Federation(ActiveParty("a", a, label_col="y"),
                     [PassiveParty("b", b, dp_bins={"b0": {"edges": [-1.0, 0.0, 1.0]}, "b1": {"lo": -3, "hi": 3}}),
                      PassiveParty("c", c)], record=True)
    fed.fit(TrainParams(mode="dp", epsilon=2.0, n_estimators=2, max_depth=2, dp_select=None, dp_buckets=4))
    rep = fed.active.dp_report
    assert rep["edge_epsilon"] == {"b": 0.0, "c": pytest.approx(0.2)}
    assert rep["epsilon_per_feature"] == {"b": pytest.approx(1.0), "c": pytest.approx(0.9)}
    edges = fed.passives["b"]._state.train.dp_edges
    assert edges[0].tolist() == [-1.0, 0.0, 1.0]
    assert np.allclose(edges[1], [-np.expm1(np.log1p(3) / 2), 0.0, np.expm1(np.log1p(3) / 2)])
    # every registered threshold is a released edge (or +inf), never a raw value
    for r in fed.passives["b"]._state.table.records:
        assert r["threshold"] == np.inf or r["threshold"] in edges[r["feature_idx"]].tolist()


def test_histogram_edges_are_quantiles_of_the_noisy_histogram():
    from vfl.core.dp import histogram_edges
    counts = np.array([10.0, 0, 0, 30, 0, 0, 0, 60])        # cells of width 1 over [0, 8] (symlog scale)
    e = histogram_edges(0.0, 8.0, counts, 2)                  # the median: half-way into the last cell
    assert np.allclose(np.log1p(e), [7 + 10 / 60])
    e4 = histogram_edges(0.0, 8.0, counts, 4)                  # 25%: inside cell 3, 50% and 75%: cell 7
    assert np.allclose(np.log1p(e4), [3 + 15 / 30, 7 + 10 / 60, 7 + 35 / 60])
    assert len(histogram_edges(0.0, 8.0, np.zeros(8), 5)) == 4      # empty: still q - 1 edges


def test_epsilon_per_feature_means_what_it_says():
    """Each feature costs epsilon_per_feature per row (edges + release): no selection by default, an
    explicit --dp-select K (which would give each released feature d x eps / K) is refused."""
    with pytest.raises(InputError, match="epsilon_per_feature charges each"):
        TrainParams(mode="dp", epsilon_per_feature=1.0, dp_select=1)
    a, b, c = small_frames(2500, seed=4)           # large enough for the default pilot with --epsilon
    fed = _fed((a, b, c))
    fed.fit(TrainParams(mode="dp", epsilon_per_feature=1.0, n_estimators=1, max_depth=2))
    rep = fed.active.dp_report
    assert "dp_select" not in rep
    assert rep["epsilon_per_party"] == {"b": 2.0, "c": 2.0}
    assert rep["epsilon_per_feature"] == {"b": pytest.approx(0.9), "c": pytest.approx(0.9)}
    assert rep["edge_epsilon"] == {"b": pytest.approx(0.2), "c": pytest.approx(0.2)}


# --- the lifetime ledger and the training rows (issue 23, finding 4) -----------------------
def test_prediction_of_training_rows_is_refused_in_mode_dp_and_survives_a_reload(tmp_path):
    a, b, c = small_frames(200, seed=9)
    fed = _fed((a, b, c))
    fed.fit(TrainParams(mode="dp", epsilon=2.0, n_estimators=1, max_depth=2))
    half = {"a": a.iloc[:10], "b": b.iloc[:10], "c": c.iloc[:10]}
    with pytest.raises(PeerError, match="refuses to route 10 row.*DP-only training"):
        fed.predict_proba(half)
    assert fed.predict_proba(fresh_ids(half)).shape == (10,)
    fed.save(tmp_path)
    fed2 = Federation.load(tmp_path)
    with pytest.raises(PeerError, match="refuses to route"):
        fed2.predict_proba(half)
    fed_he = _fed((a, b, c))                       # HE and plain trainings are not concerned
    fed_he.fit(TrainParams(mode="plain", n_estimators=1, max_depth=2))
    assert fed_he.predict_proba(half).shape == (10,)


def test_lifetime_ledger_counts_every_training_and_refuses_past_the_limit(tmp_path):
    import os
    import stat

    from parties.dp_ledger import PrivacyLedger, summary
    a, b, c = small_frames(200, seed=10)
    fed = _fed((a, b, c))
    for name in ("b", "c"):
        fed.passives[name].dp_ledger_path = str(tmp_path / f"{name}.ledger.json")
        fed.passives[name].dp_lifetime_epsilon = 5.0
    fed.fit(TrainParams(mode="dp", epsilon=2.0, n_estimators=1, max_depth=2, dp_select=None))
    path = tmp_path / "b.ledger.json"
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    doc = PrivacyLedger(path).read()
    (fp, entries), = doc["datasets"].items()
    assert [e["kind"] for e in entries] == ["dp-edges", "dp-release"]
    assert sum(e["epsilon"] for e in entries) == pytest.approx(2.0)
    fed.fit(TrainParams(mode="dp", epsilon=2.0, n_estimators=1, max_depth=2, dp_select=None))   # a new model_id
    assert summary(PrivacyLedger(path).read())[fp]["epsilon"] == pytest.approx(4.0)
    with pytest.raises(PeerError, match="refuses a training at epsilon 2.*spent epsilon 4 of its lifetime budget 5"):
        fed.fit(TrainParams(mode="dp", epsilon=2.0, n_estimators=1, max_depth=2, dp_select=None))
    with pytest.raises(PeerError, match="refuses a training without differential privacy"):
        fed.fit(TrainParams(mode="plain", n_estimators=1, max_depth=2))
    assert summary(PrivacyLedger(path).read())[fp]["epsilon"] == pytest.approx(4.0)    # refusals charge nothing
    # the command shows it
    r = CliRunner().invoke(main, ["dp-ledger", "show", str(path)])
    assert r.exit_code == 0, r.output
    assert fp[:16] in r.output and "epsilon 4" in r.output


def test_a_public_never_missing_column_has_no_missing_slot_and_a_missing_value_goes_to_bucket_0():
    """The public schema (dp_bins "missing": false) drops a feature's missing slot: k = q, not q + 1
    (a wider channel); a missing value, against the schema, goes to bucket 0 (a fixed rule)."""
    from vfl.core.dp_bins_file import check_dp_bins
    assert check_dp_bins({"b0": {"missing": False}, "b1": {"lo": 0, "hi": 1, "missing": True}}) == \
        {"b0": {"missing": False}, "b1": {"lo": 0.0, "hi": 1.0, "missing": True}}
    for bad in ({"b0": {}}, {"b0": {"missing": "no"}}, {"b0": {"missing": False, "hi": 2}}):
        with pytest.raises(InputError, match="column 'b0'"):
            check_dp_bins(bad)
    a, b, c = small_frames(300, seed=11)
    b = b.copy()
    b.loc[:2, "b0"] = np.nan
    fed = Federation(ActiveParty("a", a, label_col="y"),
                     [PassiveParty("b", b, dp_bins={"b0": {"missing": False}}), PassiveParty("c", c)], record=True)
    fed.fit(TrainParams(mode="dp", epsilon=2.0, n_estimators=1, max_depth=2, dp_select=None, dp_buckets=4))
    rel = {s: x for s, x in ((s, loads(f)) for s, r, f in fed.transport.log if r == "a")
           if isinstance(x, m.DPRelease)}
    assert rel["b"].n_bins.tolist() == [5, 5] and rel["b"].rr_domain.tolist() == [4, 5]
    assert rel["c"].rr_domain.tolist() == [5, 5]
    assert int(rel["b"].buckets[:, 0].max()) <= 3                    # never reported in the missing slot
    assert fed.active.dp_report["edge_epsilon"]["b"] == pytest.approx(0.2)   # the flag is no public bin
