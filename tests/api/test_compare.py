"""`vfl compare` / vfl.compare: the runs, the files, and bad input."""
import csv
import json
import sys
import warnings

import pytest
from click.testing import CliRunner

from cli import main
from vfl.compare import CompareConfig, _centralized, load_dataset, replot, run_comparison
from vfl.core.errors import InputError

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow
def test_cli_compare_tiny_writes_csv_json_png(tmp_path):
    out = tmp_path / "cmp"
    r = CliRunner().invoke(main, ["compare", "--dataset", "breast_cancer", "--modes", "plain,dp",
                                  "--epsilons", "1,inf", "--seeds", "1", "--rounds", "2", "--depth", "2",
                                  "--out-dir", str(out), "--quiet"])
    assert r.exit_code == 0, r.output
    for name in ("compare_runs.csv", "compare_runs.json", "breast_cancer_auc_vs_epsilon.png",
                 "breast_cancer_cost.png"):
        assert (out / name).is_file(), name
    for name in ("breast_cancer_auc_vs_epsilon.png", "breast_cancer_cost.png"):
        data = (out / name).read_bytes()
        assert data.startswith(PNG_MAGIC) and 5_000 < len(data) < 300_000
    rows = list(csv.DictReader((out / "compare_runs.csv").read_text().splitlines()))
    assert [(x["mode"], x["epsilon"]) for x in rows] == [("plain", ""), ("dp", "1.0"), ("dp", "inf")]
    for x in rows:
        assert 0.5 < float(x["test_auc"]) <= 1 and float(x["train_seconds"]) > 0
        assert 0 < int(x["train_bytes"]) < int(x["total_bytes"])
        assert int(x["n_rounds"]) == 2 and int(x["n_trees"]) == 2           # binary: one tree a round
    assert json.loads(rows[1]["epsilon_per_feature"]) == {"passive1": pytest.approx(0.9 / 15)}     # 10%: edges
    # eps = inf is the plain model on the same split, exactly
    assert rows[2]["test_auc"] == rows[0]["test_auc"]
    assert int(rows[1]["train_bytes"]) < int(rows[0]["train_bytes"])
    doc = json.loads((out / "compare_runs.json").read_text())
    assert doc["settings"]["epsilons"] == [1.0, "inf"] and len(doc["runs"]) == 3
    assert [e["mode"] for e in doc["summary"]["breast_cancer"]["entries"]] == ["plain", "dp", "dp"]
    assert "breast_cancer:" in r.output and "dp" in r.output
    # figures can be redrawn from the JSON without training
    (out / "breast_cancer_cost.png").unlink()
    assert sorted(p.name for p in replot(out)) == ["breast_cancer_auc_vs_epsilon.png", "breast_cancer_cost.png"]
    assert (out / "breast_cancer_cost.png").read_bytes().startswith(PNG_MAGIC)


def test_compare_he_matches_plain_and_xgboost_reference(tmp_path):
    cfg = CompareConfig(datasets=("breast_cancer",), modes=("plain", "he", "local", "xgboost"), seeds=2,
                        he_seeds=1, n_estimators=1, max_depth=2, plots=False)
    doc = run_comparison(cfg, tmp_path)
    runs = doc["runs"]
    assert [(x["mode"], x["seed"]) for x in runs] == [("plain", 0), ("he", 0), ("local", 0), ("xgboost", 0),
                                                      ("plain", 1), ("local", 1), ("xgboost", 1)]
    assert doc["summary"]["breast_cancer"]["he_equals_plain"] is True
    he = next(x for x in runs if x["mode"] == "he")
    assert he["key_bits"] == 1024 and he["train_bytes"] > 3 * runs[0]["train_bytes"]
    assert any("1024-bit" in n for n in doc["notes"])
    assert all(x["train_bytes"] == 0 for x in runs if x["mode"] in ("local", "xgboost"))
    assert all(x["n_rounds"] == 1 and x["n_trees"] == 1 for x in runs)     # XGBoost's counted from its booster
    assert not (tmp_path / "breast_cancer_cost.png").exists()      # --no-plots


def test_centralized_table_has_every_feature():
    frames = load_dataset("breast_cancer")
    X, y = _centralized(frames)
    assert X.shape == (569, 30) and set(y) == {0.0, 1.0}


def test_missing_matplotlib_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(InputError, match=r"plots need matplotlib.*pip install 'vfl-boost\[plot\]'"):
        run_comparison(CompareConfig(datasets=("breast_cancer",), modes=("plain",), seeds=1), tmp_path)
    assert not (tmp_path / "compare_runs.csv").exists()            # failed before training
    doc = run_comparison(CompareConfig(datasets=("breast_cancer",), modes=("plain",), seeds=1, n_estimators=1,
                                       plots=False), tmp_path)
    assert len(doc["runs"]) == 1


def test_missing_xgboost_drops_the_line_with_a_note(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "xgboost", None)
    doc = run_comparison(CompareConfig(datasets=("breast_cancer",), modes=("plain", "dp", "xgboost"),
                                       epsilons=(2.0,), seeds=1, n_estimators=1), tmp_path)
    assert [x["mode"] for x in doc["runs"]] == ["plain", "dp"]
    assert any("xgboost is not installed" in n for n in doc["notes"])
    assert (tmp_path / "breast_cancer_auc_vs_epsilon.png").is_file()


@pytest.mark.parametrize("args, msg", [
    (["--modes", "plain,foo"], "unknown mode(s) ['foo']"),
    (["--epsilons", "0,1"], "must be > 0"),
    (["--epsilons", "nan"], "got NaN"),
    (["--epsilons", "x"], "epsilon 'x' is not a number"),
    (["--epsilons", ","], "at least one epsilon"),
    (["--seeds", "0"], "seeds must be an integer >= 1"),
    (["--max-bin", "1"], "max_bin must be >= 2"),
    (["--key-bits", "512"], "512"),
    (["--dataset", "vehicle"], "needs a binary data set"),
    (["--dataset", "nope"], "'nope' is not one of"),
])
def test_cli_compare_bad_input(tmp_path, args, msg):
    r = CliRunner().invoke(main, ["compare", "--out-dir", str(tmp_path / "o"), "--no-plots", *args])
    assert r.exit_code != 0
    assert msg in r.output and "Traceback" not in r.output
    assert not (tmp_path / "o" / "compare_runs.csv").exists()


def test_give_credit_is_split_four_six_for_compare(shared_dir):
    from parties.dp import pilot_size
    from vfl.api import simulate
    from vfl.core.params import TrainParams
    frames = load_dataset("give_credit")
    assert [len(pf.feature_names) for pf in frames] == [4, 6]
    with warnings.catch_warnings():
        _, res, _, _ = simulate(frames, TrainParams(mode="dp", epsilon=6.0, n_estimators=1, max_depth=2,
                                                    dp_select=None))
    # 10% of the party's 6 places its bucket edges (DP histograms), the rest is released: 5.4 / 6
    assert res["epsilon_per_feature"] == {"passive1": pytest.approx(0.9)}
    assert res["epsilon_per_party"] == {"passive1": 6.0}
    # the default (--dp-select auto): the pilot (4,800 of 24,000 rows) picks K (its scores' argmax) features
    with warnings.catch_warnings():
        _, res, _, _ = simulate(frames, TrainParams(mode="dp", epsilon=6.0, n_estimators=1, max_depth=2))
    sel = res["dp_select"]["passive1"]
    k = sel["k"]
    assert sel["k_rule"] == "auto" and k == 1 + sel["k_score"].index(max(sel["k_score"])) and 1 <= k < 6
    assert res["epsilon_per_feature"] == {"passive1": pytest.approx(5.4 / k)}
    assert res["epsilon_per_party"] == {"passive1": 6.0}
    assert len(sel["features"]) == k and sel["pilot_rows"] == pilot_size(res["n_train"]) == 4800
    assert 0.5 < res["test_auc"] < 1


def test_compare_arms_and_defaults_come_from_one_vocabulary():
    from vfl.compare import ARMS, COMPARE_KEY_BITS, DEFAULT_ARMS, EPSILON_SCOPES, Arm, format_epsilons
    from vfl.core.params import MODES, TrainParams

    assert set(MODES) < set(ARMS) and Arm.LOCAL == "local" and EPSILON_SCOPES == ("party", "feature")
    cfg = CompareConfig()
    assert cfg.modes == DEFAULT_ARMS and cfg.key_bits == COMPARE_KEY_BITS
    assert set(ARMS) - set(DEFAULT_ARMS) == {"dp-model"}         # `vfl compare --dp-model` adds that arm
    assert (cfg.n_estimators, cfg.max_depth, cfg.max_bin) == tuple(
        TrainParams.default(n) for n in ("n_estimators", "max_depth", "max_bin"))
    assert format_epsilons(cfg.epsilons) == "0.5,1,2,4,8,inf"
    with pytest.raises(InputError, match="unknown mode"):
        CompareConfig(modes=("plain", "ensemble")).validate()


def test_compare_modes_benchmark_takes_the_commands_options(capsys):
    """benchmarks/compare_modes.py parses its argv with `vfl compare` itself."""
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    try:
        import compare_modes
    finally:
        sys.path.pop(0)
    assert compare_modes.main(["--rounds", "nope"]) == 2
    assert "'nope' is not a valid integer" in capsys.readouterr().err
    assert compare_modes.main(["--help"]) == 0
    assert "--epsilon-scope [party|feature]" in capsys.readouterr().out


def test_compare_dp_arms_old_mechanism_and_select():
    """The dp_old arm is the mechanism before issue 13 (max_bin buckets, no debiasing), the
    dp_select arm dp with --dp-select, the dp_all arm dp releasing every feature; all train in
    mode dp at each epsilon; the dp arm is the default (--dp-select auto)."""
    from vfl.compare import DP_ARMS, Arm
    # per-feature epsilons mean every feature is released: an integer --dp-select is refused (issue 23)
    with pytest.raises(InputError, match="epsilon_per_feature charges each"):
        CompareConfig(max_bin=16, dp_select=2, epsilon_scope="feature").validate()
    feat = CompareConfig(max_bin=16, epsilon_scope="feature").validate()
    old = feat.train_params(Arm.DP_OLD.value, 2.0, 3)
    assert (old.mode, old.dp_buckets, old.dp_debias, old.dp_select, old.epsilon_per_feature, old.seed) == \
        ("dp", 16, False, None, 2.0, 3)
    cfg = CompareConfig(max_bin=16, dp_select=2).validate()
    assert set(DP_ARMS) == {"dp", "dp_old", "dp_select", "dp_all"} <= set(cfg.modes)
    new = cfg.train_params(Arm.DP.value, 2.0, 0)
    assert (new.mode, new.dp_buckets, new.dp_debias, new.dp_select) == ("dp", "auto", True, "auto")
    every = cfg.train_params(Arm.DP_ALL.value, 2.0, 0)
    assert (every.mode, every.dp_buckets, every.dp_debias, every.dp_select) == ("dp", "auto", True, None)
    sel = cfg.train_params(Arm.DP_SELECT.value, 2.0, 0)
    assert (sel.mode, sel.dp_select, sel.dp_debias) == ("dp", 2, True)
    assert CompareConfig().dp_select == "auto"
    with pytest.raises(InputError, match="dp_select must be"):
        CompareConfig(modes=("dp_select",), dp_select=0).validate()


@pytest.mark.slow
def test_compare_runs_the_dp_arms_and_plots_them(tmp_path):
    cfg = CompareConfig(datasets=("breast_cancer",), modes=("dp", "dp_old", "dp_select", "local"), seeds=1,
                        epsilons=(2.0, float("inf")), n_estimators=2, max_depth=2)
    doc = run_comparison(cfg, tmp_path)
    keys = [(r["mode"], r["epsilon"]) for r in doc["runs"]]
    assert keys == [("dp", 2.0), ("dp", "inf"), ("dp_old", 2.0), ("dp_old", "inf"), ("dp_select", 2.0),
                    ("dp_select", "inf"), ("local", None)]
    runs = {k: r for k, r in zip(keys, doc["runs"])}
    # at inf the three arms are the same (no noise: no coarser buckets, no selection)
    assert runs[("dp", "inf")]["test_auc"] == runs[("dp_old", "inf")]["test_auc"] == \
        runs[("dp_select", "inf")]["test_auc"]
    assert all(r["epsilon_scope"] == "party" for r in doc["runs"] if r["mode"] != "local")
    assert (tmp_path / "breast_cancer_auc_vs_epsilon.png").read_bytes().startswith(PNG_MAGIC)


def test_summary_lists_epsilon_per_feature_per_seed_when_the_pilot_picks_different_k():
    from vfl.compare import summarize

    def run(seed, eps_f):
        return {"dataset": "d", "mode": "dp", "epsilon": 8.0, "seed": seed, "test_auc": 0.7, "train_seconds": 1.0,
                "train_bytes": 1, "total_bytes": 1, "epsilon_per_feature": {"passive1": eps_f}}
    same = summarize([run(1, 4.0), run(0, 4.0)])["d"]["entries"][0]
    assert same["epsilon_per_feature"] == {"passive1": 4.0}
    differ = summarize([run(1, 8 / 3), run(0, 4.0)])["d"]["entries"][0]
    assert differ["epsilon_per_feature"] == [{"passive1": 4.0}, {"passive1": 8 / 3}]       # seed order


def test_the_default_dp_curve_says_selection_only_where_it_happens():
    """With epsilon per feature nothing is selected: the legend must not claim --dp-select auto."""
    from vfl.compare import dp_curves

    def label(scope):
        return {arm: lab for arm, _, _, lab in dp_curves(CompareConfig(epsilon_scope=scope).validate())}["dp"]
    assert "--dp-select auto" in label("party")
    assert "no selection" in label("feature") and "--dp-select" not in label("feature")


def test_cli_compare_on_your_own_tables(tmp_path):
    """Issue 37: `vfl compare` takes --active FILE --passive FILE ... like `vfl simulate` (no
    shared datasets directory needed); --name names the outputs."""
    from support import small_frames
    a, b, c = small_frames(n=160)
    for name, f in (("bank", a), ("telco", b), ("shop", c)):
        f.rename(columns={"id": "cid", "y": "bad"}).to_csv(tmp_path / f"{name}.csv", index=False)
    out = tmp_path / "cmp"
    r = CliRunner().invoke(main, ["compare", "--active", str(tmp_path / "bank.csv"), "--passive",
                                  str(tmp_path / "telco.csv"), "--passive", str(tmp_path / "shop.csv"),
                                  "--id-col", "cid", "--label-col", "bad", "--modes", "plain,local",
                                  "--seeds", "1", "--rounds", "2", "--depth", "2", "--no-plots",
                                  "--out-dir", str(out), "--quiet"])
    assert r.exit_code == 0, r.output
    doc = json.loads((out / "compare_runs.json").read_text())
    assert [(x["dataset"], x["mode"]) for x in doc["runs"]] == [("bank", "plain"), ("bank", "local")]
    assert doc["settings"]["tables"]["passives"] == [str(tmp_path / "telco.csv"), str(tmp_path / "shop.csv")]
    assert doc["runs"][0]["test_auc"] > doc["runs"][1]["test_auc"]        # the partners' features help
    r = CliRunner().invoke(main, ["compare", "--active", str(tmp_path / "bank.csv"), "--passive",
                                  str(tmp_path / "telco.csv"), "--id-col", "cid", "--label-col", "bad",
                                  "--name", "mine", "--modes", "plain", "--seeds", "1", "--rounds", "1",
                                  "--no-plots", "--out-dir", str(out), "--quiet"])
    assert r.exit_code == 0 and "mine:" in r.output, r.output


@pytest.mark.parametrize("args, msg", [
    (["--active", "a.csv"], "--active and at least one --passive are needed together"),
    (["--passive", "b.csv"], "--active and at least one --passive are needed together"),
    (["--active", "a.csv", "--passive", "b.csv", "--dataset", "breast_cancer"], "either --dataset or your own"),
    (["--name", "x"], "--name names your own tables"),
    (["--active", "a.csv", "--passive", "b.csv"], "does not exist"),
    (["--active", "multi.csv", "--passive", "b2.csv"], "compare needs a binary label"),
])
def test_cli_compare_bad_tables(tmp_path, monkeypatch, args, msg):
    import pandas as pd
    monkeypatch.chdir(tmp_path)
    pd.DataFrame({"id": range(9), "y": [0, 1, 2] * 3, "f": range(9)}).to_csv("multi.csv", index=False)
    pd.DataFrame({"id": range(9), "g": range(9)}).to_csv("b2.csv", index=False)
    r = CliRunner().invoke(main, ["compare", "--out-dir", "o", "--no-plots", *args])
    assert r.exit_code != 0
    assert msg in r.output and "Traceback" not in r.output, r.output


# --- issue 37, item 8: the outputs -------------------------------------------------------------
def _summary_entry(mode, eps, bytes_mean):
    return {"mode": mode, "epsilon": eps, "n_runs": 3, "auc_mean": 0.71234, "auc_std": 0.0123, "auc_min": 0.7,
            "auc_max": 0.72, "train_seconds_mean": 123.456, "train_bytes_mean": bytes_mean}


def test_the_text_table_is_aligned_and_counts_bytes_in_iec_units():
    from vfl.compare import format_table
    summary = {"default_credit": {"he_equals_plain": True, "entries": [
        _summary_entry("plain", None, 66_900_000), _summary_entry("dp_select", 0.5, 1_234),
        _summary_entry("dp-model", "inf", 5e9), _summary_entry("xgboost", None, 0)]}}
    lines = format_table(summary).splitlines()
    rows = lines[1:6]
    assert len({len(r) for r in rows}) == 1, "\n".join(rows)          # every column as wide as its widest cell
    full = rows[2]                                                      # a row without an empty cell
    ends = [i for i, c in enumerate(full) if c != " " and (i + 1 == len(full) or full[i + 1] == " ")]
    assert len(ends) == 10                                              # (the bytes' unit: one more)
    for r in rows:
        assert all(r[i] != " " for i in ends[2:-2] + ends[-1:]), r                   # numbers end under their header
    assert "63.8 MiB" in rows[1] and "1.2 KiB" in rows[2] and "4.7 GiB" in rows[3] and " MB" not in lines[2]


def test_no_two_curves_share_a_label():
    from vfl.compare import dp_curves
    for cfg in (CompareConfig(), CompareConfig(dp_select=3), CompareConfig(epsilon_scope="feature")):
        labels = [label for *_, label in dp_curves(cfg.validate())]
        assert len(set(labels)) == len(labels), labels
        assert sum("--dp-select auto" in label for label in labels) <= 1, labels


def _runs():
    runs = []
    for seed in range(3):
        runs.append({"dataset": "d", "mode": "plain", "epsilon": None, "seed": seed, "test_auc": 0.8,
                     "train_seconds": 1.0, "train_bytes": 1000, "total_bytes": 1200, "epsilon_per_feature": None})
        for arm in ("dp", "dp_select", "dp_all", "dp_old"):
            for e in (0.5, 1.0, 2.0, float("inf")):
                runs.append({"dataset": "d", "mode": arm, "epsilon": e, "seed": seed,
                             "test_auc": 0.7 + 0.02 * seed + (0.05 if e == float("inf") else 0.0),
                             "train_seconds": 0.5, "train_bytes": 500, "total_bytes": 600,
                             "epsilon_per_feature": {"passive1": e}, "epsilon_per_party": {"passive1": e}})
        runs.append({"dataset": "d", "mode": "local", "epsilon": None, "seed": seed, "test_auc": 0.65,
                     "train_seconds": 0.1, "train_bytes": 0, "total_bytes": 0, "epsilon_per_feature": None})
    return runs


@pytest.mark.slow
def test_the_legend_covers_no_curve_and_the_outputs_are_shareable(tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    import vfl.compare as vc
    figures = []
    real = vc._save_figure

    def keep(fig, path):
        figures.append(fig)
        real(fig, path)
    monkeypatch.setattr(vc, "_save_figure", keep)
    cfg = CompareConfig(modes=("plain", "dp", "dp_select", "dp_all", "dp_old", "local"),
                        epsilons=(0.5, 1, 2, float("inf"))).validate()
    paths = vc.plot_dataset("d", _runs(), cfg, tmp_path, [])
    fig = figures[0]
    fig.canvas.draw()
    ax = fig.axes[0]
    legend = ax.get_legend()
    assert legend is not None and len(legend.get_texts()) == 7
    assert not legend.get_window_extent().overlaps(ax.get_window_extent())     # outside the plotting area
    files = vc.write_runs(_runs(), tmp_path, cfg, []) + paths
    assert {stat_mode(f) for f in files} == {0o644}


def stat_mode(path):
    return path.stat().st_mode & 0o777
