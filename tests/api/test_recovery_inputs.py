"""Issue 27: bounded duration options (#3), tiny weights (#5), the weight column's own wording (#7),
messages that name the real problem (#8), and the loose ends made explicit (#9)."""
from __future__ import annotations

import math
import re

import numpy as np
import pytest
from click.testing import CliRunner
from hypothesis import given
from hypothesis import strategies as st
from support import small_frames

from cli import main
from parties.server import PassiveServer
from protocols import messages as m
from protocols.messages import MAX_ROUNDS
from protocols.serialization import BigInts, dumps, loads
from protocols.transport import InMemoryTransport
from protocols.units import MAX_SECONDS, check_seconds
from vfl.api import ActiveParty, Federation, PassiveParty, TrainParams
from vfl.core import metrics
from vfl.core.errors import InputError, PeerError, ProtocolError
from vfl.core.objectives import get_objective
from vfl.core.params import MAX_ROUNDS as PARAMS_MAX_ROUNDS


def _cli_error(args):
    res = CliRunner().invoke(main, [str(a) for a in args])
    assert res.exit_code != 0
    assert res.exception is None or isinstance(res.exception, SystemExit), res.exception
    assert "Traceback" not in res.output
    return res.output


# --- 3. every duration option is bounded and checked ----------------------------------------------
@given(st.floats(allow_nan=True, allow_infinity=True) | st.sampled_from([0.0, -0.0, 1e12, MAX_SECONDS,
                                                                        math.nextafter(MAX_SECONDS, math.inf)]))
def test_check_seconds_accepts_exactly_the_finite_positive_bounded_values(v):
    ok = math.isfinite(v) and 0 < v <= MAX_SECONDS
    if ok:
        assert check_seconds(v, "--timeout") == v
    else:
        with pytest.raises(InputError, match=r"--timeout must be more than 0 and at most 86400 seconds"):
            check_seconds(v, "--timeout")


@pytest.mark.parametrize("option", ["--timeout", "--connect-timeout"])
@pytest.mark.parametrize("value", ["inf", "nan", "1e12", "0", "-5"])
def test_party_active_and_predict_refuse_unbounded_durations(tmp_path, option, value):
    """Before: --timeout inf (or 1e12) hung for good; NaN gave "did not answer within nan s"."""
    a, b, _ = small_frames(40)
    a.to_csv(tmp_path / "a.csv", index=False)
    want = f"{option} must be more than 0 and at most 86400 seconds, got {float(value)!r}"
    out = _cli_error(["party", "active", "--data", tmp_path / "a.csv", "--peer", "b=127.0.0.1:1", "--insecure",
                      "--model-dir", tmp_path / "m", option, value])
    assert want in out
    out = _cli_error(["predict", "--model-dir", tmp_path / "m", "--data", tmp_path / "a.csv", "--peer",
                      "b=127.0.0.1:1", "--insecure", "--out", tmp_path / "p.csv", option, value])
    assert want in out


@pytest.mark.parametrize("value", ["inf", "nan", "0", "1e9"])
def test_max_message_mb_is_bounded(tmp_path, value):
    a, _, _ = small_frames(40)
    a.to_csv(tmp_path / "a.csv", index=False)
    out = _cli_error(["party", "active", "--data", tmp_path / "a.csv", "--peer", "b=127.0.0.1:1", "--insecure",
                      "--model-dir", tmp_path / "m", "--max-message-mb", value])
    assert "--max-message-mb must be more than 0 and at most 65536 (MiB)" in out


def test_the_transport_checks_its_durations_too():
    pytest.importorskip("grpc")
    from protocols.grpc_client import GrpcTransport
    from protocols.grpc_security import Security
    from protocols.grpc_server import PartyServer
    for bad in (math.inf, math.nan, 1e12):
        with pytest.raises(InputError, match="--timeout must be more than 0"):
            GrpcTransport("a", {"b": "127.0.0.1:1"}, Security(), timeout=bad)
        with pytest.raises(InputError, match="the read timeout must be more than 0"):
            PartyServer("b", lambda f, w: f, "127.0.0.1:0", Security(), read_timeout=bad)
    with GrpcTransport("a", {"b": "127.0.0.1:1"}, Security(), timeout=5) as t:
        with pytest.raises(InputError, match="--connect-timeout must be more than 0"):
            t.connect(timeout=math.inf)


# --- 5. tiny positive weights ------------------------------------------------------------------------
@given(st.integers(-960, 960), st.integers(0, 2 ** 32 - 1))
def test_weighted_metrics_do_not_depend_on_the_scale_of_the_weights(k, seed):
    """Before: all weights 1e-300 made w_pos * w_neg underflow to 0: a ZeroDivisionError in
    weighted_auc (after a whole training)."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 2, 30).astype(float)
    y[:2] = [0, 1]
    p = rng.random(30)
    w = rng.integers(1, 5, 30).astype(float)
    ref = metrics.weighted_metrics(["auc", "logloss", "error"], y, p, w)
    scaled = metrics.weighted_metrics(["auc", "logloss", "error"], y, p, np.ldexp(w, k))
    assert scaled == ref


def test_all_weights_1e_minus_300_train_and_report(tmp_path):
    a, b, _ = small_frames(60)
    a["w"] = 1e-300
    a.to_csv(tmp_path / "a.csv", index=False)
    b.to_csv(tmp_path / "b.csv", index=False)
    res = CliRunner().invoke(main, ["simulate", "--active", str(tmp_path / "a.csv"), "--passive",
                                    str(tmp_path / "b.csv"), "--weight-col", "w", "--mode", "plain", "--rounds", "2",
                                    "--quiet", "--output-json", str(tmp_path / "r.json")])
    assert res.exit_code == 0, res.output
    assert "Traceback" not in res.output
    assert metrics.weighted_auc([0, 1, 1, 0], [0.1, 0.8, 0.7, 0.3], [1e-300] * 4) == 1.0


# --- 7. the weight column's own wording -----------------------------------------------------------------
INF_WEIGHT = (np.inf, r"weight column 'w' has 1 missing or infinite values \(rows 3\); every row needs a finite weight")
TEXT_WEIGHT = ("heavy", r"weight column 'w' is not numeric .* e\.g\. value 'heavy' in row 3$")
HUGE_WEIGHT = (1e300, r"the sample weights are too large \(up to .*\); scale them down")


# (the network path reaches the gradients only with a passive party serving: 1e300 in simulate only)
@pytest.mark.parametrize("value, message, command", [
    (*INF_WEIGHT, "simulate"), (*TEXT_WEIGHT, "simulate"), (*HUGE_WEIGHT, "simulate"),
    (*INF_WEIGHT, "party active"), (*TEXT_WEIGHT, "party active")])
def test_a_bad_weight_is_called_a_weight(tmp_path, value, message, command):
    """Before: an infinite weight was a "feature column" with the hint "use NaN" (NaN weights are
    refused), a text weight got "declare it categorical", 1e300 got "the label is too large"."""
    a, b, _ = small_frames(60)
    a["w"] = 1.0
    if isinstance(value, str):
        a["w"] = a["w"].astype(object)
    a.loc[3, "w"] = value
    a.to_csv(tmp_path / "a.csv", index=False)
    b.to_csv(tmp_path / "b.csv", index=False)
    if command == "simulate":
        args = ["simulate", "--active", tmp_path / "a.csv", "--passive", tmp_path / "b.csv", "--mode", "plain",
                "--rounds", 1, "--quiet"]
    else:
        args = ["party", "active", "--data", tmp_path / "a.csv", "--peer", "b=127.0.0.1:1", "--insecure",
                "--model-dir", tmp_path / "m", "--timeout", 5]
    out = _cli_error([*args, "--weight-col", "w"])
    last = out.strip().splitlines()[-1]
    assert re.search(message, last), last
    assert "feature column" not in out and "use NaN" not in out and "categorical" not in out
    assert "the label is too large" not in out


# --- 8. messages that name the real problem ---------------------------------------------------------------
@pytest.mark.parametrize("size", ["1", "0", "1.5", "nan"])
def test_a_bad_validation_size_is_named(tmp_path, size):
    """Before: --validation-size 1 said "test_size must be a fraction"."""
    a, b, _ = small_frames(60)
    a.to_csv(tmp_path / "a.csv", index=False)
    b.to_csv(tmp_path / "b.csv", index=False)
    res = CliRunner().invoke(main, ["simulate", "--active", str(tmp_path / "a.csv"), "--passive",
                                    str(tmp_path / "b.csv"), "--mode", "plain", "--rounds", "1", "--quiet",
                                    "--validation-size", size, "--early-stopping-rounds", "2"])
    if size == "0":         # 0 is "no validation set": early stopping then needs one
        assert "--early-stopping-rounds needs --validation-size" in res.output
        return
    assert res.exit_code == 1 and "validation_size (--validation-size" in res.output, res.output
    assert "test_size" not in res.output


def test_resume_of_a_dp_model_training_names_dp_model_not_the_dp_mode(tmp_path):
    """Before: --resume --dp-model 1 was refused with the DP-only mode's "noisy release" reason."""
    a, _, _ = small_frames(40)
    a.to_csv(tmp_path / "a.csv", index=False)
    out = _cli_error(["party", "active", "--data", tmp_path / "a.csv", "--peer", "b=127.0.0.1:1", "--insecure",
                      "--model-dir", tmp_path / "m", "--dp-model", 1, "--resume", "--mode", "plain"])
    assert "--resume is not available for a --dp-model training" in out
    assert "noisy release" not in out and "dp mode" not in out
    out = _cli_error(["party", "active", "--data", tmp_path / "a.csv", "--peer", "b=127.0.0.1:1", "--insecure",
                      "--model-dir", tmp_path / "m", "--mode", "dp", "--epsilon", 1, "--resume"])
    assert "--resume is not available in dp mode" in out


@pytest.mark.parametrize("stray", [("key",), ("pem",), ("pem", "key")])
def test_certs_names_the_file_that_is_really_there(tmp_path, stray):
    """Before: a stray NAME.key gave "NAME.pem already exists" though it was absent."""
    pytest.importorskip("cryptography")
    for ext in stray:
        (tmp_path / f"bank.{ext}").write_text("x")
    out = _cli_error(["certs", "--out", tmp_path, "--party", "bank"])
    for ext in ("pem", "key"):
        assert (f"bank.{ext}" in out) == (ext in stray), out
    assert "already exist" in out and "--overwrite" in out


# --- 9. loose ends, made explicit ---------------------------------------------------------------------------
@pytest.mark.parametrize("label", [0, 1])
def test_a_single_class_label_is_refused_naming_the_column(tmp_path, label):
    """Decided: an error (before: it trained without a word; every prediction was the class rate)."""
    a, b, _ = small_frames(60)
    a["y"] = label
    with pytest.raises(InputError, match=rf"label column 'y' of party 'bank' holds a single class \({label}\) "
                                         r"on the 60 training rows: a binary objective needs both 0 and 1"):
        Federation(ActiveParty("bank", a), [PassiveParty("telco", b)]).fit(TrainParams(mode="plain", n_estimators=1))
    a.to_csv(tmp_path / "a.csv", index=False)
    b.to_csv(tmp_path / "b.csv", index=False)
    out = _cli_error(["simulate", "--active", tmp_path / "a.csv", "--passive", tmp_path / "b.csv", "--mode", "plain",
                      "--rounds", 1, "--quiet"])
    assert "holds a single class" in out


def test_a_validation_set_may_hold_a_single_class():
    assert get_objective("binary").encode_labels([1, 1, 1]).tolist() == [1.0, 1.0, 1.0]


@pytest.mark.parametrize("spec", ["local:", "local", "local: "])
def test_a_local_dask_cluster_needs_its_worker_count(spec):
    """Decided: an error (before: "local:" silently meant 2 workers)."""
    pytest.importorskip("distributed")
    from crypto.dask_executor import parse_spec
    with pytest.raises(InputError, match=r"give the number of local workers, local:N"):
        parse_spec(spec)
    assert parse_spec("local:3") == ("local", 3)


def test_simulate_refuses_dask_local_without_a_count(tmp_path):
    pytest.importorskip("distributed")
    a, b, _ = small_frames(40)
    a.to_csv(tmp_path / "a.csv", index=False)
    b.to_csv(tmp_path / "b.csv", index=False)
    out = _cli_error(["simulate", "--active", tmp_path / "a.csv", "--passive", tmp_path / "b.csv", "--mode", "plain",
                      "--rounds", 1, "--quiet", "--dask", "local:"])
    assert "give the number of local workers, local:N" in out


@given(st.integers(MAX_ROUNDS, 2 ** 80))
def test_a_round_index_beyond_the_largest_training_is_refused_on_the_wire(r):
    """Decided: refused when decoded (before: a Gradients message with round_idx 2**70 was
    acknowledged); the bound is the largest n_estimators."""
    for message in (m.Gradients(r, False, {}, 1, BigInts([1])), m.HistogramRequest(r, np.zeros(1, np.int32),
                    np.zeros(1, np.int32), np.zeros((1, 1), np.int32)), m.GradientShard(r, 0, 1, b"\0")):
        with pytest.raises(ProtocolError, match=rf"{type(message).__name__}\.round_idx"):
            loads(dumps(message))
    with pytest.raises(ProtocolError, match=r"TrainResume\.n_rounds"):
        loads(dumps(m.TrainResume("m", r + 1, 0)))


def test_the_round_bound_is_the_largest_n_estimators():
    assert MAX_ROUNDS == PARAMS_MAX_ROUNDS
    TrainParams(n_estimators=MAX_ROUNDS)
    with pytest.raises(InputError, match=r"n_estimators must be <= 1000000"):
        TrainParams(n_estimators=MAX_ROUNDS + 1)


def test_a_passive_server_refuses_gradients_of_round_2_70(tmp_path):
    a, b, _ = small_frames(40)
    sb = PassiveServer("telco", b, "id", tmp_path / "telco")
    t = InMemoryTransport("bank", {"telco": sb.handle_frame})
    with pytest.raises(PeerError, match=r"Gradients\.round_idx"):
        t.call("telco", m.Gradients(2 ** 70, False, {}, 1, BigInts([1])))
