"""Public bounds / bin edges per party for a DP released model: `vfl simulate --dp-bins`, the API
(TrainParams.dp_bins, PassiveParty(dp_bins=...)), `vfl party active/passive --dp-bins`."""
import json
import re

import numpy as np
import pytest
from click.testing import CliRunner
from support import small_frames

import cli
from cli import main
from datasets.errors import InputError
from datasets.frames import PartyFrame
from parties.server import PassiveServer
from protocols import messages as m
from protocols.serialization import dumps, loads
from vfl.api import federation_from_frames, simulate
from vfl.core.params import TrainParams

EDGES_A0 = [-1.0, -0.25, 0.5, 1.5]
EDGES_B0 = [-0.5, 0.0, 0.5]


def _frames(n=400):
    a, b, c = small_frames(n)
    return [PartyFrame("a", a, "id", "y"), PartyFrame("b", b, "id"), PartyFrame("c", c, "id")]


def _used_thresholds(fed, party, feature):
    if party == "a":
        return {n.threshold for r in fed.model.rounds for t in r for n in t.nodes
                if not n.is_leaf and n.owner == "a" and n.feature == feature}
    return {r["threshold"] for r in fed.passives[party].records if r["feature"] == feature}


def test_simulate_uses_each_partys_public_edges_exactly_and_reports_the_budget_per_party():
    """Party a: public edges for a0, bounds for a1 (all public: spends nothing); party b: edges for b0
    only (b1 takes b's whole share); party c: DP edges. The trees' thresholds on a0/b0 are given edges
    (or +inf, "all non-missing left"); the record says who spent what; epsilon drops by a's share."""
    params = TrainParams(mode="plain", n_estimators=8, max_depth=2, dp_model=20.0,
                         dp_bins={"a0": {"edges": EDGES_A0}, "a1": {"lo": -3, "hi": 3}, "b:b0": {"edges": EDGES_B0}})
    fed, res, _, _ = simulate(_frames(), params)
    used_a0, used_b0 = _used_thresholds(fed, "a", "a0"), _used_thresholds(fed, "b", "b0")
    assert used_a0 and used_a0 <= set(EDGES_A0) | {float("inf")}
    assert used_b0 and used_b0 <= set(EDGES_B0) | {float("inf")}
    assert np.array_equal(fed.passives["b"]._state.train.binner.thresholds_[0], EDGES_B0)
    d = res["dp_model"]
    share = d["sketch"]["epsilon_per_party"]
    assert share == pytest.approx(0.9 * 0.1 * 20.0 / 3)
    assert d["sketch"]["per_party"] == {"a": {"epsilon": 0.0, "dp_features": 0, "public_features": 2},
                                        "b": {"epsilon": pytest.approx(share), "dp_features": 1, "public_features": 1},
                                        "c": {"epsilon": pytest.approx(share), "dp_features": 2, "public_features": 0}}
    assert d["epsilon"] == pytest.approx(20.0 - share) and d["epsilon_target"] == 20.0
    assert fed.model.dp_model == d
    # the passive party b told the active party only its counts (BinningInfo.dp_binning), no edges
    infos = [loads(f) for (_, to, f) in fed.transport.log if to == "a"] if fed.transport.log else []
    assert not any(isinstance(x, m.BinningInfo) and "edges" in json.dumps(x.dp_binning or {}) for x in infos)


def test_passive_party_public_bins_through_the_federation_api():
    fed = federation_from_frames(_frames(), dp_bins={"c1": {"edges": [0.0]}, "b:b1": {"lo": -2, "hi": 2}})
    assert fed.passives["c"]._state.dp_bins == {"c1": {"edges": [0.0]}}
    fed.fit(TrainParams(mode="plain", n_estimators=2, max_depth=2, dp_model=2.0))
    assert np.array_equal(fed.passives["c"]._state.train.binner.thresholds_[1], [0.0])
    assert fed.model.dp_model["sketch"]["per_party"]["c"]["public_features"] == 1
    # a non-DP training ignores them: exact quantile bins (documented)
    fed.fit(TrainParams(mode="plain", n_estimators=1, max_depth=2))
    assert len(fed.passives["c"]._state.train.binner.thresholds_[1]) > 1


def test_binning_info_round_trips_the_spent_budget():
    info = m.BinningInfo(np.array([4, 5]), dp_binning={"epsilon": 0.1, "dp_features": 1, "public_features": 1})
    assert loads(dumps(info)).dp_binning == {"epsilon": 0.1, "dp_features": 1, "public_features": 1}
    assert loads(dumps(m.BinningInfo(np.array([4])))).dp_binning is None


@pytest.mark.parametrize("bins, match", [
    ({"zz": {"lo": 0, "hi": 1}}, "dp_bins on 'zz' is not a feature column of any party"),
    ({"d:b0": {"lo": 0, "hi": 1}}, "dp_bins on 'd:b0' is not a feature column of any party"),
    ({"a0": {"lo": 2, "hi": 1}}, "column 'a0': \"lo\" must be below \"hi\""),
    ({"a0": {"edges": list(range(40))}}, "40 edges make 41 bins, more than max_bin = 32"),
])
def test_bad_public_bins_in_simulate(bins, match):
    with pytest.raises(InputError, match=match):
        simulate(_frames(200), TrainParams(mode="plain", n_estimators=1, max_depth=2, dp_model=1.0, dp_bins=bins))


def test_active_party_refuses_public_bins_of_columns_it_does_not_hold():
    fed = federation_from_frames(_frames(200))
    with pytest.raises(InputError, match=r"column 'b0' is not a feature column of party 'a' \(each passive party "
                                         r"gives its own"):
        fed.fit(TrainParams(mode="plain", n_estimators=1, max_depth=2, dp_model=1.0, dp_bins={"b0": {"edges": [0]}}))
    with pytest.raises(InputError, match="dp_bins on the active party's features"):
        federation_from_frames(_frames(200), dp_bins={"a0": {"edges": [0]}})


# --------------------------------------------------------------------------- the CLI
def _write_parties(tmp_path, n=300):
    a, b, c = small_frames(n)
    paths = []
    for name, df in (("a", a), ("b", b), ("c", c)):
        p = tmp_path / f"{name}.csv"
        df.to_csv(p, index=False)
        paths.append(p)
    return paths


def test_simulate_cli_dp_bins_file(tmp_path):
    pa, pb, pc = _write_parties(tmp_path)
    bins = tmp_path / "bins.json"
    bins.write_text(json.dumps({"a0": {"edges": EDGES_A0}, "a1": {"lo": -3, "hi": 3},
                                "b0": {"edges": EDGES_B0}, "b1": {"lo": -3, "hi": 3}}))
    out = tmp_path / "r.json"
    res = CliRunner().invoke(main, ["simulate", "--active", str(pa), "--passive", str(pb), "--passive", str(pc),
                                    "--mode", "plain", "--rounds", "3", "--depth", "2", "--dp-model", "1",
                                    "--dp-bins", str(bins), "--quiet", "--output-json", str(out)],
                             catch_exceptions=False)
    assert res.exit_code == 0, res.output
    d = json.loads(out.read_text())["dp_model"]
    per = d["sketch"]["per_party"]
    assert per["active"]["epsilon"] == 0.0 and per["passive1"]["epsilon"] == 0.0 and per["passive2"]["epsilon"] > 0
    assert d["epsilon"] == pytest.approx(1.0 - 2 * d["sketch"]["epsilon_per_party"])


@pytest.mark.parametrize("content, match", [
    (None, r"--dp-bins file '.*bins.json': no such file"),
    ('{"a0": [1, 2]}', r"--dp-bins file '.*bins.json', column 'a0': expected"),
    ('{"a0": {"edges": [1, 0]}}', r"column 'a0': \"edges\" must be strictly increasing"),
    ("{\n oops", r"not valid JSON at line 2, column 2"),
    ('{"zz": {"edges": [0]}}', "dp_bins on 'zz' is not a feature column of any party"),
])
def test_simulate_cli_bad_dp_bins_file(tmp_path, content, match):
    bins = tmp_path / "bins.json"
    if content is not None:
        bins.write_text(content)
    pa, pb, pc = _write_parties(tmp_path, 60)
    res = CliRunner().invoke(main, ["simulate", "--active", str(pa), "--passive", str(pb), "--mode", "plain",
                                    "--rounds", "1", "--dp-model", "1", "--dp-bins", str(bins), "--quiet"])
    assert res.exit_code != 0 and "Traceback" not in res.output
    assert res.exception is None or isinstance(res.exception, SystemExit), res.exception
    assert re.search(match, res.output), res.output


def test_dp_bins_without_dp_model_is_refused(tmp_path):
    bins = tmp_path / "bins.json"
    bins.write_text('{"x0": {"lo": 0, "hi": 1}}')
    res = CliRunner().invoke(main, ["simulate", "--mode", "plain", "--rounds", "1", "--dp-bins", str(bins), "--quiet"])
    assert res.exit_code != 0 and "dp_bins applies with dp_model only" in res.output


def test_party_passive_reads_its_dp_bins_file(tmp_path, monkeypatch):
    """`vfl party passive --dp-bins FILE`: the checked spec reaches the server; a bad file stops the
    party before it listens, with a clear error."""
    _, pb, _ = _write_parties(tmp_path, 60)
    seen = {}
    monkeypatch.setattr(cli, "serve_passive", lambda *a, **kw: seen.update(kw))
    good = tmp_path / "good.json"
    good.write_text('{"b0": {"edges": [0, 1]}}')
    base = ["party", "passive", "--name", "b", "--listen", "127.0.0.1:0", "--data", str(pb),
            "--model-dir", str(tmp_path / "m"), "--insecure"]
    res = CliRunner().invoke(main, base + ["--dp-bins", str(good)])
    assert res.exit_code == 0, res.output
    assert seen["dp_bins"] == {"b0": {"edges": [0.0, 1.0]}}
    bad = tmp_path / "bad.json"
    bad.write_text('{"b0": {"lo": 1, "hi": 0}}')
    res = CliRunner().invoke(main, base + ["--dp-bins", str(bad)])
    assert res.exit_code != 0 and "Traceback" not in res.output
    assert re.search(r"--dp-bins file '.*bad.json', column 'b0': \"lo\" must be below", res.output), res.output


def test_passive_server_refuses_public_bins_of_a_column_it_does_not_hold(tmp_path):
    _, b, _ = small_frames(50)
    with pytest.raises(InputError, match="column 'zz' is not a feature column of party 'b'"):
        PassiveServer("b", b, "id", tmp_path, dp_bins={"zz": {"edges": [0]}})
