"""The federation file's drift key (issue 34): how a passive party answers drift requests; a party's
own --drift-answers and its entry combine to the stricter."""
import pytest

from parties.federation import FederationError, load_federation, stricter_drift

BASE = """
[federation]
active = "bank"

[parties.bank]

[parties.telco]
address = "127.0.0.1:5000"
"""


def _load(tmp_path, extra_telco="", extra_bank=""):
    text = BASE.replace("[parties.bank]\n", "[parties.bank]\n" + extra_bank)
    p = tmp_path / "federation.toml"
    p.write_text(text + extra_telco)
    return load_federation(p)


def test_the_drift_key(tmp_path):
    assert _load(tmp_path).party("telco").drift == "positions"          # the default shares no names
    for policy in ("names", "positions", "decline"):
        assert _load(tmp_path, f'drift = "{policy}"\n').party("telco").drift == policy
    with pytest.raises(FederationError, match=r"\[parties.telco\] drift: expected one of positions, names, decline"):
        _load(tmp_path, 'drift = "all"\n')
    with pytest.raises(FederationError, match=r"\[parties.bank\] drift: the active party answers no drift"):
        _load(tmp_path, extra_bank='drift = "names"\n')


@pytest.mark.parametrize("a, b, stricter", [("names", "positions", "positions"), ("names", "decline", "decline"),
                                            ("positions", "decline", "decline"), ("names", "names", "names")])
def test_the_stricter_policy_wins(a, b, stricter):
    assert stricter_drift(a, b) == stricter_drift(b, a) == stricter
