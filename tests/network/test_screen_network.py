"""`vfl screen` against running passive servers (issue 33): the federation file's screen list grants
it (deny by default), the result equals the in-memory screening, the passive server keeps serving."""
from __future__ import annotations

import json
import socket
import subprocess
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from support import cli_command, start_passive

from vfl.api import ActiveParty, Federation, PassiveParty

pytestmark = pytest.mark.slow   # real party processes
pytest.importorskip("grpc")

ROOT = Path(__file__).resolve().parents[2]

FEDERATION = """
[federation]
active = "bank"

[parties.bank]

[parties.telco]
address = "127.0.0.1:1"
{grant}
"""


def _tables(tmp_path, n=400):
    rng = np.random.default_rng(3)
    x = rng.normal(size=(n, 3))
    y = (rng.random(n) < 1 / (1 + np.exp(-2 * x[:, 0]))).astype(int)
    bank = pd.DataFrame({"id": np.arange(n), "y": y, "a0": x[:, 2]})
    telco = pd.DataFrame({"id": np.arange(n)[::-1], "t0": x[::-1, 0], "t1": x[::-1, 1]})
    bank.to_csv(tmp_path / "bank.csv", index=False)
    telco.to_csv(tmp_path / "telco.csv", index=False)
    return bank, telco


def _screen(tmp_path, addr, fed, *extra):
    return subprocess.run(cli_command("screen", "--data", tmp_path / "bank.csv", "--federation", fed,
                                      "--peer", f"telco={addr}", "--insecure", "--mode", "he", "--key-bits", 1024,
                                      "--out-dir", tmp_path / "out", "--no-plot", *extra),
                          cwd=ROOT, capture_output=True, text=True, timeout=180)


def test_screening_over_the_network_is_granted_by_the_federation_file(tmp_path, children):
    bank, telco = _tables(tmp_path)
    fed = tmp_path / "fed.toml"
    fed.write_text(FEDERATION.format(grant='screen = ["bank"]'))
    addr = start_passive(children, tmp_path, "telco", "--data", tmp_path / "telco.csv", "--model-dir",
                         tmp_path / "m", "--insecure", "--federation", fed)
    r = _screen(tmp_path, addr, fed, "--monotone")
    assert r.returncode == 0, r.stderr
    doc = json.loads((tmp_path / "out" / "screening.json").read_text())
    assert [f["feature"] for f in doc["features"]] == ["a0", "#0", "#1"]      # passive names stay at home
    t = PassiveParty("telco", telco)
    t.screen_allowed = True
    ref = Federation(ActiveParty("bank", bank), [t]).screen(mode="plain", monotone=True)
    for got, want in zip(doc["features"], ref.features):
        assert abs(got["iv"] - want.iv) < 1e-9
    assert "IV" in r.stdout and "telco:#0" in r.stdout
    assert not list((tmp_path / "m").glob("*.json"))          # a screening writes no model file
    # the server serves a second screening (the session was closed)
    r = _screen(tmp_path, addr, fed)
    assert r.returncode == 0, r.stderr
    # --min-iv: the training screens first and the passive server trains on the position it keeps
    r = subprocess.run(cli_command("party", "active", "--data", tmp_path / "bank.csv", "--federation", fed,
                                   "--peer", f"telco={addr}", "--insecure", "--mode", "plain", "--rounds", 2,
                                   "--quiet", "--model-dir", tmp_path / "ma", "--min-iv", 0.5),
                       cwd=ROOT, capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stderr
    (model,) = list((tmp_path / "m").glob("*.json"))
    assert json.loads(model.read_text())["features"] == ["t0"]


def test_a_party_that_grants_nothing_refuses(tmp_path, children):
    _tables(tmp_path, 100)
    fed = tmp_path / "fed.toml"
    fed.write_text(FEDERATION.format(grant=""))
    addr = start_passive(children, tmp_path, "telco", "--data", tmp_path / "telco.csv", "--model-dir",
                         tmp_path / "m", "--insecure", "--federation", fed)
    r = _screen(tmp_path, addr, fed)
    assert r.returncode != 0
    assert "rule 'who may screen'" in r.stderr and "Traceback" not in r.stderr


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_over_mutual_tls_only_the_parties_in_the_screen_list_screen(tmp_path, children):
    pytest.importorskip("cryptography")
    _tables(tmp_path, 150)
    port = _free_port()
    fed = tmp_path / "fed.toml"
    fed.write_text('[federation]\nactive = "bank"\n\n[parties.bank]\n\n[parties.shop]\naddress = "127.0.0.1:1"\n\n'
                   f'[parties.telco]\naddress = "127.0.0.1:{port}"\nhosts = ["127.0.0.1"]\n'
                   'train = ["bank", "shop"]\nscreen = ["bank"]\n')
    certs = tmp_path / "certs"
    r = subprocess.run(cli_command("certs", "--out", certs, "--federation", fed), cwd=ROOT, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    err = open(tmp_path / "telco.err", "w")
    p = subprocess.Popen(cli_command("party", "passive", "--name", "telco", "--listen", f"127.0.0.1:{port}", "--data",
                                     tmp_path / "telco.csv", "--model-dir", tmp_path / "m", "--federation", fed,
                                     "--tls-dir", certs), cwd=ROOT, stdout=subprocess.PIPE, stderr=err, text=True)
    children.append(p)
    assert "listening on" in p.stdout.readline(), (tmp_path / "telco.err").read_text()
    r = subprocess.run(cli_command("screen", "--federation", fed, "--peer", f"telco=127.0.0.1:{port}", "--data",
                                   tmp_path / "bank.csv", "--tls-dir", certs, "--mode", "he", "--key-bits", 1024),
                       cwd=ROOT, capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stderr
    assert "telco:#0: IV" in r.stdout
    r = subprocess.run(cli_command("screen", "--name", "shop", "--peer", f"telco=127.0.0.1:{port}", "--data",
                                   tmp_path / "bank.csv", "--tls-dir", certs, "--mode", "plain"),
                       cwd=ROOT, capture_output=True, text=True, timeout=180)
    assert r.returncode == 1 and "refuses to screen its features for 'shop'" in r.stderr, r.stderr
    err.close()
