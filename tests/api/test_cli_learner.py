"""`vfl simulate` with --objective, --validation-size, --early-stopping-rounds, --subsample, --goss."""
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner

from cli import main

ROOT = Path(__file__).resolve().parents[2]


def run(*args):
    return CliRunner().invoke(main, ["simulate", "--quiet", *args], catch_exceptions=False)


def csv_pair(tmp_path, y, X, label_col="y"):
    ids = np.arange(len(y))
    g = pd.DataFrame({"id": ids, label_col: y, **{f"g{i}": X[:, i] for i in range(2)}})
    h = pd.DataFrame({"id": ids, **{f"h{i}": X[:, i] for i in range(2, X.shape[1])}})
    gp, hp = tmp_path / "active.csv", tmp_path / "passive.csv"
    g.to_csv(gp, index=False)
    h.to_csv(hp, index=False)
    return str(gp), str(hp)


def test_binary_json_reports_auc_accuracy_and_logloss(tmp_path):
    out = tmp_path / "r.json"
    res = run("--mode", "plain", "--rounds", "3", "--output-json", str(out))
    assert res.exit_code == 0, res.output
    r = json.loads(out.read_text())
    assert r["objective"] == "binary" and r["test_auc"] > 0.9 and r["test_accuracy"] > 0.85
    assert r["test_logloss"] > 0 and r["test_rmse"] is None and r["n_validation"] == 0
    assert "test accuracy:" in res.output


def test_multiclass_on_vehicle_by_default_objective(shared_dir, tmp_path):
    out, pred = tmp_path / "r.json", tmp_path / "p.csv"
    res = run("--dataset", "vehicle", "--mode", "plain", "--rounds", "5", "--output-json", str(out),
              "--predictions", str(pred))
    assert res.exit_code == 0, res.output
    assert "objective multiclass" in res.output and "test accuracy:" in res.output
    r = json.loads(out.read_text())
    assert r["test_accuracy"] > 0.5 and r["test_logloss"] > 0 and r["test_auc"] is None
    assert r["classes"] == [0, 1, 2, 3] and r["n_rounds"] == 5 and r["n_trees"] == 5 * 4   # K trees a round
    p = pd.read_csv(pred)
    assert list(p.columns) == ["id", "prediction", "proba_0", "proba_1", "proba_2", "proba_3"]
    assert np.allclose(p.filter(like="proba_").sum(axis=1), 1)


def test_regression_from_csv_with_predictions(tmp_path):
    rng = np.random.default_rng(0)
    X = rng.normal(size=(200, 4))
    y = 3 * X[:, 0] + 2 * X[:, 3] + 0.1 * rng.normal(size=200)
    g, h = csv_pair(tmp_path, y, X)
    out, pred = tmp_path / "r.json", tmp_path / "p.csv"
    res = run("--active", g, "--passive", h, "--objective", "regression", "--mode", "plain", "--rounds", "20",
              "--output-json", str(out), "--predictions", str(pred))
    assert res.exit_code == 0, res.output
    r = json.loads(out.read_text())
    assert r["test_rmse"] < 0.5 * y.std() and r["test_mae"] < r["test_rmse"] and r["test_accuracy"] is None
    assert "test RMSE:" in res.output
    assert list(pd.read_csv(pred).columns) == ["id", "prediction"]


def test_string_labels_mapping_is_reported(tmp_path):
    rng = np.random.default_rng(1)
    X = rng.normal(size=(150, 4))
    y = np.array(["bus", "car", "van"])[(X[:, 0] > 0).astype(int) + (X[:, 2] > 0.5).astype(int)]
    g, h = csv_pair(tmp_path, y, X)
    pred = tmp_path / "p.csv"
    res = run("--active", g, "--passive", h, "--objective", "multiclass", "--mode", "plain", "--rounds", "4",
              "--predictions", str(pred))
    assert res.exit_code == 0, res.output
    assert "classes: 0 = 'bus', 1 = 'car', 2 = 'van'" in res.output
    p = pd.read_csv(pred)
    assert set(p["prediction"]) <= {"bus", "car", "van"} and "proba_van" in p.columns
    res = run("--active", g, "--passive", h, "--mode", "plain", "--rounds", "1")      # binary: a clear error
    assert res.exit_code != 0 and "label column 'y'" in res.output and "not numeric" in res.output
    assert "Traceback" not in res.output


def test_validation_and_early_stopping(tmp_path):
    out = tmp_path / "r.json"
    res = run("--mode", "plain", "--rounds", "60", "--learning-rate", "1.0", "--depth", "6",
              "--min-child-weight", "0", "--validation-size", "0.25", "--early-stopping-rounds", "2",
              "--output-json", str(out))
    assert res.exit_code == 0, res.output
    r = json.loads(out.read_text())
    hist = r["history"]["validation"]["logloss"]
    assert r["n_validation"] > 0 and r["best_iteration"] == int(np.argmin(hist))
    assert r["n_rounds"] == r["best_iteration"] + 3 < 60
    assert f"best iteration {r['best_iteration'] + 1}" in res.output


@pytest.mark.parametrize("flags", [["--goss"], ["--subsample", "0.5"]])
def test_sampling_flags(tmp_path, flags):
    out = tmp_path / "r.json"
    res = run("--mode", "plain", "--rounds", "5", "--output-json", str(out), *flags)
    assert res.exit_code == 0, res.output
    r = json.loads(out.read_text())
    assert r["params"]["goss"] == ("--goss" in flags) and r["test_auc"] > 0.9


@pytest.mark.parametrize("flags, message", [
    (["--subsample", "0"], "parameter subsample must be > 0"),
    (["--early-stopping-rounds", "3"], "--early-stopping-rounds needs --validation-size"),
    (["--goss", "--subsample", "0.5"], "cannot be combined"),
    (["--eval-metric", "rmse"], "eval_metric 'rmse' does not fit objective 'binary'"),
    (["--objective", "multiclass", "--validation-size", "0.2", "--eval-metric", "auc"], "does not fit"),
])
def test_bad_flags_are_clear_errors(flags, message):
    res = run("--mode", "plain", "--rounds", "2", *flags)
    assert res.exit_code != 0 and message in res.output and "Traceback" not in res.output


@pytest.mark.slow
def test_he_multiclass_subprocess(tmp_path):
    rng = np.random.default_rng(2)
    X = rng.normal(size=(60, 4))
    y = (X[:, 0] > 0).astype(int) + (X[:, 2] > 0.5).astype(int)
    g, h = csv_pair(tmp_path, y, X)
    out = tmp_path / "r.json"
    proc = subprocess.run([sys.executable, "-m", "cli", "simulate", "--quiet", "--active", g, "--passive", h,
                           "--objective", "multiclass", "--key-bits", "1024", "--rounds", "2", "--depth", "2",
                           "--output-json", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    r = json.loads(out.read_text())
    assert r["mode"] == "he" and r["objective"] == "multiclass" and r["test_accuracy"] is not None


# --- the face: one vocabulary, one set of defaults, one TrainParams builder, one error group -------
def test_deprecated_guest_host_trees_names_work_with_a_one_line_note(tmp_path):
    rng = np.random.default_rng(3)
    X = rng.normal(size=(80, 4))
    g, h = csv_pair(tmp_path, (X[:, 0] > 0).astype(int), X)
    old = run("--guest", g, "--host=" + h, "--mode", "plain", "--trees", "1")
    new = run("--active", g, "--passive", h, "--mode", "plain", "--rounds", "1")
    assert old.exit_code == 0 and new.exit_code == 0, old.output + new.output
    assert "warning: --guest is deprecated, use --active\n" in old.output
    assert "warning: --host is deprecated, use --passive\n" in old.output
    assert "warning: --trees is deprecated, use --rounds\n" in old.output
    assert "deprecated" not in new.output
    def stable(output):       # (times vary, and the byte counts by a few bytes of random salts)
        return [ln for ln in output.splitlines() if "deprecated" not in ln and not ln.startswith(("train time",
                                                                                                  "bytes "))]
    assert len(stable(new.output)) >= 5 and stable(old.output) == stable(new.output)
    # `vfl certs --host` is a DNS name, not a party: no note there
    certs = CliRunner().invoke(main, ["certs", "--out", str(tmp_path / "c"), "--party", "a", "--host", "x.example"])
    assert certs.exit_code == 0 and "is deprecated" not in certs.output


@pytest.mark.slow
def test_cli_defaults_are_train_params_defaults_and_follow_them():
    """The CLI options, the estimators and CompareConfig take their defaults from TrainParams'
    fields: changing one there (in a fresh interpreter) changes all of them."""
    code = (
        "import dataclasses, inspect\n"
        "from vfl.core.params import TrainParams\n"
        "fs = {f.name: f for f in dataclasses.fields(TrainParams)}\n"
        "fs['max_depth'].default = 7; fs['learning_rate'].default = 0.05; fs['mode'].default = 'plain'\n"
        "import cli\n"
        "from vfl.compare import CompareConfig\n"
        "from vfl.estimators import VerticalBoostingClassifier\n"
        "opts = {p.name: p.default for p in cli.simulate.params}\n"
        "act = {p.name: p.default for p in cli.party_active.params}\n"
        "cmp = {p.name: p.default for p in cli.compare.params}\n"
        "est = inspect.signature(VerticalBoostingClassifier).parameters\n"
        "print(opts['depth'], opts['learning_rate'], opts['mode'], act['depth'], cmp['depth'],\n"
        "      cmp['learning_rate'], CompareConfig().max_depth, est['max_depth'].default,\n"
        "      est['learning_rate'].default, est['mode'].default)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["7", "0.05", "plain", "7", "7", "0.05", "7", "7", "0.05", "plain"]


def test_every_shared_option_default_equals_train_params():
    import dataclasses
    import inspect

    import cli
    from vfl.compare import CompareConfig
    from vfl.core.params import TrainParams
    from vfl.estimators import VerticalBoostingRegressor

    fields = {f.name: f.default for f in dataclasses.fields(TrainParams)}
    for command in (cli.simulate, cli.party_active):
        opts = {cli._OPTION_FIELDS.get(p.name, p.name): p.default for p in command.params}
        shared = set(opts) & set(fields) - {"objective"}          # simulate: the data set's task
        assert len(shared) >= 20
        assert {k: opts[k] for k in shared} == {k: fields[k] for k in shared}
    assert {p.name: p.default for p in cli.party_active.params}["objective"] == fields["objective"]
    est = inspect.signature(VerticalBoostingRegressor).parameters
    assert all(est[k].default == fields[k] for k in set(est) & set(fields) - {"objective"})
    cfg = CompareConfig()
    assert [cfg.n_estimators, cfg.max_depth, cfg.learning_rate, cfg.max_bin] == \
        [fields["n_estimators"], fields["max_depth"], fields["learning_rate"], fields["max_bin"]]


def test_train_params_from_options_is_the_one_builder():
    import cli
    from vfl.core.params import TrainParams

    ctx = cli.simulate.make_context("simulate", ["--rounds", "3", "--depth", "2", "--mode", "dp", "--epsilon", "2",
                                                 "--goss", "--objective", "regression"])
    options = {k: v for k, v in ctx.params.items() if k in {p.name for p in cli.party_active.params}
               and k not in ("name", "data", "id_col", "label_col", "peer_specs", "model_dir", "resume", "warm_start",
                             "force", "timeout", "connect_timeout", "output_json", "quiet", "validation_data",
                             "tls_dir", "insecure", "token_file", "max_message_mb", "log_level", "link_mbps",
                             "dask_scheduler", "dask_tls_dir", "dask_insecure")}
    params = cli.train_params_from_options(options)
    assert params == TrainParams(n_estimators=3, max_depth=2, mode="dp", epsilon=2.0, goss=True,
                                 objective="regression")


def test_cli_choices_are_the_library_vocabulary():
    import cli
    from vfl.core.params import ALIGNMENTS, MODES, OBJECTIVES, PREDICTIONS, Alignment, Mode, Prediction

    choices = {p.name: tuple(p.type.choices) for p in cli.simulate.params if hasattr(p.type, "choices")}
    assert choices["mode"] == MODES == tuple(m.value for m in Mode) == ("he", "plain", "dp")
    assert choices["align"] == ALIGNMENTS == ("hash", "psi") and Alignment.PSI == "psi"
    assert choices["prediction"] == PREDICTIONS == ("one-round", "node") and Prediction.NODE == "node"
    assert choices["objective"] == OBJECTIVES
    assert Mode.HE == "he" and str(Mode.DP) == "dp" and json.dumps({"mode": Mode.HE}) == '{"mode": "he"}'


def test_the_group_translates_library_errors_and_shows_a_weak_key_once():
    import warnings

    import click

    import cli
    from crypto.keys import WeakKeyWarning
    from datasets.errors import InputError, PeerError, ProtocolError

    group = cli.VFLGroup("vfl")

    @group.command()
    @click.argument("kind")
    def boom(kind):
        for _ in range(3):
            warnings.warn("1024-bit keys are weak", WeakKeyWarning)
        raise {"input": InputError, "peer": PeerError, "protocol": ProtocolError, "os": OSError}[kind](f"bad {kind}")

    for kind in ("input", "peer", "protocol", "os"):
        res = CliRunner().invoke(group, ["boom", kind])
        assert res.exit_code == 1 and res.output.endswith(f"Error: bad {kind}\n"), res.output
        assert res.output.count("warning: 1024-bit keys are weak") == 1
    res = CliRunner().invoke(group, ["boom", "other"])
    assert isinstance(res.exception, KeyError)                  # not a library error: not translated


def test_one_byte_formatter():
    from protocols.units import format_bytes

    assert [format_bytes(n) for n in (0, 1023, 1024, 1536, 5 * 2 ** 20, 3 * 2 ** 30, 2 ** 50)] == \
        ["0 B", "1023 B", "1.0 KiB", "1.5 KiB", "5.0 MiB", "3.0 GiB", "1048576.0 GiB"]
