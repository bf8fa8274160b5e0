"""One matrix for the lossless claim: ``mode="he"`` grows exactly the trees of ``mode="plain"``
(same tree structures, same raw scores on the training rows) for every case below, under both
schemes (Paillier, OU) and with the histograms built inline or on a small worker pool.

Each plain model is trained once per case (module cache ``_PLAIN``) and compared with every
(scheme, workers) HE run of that case. The checks of what travels in each HE run (target groups,
sampled rows, pre-shifted copies, category values) stay in the modules that own them.

Old test (its he == plain part; s = paillier, ou)        -> matrix ids test_he_grows_the_trees_of_plain[...]
parties/test_training.py
  test_he_and_plain_grow_identical_trees_on_breast_cancer[s] -> breast-2p-binary-s-inline
  test_he_and_plain_identical_on_three_parties[s]            -> breast-3p-binary-s-inline
parties/test_parallel_training.py
  test_he_equals_plain_with_every_fast_path_on_two_passive_pools[p-s]
                                                       -> small-3p-binary-s-pool2[-preshiftP]
core/test_objectives.py
  test_he_and_plain_grow_identical_trees[o-s] (NaNs)   -> {multiclass,regression,pseudohuber}-missing-s-inline
  test_he_target_groups_match_plain                    -> multiclass10-target-groups-paillier-inline
parties/test_ou_training.py
  test_ou_equals_plain_with_categorical_weights_and_monotone -> passive-categorical-weights-monotone-ou-inline
  test_ou_multiclass_target_groups_equal_plain   -> multiclass10-target-groups-standard-randomness-ou-inline
api/test_credit.py
  test_he_and_plain_grow_identical_trees_with_categories_weights_and_constraints[s]
                                                       -> credit-categorical-weights-monotone-s-inline
core/test_sampling_in_training.py
  test_he_equals_plain_with_sampling_and_only_sampled_rows_are_encrypted[kw]
                                                       -> {subsample,goss}-multiclass-paillier-inline
  test_multiclass_target_groups_with_preshift_and_pools_equal_plain[p]
                                                       -> multiclass4-two-groups-paillier-pool2-preshiftP
api/test_estimators.py
  test_classifier_he_mode[s]                           -> wine-estimator-parties-multiclass-s-default-workers
  test_table_he_equals_plain_and_pickles               -> wine-estimator-table-binary-paillier-default-workers
New combinations: every case under the other scheme too, and multiclass-missing-s-pool2,
passive-categorical-weights-monotone-s-pool2.
The old tests keep what they check besides equality (messages, pools, target groups, categories).
"""
import numpy as np
import pandas as pd
import pytest
from credit_support import credit_frames
from sklearn.datasets import load_wine
from support import KEY_BITS, alive, small_frames

from crypto import parallel
from datasets import breast_cancer_parties
from parties.channel import GradientChannel
from vfl.api import ActiveParty, Federation, PassiveParty, TrainParams, federation_from_frames
from vfl.estimators import VerticalBoostingClassifier


def _missing(objective):
    rng = np.random.default_rng(3)
    X = rng.normal(size=(70, 4))
    X[rng.random(X.shape) < 0.1] = np.nan
    x0, x2 = np.nan_to_num(X[:, 0]), np.nan_to_num(X[:, 2])
    y = {"multiclass": (x0 > 0).astype(int) + (x2 > 0.3).astype(int),
         "regression": 5 * x0 + 40 * x2 + rng.normal(size=70),
         "pseudohuber": x0 + 3 * x2 + rng.standard_t(2, size=70)}[objective]
    ids = np.arange(70)
    a = pd.DataFrame({"id": ids, "y": y, "a0": X[:, 0], "a1": X[:, 1]})
    b = pd.DataFrame({"id": ids, "b0": X[:, 2], "b1": X[:, 3]})
    return lambda n_jobs: Federation(ActiveParty("a", a, n_jobs=n_jobs), [PassiveParty("b", b, n_jobs=n_jobs)])


def _breast(k):
    frames = breast_cancer_parties(k)
    return lambda n_jobs: federation_from_frames(frames, n_jobs=n_jobs)


def _credit():
    bank, bureau = credit_frames()
    return lambda n_jobs: Federation(ActiveParty("bank", bank, weight_col="w", n_jobs=n_jobs),
                                     [PassiveParty("bureau", bureau, monotone={"days_late": +1}, n_jobs=n_jobs)])


def _passive_categorical():
    a, b, _ = small_frames(n=160, seed=7)
    rng = np.random.default_rng(7)
    b["colour"] = rng.choice(["red", "green", "blue", "grey"], size=160)
    a["y"] = ((a["a0"] + b["b0"] + (b["colour"] == "red") * 1.0) > 0.3).astype(int)
    a["w"] = np.random.default_rng(3).uniform(0.5, 3.0, size=160)
    return lambda n_jobs: Federation(ActiveParty("bank", a, weight_col="w", n_jobs=n_jobs),
                                     [PassiveParty("telco", b, categorical=["colour"], monotone={"b0": +1},
                                                   n_jobs=n_jobs)])


def _sampling():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(80, 4))
    z = X[:, 0] + X[:, 2] - 0.5 * X[:, 3] + 0.5 * rng.normal(size=80)
    ids = np.arange(80)
    a = pd.DataFrame({"id": ids, "y": np.digitize(z, [-0.7, 0.7]), "a0": X[:, 0], "a1": X[:, 1]})
    b = pd.DataFrame({"id": ids, "b0": X[:, 2], "b1": X[:, 3]})
    return lambda n_jobs: Federation(ActiveParty("a", a, n_jobs=n_jobs), [PassiveParty("b", b, n_jobs=n_jobs)])


def _small3():
    a, b, c = small_frames(160)
    return lambda n_jobs: Federation(ActiveParty("bank", a, n_jobs=n_jobs),
                                     [PassiveParty("telco", b, n_jobs=n_jobs), PassiveParty("shop", c, n_jobs=n_jobs)])


def _ten_classes():
    rng = np.random.default_rng(4)
    X = rng.normal(size=(50, 4))
    y = rng.integers(0, 10, size=50)
    y[:10] = np.arange(10)
    ids = np.arange(50)
    a = pd.DataFrame({"id": ids, "y": y, "a0": X[:, 0], "a1": X[:, 1]})
    b = pd.DataFrame({"id": ids, "b0": X[:, 2], "b1": X[:, 3]})
    return lambda n_jobs: Federation(ActiveParty("a", a, n_jobs=n_jobs), [PassiveParty("b", b, n_jobs=n_jobs)])


class _Estimator:
    """The scikit-learn face as a case: ``fit(TrainParams)`` fits a VerticalBoostingClassifier with
    the same settings, and the fitted federation answers the comparison."""

    def __init__(self, X, y):
        self.X, self.y, self.fed = X, y, None

    def fit(self, p: TrainParams):
        clf = VerticalBoostingClassifier(n_estimators=p.n_estimators, max_depth=p.max_depth,
                                         mode=getattr(p.mode, "value", p.mode), key_bits=p.key_bits,
                                         scheme=getattr(p.scheme, "value", p.scheme)).fit(self.X, self.y)
        assert clf.get_params()["scheme"] == clf.model_.params["scheme"] == p.scheme
        self.fed = clf.federation_

    def __getattr__(self, name):        # model, predict_raw, passives: the fitted federation's
        return getattr(self.fed, name)


def _wine_parties():
    b = load_wine()
    X = pd.DataFrame(b.data, columns=[f"f{i}" for i in range(13)])
    X.insert(0, "id", [f"w{i}" for i in range(len(X))])
    parts = {"bank": X[["id"] + [f"f{i}" for i in range(6)]],
             "telco": X[["id"] + [f"f{i}" for i in range(6, 13)]].sample(frac=1, random_state=0)}
    small = {k: v[v["id"].isin([f"w{i}" for i in range(0, 178, 3)])] for k, v in parts.items()}
    y = np.array(["red", "rose", "white"])[b.target][::3]
    return lambda n_jobs: _Estimator(small, y)


def _wine_table():
    b = load_wine()
    X = pd.DataFrame(b.data, columns=[f"f{i}" for i in range(13)])
    return lambda n_jobs: _Estimator(X.iloc[::3], np.where(b.target[::3] == 0, "a", "b"))


def _four_classes():
    a, b, c = small_frames(200, seed=4)
    a = a.assign(y=(b["b0"] > 0).astype(int) + 2 * (c["c0"] > 0.3).astype(int))
    return lambda n_jobs: Federation(ActiveParty("bank", a, n_jobs=n_jobs),
                                     [PassiveParty("telco", b, n_jobs=n_jobs), PassiveParty("shop", c, n_jobs=n_jobs)])


#: case id -> (federation builder factory, training parameters, passive parties that must split, slow)
CASES = {
    "breast-2p-binary": (lambda: _breast(2), dict(n_estimators=4, max_depth=4), {"passive1"}, True),
    "breast-3p-binary": (lambda: _breast(3), dict(n_estimators=3, max_depth=3), {"passive1", "passive2"}, True),
    "small-3p-binary": (_small3, dict(n_estimators=2, max_depth=3), {"telco", "shop"}, False),
    **{f"{o}-missing": (lambda o=o: _missing(o),
                        dict(objective=o, n_estimators=2, max_depth=2, huber_slope=0.5), {"b"}, False)
       for o in ("multiclass", "regression", "pseudohuber")},
    "credit-categorical-weights-monotone": (
        _credit, dict(n_estimators=3, max_depth=3, learning_rate=0.5, min_data_per_group=5, cat_smooth=1.0,
                      monotone_constraints={"income": -1}), {"bureau"}, False),
    "passive-categorical-weights-monotone": (
        _passive_categorical, dict(n_estimators=3, max_depth=3, monotone_constraints={"a0": 1}), {"telco"}, False),
    "subsample-multiclass": (_sampling, dict(objective="multiclass", n_estimators=2, max_depth=2, subsample=0.5),
                             {"b"}, False),
    "goss-multiclass": (_sampling, dict(objective="multiclass", n_estimators=2, max_depth=2, goss=True,
                                        learning_rate=1.0), {"b"}, False),
    "wine-estimator-parties-multiclass": (_wine_parties, dict(n_estimators=2, max_depth=2), set(), False),
    "wine-estimator-table-binary": (_wine_table, dict(n_estimators=2, max_depth=2), set(), False),
    # four classes in two gradient groups of 2 (as when the targets do not fit one plaintext: PATCHES)
    "multiclass4-two-groups": (_four_classes, dict(objective="multiclass", n_estimators=2, max_depth=3), set(),
                               False),
    # ten classes of 108-bit slots do not fit one plaintext: the targets travel in groups
    "multiclass10-target-groups": (_ten_classes, dict(precision_bits=48, objective="multiclass", n_estimators=1,
                                                      max_depth=2, min_child_weight=0.01), set(), False),
    "multiclass10-target-groups-standard-randomness": (
        _ten_classes, dict(precision_bits=48, objective="multiclass", n_estimators=1, max_depth=2,
                           min_child_weight=0.01, encryption="standard"), set(), True),   # ~3.5 s: full-length r
}

#: (case, scheme, workers, preshift) the matrix runs: every case under both schemes inline (the old
#: tests ran some cases under one scheme only; the other is added), and small cases on a pool of 2
#: workers per party, the three-party one with every pre-shift setting the old pool test used
#: (the estimator cases run with the face's own default workers: ``None``)
MATRIX = ([(c, s, None if c.startswith("wine-estimator") else 1, "auto") for c in CASES for s in ("paillier", "ou")]
          + [("small-3p-binary", "paillier", 2, p) for p in (False, True, "auto", 3)]
          + [("small-3p-binary", "ou", 2, p) for p in (False, 3)]
          + [("multiclass4-two-groups", "paillier", 2, p) for p in (False, True)]
          + [(c, s, 2, "auto") for c in ("multiclass-missing", "passive-categorical-weights-monotone")
             for s in ("paillier", "ou")])

#: case -> what the HE run patches (monkeypatch) before training
PATCHES = {"multiclass4-two-groups": lambda mp: mp.setattr(GradientChannel, "group_size", lambda self, layout: 2)}

_PLAIN: dict = {}       # case -> (structures, raw scores) of its plain model, trained once per module


def _structures(model):
    return [t.structure() for rnd in model.rounds for t in rnd]


def _outcome(fed):
    """Tree structures, raw scores on the training rows, and each passive party's split records."""
    return (_structures(fed.model), np.asarray(fed.predict_raw()),
            {name: p.records for name, p in fed.passives.items()})


def _plain(case):
    if case not in _PLAIN:
        builder, params, _, _ = CASES[case]
        fed = builder()(1)
        fed.fit(TrainParams(mode="plain", key_bits=KEY_BITS, **params))
        _PLAIN[case] = _outcome(fed)
    return _PLAIN[case]


def _param(case, scheme, workers, preshift):
    # slow: the large cases and every case that starts worker pools (the estimator face's default does)
    marks = [pytest.mark.slow] if CASES[case][3] or workers != 1 else []
    pool = {1: "inline", None: "default-workers"}.get(workers, f"pool{workers}")
    return pytest.param(case, scheme, workers, preshift, marks=marks,
                        id=f"{case}-{scheme}-{pool}" + ("" if preshift == "auto" else f"-preshift{preshift}"))



@pytest.mark.parametrize("case, scheme, workers, preshift", [_param(*row) for row in MATRIX])
def test_he_grows_the_trees_of_plain(case, scheme, workers, preshift, started_pids, monkeypatch):
    builder, params, passives, _ = CASES[case]
    plain_structures, plain_raw, plain_records = _plain(case)
    monkeypatch.setattr(ActiveParty, "preshift", preshift)
    if case in PATCHES:
        PATCHES[case](monkeypatch)
    if workers and workers > 1:     # send even tiny batches to the workers
        monkeypatch.setattr(parallel, "POLICY", parallel.ParallelPolicy.always())
    fed = builder()(workers)
    fed.fit(TrainParams(mode="he", scheme=scheme, key_bits=KEY_BITS, **params))
    structures, raw, records = _outcome(fed)
    assert structures == plain_structures
    np.testing.assert_allclose(raw, plain_raw, rtol=0, atol=1e-12)    # summation order aside (OU)
    assert records == plain_records                                    # the passive thresholds too
    # the trees really use passive splits (otherwise equality would prove little)
    owners = {n.owner for rnd in fed.model.rounds for t in rnd for n in t.nodes if not n.is_leaf}
    assert passives <= owners
    if workers is not None:
        assert len(started_pids) == (0 if workers == 1 else workers * (1 + len(fed.passives)))
    assert not any(alive(p) for p in started_pids)                  # and stopped them
