"""Accuracy against XGBoost (``hist``, same trees, depth, learning rate, bins, lambda,
min_child_weight and base score) on the same 80/20 split. ``plain`` mode: it grows the
same trees as ``he`` (tested in test_learner_objectives)."""
import numpy as np
import pytest

from datasets import join_parties, load_shared, sklearn_parties
from datasets.split import train_test_split_parties
from vfl.api import federation_from_frames
from vfl.core import metrics
from vfl.core.objectives import get_objective
from vfl.core.params import TrainParams

xgb = pytest.importorskip("xgboost")


def joined(parties):
    X, y, ids = join_parties(parties)
    assert np.array_equal(ids, parties[0].frame[parties[0].id_col].to_numpy())   # active party's row order
    return X, y


def both(parties, objective, n_estimators=20, max_depth=4, seed=0):
    """(federated test output, XGBoost test output, test labels) on the same split."""
    p = TrainParams(mode="plain", objective=objective, n_estimators=n_estimators, max_depth=max_depth)
    train, test = train_test_split_parties(parties, test_size=0.2, seed=seed)
    fed = federation_from_frames(train)
    fed.fit(p)
    ours = get_objective(objective).transform(fed.predict_raw({pf.name: pf.frame for pf in test}))
    Xtr, ytr = joined(train)
    Xte, yte = joined(test)
    common = dict(n_estimators=p.n_estimators, max_depth=p.max_depth, learning_rate=p.learning_rate,
                  max_bin=p.max_bin, reg_lambda=p.reg_lambda, min_child_weight=p.min_child_weight,
                  gamma=p.gamma, tree_method="hist", n_jobs=1)
    if objective == "multiclass":
        index = {c: i for i, c in enumerate(fed.model.classes)}
        ytr = np.array([index[int(v)] for v in ytr])
        yte = np.array([index[int(v)] for v in yte])
        ref = xgb.XGBClassifier(objective="multi:softprob", **common).fit(Xtr, ytr).predict_proba(Xte)
    elif objective == "binary":
        ytr, yte = ytr.astype(float), yte.astype(float)
        ref = xgb.XGBClassifier(objective="binary:logistic", base_score=ytr.mean(), **common) \
            .fit(Xtr, ytr).predict_proba(Xte)[:, 1]
    else:
        ytr, yte = ytr.astype(float), yte.astype(float)
        ref = xgb.XGBRegressor(objective="reg:squarederror", base_score=ytr.mean(), **common) \
            .fit(Xtr, ytr).predict(Xte)
    return ours, ref, yte


@pytest.mark.slow
@pytest.mark.parametrize("name", ["wine", "vehicle"])
def test_multiclass_accuracy_matches_xgboost(name, request):
    parties = sklearn_parties(name) if name == "wine" else \
        (request.getfixturevalue("shared_dir"), load_shared("vehicle"))[1]
    ours, ref, y = both(parties, "multiclass")
    acc, acc_ref = 1 - metrics.merror(y, ours), 1 - metrics.merror(y, ref)
    assert acc > (0.9 if name == "wine" else 0.6)          # a real classifier, not chance
    assert abs(acc - acc_ref) <= 0.02, (acc, acc_ref)
    assert metrics.mlogloss(y, ours) < 1.1 * metrics.mlogloss(y, ref)


@pytest.mark.parametrize("name", ["diabetes", "student"])
def test_regression_rmse_matches_xgboost(name, request):
    parties = sklearn_parties(name) if name == "diabetes" else \
        (request.getfixturevalue("shared_dir"), load_shared("student"))[1]
    ours, ref, y = both(parties, "regression")
    rmse, rmse_ref = metrics.rmse(y, ours), metrics.rmse(y, ref)
    assert rmse < 0.95 * y.std()                            # better than the mean
    assert abs(rmse - rmse_ref) <= 0.05 * rmse_ref, (rmse, rmse_ref)


def test_ionosphere_auc_with_missing_values_matches_xgboost(shared_dir):
    parties = load_shared("ionosphere")
    assert parties[0].frame["x2"].isna().all()                       # the all-NaN column
    assert parties[1].frame.drop(columns="sid").isna().any().any()   # missing values at the passive party too
    ours, ref, y = both(parties, "binary")
    auc, auc_ref = metrics.auc(y, ours), metrics.auc(y, ref)
    assert auc > 0.85
    assert abs(auc - auc_ref) <= 0.02, (auc, auc_ref)
