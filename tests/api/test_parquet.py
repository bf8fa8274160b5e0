"""Parquet input end to end and batched prediction: a federation trained from Parquet directories is
the one trained from CSV files (he and plain), `vfl simulate` takes Parquet, and prediction in batches
(API, `vfl party` servers + `predict_active`, CLI `vfl predict --batch-rows`) gives the output of
scoring all rows at once."""
from __future__ import annotations

import threading

import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner
from support import KEY_BITS, small_frames

pytest.importorskip("pyarrow")

from cli import main  # noqa: E402
from datasets.catalogue import load_active_passive  # noqa: E402
from datasets.errors import InputError  # noqa: E402
from protocols import alignment  # noqa: E402
from vfl.api import Federation, TrainParams, federation_from_frames  # noqa: E402

SALT = bytes(range(16))


@pytest.fixture
def fixed_salt(monkeypatch):
    """One alignment salt for both trainings, so both see the rows in the same order."""
    monkeypatch.setattr(alignment, "new_salt", lambda: SALT)


def write_tables(tmp_path, n=120):
    """The three parties' tables as CSV files and as Parquet directories of 3 files each."""
    a, b, c = small_frames(n)
    out = {}
    for name, df in (("active", a), ("passive1", b), ("passive2", c)):
        df.to_csv(tmp_path / f"{name}.csv", index=False)
        d = tmp_path / f"{name}_pq"
        d.mkdir()
        for i, part in enumerate(np.array_split(np.arange(len(df)), 3)):
            df.iloc[part].to_parquet(d / f"part-{i}.parquet", index=False)
        out[name] = (tmp_path / f"{name}.csv", d)
    return out


def records(fed):
    return {name: [(r["feature"], r["threshold"], r["default_left"]) for r in p.records]
            for name, p in fed.passives.items()}


def structures(model):
    return [t.structure() for r in model.rounds for t in r]


@pytest.mark.parametrize("mode", ["plain", "he"])
def test_parquet_directories_train_the_csv_model(tmp_path, fixed_salt, mode):
    tables = write_tables(tmp_path)
    params = TrainParams(mode=mode, n_estimators=2, max_depth=3, key_bits=KEY_BITS, seed=1)
    feds, probas = [], []
    for kind in (0, 1):
        parties = load_active_passive(tables["active"][kind], [tables["passive1"][kind], tables["passive2"][kind]])
        fed = federation_from_frames(parties)
        fed.fit(params)
        feds.append(fed)
        probas.append(fed.predict_proba({"active": tables["active"][kind], "passive1": tables["passive1"][kind],
                                         "passive2": tables["passive2"][kind]}))
    assert structures(feds[0].model) == structures(feds[1].model)
    assert records(feds[0]) == records(feds[1])
    assert np.array_equal(probas[0], probas[1])
    assert len(probas[0]) == 120 and len(set(probas[0].tolist())) > 2


def test_from_files_and_batched_api_prediction(tmp_path, fixed_salt):
    tables = write_tables(tmp_path, n=90)
    fed = Federation.from_files(("active", tables["active"][1]),
                                {"passive1": tables["passive1"][1], "passive2": tables["passive2"][0]})
    fed.fit(mode="plain", n_estimators=3, max_depth=3)
    a, b, c = small_frames(90)
    frames = {"active": a.drop(columns="y"), "passive1": b, "passive2": c}
    whole = fed.predict_proba(frames)
    for batch_rows in (1, 7, 89, 1000):
        got = fed.predict_proba(frames, batch_rows=batch_rows)
        assert np.array_equal(got, whole)
    assert np.array_equal(fed.predict_raw(frames, prediction="node", align="psi", batch_rows=13),
                          fed.predict_raw(frames))
    assert np.array_equal(fed.predict(frames, batch_rows=4), fed.predict(frames))
    # a file of the active party's rows is read and scored in batches
    paths = {"active": tables["active"][1], "passive1": tables["passive1"][0], "passive2": tables["passive2"][1]}
    assert np.array_equal(fed.predict_proba(paths, batch_rows=11), whole)
    dup = a.drop(columns="y")
    dup.loc[50, "id"] = dup.loc[3, "id"]
    with pytest.raises(InputError, match="duplicated ids: 3"):
        fed.predict_proba({**frames, "active": dup}, batch_rows=10)     # across batches
    with pytest.raises(InputError, match="batch_rows"):
        fed.predict_proba(frames, batch_rows=0)


def test_simulate_reads_parquet_directories(tmp_path):
    tables = write_tables(tmp_path)
    outs = []
    for kind in (0, 1):
        out = tmp_path / f"pred{kind}.csv"
        r = CliRunner().invoke(main, ["simulate", "--active", str(tables["active"][kind]), "--passive",
                                      str(tables["passive1"][kind]), "--passive", str(tables["passive2"][kind]),
                                      "--mode", "plain", "--rounds", "2", "--quiet", "--predictions", str(out)])
        assert r.exit_code == 0, r.output
        outs.append(pd.read_csv(out))
    assert outs[0]["id"].tolist() == outs[1]["id"].tolist() and len(outs[0]) == 24
    r = CliRunner().invoke(main, ["simulate", "--active", str(tables["active"][1]), "--passive",
                                  str(tmp_path / "nope_pq"), "--mode", "plain"])
    assert r.exit_code != 0 and "nope_pq" in r.output and "does not exist" in r.output


# --------------------------------------------------------------------------- network: servers in threads

def _serve(name, data, model_dir):
    from parties.network import serve_passive
    from protocols.grpc_security import Security

    ready, stop, port = threading.Event(), threading.Event(), []

    def on_ready(p):
        port.append(p)
        ready.set()

    t = threading.Thread(target=serve_passive, args=(name, "127.0.0.1:0", data, "id", model_dir, Security()),
                         kwargs=dict(on_ready=on_ready, stop_event=stop), daemon=True)
    t.start()
    assert ready.wait(30)
    return f"127.0.0.1:{port[0]}", stop, t


@pytest.mark.slow
def test_network_parquet_training_and_batched_predict(tmp_path):
    from parties.network import predict_active, train_active
    from protocols.grpc_security import Security

    tables = write_tables(tmp_path, n=150)
    servers = {name: _serve(name, tables[name][1], tmp_path / f"m_{name}") for name in ("passive1", "passive2")}
    try:
        peers = {name: s[0] for name, s in servers.items()}
        params = TrainParams(mode="he", n_estimators=2, max_depth=3, key_bits=KEY_BITS)
        summary = train_active(tables["active"][1], "id", "y", "active", peers, params, tmp_path / "ma", Security())
        assert summary["n_train"] == 150
        a, _, _ = small_frames(150)
        a.drop(columns="y").iloc[::-1].to_csv(tmp_path / "new.csv", index=False)
        d = tmp_path / "new_pq"
        d.mkdir()
        a.drop(columns="y").iloc[:70].to_parquet(d / "a.parquet", index=False)
        a.drop(columns="y").iloc[70:].to_parquet(d / "b.parquet", index=False)
        ref_ids, ref, s0 = predict_active(tmp_path / "ma", tmp_path / "new.csv", "id", peers, Security(),
                                          out=tmp_path / "whole.csv", batch_rows=10**6, collect=True)
        assert s0["n_batches"] == 1 and ref_ids.tolist() == a["id"].iloc[::-1].tolist()
        whole = (tmp_path / "whole.csv").read_bytes()
        # batches never span two Parquet files: 70 + 80 rows in batches of 16 are 5 + 5 batches
        for data, batch_rows, n_batches, extra in (
                (tmp_path / "new.csv", 7, 22, {}), (d, 16, 10, {}),
                (tmp_path / "new.csv", 40, 4, {"prediction": "node", "align": "psi"})):
            ids, proba, s = predict_active(tmp_path / "ma", data, "id", peers, Security(),
                                           out=tmp_path / "b.csv", batch_rows=batch_rows, **extra)
            assert ids is None and proba is None        # not kept: the output file has them
            assert s["n_rows"] == 150 and s["n_batches"] == n_batches
            got = pd.read_csv(tmp_path / "b.csv").set_index("id").loc[ref_ids]
            assert np.array_equal(got["proba"].to_numpy(), ref)
            if data == tmp_path / "new.csv":
                assert (tmp_path / "b.csv").read_bytes() == whole     # the same file, byte for byte
        r = CliRunner().invoke(main, ["predict", "--model-dir", str(tmp_path / "ma"), "--data", str(d), "--insecure",
                                      "--peer", f"passive1={peers['passive1']}",
                                      "--peer", f"passive2={peers['passive2']}",
                                      "--out", str(tmp_path / "cli.csv"), "--batch-rows", "33"])
        assert r.exit_code == 0, r.output
        assert "predicted 150 rows" in r.output and "(6 batch(es))" in r.output     # 33+33+4, 33+33+14
        got = pd.read_csv(tmp_path / "cli.csv").set_index("id").loc[ref_ids]
        assert np.array_equal(got["proba"].to_numpy(), ref)
        # a bad batch stops the prediction and leaves no output file behind
        bad = a.drop(columns="y").astype({"a0": object})
        bad.loc[120, "a0"] = "oops"
        bad.to_csv(tmp_path / "bad.csv", index=False)
        with pytest.raises(InputError, match="'oops' in row 0 .*from row 120"):
            predict_active(tmp_path / "ma", tmp_path / "bad.csv", "id", peers, Security(),
                           out=tmp_path / "bad_out.csv", batch_rows=60)
        assert not (tmp_path / "bad_out.csv").exists()
        assert not [f for f in tmp_path.iterdir() if f.name.startswith(".bad_out.csv")]
    finally:
        for _, stop, t in servers.values():
            stop.set()
        for _, _, t in servers.values():
            t.join(10)
