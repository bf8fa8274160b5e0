"""Issue 37, item 7: a Pipeline whose steps output arrays (SimpleImputer) loses the column names
the estimator's `parties` assigns by: a clear error saying what to do, and the way it says works."""
import numpy as np
import pandas as pd
import pytest
from sklearn.compose import ColumnTransformer
from sklearn.impute import SimpleImputer
from sklearn.model_selection import GridSearchCV
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

from vfl.core.errors import InputError
from vfl.estimators import VerticalBoostingClassifier

PARTIES = {"bank": ["age", "income"], "telco": ["calls", "spend"]}


def data(n=200):
    rng = np.random.default_rng(0)
    X = pd.DataFrame(rng.normal(size=(n, 4)), columns=["age", "income", "calls", "spend"])
    y = (X.age + X.calls > 0).astype(int)
    X.iloc[::7, 1] = np.nan
    X.iloc[::5, 2] = np.nan
    return X, y


def test_an_array_output_step_gets_an_error_naming_set_output():
    X, y = data()
    pipe = make_pipeline(SimpleImputer(), VerticalBoostingClassifier(n_estimators=2, mode="plain", parties=PARTIES))
    with pytest.raises(InputError, match=r"names column 'age', but X is an array without column names .*"
                                         r"set_output\(transform=\"pandas\"\)"):
        pipe.fit(X, y)


@pytest.mark.slow
def test_set_output_pandas_keeps_the_names_and_the_parties():
    X, y = data()
    clf = VerticalBoostingClassifier(n_estimators=3, mode="plain", parties=PARTIES)
    pipe = make_pipeline(SimpleImputer(), StandardScaler(), clf).set_output(transform="pandas")
    pipe.fit(X, y)
    assert pipe[-1].parties_ == PARTIES and pipe[-1].feature_names_in_.tolist() == list(X.columns)
    assert pipe.score(X, y) > 0.8
    # the same model as fitting the estimator on the imputed, scaled frame itself
    Xt = StandardScaler().set_output(transform="pandas").fit_transform(
        SimpleImputer().set_output(transform="pandas").fit_transform(X))
    alone = VerticalBoostingClassifier(n_estimators=3, mode="plain", parties=PARTIES).fit(Xt, y)
    assert np.allclose(pipe.predict_proba(X), alone.predict_proba(Xt))
    search = GridSearchCV(pipe, {"verticalboostingclassifier__max_depth": [2, 3]}, cv=2).fit(X, y)
    assert search.best_estimator_[-1].parties_ == PARTIES


def test_a_column_transformer_keeps_the_names_without_prefixes():
    X, y = data()
    pre = ColumnTransformer([("impute", SimpleImputer(), ["income", "calls"])], remainder="passthrough",
                            verbose_feature_names_out=False)
    pipe = make_pipeline(pre, VerticalBoostingClassifier(n_estimators=2, mode="plain", parties=PARTIES))
    pipe.set_output(transform="pandas").fit(X, y)
    assert sorted(pipe[-1].feature_names_in_) == sorted(X.columns)
