"""`vfl certs` / load_party_tls refusals in process, each before a key is generated or a file
written: duplicate, reserved or cross-party names, bad --days, an --out that is a file, a damaged
CA, a party certificate that is not PEM."""
import pytest

pytest.importorskip("cryptography")

from protocols.certs import load_party_tls, make_certs  # noqa: E402
from vfl.core.errors import InputError  # noqa: E402


@pytest.mark.parametrize("parties, kwargs, message", [
    ([], {}, "give at least one --party NAME"),
    (["bank", "bank"], {}, r"party names must be unique, got \['bank', 'bank'\]"),
    (["bank", "ca"], {}, "'ca' is reserved for the CA's own files"),
    (["bank"], {"days": 0}, "--days must be at least 1 and at most 36500 .100 years., got 0"),
    (["bank", "telco"], {"hosts": ("telco",)}, "host 'telco' for the certificate of party 'bank' is the name of "
                                               "party 'telco'"),
    (["bank", "telco"], {"party_hosts": {"telco": ("bank",)}}, "host 'bank' for the certificate of party 'telco'"),
    (["bad name"], {}, "bad name"),
])
def test_refused_before_anything_is_written(tmp_path, parties, kwargs, message):
    with pytest.raises(InputError, match=message):
        make_certs(tmp_path / "out", parties, **kwargs)
    assert not (tmp_path / "out").exists()


def test_out_must_be_a_directory(tmp_path):
    (tmp_path / "out").write_text("x")
    with pytest.raises(InputError, match=f"{tmp_path / 'out'} exists and is not a directory"):
        make_certs(tmp_path / "out", ["bank"])


def test_a_damaged_ca_is_named(tmp_path):
    (tmp_path / "ca.pem").write_text("not a certificate")
    (tmp_path / "ca.key").write_text("not a key")
    with pytest.raises(InputError, match=f"cannot read the CA in {tmp_path} \\(ca.pem, ca.key\\)"):
        make_certs(tmp_path, ["bank"])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ca.key", "ca.pem"]


def test_a_party_certificate_that_is_not_pem_is_named(tmp_path):
    for name in ("ca.pem", "bank.pem", "bank.key"):
        (tmp_path / name).write_text("garbage")
    with pytest.raises(InputError, match=f"{tmp_path / 'bank.pem'} is not a PEM certificate"):
        load_party_tls(tmp_path, "bank")
