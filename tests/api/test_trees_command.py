"""`vfl trees MODEL_DIR` (issue 37, item 9): the trees as the active party sees them (passive
splits as party:record#k, none of the passive party's feature names or thresholds) and a
passive party's own view (its records, thresholds included)."""
import re
import stat

import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner

from cli import main
from vfl.api import ActiveParty, Federation, PassiveParty


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    rng = np.random.default_rng(0)
    ids = np.arange(300)
    X = rng.normal(size=(300, 4))
    a = pd.DataFrame({"id": ids, "y": (X[:, 0] + X[:, 1] - X[:, 2] > 0).astype(int), "age": X[:, 0]})
    fed = Federation(ActiveParty("bank", a),
                     [PassiveParty("telco", pd.DataFrame({"id": ids, "calls_secret": X[:, 1]})),
                      PassiveParty("shop", pd.DataFrame({"id": ids, "spend_secret": X[:, 2], "z": X[:, 3]}))])
    fed.fit(mode="plain", n_estimators=3, max_depth=2)
    d = tmp_path_factory.mktemp("model")
    fed.save(d)
    return fed, d


def run(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def test_the_active_view_names_passive_splits_by_record_only(saved, tmp_path):
    fed, d = saved
    r = run("trees", d, "--out", tmp_path / "out")
    assert r.exit_code == 0, r.output
    text = r.stdout
    nodes = [n for rnd in fed.model.rounds for t in rnd for n in t.nodes if not n.is_leaf]
    passive = {f"{n.owner}:record#{n.record_id}" for n in nodes if n.owner != "bank"}
    assert passive and passive == set(re.findall(r"\w+:record#\d+", text))
    assert "secret" not in text                                   # no passive feature name
    thresholds = [r["threshold"] for p in fed.passives.values() for r in p.records]
    assert not any(f"{t:.6g}" in text for t in thresholds)        # and no passive threshold
    for n in nodes:
        if n.owner == "bank":
            assert f"age <= {n.threshold:.6g}" in text
    assert text.count("round ") == 3 and text.count("leaf ") == sum(len(t.leaves()) for rnd in fed.model.rounds
                                                                     for t in rnd)
    pngs = sorted((tmp_path / "out").glob("tree_r*.png"))
    assert [p.name for p in pngs] == ["tree_r1.png", "tree_r2.png", "tree_r3.png"]
    for f in [*pngs, tmp_path / "out" / "trees.txt"]:
        assert stat.S_IMODE(f.stat().st_mode) == 0o644
        assert f.read_bytes()[:4] in (b"\x89PNG", b"mode")


def test_a_passive_party_sees_its_own_thresholds(saved):
    fed, d = saved
    r = run("trees", d, "--party", "telco")
    assert r.exit_code == 0, r.output
    records = fed.passives["telco"].records
    lines = [ln for ln in r.stdout.splitlines() if ln.strip().startswith("record#")]
    assert len(lines) == len(records)
    for line, rec in zip(lines, records):
        assert line.strip().startswith(f"record#{rec['record_id']}: calls_secret <= {rec['threshold']:.6g}")
    assert "spend_secret" not in r.stdout                       # only its own


@pytest.mark.parametrize("args, msg", [
    (["--party", "nobody"], "no model file of passive party 'nobody'"),
    (["--model-id", "x"], "--model-id goes with --party"),
])
def test_trees_errors(saved, args, msg):
    _, d = saved
    r = run("trees", d, *args)
    assert r.exit_code != 0 and msg in r.output and "Traceback" not in r.output


def test_trees_of_a_missing_directory(tmp_path):
    r = run("trees", tmp_path / "nope")
    assert r.exit_code == 1 and "does not exist" in r.output
