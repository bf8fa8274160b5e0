"""`vfl report` (issue 34): one self-contained HTML page (every section with its heading and its
figures, inline CSS and base64 PNGs, nothing fetched), or JSON; written 0644 and atomically; clear
errors for an unfinished model and bad inputs; and the page opens in a real headless browser
(Debian's chromium, installed by .ci/run where apt is available)."""
from __future__ import annotations

import base64
import io
import json
import os
import shutil
import stat
import subprocess
from html.parser import HTMLParser

import pytest
from click.testing import CliRunner
from credit_support import credit_frames
from hypothesis import given, settings
from hypothesis import strategies as st

from cli import main
from datasets.errors import InputError
from vfl.api import ActiveParty, Federation, PassiveParty, TrainParams
from vfl.commands.report_doc import SECTIONS, read_scores

#: the figures each section shows (the others are tables and text)
FIGURES = {"metrics": 4, "importance": 1, "iv": 1, "explanations": 1, "drift": 1}


def _run(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A simulated credit model with its evaluation run (per segment, with drift), an IV and an
    explanations file."""
    d = tmp_path_factory.mktemp("report")
    bank, bureau = credit_frames(600)
    bank.drop(columns="w").to_csv(d / "bank.csv", index=False)
    bureau.to_csv(d / "bureau.csv", index=False)
    r = _run("simulate", "--active", d / "bank.csv", "--passive", d / "bureau.csv", "--mode", "plain", "--rounds", 3,
             "--depth", 3, "--quiet", "--segment", "segment", "--drift", "--save-model", d / "model",
             "--output-json", d / "run.json")
    assert r.exit_code == 0, r.output
    (d / "iv.json").write_text(json.dumps({"passive1": {"days_late": 0.41, "education": 0.12},
                                           "active": {"income": 0.33}}))
    (d / "expl.json").write_text(json.dumps({"global": {"active": {"income": 0.2, "segment": 0.05},
                                                        "passive1": {"days_late": 0.3}}}))
    return d


def _report(d, out, *extra):
    r = _run("report", "--model-dir", d / "model", "--evaluation", d / "run.json", "--iv", d / "iv.json",
             "--explanations", d / "expl.json", "--out", out, *extra)
    assert r.exit_code == 0, r.output
    return out


class Page(HTMLParser):
    """Each <section id>'s heading and images, and every external reference of the page."""

    def __init__(self):
        super().__init__()
        self.sections, self.current, self.in_h2, self.external, self.tags = {}, None, False, [], set()

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        self.tags.add(tag)
        if tag == "section":
            self.current = a.get("id")
            self.sections[self.current] = {"heading": "", "images": []}
        elif tag == "h2":
            self.in_h2 = True
        elif tag == "img" and self.current:
            self.sections[self.current]["images"].append(a.get("src", ""))
        for key in ("src", "href"):
            v = a.get(key) or ""
            if v and not v.startswith(("data:", "#")):
                self.external.append(v)

    def handle_endtag(self, tag):
        if tag == "h2":
            self.in_h2 = False
        elif tag == "section":
            self.current = None

    def handle_data(self, data):
        if self.in_h2 and self.current:
            self.sections[self.current]["heading"] += data


def test_every_section_has_its_heading_and_figures(trained, tmp_path):
    out = _report(trained, tmp_path / "report.html")
    assert stat.S_IMODE(os.stat(out).st_mode) == 0o644             # shareable
    page = Page()
    page.feed(out.read_text())
    assert [s for s in page.sections] == [i for i, _ in SECTIONS]
    for sid, heading in SECTIONS:
        assert page.sections[sid]["heading"] == heading
        images = page.sections[sid]["images"]
        assert len(images) == FIGURES.get(sid, 0), sid
        for src in images:                  # each an inline PNG that decodes
            assert src.startswith("data:image/png;base64,")
            png = base64.b64decode(src.split(",", 1)[1])
            plt_image = pytest.importorskip("matplotlib.image").imread(io.BytesIO(png), format="png")
            assert plt_image.shape[0] > 100 and plt_image.shape[1] > 100
    assert page.external == [] and not {"script", "link", "iframe"} & page.tags     # opens offline
    text = out.read_text()
    for expected in ("KS threshold", "Gini", "cum. capture", "Calibration bins", "Per segment (segment)",
                     "region_north_Z3", "days_late", "0.4100", "Training counts in the model file: kept",
                     "what each party learned".lower()):
        assert expected.lower() in text.lower(), expected


def test_json_format_and_the_html_say_the_same(trained, tmp_path):
    doc = json.loads(_report(trained, tmp_path / "r.json", "--format", "json").read_text())
    run = json.loads((trained / "run.json").read_text())
    assert doc["metrics"] == run["credit"] and doc["drift"] == run["drift"]
    assert doc["headline"]["ks"] == run["credit"]["overall"]["ks"]
    assert doc["iv"]["passive1"]["days_late"] == 0.41
    assert doc["explanations"]["passive1"] == {"days_late": 0.3}
    assert doc["features"]["passive1"]["features"] == ["education", "days_late"]     # the simulation saved both
    assert doc["privacy"]["mode"] == "plain" and "drift" in doc["privacy"]["learned"]
    assert stat.S_IMODE(os.stat(tmp_path / "r.json").st_mode) == 0o644


def test_without_an_evaluation_every_section_still_shows(trained, tmp_path):
    r = _run("report", "--model-dir", trained / "model", "--out", tmp_path / "bare.html")
    assert r.exit_code == 0, r.output
    page = Page()
    page.feed((tmp_path / "bare.html").read_text())
    assert list(page.sections) == [i for i, _ in SECTIONS]
    assert "No evaluation run given" in (tmp_path / "bare.html").read_text()


@pytest.mark.parametrize("setup, args, message", [
    (lambda d, t: (t / "m").mkdir() or (t / "m" / "checkpoint.json").write_text("{}"),
     ["--model-dir", "{t}/m"], "holds only an unfinished training"),
    (lambda d, t: None, ["--model-dir", "{t}/absent"], "does not exist"),
    (lambda d, t: (t / "e.json").write_text(json.dumps({"n_rows": 3})),
     ["--model-dir", "{d}/model", "--evaluation", "{t}/e.json"], "holds no credit metrics"),
    (lambda d, t: (t / "iv.json").write_text(json.dumps({"p": {"f": "high"}})),
     ["--model-dir", "{d}/model", "--iv", "{t}/iv.json"], "feature 'f': 'high' is not a finite number"),
    (lambda d, t: (t / "x.json").write_text("{not json"),
     ["--model-dir", "{d}/model", "--explanations", "{t}/x.json"], "explanations file"),
    (lambda d, t: (t / "dr.json").write_text(json.dumps({"n_rows": 3})),
     ["--model-dir", "{d}/model", "--drift", "{t}/dr.json"], "no drift report in it"),
])
def test_bad_input_is_a_clear_error(trained, tmp_path, setup, args, message):
    setup(trained, tmp_path)
    r = _run("report", *[a.format(d=trained, t=tmp_path) for a in args], "--out", tmp_path / "r.html")
    assert r.exit_code == 1 and message in r.output and "Traceback" not in r.output, r.output
    assert not (tmp_path / "r.html").exists()


def _chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.mark.slow
def test_the_report_opens_in_a_headless_browser(trained, tmp_path):
    browser = _chromium()
    if browser is None:
        pytest.skip("no chromium binary: install Debian's chromium package (apt-get install chromium; .ci/run does "
                    "where apt is available)")
    out = _report(trained, tmp_path / "report.html")
    shot = tmp_path / "shot.png"
    base = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--hide-scrollbars",
            f"--user-data-dir={tmp_path / 'profile'}", "--host-resolver-rules=MAP * ~NOTFOUND",
            "--enable-logging=stderr", "--v=0"]
    r = subprocess.run(base + [f"--screenshot={shot}", "--window-size=1280,5000", out.as_uri()],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    console = [line for line in r.stderr.splitlines() if "CONSOLE" in line or "ERR_" in line]
    assert console == [], console            # no console message, no failed load
    png = shot.read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    image = pytest.importorskip("matplotlib.image").imread(io.BytesIO(png), format="png")
    assert image.shape[:2] == (5000, 1280)
    assert image[:, :, :3].std() > 0.05             # not a blank page
    dom = subprocess.run(base + ["--dump-dom", out.as_uri()], capture_output=True, text=True, timeout=120)
    assert dom.returncode == 0, dom.stderr
    page = Page()
    page.feed(dom.stdout)
    assert list(page.sections) == [i for i, _ in SECTIONS]     # the browser's DOM shows every section
    assert sum(len(s["images"]) for s in page.sections.values()) == sum(FIGURES.values())


@pytest.mark.parametrize("objective, metric_figures", [("multiclass", 4), ("regression", 1)])
def test_multiclass_and_regression_reports(tmp_path, objective, metric_figures):
    bank, bureau = credit_frames(400)
    bank = bank.drop(columns="w")
    if objective == "multiclass":
        bank = bank.assign(y=bank["segment"]).drop(columns="segment")
    else:
        bank = bank.assign(y=bank["income"]).drop(columns="income")
    fed = Federation(ActiveParty("bank", bank), [PassiveParty("bureau", bureau)])
    fed.fit(TrainParams(mode="plain", n_estimators=2, max_depth=2, objective=objective))
    ev = fed.evaluate({"bank": bank, "bureau": bureau}, "y", drift=True)
    fed.save(tmp_path / "model")
    (tmp_path / "run.json").write_text(json.dumps(ev))
    r = _run("report", "--model-dir", tmp_path / "model", "--evaluation", tmp_path / "run.json",
             "--out", tmp_path / "r.html")
    assert r.exit_code == 0, r.output
    page = Page()
    page.feed((tmp_path / "r.html").read_text())
    assert list(page.sections) == [i for i, _ in SECTIONS]
    assert len(page.sections["metrics"]["images"]) == metric_figures
    assert len(page.sections["drift"]["images"]) == 1
    if objective == "multiclass":
        assert set(ev["credit"]["overall"]["per_class"]) == set(bank["y"])
        assert "class region_east_Z3 (one vs rest)" in (tmp_path / "r.html").read_text()
    else:
        assert "Deciles of the prediction" in (tmp_path / "r.html").read_text()


def test_privacy_section_with_dp_epsilon_and_the_ledger(tmp_path):
    r = _run("simulate", "--dataset", "breast_cancer", "--mode", "dp", "--epsilon", 4, "--rounds", 2, "--depth", 2,
             "--quiet", "--dp-ledger-dir", tmp_path / "ledgers", "--save-model", tmp_path / "model",
             "--output-json", tmp_path / "run.json")
    assert r.exit_code == 0, r.output
    ledger = tmp_path / "ledgers" / "passive1.dp-ledger.json"
    _run("report", "--model-dir", tmp_path / "model", "--evaluation", tmp_path / "run.json", "--dp-ledger", ledger,
         "--out", tmp_path / "r.json", "--format", "json")
    doc = json.loads((tmp_path / "r.json").read_text())
    run = json.loads((tmp_path / "run.json").read_text())
    assert doc["privacy"]["mode"] == "dp" and doc["privacy"]["epsilon_per_party"] == run["epsilon_per_party"]
    (spent,) = doc["privacy"]["ledgers"][str(ledger)].values()
    assert spent["epsilon"] == pytest.approx(4.0) and spent["entries"] >= 1
    assert "locally differentially private release" in doc["privacy"]["learned"]["active party"]
    _report_html = _run("report", "--model-dir", tmp_path / "model", "--evaluation", tmp_path / "run.json",
                        "--dp-ledger", ledger, "--out", tmp_path / "r.html")
    assert _report_html.exit_code == 0, _report_html.output
    html = (tmp_path / "r.html").read_text()
    assert "DP epsilon per passive party" in html and str(ledger) in html


@settings(max_examples=100, deadline=None)
@given(st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=4),
                    lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=6), c, max_size=3),
                    max_leaves=15))
def test_iv_and_explanation_files_are_read_or_refused_clearly(tmp_path_factory, value):
    path = tmp_path_factory.mktemp("scores") / "s.json"
    path.write_text(json.dumps(value))
    try:
        scores = read_scores(path, "IV file")
    except InputError as exc:
        assert str(exc).startswith("IV file")
        return
    assert all(isinstance(v, float) for feats in scores.values() for v in feats.values())
