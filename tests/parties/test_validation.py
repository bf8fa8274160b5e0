"""Validation set, metric history and early stopping."""
import numpy as np
import pandas as pd
import pytest
from support import KEY_BITS

from protocols import messages as m
from protocols.serialization import loads
from vfl.api import ActiveParty, Federation, PassiveParty
from vfl.core import metrics
from vfl.core.errors import InputError
from vfl.core.objectives import get_objective


def dataset(objective, n=240, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 4))
    z = X[:, 0] + X[:, 2] - 0.5 * X[:, 3] + 0.8 * rng.normal(size=n)
    y = {"binary": (z > 0).astype(int), "regression": 10 * z,
         "multiclass": np.digitize(z, [-0.7, 0.7])}[objective]
    ids = np.arange(n) * 7 + 3
    a = pd.DataFrame({"id": ids, "y": y, "a0": X[:, 0], "a1": X[:, 1]})
    b = pd.DataFrame({"id": ids, "b0": X[:, 2], "b1": X[:, 3]})
    cut = int(0.7 * n)
    return (a.iloc[:cut], b.iloc[:cut].sample(frac=1, random_state=1)), (a.iloc[cut:], b.iloc[cut:])


def federation(train, record=False):
    return Federation(ActiveParty("a", train[0]), [PassiveParty("b", train[1])], record=record)


def raw_first_rounds(fed, frames, k):
    model = fed.model
    rounds, best = model.rounds, model.best_iteration
    model.rounds, model.best_iteration = rounds[:k], None
    try:
        return fed.predict_raw(frames)
    finally:
        model.rounds, model.best_iteration = rounds, best


OVERFIT = dict(mode="plain", n_estimators=60, max_depth=5, learning_rate=1.0, min_child_weight=0.0,
               reg_lambda=0.01)


@pytest.mark.parametrize("objective, metric", [("binary", "logloss"), ("multiclass", "mlogloss"),
                                               ("regression", "rmse"), ("binary", "auc")])
def test_early_stopping_stops_where_the_history_says(objective, metric):
    train, val = dataset(objective)
    fed = federation(train)
    esr = 3
    model = fed.fit(objective=objective, early_stopping_rounds=esr, eval_metric=metric,
                    validation={"a": val[0], "b": val[1]}, **OVERFIT)
    hist = model.history["validation"][metric]
    assert len(hist) == model.n_rounds == len(model.history["train"][metric])
    best = int(np.argmax(hist)) if metric == "auc" else int(np.argmin(hist))    # first best
    assert model.best_iteration == best
    assert model.n_rounds == best + esr + 1 < OVERFIT["n_estimators"]          # it stopped early
    worse = (lambda v: v <= hist[best]) if metric == "auc" else (lambda v: v >= hist[best])
    assert all(worse(v) for v in hist[best + 1:])
    assert model.params["eval_metric"] == metric
    # predictions use the best iteration by default
    frames = {"a": val[0].drop(columns="y"), "b": val[1]}
    assert np.array_equal(fed.predict_raw(frames), raw_first_rounds(fed, frames, best + 1))
    assert np.array_equal(fed.predict_raw(frames, prediction="node"), fed.predict_raw(frames))
    assert not np.array_equal(fed.predict_raw(frames), raw_first_rounds(fed, frames, model.n_rounds))


@pytest.mark.parametrize("objective", ["binary", "multiclass", "regression"])
def test_history_matches_predictions_round_by_round(objective):
    train, val = dataset(objective, n=150)
    fed = federation(train)
    model = fed.fit(objective=objective, mode="plain", n_estimators=5, max_depth=3,
                    validation={"a": val[0], "b": val[1]})
    assert model.best_iteration is None and model.n_rounds == 5     # no early stopping asked
    loss = get_objective(objective)
    frames = {"a": val[0].drop(columns="y"), "b": val[1]}
    yv = val[0]["y"].to_numpy()
    names = {"binary": ["logloss", "auc", "error"], "multiclass": ["mlogloss", "merror"],
             "regression": ["rmse", "mae"]}[objective]
    assert sorted(model.history["validation"]) == sorted(names)
    for r in range(5):
        out = loss.transform(raw_first_rounds(fed, frames, r + 1))
        for name in names:
            assert model.history["validation"][name][r] == pytest.approx(metrics.METRICS[name](yv, out),
                                                                         rel=1e-12, abs=1e-12)
    # the training history too (training rows, through federated prediction)
    out = loss.transform(fed.predict_raw({"a": train[0].drop(columns="y"), "b": train[1]}))
    first = names[0]
    assert model.history["train"][first][-1] == pytest.approx(
        metrics.METRICS[first](train[0]["y"].to_numpy(), out), rel=1e-9)


def test_validation_evaluates_only_the_new_trees_each_round():
    train, val = dataset("binary", n=200)
    fed = federation(train, record=True)
    fed.fit(mode="plain", n_estimators=8, max_depth=3, validation={"a": val[0], "b": val[1]})
    per_round = []
    for sender, receiver, frame in fed.transport.log:
        msg = loads(frame)
        if receiver == "b" and isinstance(msg, m.GradientsStart):
            per_round.append([])
        elif receiver == "b" and isinstance(msg, (m.LeafMaskRequest, m.RouteRequest)):
            assert isinstance(msg, m.LeafMaskRequest)          # one-round protocol, one message
            per_round[-1].append(len(msg.tree_sizes))
    assert len(per_round) == 8
    # at most one request per round, holding only that round's tree
    assert all(sizes in ([], [1]) for sizes in per_round) and sum(map(len, per_round)) >= 4


@pytest.mark.parametrize("kw", [dict(align="psi"), dict(mode="dp", epsilon=8.0),
                                dict(subsample=0.7), dict(goss=True, learning_rate=1.0)])
def test_validation_with_psi_dp_and_sampling(kw):
    train, val = dataset("multiclass", n=150)
    fed = federation(train)
    params = dict(mode="plain", objective="multiclass", n_estimators=4, max_depth=3)
    params.update(kw)
    model = fed.fit(validation={"a": val[0], "b": val[1]}, **params)
    frames = {"a": val[0].drop(columns="y"), "b": val[1]}
    out = get_objective("multiclass").transform(fed.predict_raw(frames, prediction="node"))
    yv = val[0]["y"].to_numpy()
    assert model.history["validation"]["mlogloss"][-1] == pytest.approx(metrics.mlogloss(yv, out), rel=1e-12)


def test_he_validation_history_equals_plain():
    train, val = dataset("multiclass", n=90)
    out = {}
    for mode in ("plain", "he"):
        fed = federation(train)
        model = fed.fit(objective="multiclass", mode=mode, key_bits=KEY_BITS, n_estimators=3, max_depth=2,
                        early_stopping_rounds=1, validation={"a": val[0], "b": val[1]})
        out[mode] = (model.history, model.best_iteration, model.n_rounds)
    assert out["he"] == out["plain"]


def test_history_and_best_iteration_survive_save_and_load(tmp_path):
    train, val = dataset("regression")
    fed = federation(train)
    fed.fit(objective="regression", early_stopping_rounds=2, validation={"a": val[0], "b": val[1]}, **OVERFIT)
    frames = {"a": val[0].drop(columns="y"), "b": val[1]}
    before = fed.predict(frames)
    fed.save(tmp_path)
    fed2 = Federation.load(tmp_path)
    assert fed2.model.history == fed.model.history
    assert fed2.model.best_iteration == fed.model.best_iteration is not None
    assert np.array_equal(fed2.predict(frames), before)


# --------------------------------------------------------------------------- bad input
def test_validation_ids_that_do_not_align_are_refused():
    train, val = dataset("binary")
    fed = federation(train)
    with pytest.raises(InputError, match=r"party 'b': validation set does not align: party 'b' has no row "
                                         r"for 5 of the 72 requested sample ids"):
        fed.fit(mode="plain", n_estimators=2, validation={"a": val[0], "b": val[1].iloc[5:]})


@pytest.mark.parametrize("case, match", [
    ("no_validation", r"early_stopping_rounds needs a validation set"),
    ("missing_party", r"validation data: unknown part\(ies\) \[\], missing \['b'\]"),
    ("missing_feature", r"validation set: party 'a' lacks feature column\(s\) \['a1'\]"),
    ("passive_feature", r"validation set: party 'b' lacks feature column\(s\) \['b1'\]"),
    ("duplicate_ids", r"validation set: party 'a'.*1 duplicated ids"),
    ("nan_label", r"label column 'label \(validation set\)' of party 'a' has 1 NaN/inf"),
    ("unknown_class", r"holds classes \[7\] that are not in the training labels \[0, 1, 2\]"),
    ("single_class_auc", r"validation set holds a single class: AUC"),
])
def test_bad_validation_input(case, match):
    objective = {"nan_label": "regression", "unknown_class": "multiclass"}.get(case, "binary")
    train, (va, vb) = dataset(objective)
    fed = federation(train)
    kw = dict(mode="plain", n_estimators=2, objective=objective, early_stopping_rounds=2)
    if case == "no_validation":
        validation = None
    elif case == "missing_party":
        validation = {"a": va}
    elif case == "missing_feature":
        validation = {"a": va.drop(columns="a1"), "b": vb}
    elif case == "passive_feature":
        validation = {"a": va, "b": vb.drop(columns="b1")}
    elif case == "duplicate_ids":
        validation = {"a": pd.concat([va, va.iloc[:1]]), "b": vb}
    elif case == "nan_label":
        validation = {"a": va.assign(y=va["y"].where(va.index != va.index[3])), "b": vb}
    elif case == "unknown_class":
        validation = {"a": va.assign(y=va["y"].where(va.index != va.index[0], 7)), "b": vb}
    else:
        validation = {"a": va.assign(y=1), "b": vb}
        kw["eval_metric"] = "auc"
    with pytest.raises(InputError, match=match):
        fed.fit(validation=validation, **kw)


def test_passive_without_validation_data_is_a_clear_error():
    train, val = dataset("binary")
    fed = federation(train)
    with pytest.raises(InputError, match=r"party 'b' has no validation data \(load_validation_data\)"):
        fed.active.fit(fed.transport, ["b"], None, validation=val[0])


def test_eval_metric_must_fit_the_objective():
    train, val = dataset("binary")
    with pytest.raises(InputError, match=r"eval_metric 'rmse' does not fit objective 'binary'"):
        federation(train).fit(mode="plain", eval_metric="rmse", validation={"a": val[0], "b": val[1]})


def test_psi_validation_ids_that_do_not_align_are_refused():
    train, val = dataset("binary")
    fed = federation(train)
    with pytest.raises(InputError, match=r"validation set does not align: party 'b' has no row for 5 of the 72 "
                                         r"validation ids"):
        fed.fit(mode="plain", n_estimators=2, align="psi", validation={"a": val[0], "b": val[1].iloc[5:]})


def test_auc_metric_equals_sklearn_with_ties():
    from sklearn.metrics import roc_auc_score

    from vfl.core.metrics import auc
    rng = np.random.default_rng(0)
    for _ in range(20):
        n = int(rng.integers(2, 200))
        y = rng.integers(0, 2, n)
        if len(set(y)) < 2:
            continue
        p = np.round(rng.random(n), int(rng.integers(1, 3)))     # many ties
        assert abs(auc(y, p) - roc_auc_score(y, p)) < 1e-12
    assert np.isnan(auc([1, 1], [0.2, 0.3]))
