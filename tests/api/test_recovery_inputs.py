"""Issue 27: bounded duration options (#3), tiny weights (#5), the weight column's own wording (#7),
messages that name the real problem (#8), and the loose ends made explicit (#9)."""
from __future__ import annotations

import math

import pytest
from click.testing import CliRunner
from hypothesis import given
from hypothesis import strategies as st
from support import small_frames

from cli import main
from protocols.units import MAX_SECONDS, check_seconds
from vfl.core.errors import InputError


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
    from protocols.grpc_transport import GrpcTransport, PartyServer, Security
    for bad in (math.inf, math.nan, 1e12):
        with pytest.raises(InputError, match="--timeout must be more than 0"):
            GrpcTransport("a", {"b": "127.0.0.1:1"}, Security(), timeout=bad)
        with pytest.raises(InputError, match="the read timeout must be more than 0"):
            PartyServer("b", lambda f, w: f, "127.0.0.1:0", Security(), read_timeout=bad)
    with GrpcTransport("a", {"b": "127.0.0.1:1"}, Security(), timeout=5) as t:
        with pytest.raises(InputError, match="--connect-timeout must be more than 0"):
            t.connect(timeout=math.inf)
