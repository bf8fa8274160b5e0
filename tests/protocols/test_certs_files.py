"""Private keys are written through the atomic writer: 0600 from the start, a fresh O_EXCL
temporary file, no link followed (issue 10 #8)."""
from __future__ import annotations

import os
import stat

import pytest

pytest.importorskip("cryptography")

from protocols.certs import make_certs  # noqa: E402


def _mode(p):
    return stat.S_IMODE(os.stat(p).st_mode)


def test_pre_created_tmp_files_and_links_do_not_leak_the_keys(tmp_path):
    out = tmp_path / "pki"
    out.mkdir()
    # an attacker's world-readable NAME.key.tmp, and a link NAME.key.tmp -> a file they can read
    (out / "ca.key.tmp").write_text("")
    os.chmod(out / "ca.key.tmp", 0o666)
    stolen = tmp_path / "stolen"
    stolen.write_text("")
    os.chmod(stolen, 0o666)
    (out / "bank.key.tmp").symlink_to(stolen)
    make_certs(out, ["bank", "shop"])
    for key in ("ca.key", "bank.key", "shop.key"):
        assert _mode(out / key) == 0o600 and not (out / key).is_symlink()
        assert (out / key).read_text().startswith("-----BEGIN PRIVATE KEY-----")
    assert stolen.read_text() == "" and (out / "ca.key.tmp").read_text() == ""
    assert _mode(out / "bank.pem") == 0o644
    assert not [p.name for p in out.iterdir() if p.name.startswith(".")]


def test_overwriting_a_key_that_is_a_link_replaces_the_link(tmp_path):
    out = tmp_path / "pki"
    make_certs(out, ["bank"])
    target = tmp_path / "target"
    target.write_text("keep")
    (out / "bank.key").unlink()
    (out / "bank.key").symlink_to(target)
    make_certs(out, ["bank"], overwrite=True)
    assert target.read_text() == "keep" and not (out / "bank.key").is_symlink()
    assert _mode(out / "bank.key") == 0o600
