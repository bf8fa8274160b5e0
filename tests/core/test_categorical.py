"""Native categorical features: category bins, the partition split rule, LightGBM's choice,
and categorical vs one-hot encoding (issue 15, item 1)."""
import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support import examples

from datasets import load_shared
from datasets.errors import InputError
from datasets.frames import MAX_CATEGORIES, party_data
from vfl.api import ActiveParty, Federation, PassiveParty, TrainParams
from vfl.core import metrics
from vfl.core.binning import Binner
from vfl.core.split import CategoricalParams, find_best_split, goes_left


# -- bins -----------------------------------------------------------------------------------
def test_category_bins_keep_the_most_frequent_pool_the_rest_and_missing_last():
    codes = np.array([0, 0, 0, 1, 1, 2, 3, 3, 3, 3, np.nan, -1])[:, None]
    b = Binner(max_bin=8, categorical=[True], max_cat=2).fit(codes)
    assert b.categories_[0].tolist() == [0, 3]              # the two most frequent, in code order
    assert b.n_bins.tolist() == [4]                          # 2 categories + pooled + missing
    bins = b.transform(codes)[:, 0].tolist()
    assert bins == [0, 0, 0, 2, 2, 2, 1, 1, 1, 1, 3, 2]       # 1, 2 and unseen (-1) pooled; NaN missing
    assert b.left_codes(0, [1, 2], 5) == [1, 2, 3, 4]         # pooled bin expands to every other code
    with pytest.raises(ValueError):
        b.threshold(0, 0)


@settings(max_examples=examples(40), deadline=None)
@given(st.lists(st.one_of(st.integers(0, 12), st.just(-1), st.none()), min_size=1, max_size=60),
       st.integers(1, 8))
def test_routing_by_bins_equals_routing_by_codes(values, max_cat):
    """Training routes by bins, prediction by raw codes: the two agree for every left set."""
    codes = np.array([np.nan if v is None else v for v in values], dtype=np.float64)
    b = Binner(max_bin=4, categorical=[True], max_cat=max_cat).fit(codes[:, None])
    bins = b.transform(codes[:, None])[:, 0].astype(np.int64)
    n_ordinary = b.missing_bin(0)
    rng = np.random.default_rng(len(values) + max_cat)
    left = sorted(set(rng.integers(0, n_ordinary, size=3).tolist()))
    for dl in (False, True):
        by_bins = goes_left(bins, -1, dl, missing=bins == n_ordinary, categories=left)
        codes_train = np.where(codes < 0, 99, codes)      # (training data has no unseen code)
        by_codes = goes_left(codes_train, None, dl, categories=b.left_codes(0, left, 100))
        assert by_bins.tolist() == by_codes.tolist()


def test_unseen_categories_go_right_and_missing_follows_default_left():
    x = np.array([0.0, 1.0, 2.0, -1.0, np.nan])
    assert goes_left(x, None, True, categories=[0, 2]).tolist() == [True, False, True, False, True]
    assert goes_left(x, None, False, categories=[0, 2]).tolist() == [True, False, True, False, False]


# -- encoding -------------------------------------------------------------------------------
def test_text_and_category_columns_are_categorical_and_encoded_with_the_training_vocabulary():
    frame = pd.DataFrame({"id": [1, 2, 3, 4], "region": ["north", "south", None, "north"],
                          "kind": pd.Categorical(["a", "b", "a", "a"]), "x": [1.0, 2.0, 3.0, 4.0]})
    d = party_data(frame, "p", "id")
    assert d.categories == {"region": ["north", "south"], "kind": ["a", "b"]}
    assert np.array_equal(d.X[:, 0], [0, 1, np.nan, 0], equal_nan=True)
    new = pd.DataFrame({"id": [9], "region": ["east"], "kind": ["b"], "x": [0.0]})
    d2 = party_data(new, "p", "id", categories=d.categories)
    assert d2.X[0, :2].tolist() == [-1.0, 1.0]                # unseen region -> -1


def test_numbers_with_a_typo_stay_an_error_unless_declared():
    frame = pd.DataFrame({"id": [1, 2, 3], "c": ["1.0", "oops", "3"]})
    with pytest.raises(InputError, match="feature column 'c' is not numeric.*--categorical c"):
        party_data(frame, "p", "id")
    assert party_data(frame, "p", "id", categorical=["c"]).categories == {"c": ["1.0", "3", "oops"]}


def test_bad_categorical_input_gets_clear_errors():
    frame = pd.DataFrame({"id": np.arange(MAX_CATEGORIES + 1), "u": [f"v{i}" for i in range(MAX_CATEGORIES + 1)]})
    with pytest.raises(InputError, match=f"categorical column 'u' has {MAX_CATEGORIES + 1} distinct values"):
        party_data(frame, "p", "id")
    with pytest.raises(InputError, match="categorical column.*'nope'.*not feature columns"):
        party_data(pd.DataFrame({"id": [1], "x": [1.0]}), "p", "id", categorical=["nope"])
    with pytest.raises(InputError, match="hold text, but the model was trained on them as numeric"):
        party_data(pd.DataFrame({"id": [1], "x": ["a"]}), "p", "id", categories={})
    with pytest.raises(InputError, match="max_cat"):
        TrainParams(max_cat=0)


# -- split finding --------------------------------------------------------------------------
def test_categorical_split_is_the_best_prefix_of_the_gradient_order():
    # bins 0..3 categories, 4 pooled, 5 missing; G/H order: 2 < 0 < 4 < 1 < 3 (missing empty)
    g = np.array([-1.0, 3.0, -6.0, 5.0, 0.5, 0.0])
    h = np.array([4.0, 4.0, 4.0, 4.0, 4.0, 0.0])
    info = find_best_split(g, h, np.array([0, 6]), g.sum(), h.sum(), 1.0, 0.0, categorical=np.array([True]),
                           n_samples=20, cat_params=CategoricalParams(0.0, 1, 32))
    assert info.categories == (0, 2) and info.bin_idx == -1 and not info.default_left
    assert info.sum_gradients_left == -7.0 and info.sum_hessians_left == 8.0


def test_min_data_per_group_and_cat_smooth_regularise():
    g = np.array([-6.0, 1.0, 1.0, 4.0, 0.0, 0.0])
    h = np.array([2.0, 2.0, 2.0, 2.0, 0.0, 0.0])
    off = np.array([0, 6])
    free = find_best_split(g, h, off, 0.0, 8.0, 1.0, 0.0, categorical=np.array([True]), n_samples=8,
                           cat_params=CategoricalParams(0.0, 1, 32))
    assert free.categories == (0,)
    grouped = find_best_split(g, h, off, 0.0, 8.0, 1.0, 0.0, categorical=np.array([True]), n_samples=8,
                              cat_params=CategoricalParams(0.0, 4, 32))
    assert grouped.categories == (0, 1) or grouped.categories == (0, 2)     # groups of >= 4 samples
    assert find_best_split(g, h, off, 0.0, 8.0, 1.0, 0.0, categorical=np.array([True]), n_samples=8,
                           cat_params=CategoricalParams(3.0, 1, 32)) is None   # every bin below cat_smooth


def _credit_like(n, seed, n_cat=8):
    rng = np.random.default_rng(seed)
    effect = np.array([-1.5, 1.2, 0.1, -0.6, 2.0, -2.2, 0.7, -0.2])[:n_cat]
    c = rng.integers(0, n_cat, size=n)
    y = (rng.random(n) < 1 / (1 + np.exp(-effect[c]))).astype(int)
    return c, y


def test_categorical_split_equals_lightgbms_choice():
    lgb = pytest.importorskip("lightgbm")
    c, y = _credit_like(3000, seed=4)
    names = np.array([f"grade_{k}" for k in range(8)])
    ids = np.arange(len(y))
    fed = Federation(ActiveParty("bank", pd.DataFrame({"id": ids, "y": y})),
                     [PassiveParty("bureau", pd.DataFrame({"id": ids, "grade": names[c]}))])
    fed.fit(TrainParams(mode="plain", n_estimators=1, max_depth=1, learning_rate=1.0, reg_lambda=1.0,
                        min_child_weight=0.0, cat_smooth=0.0, min_data_per_group=1, max_cat_threshold=32))
    rec = fed.passives["bureau"].records[0]
    vocab = fed.passives["bureau"].categories["grade"]
    ours = frozenset(vocab[k] for k in rec["categories"])
    booster = lgb.train({"objective": "binary", "num_leaves": 2, "learning_rate": 1.0, "lambda_l2": 1.0,
                         "cat_l2": 0.0, "cat_smooth": 0.0, "min_data_per_group": 1, "max_cat_to_onehot": 1,
                         "min_data_in_leaf": 1, "min_sum_hessian_in_leaf": 0.0, "verbose": -1,
                         "max_cat_threshold": 32},
                        lgb.Dataset(c.reshape(-1, 1), y, categorical_feature=[0]), num_boost_round=1)
    root = booster.dump_model()["tree_info"][0]["tree_structure"]
    assert root["decision_type"] == "=="
    theirs = frozenset(f"grade_{int(k)}" for k in str(root["threshold"]).split("||"))
    everything = frozenset(names)
    assert {ours, everything - ours} == {theirs, everything - theirs}
    assert len(ours) not in (0, 8)


@pytest.mark.slow
def test_categorical_beats_one_hot_on_a_200_category_column(shared_dir):
    """A shared dataset's numeric column bucketed into 200 shuffled labels: native categories
    group them in a few splits, one-hot needs a split per category."""
    active = load_shared("default_credit")[0]
    frame = active.frame
    rng = np.random.default_rng(0)
    buckets = pd.qcut(frame["x7"].rank(method="first"), 200, labels=False).to_numpy()
    labels = np.array([f"segment_{k:03d}" for k in rng.permutation(200)])[buckets]
    ids, y = frame["id"].to_numpy(), frame["y"].to_numpy()
    train = np.arange(len(ids)) < int(0.8 * len(ids))
    test = ~train
    onehot = pd.get_dummies(pd.Series(labels), dtype=float)
    params = dict(mode="plain", n_estimators=10, max_depth=3, learning_rate=0.3, max_cat=256)
    aucs = {}
    for kind, feats in (("categorical", pd.DataFrame({"segment": labels})), ("one-hot", onehot)):
        passive = pd.concat([pd.DataFrame({"id": ids}), feats.reset_index(drop=True)], axis=1)
        fed = Federation(ActiveParty("bank", pd.DataFrame({"id": ids[train], "y": y[train]})),
                         [PassiveParty("shop", passive[train])])
        fed.fit(TrainParams(**params))
        p = fed.predict_proba({"bank": pd.DataFrame({"id": ids[test]}), "shop": passive[test]})
        aucs[kind] = metrics.auc(y[test].astype(float), p)
    assert aucs["categorical"] > aucs["one-hot"] + 0.02, aucs


@settings(max_examples=examples(50), deadline=None)
@given(st.lists(st.one_of(st.sampled_from(["a", "b", "zz", "north", "é"]), st.none()), min_size=1, max_size=40),
       st.lists(st.sampled_from(["a", "b", "q", None]), min_size=1, max_size=10))
def test_category_codes_decode_to_the_values(train, new):
    frame = pd.DataFrame({"id": np.arange(len(train)), "c": pd.Series(train, dtype=object)})
    d = party_data(frame, "p", "id", categorical=["c"])
    vocab = d.categories["c"]
    assert vocab == sorted({v for v in train if v is not None})
    for v, code in zip(train, d.X[:, 0]):
        assert (np.isnan(code) and v is None) or vocab[int(code)] == v
    d2 = party_data(pd.DataFrame({"id": np.arange(len(new)), "c": pd.Series(new, dtype=object)}), "p", "id",
                    categories=d.categories)
    for v, code in zip(new, d2.X[:, 0]):
        assert (np.isnan(code) and v is None) or (code == -1 and v not in vocab) or vocab[int(code)] == v
