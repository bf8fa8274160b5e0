"""`--dp-model`: `vfl simulate`, the Python API, `vfl compare --dp-model`, and what each party receives."""
import json
import math
import re

import pytest
from click.testing import CliRunner
from support import KEY_BITS, small_frames

from cli import main
from datasets.errors import ProtocolError
from datasets.frames import PartyFrame
from parties.passive_train import _binner
from protocols import messages as m
from protocols.serialization import dumps, loads
from vfl.api import federation_from_frames
from vfl.compare import CompareConfig, run_comparison
from vfl.core.dp_bins import DPBinner
from vfl.core.model import BoostedModel
from vfl.core.params import TrainParams


def _run(args):
    return CliRunner().invoke(main, args, catch_exceptions=False)


def _cli_error(args):
    res = CliRunner().invoke(main, args)
    assert res.exit_code != 0
    assert res.exception is None or isinstance(res.exception, SystemExit), res.exception
    assert "Traceback" not in res.output
    return res.output


def test_simulate_dp_model_reports_and_records_the_budget(tmp_path):
    out, models = tmp_path / "r.json", tmp_path / "models"
    res = _run(["simulate", "--mode", "plain", "--rounds", "3", "--depth", "2", "--dp-model", "1", "--quiet",
                "--output-json", str(out), "--save-model", str(models)])
    assert res.exit_code == 0, res.output
    assert "privacy (released model): epsilon 1 per training row" in res.output
    d = json.loads(out.read_text())["dp_model"]
    assert d["epsilon"] == pytest.approx(1.0) and d["mechanism"] == "laplace" and d["delta"] is None
    assert d["n_trees"] == 3 and d["per_tree"]["levels"] == 2
    per_tree = d["per_tree"]["epsilon_after_sampling"]
    assert d["sketch"]["epsilon_total"] + 3 * per_tree == pytest.approx(1.0)
    model = BoostedModel.load(models / "active.json")
    assert model.dp_model == d
    assert "train" not in model.history                         # exact training metrics are not released
    for rnd in model.rounds:
        for tree in rnd:
            assert len(tree.leaves()) == 4                       # grown to max_depth whatever the data
            assert all(n.gain == 0.0 and n.n_samples == 0 for n in tree.nodes)
            # the file keeps what prediction needs only: no sum, exact or noisy, in any node (issue 23,
            # finding 6: noisy leaf sums at full precision revealed more than the leaf values)
            assert all(n.sum_gradients == 0.0 and n.sum_hessians == 0.0 for n in tree.nodes)
            assert any(n.value != 0.0 for n in tree.leaves())
    raw = json.loads((models / "active.json").read_text())
    for rnd in raw["rounds"]:
        for tree in rnd:
            assert all(nd.get("sum_gradients", 0.0) == 0.0 and nd.get("sum_hessians", 0.0) == 0.0
                       for nd in tree["nodes"])
    assert "NOT PRIVATE" not in json.dumps(raw) and "OpenDP" in d["noise"]


def test_simulate_dp_model_gaussian_with_delta(tmp_path):
    out = tmp_path / "r.json"
    res = _run(["simulate", "--mode", "plain", "--rounds", "2", "--depth", "2", "--dp-model", "2", "--dp-delta",
                "1e-5", "--quiet", "--output-json", str(out)])
    assert res.exit_code == 0, res.output
    assert "delta 1e-05" in res.output
    d = json.loads(out.read_text())["dp_model"]
    assert d["mechanism"] == "gaussian" and d["delta"] == 1e-5 and 1.98 <= d["epsilon"] <= 2.0
    assert d["per_tree"]["leaf_gradient_sigma"] > 0


def test_dp_model_inf_reproduces_the_non_private_training_exactly():
    a, b, c = small_frames(200)
    frames = [PartyFrame("a", a, "id", "y"), PartyFrame("b", b, "id"), PartyFrame("c", c, "id")]
    models = []
    for extra in ({}, {"dp_model": math.inf}):
        fed = federation_from_frames(frames)
        fed.fit(TrainParams(mode="plain", n_estimators=3, max_depth=3, seed=1, **extra))
        models.append(fed.model)
    plain, inf = models
    assert inf.dp_model["mechanism"] == "none" and plain.dp_model is None
    assert [[t.to_dict() for t in r] for r in plain.rounds] == [[t.to_dict() for t in r] for r in inf.rounds]


def test_a_finite_epsilon_changes_the_model():
    """(the assertion above can fail: a DP model differs from the exact one)"""
    a, b, c = small_frames(200)
    frames = [PartyFrame("a", a, "id", "y"), PartyFrame("b", b, "id"), PartyFrame("c", c, "id")]
    fed = federation_from_frames(frames)
    fed.fit(TrainParams(mode="plain", n_estimators=2, max_depth=2, dp_model=50.0))
    ref = federation_from_frames(frames)
    ref.fit(TrainParams(mode="plain", n_estimators=2, max_depth=2))
    assert [[t.to_dict() for t in r] for r in fed.model.rounds] != [[t.to_dict() for t in r] for r in ref.model.rounds]


def test_cyclic_trees_split_on_one_feature_each_in_turn_over_all_parties():
    a, b, c = small_frames(300)
    frames = [PartyFrame("a", a, "id", "y"), PartyFrame("b", b, "id"), PartyFrame("c", c, "id")]
    fed = federation_from_frames(frames)
    fed.fit(TrainParams(mode="plain", n_estimators=7, max_depth=2, dp_model=20.0, dp_trees="cyclic"))
    order = [("a", "a0"), ("a", "a1"), ("b", None), ("b", None), ("c", None), ("c", None), ("a", "a0")]
    records = {p: {r["record_id"]: r["feature"] for r in fed.passives[p].records} for p in ("b", "c")}
    for (party, feature), rnd, j in zip(order, fed.model.rounds, range(7)):
        internal = [n for n in rnd[0].nodes if not n.is_leaf]
        assert len(internal) == 3 and {n.owner for n in internal} == {party}
        features = {n.feature if party == "a" else records[party][n.record_id] for n in internal}
        assert features == {feature or f"{party}{j % 2}"}


def test_selected_trees_choose_the_informative_features():
    """The default dp_trees "selected": each tree splits on one feature, chosen by the exponential
    mechanism; y depends on a0, b0 and c0 only, so at a large epsilon every tree picks one of them
    (cyclic trees would take a1, b1, c1 in turn as well)."""
    a, b, c = small_frames(2000)
    frames = [PartyFrame("a", a, "id", "y"), PartyFrame("b", b, "id"), PartyFrame("c", c, "id")]
    fed = federation_from_frames(frames)
    fed.fit(TrainParams(mode="plain", n_estimators=6, max_depth=2, dp_model=300.0))
    assert fed.model.dp_model["per_tree"]["feature_choice_epsilon"] > 0
    records = {p: {r["record_id"]: r["feature"] for r in fed.passives[p].records} for p in ("b", "c")}
    chosen = []
    for rnd in fed.model.rounds:
        internal = [n for n in rnd[0].nodes if not n.is_leaf]
        features = {n.feature if n.owner == "a" else records[n.owner][n.record_id] for n in internal}
        assert len(internal) == 3 and len(features) == 1
        chosen += features
    assert set(chosen) <= {"a0", "b0", "c0"}, chosen


def test_passive_parties_receive_their_sketch_budget_at_setup_and_nothing_else_new():
    """What each passive party receives: TrainSetup.dp_binning = {epsilon: its share}; its bins are DP."""
    a, b, c = small_frames(300)
    frames = [PartyFrame("a", a, "id", "y"), PartyFrame("b", b, "id"), PartyFrame("c", c, "id")]
    fed = federation_from_frames(frames, record=True)
    fed.fit(TrainParams(mode="plain", n_estimators=2, max_depth=2, dp_model=3.0, dp_budget="0.3,0.2,0.5"))
    setups = [loads(frame) for frame in _frames_to(fed, "b") if _is(frame, "TrainSetup")]
    assert len(setups) == 1
    # three parties hold features: 90% of 0.3 * 3.0 / 3 each (the base score takes 10%)
    # ... and the training's total, which the party's lifetime ledger charges (parties.dp_ledger)
    assert setups[0].dp_binning == {"epsilon": pytest.approx(0.27), "training_epsilon": pytest.approx(3.0)}
    assert fed.model.dp_model["sketch"]["epsilon_per_party"] == pytest.approx(0.27)
    binner = fed.passives["b"]._state.train.binner
    assert isinstance(binner, DPBinner) and binner.epsilon == pytest.approx(0.27)
    kinds = {loads(frame).__class__.__name__ for frame in _frames_to(fed, "b")}
    assert kinds <= {"AlignRequest", "AlignResult", "TrainSetup", "GradientsStart", "GradientShard",
                     "HistogramRequest", "SplitRequest", "TrainEnd"}


def _frames_to(fed, party):
    return [frame for (_, to, frame) in fed.transport.log if to == party]


def _is(frame, name):
    return loads(frame).__class__.__name__ == name


@pytest.mark.slow
def test_he_mode_with_dp_model(tmp_path):
    out = tmp_path / "r.json"
    res = _run(["simulate", "--mode", "he", "--key-bits", str(KEY_BITS), "--rounds", "2", "--depth", "2",
                "--dp-model", "4", "--quiet", "--output-json", str(out)])
    assert res.exit_code == 0, res.output
    d = json.loads(out.read_text())
    assert d["mode"] == "he" and d["dp_model"]["epsilon"] == pytest.approx(4.0)


@pytest.mark.parametrize("args, match", [
    (["--dp-model", "0"], "dp_model must be > 0"),
    (["--dp-model", "-2"], "dp_model must be > 0"),
    (["--dp-model", "nan"], "dp_model must be a number"),
    (["--dp-model", "1", "--dp-delta", "1"], r"dp_delta must be a number in \(0, 1\)"),
    (["--dp-delta", "1e-5"], "dp_delta applies with dp_model only"),
    (["--mode", "dp", "--epsilon", "1", "--dp-model", "1"], "dp_model applies to modes 'he' and 'plain'"),
    (["--dp-model", "1", "--objective", "regression"], "needs dp_clip"),
    (["--dp-model", "1", "--goss"], "cannot be combined with goss"),
    (["--dp-model", "1", "--dp-budget", "0.1,0.9"], "dp_budget must be three"),
    (["--dp-model", "1", "--dp-trees", "forest"], "Invalid value for '--dp-trees'"),
    (["--dp-trees", "exponential"], "dp_trees applies with dp_model only"),
])
def test_bad_dp_model_options_get_a_clear_error(args, match):
    out = _cli_error(["simulate", "--mode", "plain", "--rounds", "2", "--quiet", *args])
    assert re.search(match, out), out


def test_compare_dp_model_arm(tmp_path):
    res = _run(["compare", "--dataset", "breast_cancer", "--modes", "plain,local", "--dp-model", "--epsilons",
                "5,inf", "--seeds", "1", "--rounds", "2", "--depth", "2", "--no-plots", "--quiet",
                "--out-dir", str(tmp_path)])
    assert res.exit_code == 0, res.output
    doc = json.loads((tmp_path / "compare_runs.json").read_text())
    runs = {(r["mode"], r["epsilon"]): r for r in doc["runs"]}
    assert set(runs) == {("plain", None), ("local", None), ("dp-model", 5.0), ("dp-model", "inf")}
    assert "dp-model" in res.output
    assert doc["settings"]["dp_model"] == {"max_depth": 3, "learning_rate": 0.5}


def test_compare_dp_model_figure(tmp_path):
    pytest.importorskip("matplotlib")
    cfg = CompareConfig(datasets=("breast_cancer",), modes=("plain", "dp-model"), epsilons=(2.0, math.inf),
                        seeds=1, n_estimators=2, max_depth=2)
    doc = run_comparison(cfg, tmp_path)
    assert str(tmp_path / "breast_cancer_dp_model_auc_vs_epsilon.png") in doc["files"]
    assert (tmp_path / "breast_cancer_dp_model_auc_vs_epsilon.png").stat().st_size > 1000
    assert (tmp_path / "breast_cancer_dp_model_auc_vs_epsilon.png").stat().st_mode & 0o777 == 0o644   # shareable


def test_dp_setup_message_round_trips_and_bad_budgets_are_refused():
    msg = loads(dumps(m.TrainSetup("plain", 16, "abc", {"epsilon": 0.25})))
    assert msg.dp_binning == {"epsilon": 0.25} and isinstance(_binner(msg), DPBinner)
    assert loads(dumps(m.TrainSetup("plain", 16, "abc"))).dp_binning is None
    for bad in ({"epsilon": 0}, {"epsilon": float("nan")}, {"epsilon": "1"}, {"eps": 1.0}, {"epsilon": 1, "x": 2}):
        with pytest.raises(ProtocolError, match="dp_binning"):
            _binner(m.TrainSetup("plain", 16, "abc", bad))
