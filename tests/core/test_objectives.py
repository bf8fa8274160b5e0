"""Objectives: multiclass softmax, squared error, pseudo-Huber; labels; packing of
unbounded and multi-target gradients (he == plain for every objective: tests/test_he_equals_plain.py)."""
import numpy as np
import pandas as pd
import pytest
from support import KEY_BITS, gradient_messages

from protocols import messages as m
from protocols.serialization import loads
from vfl.api import ActiveParty, Federation, PassiveParty
from vfl.core.errors import InputError
from vfl.core.model import BoostedModel
from vfl.core.objectives import (
    PseudoHuberObjective,
    SoftmaxObjective,
    SquaredErrorObjective,
    plan_precision,
    pow2_ceil,
    softmax,
)
from vfl.core.params import TrainParams


def make_data(n=90, seed=0, nan_rate=0.0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 4))
    if nan_rate:
        X[rng.random(X.shape) < nan_rate] = np.nan
    return np.arange(n), X, rng


def federation(y, X, ids, record=False, label_dtype=None):
    a = pd.DataFrame({"id": ids, "y": pd.Series(y, dtype=label_dtype), "a0": X[:, 0], "a1": X[:, 1]})
    b = pd.DataFrame({"id": ids, "b0": X[:, 2], "b1": X[:, 3]})
    return Federation(ActiveParty("a", a), [PassiveParty("b", b)], record=record)


def trees(fed):
    return [t.structure() for rnd in fed.model.rounds for t in rnd]


def received(fed, party, kind):
    msgs = [loads(f) for s, r, f in fed.transport.log if r == party]
    if kind is m.Gradients:          # a round's gradients travel as a stream: reassembled
        return gradient_messages(msgs)
    return [msg for msg in msgs if isinstance(msg, kind)]


# --------------------------------------------------------------------------- losses
def _numeric_grad(loss_fn, raw, eps=1e-6):
    g = np.zeros_like(raw)
    for idx in np.ndindex(raw.shape):
        up, dn = raw.copy(), raw.copy()
        up[idx] += eps
        dn[idx] -= eps
        g[idx] = (loss_fn(up)[idx[0]] - loss_fn(dn)[idx[0]]) / (2 * eps)
    return g


def test_softmax_gradient_is_the_derivative_of_the_log_loss():
    rng = np.random.default_rng(1)
    raw, y = rng.normal(size=(6, 3)), np.array([0, 1, 2, 2, 1, 0])
    g, h = SoftmaxObjective().gradients(y, raw)
    num = _numeric_grad(lambda r: -np.log(softmax(r)[np.arange(6), y]), raw)
    assert np.allclose(g, num, atol=1e-6)
    p = softmax(raw)
    assert np.allclose(h, 2 * p * (1 - p))         # XGBoost's multi:softprob hessian
    assert np.abs(g).max() <= 1 and h.max() <= 0.5  # the constant packing bounds hold


def test_regression_gradients_are_derivatives():
    rng = np.random.default_rng(2)
    raw, y = rng.normal(size=(8, 1)) * 3, rng.normal(size=8)
    g, h = SquaredErrorObjective().gradients(y, raw)
    assert np.allclose(g[:, 0], raw[:, 0] - y) and np.all(h == 1)
    loss = PseudoHuberObjective(huber_slope=0.7)
    g, h = loss.gradients(y, raw)
    f = lambda r: 0.49 * (np.sqrt(1 + ((r[:, 0] - y) / 0.7) ** 2) - 1)  # noqa: E731
    assert np.allclose(g, _numeric_grad(f, raw), atol=1e-6)
    gp = loss.gradients(y, raw + 1e-6)[0]
    gm = loss.gradients(y, raw - 1e-6)[0]
    assert np.allclose(h, (gp - gm) / 2e-6, atol=1e-5)
    assert np.abs(g).max() < 0.7                  # |g| < huber_slope


def test_pow2_ceil_and_precision_plan():
    assert [pow2_ceil(x) for x in (0.3, 1.0, 1.5, 4.0, 1000.0)] == [0.5, 1.0, 2.0, 4.0, 1024.0]
    assert pow2_ceil(0.0) > 0
    assert plan_precision(1.0, 0.25, 455, 32) == 32               # binary: the usual 32 bits
    bits = plan_precision(2.0 ** 30, 1.0, 10_000, 32)             # huge residuals: fewer bits
    assert bits == 53 - 30 - 14 and 2.0 ** 30 * 10_000 * 2.0 ** bits < 2.0 ** 53
    with pytest.raises(InputError, match=r"label is too large.*scale it down"):
        plan_precision(2.0 ** 45, 1.0, 1000, 32)


# --------------------------------------------------------------------------- multiclass labels
def test_string_labels_are_mapped_reported_and_predicted_back(tmp_path):
    ids, X, _ = make_data(120)
    names = np.array(["car", "bus", "van"])
    y = names[(X[:, 0] > 0).astype(int) + (X[:, 2] > 0.3).astype(int)]
    fed = federation(y, X, ids)
    model = fed.fit(mode="plain", objective="multiclass", n_estimators=4, max_depth=3)
    assert model.classes == ["bus", "car", "van"] and model.n_targets == 3
    assert fed.active.label_mapping == {"bus": 0, "car": 1, "van": 2}
    pred = fed.predict()
    assert set(pred) <= {"bus", "car", "van"} and np.mean(pred == y) > 0.8
    proba = fed.predict_proba()
    assert proba.shape == (120, 3) and np.allclose(proba.sum(axis=1), 1)
    assert np.array_equal(np.array(model.classes)[proba.argmax(axis=1)], pred)
    fed.save(tmp_path)
    fed2 = Federation.load(tmp_path)
    frames = {"a": pd.DataFrame({"id": ids, "a0": X[:, 0], "a1": X[:, 1]}),
              "b": pd.DataFrame({"id": ids, "b0": X[:, 2], "b1": X[:, 3]})}
    assert np.array_equal(fed2.predict(frames), pred)
    assert BoostedModel.load(tmp_path / "a.json").classes == ["bus", "car", "van"]


def test_integer_labels_that_are_not_0_to_k_are_mapped():
    ids, X, _ = make_data(120)
    y = np.array([3, 7, 9])[(X[:, 0] > 0).astype(int) + (X[:, 2] > 0.3).astype(int)]
    fed = federation(y, X, ids)
    model = fed.fit(mode="plain", objective="multiclass", n_estimators=3)
    assert model.classes == [3, 7, 9] and fed.active.label_mapping == {3: 0, 7: 1, 9: 2}
    assert set(fed.predict().tolist()) <= {3, 7, 9}


@pytest.mark.parametrize("labels, match", [
    ([0, 1, np.nan, 2] * 10, r"label column 'y' of party 'a' has 1\d? NaN/inf"),
    ([0, 1.5, 2, 1] * 10, r"non-integer values \[1\.5\].*objective='regression'"),
    ([4] * 40, r"single class \[4\].*at least 2 classes"),
    (["x", None, "y", "z"] * 10, r"has 10 missing labels"),
])
def test_bad_multiclass_labels(labels, match):
    ids, X, _ = make_data(40)
    fed = federation(np.array(labels, dtype=object if isinstance(labels[0], str) else None), X, ids)
    with pytest.raises(InputError, match=match):
        fed.fit(mode="plain", objective="multiclass", n_estimators=1)


def test_label_mixing_strings_and_numbers_is_refused():
    ids, X, _ = make_data(40)
    with pytest.raises(InputError, match=r"label column 'y' mixes strings and other values"):
        federation(np.array(["a", 1, "b", 2] * 10, dtype=object), X, ids)


def test_binary_refuses_string_labels_clearly():
    ids, X, _ = make_data(40)
    fed = federation(np.array(["yes", "no"] * 20, dtype=object), X, ids)
    with pytest.raises(InputError, match=r"label column 'y' of party 'a' is not numeric \(e\.g\. 'no', 'yes'\).*"
                                         r"objective='multiclass'"):
        fed.fit(mode="plain", objective="binary", n_estimators=1)


@pytest.mark.parametrize("bad, match", [(np.nan, "1 NaN/inf values"), (np.inf, "1 NaN/inf values")])
def test_regression_labels_must_be_finite(bad, match):
    ids, X, _ = make_data(40)
    y = X[:, 0].copy()
    y[7] = bad
    with pytest.raises(InputError, match=r"label column 'y' of party 'a' has " + match + r" \(ids \[7\]\)"):
        federation(y, X, ids).fit(mode="plain", objective="regression", n_estimators=1)
    with pytest.raises(InputError, match=r"label column 'y' of party 'a' is not numeric"):
        federation(np.array(["1.0", "2"] * 20, dtype=object), X, ids).fit(mode="plain", objective="regression")


def test_objective_and_huber_parameters_are_checked():
    with pytest.raises(InputError, match=r"parameter objective must be one of"):
        TrainParams(objective="poisson")
    with pytest.raises(InputError, match=r"parameter huber_slope must be > 0"):
        TrainParams(objective="pseudohuber", huber_slope=0)
    assert TrainParams(objective="reg:pseudohubererror").objective == "pseudohuber"
    assert TrainParams(objective="multi:softprob").objective == "multiclass"


# --------------------------------------------------------------------------- packing
def test_all_classes_travel_in_one_message_one_value_per_sample():
    ids, X, _ = make_data(90)
    y = (X[:, 0] > 0).astype(int) + (X[:, 2] > 0.3).astype(int) + (X[:, 1] > 1).astype(int)
    fed = federation(y, X, ids, record=True)
    fed.fit(mode="he", key_bits=KEY_BITS, objective="multiclass", n_estimators=2, max_depth=2)
    grads = received(fed, "b", m.Gradients)
    assert len(grads) == 2                                   # one message per round, all 4 classes
    for msg in grads:
        assert msg.encrypted and len(msg.values) == 90 * msg.shifts   # one ciphertext per sample
        #                                                    (times the pre-shifted copies, crypto.compress)
        assert msg.layout["n_targets"] == 4


def test_regression_layout_is_data_driven_power_of_two():
    ids, X, rng = make_data(90)
    y = 300 * X[:, 0] + rng.normal(size=90)
    fed = federation(y, X, ids, record=True)
    fed.fit(mode="plain", objective="regression", n_estimators=4, max_depth=3, learning_rate=0.5)
    layouts = [msg.layout for msg in received(fed, "b", m.Gradients)]
    bounds = [lay["g_max"] / 2 ** lay["precision_bits"] for lay in layouts]
    resid = np.abs(y - y.mean()).max()
    assert bounds[0] == pow2_ceil(resid) and bounds[0] < 2 * resid          # first round: residuals
    assert all(float(b).is_integer() and (int(b) & (int(b) - 1)) == 0 for b in bounds)   # powers of 2
    assert bounds[-1] < bounds[0]                                           # the fit shrinks them


def test_large_regression_targets_train_with_fewer_fractional_bits():
    ids, X, rng = make_data(200)
    y = 1e9 * (X[:, 0] + 0.1 * rng.normal(size=200))     # residuals ~ 2**31: 32 bits would overflow
    fed = federation(y, X, ids, record=True)
    fed.fit(mode="plain", objective="regression", n_estimators=5, max_depth=3)
    lay = received(fed, "b", m.Gradients)[0].layout
    assert lay["precision_bits"] < 32
    assert np.sqrt(np.mean((fed.predict() - y) ** 2)) < 0.5 * y.std()    # it really learns
    with pytest.raises(InputError, match=r"label is too large"):
        federation(y * 1e7, X, ids).fit(mode="plain", objective="regression", n_estimators=1)


def test_classes_that_do_not_fit_one_plaintext_use_target_groups():
    """13 classes overflow a 1024-bit plaintext: two groups of targets per sample; the trees are
    exactly those of the single-group layout of a 2048-bit key."""
    ids, X, rng = make_data(130)
    y = rng.integers(0, 13, size=130)
    y[:13] = np.arange(13)
    out = {}
    for bits in (1024, 2048):
        fed = federation(y, X, ids, record=True)
        fed.fit(mode="plain", key_bits=bits, objective="multiclass", n_estimators=2, max_depth=2)
        out[bits] = trees(fed)
        msg = received(fed, "b", m.Gradients)[0]
        assert len(msg.values) == 130 * (2 if bits == 1024 else 1)
        assert msg.layout["n_targets"] == (12 if bits == 1024 else 13)
    assert out[1024] == out[2048]


def test_one_target_that_cannot_fit_the_key_is_a_clear_error():
    from crypto.packing import PackingLayout, PackingOverflowError
    from parties.active import GradientChannel
    layout = PackingLayout.for_bounds(2.0 ** 960, 1.0, 1000, n_targets=3)
    with pytest.raises(PackingOverflowError, match=r"a 1024-bit key cannot hold one packed value.*larger key"):
        GradientChannel("plain", 1024, "fast").group_size(layout)


# --------------------------------------------------------------------------- target groups
# (he == plain for every objective and for target groups: tests/test_he_equals_plain.py)
@pytest.mark.slow
def test_he_target_groups_travel_in_two_groups():
    ids, X, rng = make_data(50, seed=4)
    y = rng.integers(0, 10, size=50)
    y[:10] = np.arange(10)
    for mode in ("plain", "he"):
        fed = federation(y, X, ids, record=True)
        fed.fit(mode=mode, key_bits=KEY_BITS, precision_bits=48, objective="multiclass", n_estimators=1,
                max_depth=2, min_child_weight=0.01)
        msg = received(fed, "b", m.Gradients)[0]
        assert len(msg.values) == 100                        # 10 classes of 108 bits: 2 groups
