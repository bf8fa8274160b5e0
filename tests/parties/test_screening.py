"""Federated screening (issue 33): WOE/IV from the encrypted histogram equal a naive centralised
computation, monotone merging, what the passive party sends (never a threshold), refusals both ways,
the grant, DP noise charged to the ledger, --min-iv training the same model as the kept columns."""
from __future__ import annotations

import json
import warnings

import numpy as np
import pandas as pd
import pytest
from support import KEY_BITS

from datasets.errors import InputError, PeerError, ProtocolError
from parties.channel import GradientChannel
from parties.federation import Access, FederationError, load_federation
from parties.passive_screen import noise_headroom
from protocols import messages as m
from protocols.serialization import loads
from vfl.api import ActiveParty, Federation, PassiveParty, ScreenParams, TrainParams
from vfl.core.binning import Binner
from vfl.core.rounds import RoundGradients, RoundTiming
from vfl.core.woe import naive_counts, screen_feature


@pytest.fixture(autouse=True)
def _weak_keys():
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*1024-bit")
        yield


def frames(n=700, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 5))
    x[rng.random(n) < 0.1, 1] = np.nan
    y = (rng.random(n) < 1 / (1 + np.exp(-1.5 * x[:, 0] - np.nan_to_num(x[:, 1])))).astype(int)
    ids = np.arange(n)
    perm = rng.permutation(n)           # the passive party's rows in another order, and a few rows only it has
    bank = pd.DataFrame({"id": ids[:-20], "y": y[:-20], "a0": x[:-20, 4], "a1": np.round(x[:-20, 3], 1)})
    telco = pd.DataFrame({"id": ids[perm], "t0": x[perm, 0], "t1": x[perm, 1], "t2": x[perm, 2],
                          "t3": np.where(x[perm, 2] > 0, 1.0, 0.0)})
    return bank, telco


def federation(bank, telco, grant=True, record=False, **passive):
    t = PassiveParty("telco", telco, **passive)
    t.screen_allowed = grant
    return Federation(ActiveParty("bank", bank), [t], record=record)


def naive(bank, telco, max_bin=32):
    """The centralised computation: the joined table, each column binned by the training binner."""
    joined = bank.merge(telco, on="id")
    out = {}
    for party, cols in (("bank", ["a0", "a1"]), ("telco", ["t0", "t1", "t2", "t3"])):
        X = joined[cols].to_numpy(dtype=float)
        b = Binner(max_bin).fit(X)
        B = b.transform(X)
        for j, c in enumerate(cols):
            r, e = naive_counts(B[:, j], joined["y"].to_numpy(), int(b.n_bins[j]))
            out[(party, c)] = screen_feature(party, j, c, r, e)[0]
    return out


@pytest.mark.parametrize("mode, scheme", [("he", "paillier"), ("he", "ou"), ("plain", "paillier")])
def test_iv_and_woe_equal_the_centralised_computation(mode, scheme):
    bank, telco = frames()
    res = federation(bank, telco).screen(mode=mode, scheme=scheme, key_bits=KEY_BITS)
    ref = naive(bank, telco)
    assert res.n_rows == 680 and len(res.features) == 6
    for f in res.features:
        r = ref[(f.party, f.feature)]
        np.testing.assert_array_equal(f.rows, r.rows)
        np.testing.assert_array_equal(f.events, r.events)
        np.testing.assert_allclose(f.woe, r.woe, atol=1e-9, rtol=0, equal_nan=True)
        assert abs(f.iv - r.iv) < 1e-9
        assert f.missing_share == pytest.approx(r.missing_share, abs=1e-12)
    t1 = next(f for f in res.features if f.feature == "t1")
    assert t1.missing_share > 0.05 and t1.iv > 0.1
    assert res.iv()["telco"]["t0"] > res.iv()["telco"]["t2"]


def test_monotone_and_min_share_merges_reach_the_passive_party_as_bin_indices_only():
    bank, telco = frames()
    fed = federation(bank, telco, record=True)
    res = fed.screen(mode="he", key_bits=KEY_BITS, monotone=True, min_share=0.05, max_bin=16)
    for f in res.features:
        if f.feature == "a1":           # a rounded column: few bins, possibly fewer after pooling
            continue
        w = f.woe[:-1]
        d = np.diff(w)
        assert (d >= -1e-9).all() or (d <= -0.0).all() or (d <= 1e-9).all(), (f.feature, w)
        assert all(r >= 0.05 * f.n_rows for r in f.rows[:-1]) or len(f.rows) == 2
    # what the passive party sent: its slots per feature (integers), the encrypted sums, acks; no value of its
    thresholds = set()
    t = fed.passives["telco"]
    b = t._state.last_screening.binner
    for thr in b.thresholds_:
        thresholds |= {float(v) for v in thr}
    sent = [loads(frame) for sender, _, frame in fed.transport.log if sender == "telco"]
    assert {type(x).__name__ for x in sent} <= {"IdHashes", "AlignAck", "ScreenBins", "Ack", "ScreenResponse"}
    for msg in sent:
        for value in vars(msg).values():
            arr = np.asarray(value.values if hasattr(value, "values") and not isinstance(value, dict) else value,
                             dtype=object).ravel()
            for v in arr.tolist():
                if isinstance(v, float):
                    assert v not in thresholds
        if isinstance(msg, m.ScreenBins):
            assert msg.n_bins.dtype.kind in "iu"
    merge = [loads(frame) for sender, _, frame in fed.transport.log if sender == "bank"
             and isinstance(loads(frame), m.ScreenMerge)]
    assert len(merge) == 1 and merge[0].group_of_bin.dtype.kind in "iu"
    # the passive party's own view: the groups in its own edges (never sent)
    ranges = t.screen_bins()["t0"]
    t0 = next(f for f in res.features if f.feature == "t0")
    assert len(ranges) == len(t0.groups) and ranges[-1] == "missing" and ranges[0].startswith("(-inf")


def test_a_screening_session_answers_no_training_histogram_and_a_training_session_no_screening():
    bank, telco = frames(200)
    t = PassiveParty("telco", telco)
    t.screen_allowed = True
    fed = Federation(ActiveParty("bank", bank), [t])
    tr = fed.transport
    fed.active.align(tr, ["telco"], b"s" * 16, "sess1")
    tr.call("telco", m.ScreenSetup("scr1", "plain", 8))
    with pytest.raises(PeerError, match="refuses HistogramRequest: rule 'screening session'"):
        tr.call("telco", m.HistogramRequest(0, np.zeros(1, np.int32), np.zeros(1, np.int32),
                                            np.zeros((1, 180), np.int32)))
    assert t.training_refused is not None
    # the reverse: a training session (TrainSetup) answers no ScreenRequest
    fed.active.align(tr, ["telco"], b"s" * 16, "sess2")
    tr.call("telco", m.TrainSetup("plain", 8, "model1"))
    with pytest.raises(PeerError, match="rule 'training session': a training session answers no screening"):
        tr.call("telco", m.ScreenRequest("model1"))
    with pytest.raises(PeerError, match="refuses"):
        tr.call("telco", m.HistogramRequest(0, np.zeros(1, np.int32), np.zeros(1, np.int32),
                                            np.zeros((1, 180), np.int32)))
    # a second screening histogram in one session is refused too
    res = fed.screen(mode="plain")
    assert res.n_rows == 180


def test_screening_needs_the_passive_partys_grant():
    bank, telco = frames(200)
    with pytest.raises(PeerError, match="rule 'who may screen'"):
        federation(bank, telco, grant=False).screen(mode="plain")


def test_bad_inputs_get_clear_messages():
    bank, telco = frames(200)
    multi = bank.assign(y=np.arange(len(bank)) % 3)
    with pytest.raises(InputError, match="multiclass target .* defined for binary targets only"):
        federation(multi, telco).screen(mode="plain")
    reg = bank.assign(y=np.linspace(0, 1, len(bank)))
    with pytest.raises(InputError, match="non-binary target"):
        federation(reg, telco).screen(mode="plain")
    res = federation(bank, telco.assign(t2=1.0)).screen(mode="plain")
    t2 = next(f for f in res.features if f.feature == "t2")
    assert t2.iv == 0.0 and any("constant feature" in n for n in t2.notes)
    other = telco.assign(id=telco["id"] + 10_000)
    with pytest.raises((InputError, PeerError), match="no sample id in common: nothing to screen"):
        federation(bank, other).screen(mode="plain")


@pytest.mark.slow      # several 1024-bit Paillier rounds: seconds
def test_dp_noise_on_the_counts_is_charged_to_the_ledger(tmp_path):
    bank, telco = frames()
    ledger = tmp_path / "telco.json"
    fed = federation(bank, telco, record=True)
    t = fed.passives["telco"]
    t.screen_epsilon, t.dp_ledger_path = 1.0, str(ledger)
    res = fed.screen(mode="he", key_bits=KEY_BITS)
    assert res.parties["telco"]["epsilon"] == 1.0
    doc = json.loads(ledger.read_text())
    entries = next(iter(doc["datasets"].values()))
    assert [(e["kind"], e["epsilon"]) for e in entries] == [("screen", 1.0)]
    ref = naive(bank, telco)
    noisy = [f for f in res.features if f.party == "telco"]
    assert any(not np.array_equal(f.rows, ref[("telco", f.feature)].rows) for f in noisy)
    # the noise covers the largest weights the active party's layout admits per row, whatever it sent
    K = noise_headroom(680, 4, 1.0)
    assert K >= 2 and t.dp_releases[-1]["noise_scale"] == 4 * (K + K) / 1.0
    assert sum(len(f.rows) for f in noisy) >= 4 and all((f.rows >= 0).all() for f in noisy)
    with pytest.raises(InputError, match="swamps 30 rows"):
        noise_headroom(30, 400, 0.1)
    # large epsilon: nearly the exact IV
    t.screen_epsilon = 1e6
    res = fed.screen(mode="plain")
    for f in res.features:
        assert abs(f.iv - ref[(f.party, f.feature)].iv) < 1e-3
    assert noise_headroom(680, 4, float("inf")) == 1


def test_dp_only_mode_charges_epsilon_per_feature_and_estimates_the_counts(tmp_path):
    bank, telco = frames(3000)
    fed = federation(bank, telco)
    t = fed.passives["telco"]
    t.dp_ledger_path = str(tmp_path / "l.json")
    res = fed.screen(mode="dp", dp_epsilon_per_feature=8.0, max_bin=4)
    entries = next(iter(json.loads((tmp_path / "l.json").read_text())["datasets"].values()))
    assert [(e["kind"], e["epsilon"]) for e in entries] == [("screen-dp", 32.0)]
    ref = naive(bank, telco, max_bin=4)
    t0 = next(f for f in res.features if f.feature == "t0")
    assert abs(t0.iv - ref[("telco", "t0")].iv) < 0.25 * ref[("telco", "t0")].iv
    with pytest.raises(InputError, match="dp_epsilon_per_feature"):
        ScreenParams(mode="dp")


@pytest.mark.slow      # several 1024-bit Paillier rounds: seconds
def test_min_iv_trains_the_same_model_as_the_kept_columns_only():
    bank, telco = frames(500)
    prm = dict(mode="he", key_bits=KEY_BITS, n_estimators=3, max_depth=3)
    fed = federation(bank, telco)
    res = fed.screen(mode="plain")
    cut = 0.3
    kept = res.kept(cut)
    assert 0 < len(kept["telco"]) and len(kept["telco"]) + len(kept["bank"]) < 6, res.table()
    fed.fit(TrainParams(min_iv=cut, **prm))
    p1 = fed.predict_proba()
    tel_cols = [telco.columns[1 + j] for j in kept["telco"]]
    bank_cols = [bank.columns[2 + j] for j in kept["bank"]]
    assert fed.passives["telco"].feature_names == tel_cols and fed.model.active_features == bank_cols
    ref = federation(bank[["id", "y", *bank_cols]], telco[["id", *tel_cols]])
    ref.fit(TrainParams(**prm))
    np.testing.assert_array_equal(p1, ref.predict_proba())
    res2 = fed.screen(mode="plain")         # a screening beside the trained model: every feature, model intact
    assert len(res2.features) == 6 and [f.feature for f in res2.features][2:] == ["t0", "t1", "t2", "t3"]
    np.testing.assert_array_equal(fed.predict_proba(), p1)
    np.testing.assert_array_equal(fed.predict_proba({"bank": bank.drop(columns="y"), "telco": telco}),
                                  ref.predict_proba({"bank": bank.drop(columns="y")[["id", *bank_cols]],
                                                     "telco": telco[["id", *tel_cols]]}))
    fed.fit(TrainParams(**prm))             # the next training: every feature again
    assert fed.passives["telco"].feature_names == ["t0", "t1", "t2", "t3"]
    assert fed.model.active_features == ["a0", "a1"]
    with pytest.raises(InputError, match="min_iv"):
        TrainParams(min_iv=0.1, mode="dp")


@pytest.mark.slow      # several 1024-bit Paillier rounds: seconds
def test_the_events_stream_under_a_small_frame_cap():
    """Like training, the encrypted events travel as GradientShard messages under the frame cap."""
    bank, telco = frames(600)
    fed = federation(bank, telco, record=True)
    fed.transport.max_frame_bytes = 40_000
    fed.screen(mode="he", key_bits=KEY_BITS)
    frames_to = [frame for s, r, frame in fed.transport.log if s == "bank" and r == "telco"]
    shards = [f for f in frames_to if isinstance(loads(f), m.GradientShard)]
    assert len(shards) > 1 and max(len(f) for f in frames_to) < 40_000


FED = """
[federation]
active = "bank"

[parties.bank]

[parties.telco]
address = "10.0.0.7:50051"
train = ["bank", "shop"]
screen = ["bank"]
screen_epsilon = 2.5

[parties.shop]
address = "10.0.0.8:50051"
"""


def test_the_federation_file_grants_screening_per_party(tmp_path):
    path = tmp_path / "f.toml"
    path.write_text(FED)
    fed = load_federation(path)
    assert fed.party("telco").screen == ("bank",) and fed.party("telco").screen_epsilon == 2.5
    assert fed.party("shop").screen == () and fed.party("shop").screen_epsilon is None
    telco = Access("telco", True, fed)
    assert telco.check_screen("certificate bank") == "bank"
    with pytest.raises(ProtocolError, match="rule 'who may screen'.*only \\['bank'\\]"):
        telco.check_screen("certificate shop")              # may train, may not screen
    with pytest.raises(ProtocolError, match="rule 'who may screen'"):
        Access("shop", True, fed).check_screen("certificate bank")      # default: nobody
    with pytest.raises(ProtocolError, match="rule 'who may screen'"):
        Access("shop", False, fed).check_screen("bank")
    assert Access("telco", False, fed).check_screen("bank") == "bank"
    for bad, where in (('screen_epsilon = -1', "screen_epsilon"), ('screen_epsilon = "x"', "screen_epsilon"),
                       ('screen = ["nobody"]', "screen")):
        path.write_text(FED.replace("screen_epsilon = 2.5", bad).replace('screen = ["bank"]\n', "")
                        if "screen =" in bad else FED.replace("screen_epsilon = 2.5", bad))
        with pytest.raises(FederationError, match=f"\\[parties.telco\\] {where}"):
            load_federation(path)


def test_a_parquet_table_read_piece_by_piece_screens_and_trains_on_its_kept_columns(tmp_path):
    pytest.importorskip("pyarrow")
    bank, telco = frames(400)
    telco.to_parquet(tmp_path / "t.parquet")
    t = PassiveParty.from_file("telco", tmp_path / "t.parquet")
    t.screen_allowed = True
    fed = Federation(ActiveParty("bank", bank), [t])
    res = fed.screen(mode="plain")
    ref = naive(bank, telco)
    for f in res.features:
        assert abs(f.iv - ref[(f.party, f.feature)].iv) < 1e-9
    kept = res.kept(0.5)["telco"]
    fed.fit(TrainParams(mode="plain", n_estimators=2, min_iv=0.5))
    assert t.feature_names == [telco.columns[1 + j] for j in kept] and type(t._state.X).__name__ == "PieceTable"


def test_events_weighted_beyond_counts_are_refused():
    """An active party that packs rows with weights beyond 0/1 (a layout admitting them) would read more than
    counts: the passive party refuses the histogram and the session ends."""
    bank, telco = frames(200)
    t = PassiveParty("telco", telco)
    t.screen_allowed = True
    fed = Federation(ActiveParty("bank", bank), [t])
    tr = fed.transport
    fed.active.align(tr, ["telco"], b"s" * 16, "sess1")
    tr.call("telco", m.ScreenSetup("scr1", "plain", 8))
    ch = GradientChannel("plain", KEY_BITS, "fast", n_samples=180)
    ch.plan(40, 1, False, None, passives=["telco"])
    w = (1 << np.arange(180) % 40).astype(np.int64).reshape(-1, 1)        # row i weighs 2^(i mod 40)
    ch.round_started(RoundGradients(0, w, np.ones((180, 1), np.int64), float(w.max()), 1.0, 0, None, RoundTiming()))
    for msg in ch.messages(0):
        tr.call("telco", msg)
    with pytest.raises(PeerError, match="rule 'event weights'"):
        tr.call("telco", m.ScreenRequest("scr1"))
    assert t.training_refused is not None
    ch.close()
