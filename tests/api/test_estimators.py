"""scikit-learn estimators over a simulated federation."""
import numpy as np
import pandas as pd
import pytest
from sklearn.base import clone, is_classifier, is_regressor
from sklearn.exceptions import NotFittedError
from support import KEY_BITS

from vfl import VerticalBoostingClassifier, VerticalBoostingRegressor
from vfl.errors import InputError


def wine_parties(labels=("red", "rose", "white")):
    from sklearn.datasets import load_wine
    b = load_wine()
    X = pd.DataFrame(b.data, columns=[f"f{i}" for i in range(13)])
    X.insert(0, "id", [f"w{i}" for i in range(len(X))])
    parts = {"bank": X[["id"] + [f"f{i}" for i in range(6)]],
             "telco": X[["id"] + [f"f{i}" for i in range(6, 13)]].sample(frac=1, random_state=0)}
    return parts, np.array(labels)[b.target]


def diabetes_parties():
    from sklearn.datasets import load_diabetes
    b = load_diabetes()
    X = pd.DataFrame(b.data, columns=[f"f{i}" for i in range(10)])
    X.insert(0, "id", np.arange(len(X)))
    return [X[["id", "f0", "f1", "f2", "f3"]], X[["id", "f4", "f5", "f6"]], X[["id", "f7", "f8", "f9"]]], b.target


def test_get_params_set_params_clone_round_trip():
    clf = VerticalBoostingClassifier(n_estimators=7, max_depth=2, mode="plain", subsample=0.8)
    params = clf.get_params()
    assert params["n_estimators"] == 7 and params["subsample"] == 0.8 and params["mode"] == "plain"
    c2 = clone(clf)
    assert c2 is not clf and c2.get_params() == params
    assert c2.set_params(learning_rate=0.1) is c2 and c2.learning_rate == 0.1 and clf.learning_rate == 0.3
    reg = VerticalBoostingRegressor(objective="pseudohuber", huber_slope=2.0)
    assert clone(reg).get_params() == reg.get_params() and reg.get_params()["huber_slope"] == 2.0
    assert is_classifier(clf) and is_regressor(reg)
    parts, y = wine_parties()
    fitted = VerticalBoostingClassifier(n_estimators=2, mode="plain").fit(parts, y)
    fresh = clone(fitted)
    assert not hasattr(fresh, "federation_") and fresh.get_params() == fitted.get_params()
    with pytest.raises(NotFittedError):
        fresh.predict(parts)


def test_classifier_multiclass_with_string_labels():
    parts, y = wine_parties()
    clf = VerticalBoostingClassifier(n_estimators=10, max_depth=3, mode="plain").fit(parts, y)
    assert clf.classes_.tolist() == ["red", "rose", "white"] and clf.model_.objective == "multiclass"
    pred = clf.predict(parts)
    assert set(pred) <= set(clf.classes_) and clf.score(parts, y) > 0.95
    proba = clf.predict_proba(parts)
    assert proba.shape == (178, 3) and np.allclose(proba.sum(axis=1), 1)
    assert np.array_equal(clf.classes_[proba.argmax(axis=1)], pred)
    imp = clf.feature_importances_
    assert imp.shape == (13,) == (clf.n_features_in_,) and imp.sum() == pytest.approx(1.0) and (imp >= 0).all()
    assert clf.feature_names_in_.tolist() == [f"f{i}" for i in range(13)]
    assert clf.feature_parties_.tolist() == ["bank"] * 6 + ["telco"] * 7
    split = clone(clf).set_params(importance_type="split").fit(parts, y).feature_importances_
    assert split.sum() == pytest.approx(1.0) and not np.allclose(split, imp)


def test_classifier_binary_labels_and_list_input():
    parts, y = wine_parties()
    yb = np.where(y == "red", "yes", "no")
    clf = VerticalBoostingClassifier(n_estimators=5, mode="plain").fit(list(parts.values()), yb)
    assert clf.model_.objective == "binary" and clf.classes_.tolist() == ["no", "yes"]
    assert clf.party_names_ == ["party0", "party1"]
    proba = clf.predict_proba(list(parts.values()))
    assert proba.shape == (178, 2) and np.allclose(proba.sum(axis=1), 1)
    assert clf.score(list(parts.values()), yb) > 0.95


def test_classifier_he_mode():
    parts, y = wine_parties()
    small = {k: v[v["id"].isin([f"w{i}" for i in range(0, 178, 3)])] for k, v in parts.items()}
    ys = y[::3]
    out = [VerticalBoostingClassifier(n_estimators=2, max_depth=2, mode=mode, key_bits=KEY_BITS)
           .fit(small, ys).predict_proba(small) for mode in ("plain", "he")]
    assert np.array_equal(out[0], out[1])


@pytest.mark.parametrize("kw", [dict(mode="dp", epsilon=4.0), dict(mode="plain", align="psi")])
def test_estimator_dp_and_psi(kw):
    parts, y = diabetes_parties()
    reg = VerticalBoostingRegressor(n_estimators=5, **kw).fit(parts, y)
    assert reg.model_.params["mode"] == kw["mode"] and reg.predict(parts).shape == (442,)
    assert clone(reg).get_params() == reg.get_params()


def test_regressor_three_parties_and_early_stopping():
    parts, y = diabetes_parties()
    train = [p.iloc[:330] for p in parts]
    val = [p.iloc[330:] for p in parts]
    reg = VerticalBoostingRegressor(n_estimators=60, max_depth=3, learning_rate=0.5, mode="plain",
                                    early_stopping_rounds=3)
    reg.fit(train, y[:330], eval_set=(val, y[330:]))
    hist = reg.evals_result_["validation"]["rmse"]
    assert reg.best_iteration_ == int(np.argmin(hist)) and len(hist) < 60
    assert reg.score(val, y[330:]) > 0.3
    assert reg.predict(val).shape == (112,)
    hub = VerticalBoostingRegressor(n_estimators=20, mode="plain", objective="pseudohuber", huber_slope=50.0)
    assert hub.fit(train, y[:330]).model_.objective == "pseudohuber" and hub.score(val, y[330:]) > 0.2


@pytest.mark.parametrize("case, match", [
    ("not_frames", r"X has the id column 'id', but a single table's rows are matched by position"),
    ("not_df", r"X: party 'telco' must be a pandas DataFrame, got ndarray"),
    ("y_length", r"y has \(10,\) labels but the active party 'bank' has 178 rows"),
    ("no_id", r"X: party 'bank' has no id column 'id'"),
    ("single_class", r"y holds one class only \(\['red'\]\): a classifier needs at least 2"),
    ("bad_param", r"parameter n_estimators must be >= 1, got 0"),
    ("es_no_eval", r"early_stopping_rounds needs an eval_set"),
    ("eval_unknown", r"eval_set labels \['blue'\] are not among the training classes"),
    ("importance", r"importance_type must be 'gain' or 'split'"),
    ("nan_label", r"y has 1 missing labels"),
])
def test_classifier_bad_input(case, match):
    parts, y = wine_parties()
    kw = dict(mode="plain", n_estimators=1)
    X, fit_kw = parts, {}
    if case == "not_frames":
        X = parts["bank"]
    elif case == "not_df":
        X = {"bank": parts["bank"], "telco": parts["telco"].to_numpy()}
    elif case == "y_length":
        y = y[::18]
    elif case == "no_id":
        X = {"bank": parts["bank"].rename(columns={"id": "key"}), "telco": parts["telco"]}
    elif case == "single_class":
        y = np.array(["red"] * len(y))
    elif case == "bad_param":
        kw["n_estimators"] = 0
    elif case == "es_no_eval":
        kw["early_stopping_rounds"] = 2
    elif case == "eval_unknown":
        fit_kw["eval_set"] = (parts, np.where(y == "red", "blue", y))
    elif case == "importance":
        kw["importance_type"] = "cover"
    elif case == "nan_label":
        y = pd.Series(y).where(np.arange(len(y)) != 5).to_numpy()
    with pytest.raises(InputError, match=match):
        VerticalBoostingClassifier(**kw).fit(X, y, **fit_kw)


def test_predict_with_other_parties_and_regressor_bad_labels():
    parts, y = wine_parties()
    clf = VerticalBoostingClassifier(n_estimators=1, mode="plain").fit(parts, y)
    with pytest.raises(InputError, match=r"X has parties \['bank'\], the model was fitted with \['bank', 'telco'\]"):
        clf.predict({"bank": parts["bank"]})
    rparts, ry = diabetes_parties()
    ry = ry.astype(float)
    ry[3] = np.inf
    with pytest.raises(InputError, match=r"y has 1 NaN/inf values \(rows \[3\]\)"):
        VerticalBoostingRegressor(mode="plain").fit(rparts, ry)
    with pytest.raises(InputError, match=r"y must hold numbers for a regressor"):
        VerticalBoostingRegressor(mode="plain").fit(rparts, ["a"] * len(ry))
    with pytest.raises(InputError, match=r"parameter objective must be 'regression' or 'pseudohuber'"):
        VerticalBoostingRegressor(mode="plain", objective="binary").fit(rparts, np.zeros(len(ry)))
    with pytest.raises(InputError, match=r"eval_set must be a pair"):
        VerticalBoostingRegressor(mode="plain").fit(rparts, np.zeros(len(ry)), eval_set=rparts)


def test_from_vfl_import_train_params_loads_no_party_stack():
    """`vfl` exports the core names directly and the party wiring lazily (PEP 562)."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    code = ("import sys\nfrom vfl import Mode, TrainParams\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('parties', 'protocols', 'crypto')))\n"
            "import vfl\nvfl.Federation\n"
            "print(any(m.startswith('parties.') for m in sys.modules))\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split("\n")[:2] == ["[]", "True"]


def test_estimators_wire_no_party_themselves():
    """The estimators go through vfl.api (federation_from_frames), not the party classes."""
    import vfl.estimators as est
    from vfl.api import Federation
    from vfl.params import TrainParams

    assert not hasattr(est, "ActiveParty") and not hasattr(est, "PassiveParty")
    parts, y = wine_parties()
    clf = VerticalBoostingClassifier(mode="plain", n_estimators=2).fit(parts, y)
    assert type(clf.federation_) is Federation and list(clf.federation_.passives) == ["telco"]
    assert clf.get_params()["max_depth"] == TrainParams.default("max_depth")
