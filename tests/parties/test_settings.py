"""The environment switches (issue 26, item 5): one object (parties.settings.Settings), parsed
strictly (a bad value names the variable), read once per training by each party, recorded in the
model and in the simulation's JSON; nothing writes os.environ."""
import json
import os

import pytest
from click.testing import CliRunner
from support import KEY_BITS, small_frames

from cli import main
from datasets.errors import InputError
from parties import settings as settings_mod
from parties.settings import ENVIRONMENT, Settings
from vfl.api import ActiveParty, Federation, PassiveParty, TrainParams
from vfl.core.model import BoostedModel


def test_defaults_and_every_accepted_spelling():
    assert Settings.from_environ({}) == Settings(n_jobs=0, overlap=True)
    assert Settings.from_environ({"VFL_N_JOBS": " 3 ", "VFL_OVERLAP": ""}) == Settings(n_jobs=3, overlap=True)
    for word, on in [("1", True), ("TRUE", True), ("on", True), ("yes", True),
                     ("0", False), ("false", False), ("Off", False), ("no", False)]:
        assert Settings.from_environ({"VFL_OVERLAP": word}).overlap is on
    assert Settings.from_environ({"VFL_N_JOBS": "0"}).n_jobs == 0
    assert Settings(n_jobs=4).to_dict() == {"n_jobs": 4, "overlap": True}


@pytest.mark.parametrize("name,value,match", [
    ("VFL_OVERLAP", "disable", r"environment variable VFL_OVERLAP must be one of 1, true, on, yes \(overlap on\) "
                               r"or 0, false, off, no \(off\), got 'disable'"),
    ("VFL_OVERLAP", "2", "VFL_OVERLAP must be one of .* got '2'"),
    ("VFL_N_JOBS", "many", r"environment variable VFL_N_JOBS must be an integer from 0 \(all cores\) to 256, "
                           r"got 'many'"),
    ("VFL_N_JOBS", "-1", "VFL_N_JOBS must be an integer .* got '-1'"),
    ("VFL_N_JOBS", "257", "VFL_N_JOBS must be an integer .* got '257'"),
    ("VFL_N_JOBS", "2.5", "VFL_N_JOBS must be an integer .* got '2.5'"),
])
def test_a_bad_value_is_an_error_naming_the_variable(name, value, match):
    with pytest.raises(InputError, match=match):
        Settings.from_environ({name: value})


def test_a_party_given_n_jobs_overrides_the_environment():
    env = Settings.from_environ({"VFL_N_JOBS": "3", "VFL_OVERLAP": "0"})
    assert env.for_party(None) == env and env.for_party(1) == Settings(n_jobs=1, overlap=False)
    with pytest.raises(InputError, match="n_jobs must be an integer"):
        env.for_party(-2)


def _federation(n=120):
    a, b, c = small_frames(n)
    return Federation(ActiveParty("bank", a, n_jobs=1), [PassiveParty("telco", b), PassiveParty("shop", c)])


def test_read_once_per_training_by_each_party_and_recorded_in_the_model(monkeypatch, tmp_path):
    reads = []
    real = Settings.from_environ.__func__

    def counted(cls, environ=None):
        reads.append(dict(os.environ if environ is None else environ).get("VFL_OVERLAP"))
        return real(cls, environ)

    monkeypatch.setattr(Settings, "from_environ", classmethod(counted))
    monkeypatch.setenv("VFL_OVERLAP", "off")
    monkeypatch.setenv("VFL_N_JOBS", "1")
    fed = _federation()
    model = fed.fit(TrainParams(mode="he", key_bits=KEY_BITS, n_estimators=3, max_depth=2))
    assert reads == ["off"] * 3                      # the active party and each passive party, once
    assert model.settings == {"n_jobs": 1, "overlap": False}
    assert fed.passives["telco"]._state.train.settings == Settings(n_jobs=1, overlap=False)
    path = tmp_path / "model.json"
    model.save(path)
    assert json.loads(path.read_text())["settings"] == {"n_jobs": 1, "overlap": False}
    assert BoostedModel.load(path).settings == {"n_jobs": 1, "overlap": False}


def test_a_damaged_settings_entry_of_a_model_file_is_named(tmp_path):
    fed = _federation()
    model = fed.fit(TrainParams(mode="plain", n_estimators=1, max_depth=1))
    d = model.to_dict() | {"settings": {"n_jobs": [1]}}
    d.pop("content_hash", None)
    with pytest.raises(InputError, match=r"settings.n_jobs"):
        BoostedModel.from_dict(d, "m.json")


def test_the_simulation_records_its_settings_and_the_cli_writes_no_environment(monkeypatch, tmp_path):
    monkeypatch.delenv("VFL_N_JOBS", raising=False)
    monkeypatch.setenv("VFL_OVERLAP", "1")
    before = {k: v for k, v in os.environ.items() if k.startswith("VFL_")}
    out = tmp_path / "run.json"
    result = CliRunner().invoke(main, ["simulate", "--mode", "plain", "--rounds", "1", "--depth", "2",
                                       "--jobs", "1", "--quiet", "--output-json", str(out)])
    assert result.exit_code == 0, result.output
    assert json.loads(out.read_text())["settings"] == {"n_jobs": 1, "overlap": True}
    assert {k: v for k, v in os.environ.items() if k.startswith("VFL_")} == before      # --jobs went to the parties


def test_nothing_in_the_toolkit_writes_the_environment():
    """The variables' names live in one place, and no module assigns os.environ (the malloc
    settings of parties/memory.py excepted: Arrow's allocator is chosen by its variable, before
    pyarrow is imported, for the party process and the workers it starts)."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    writers, readers = [], []
    for package in ("crypto", "protocols", "vfl", "parties", "datasets"):
        for dirpath, _, files in os.walk(os.path.join(root, package)):
            for f in files:
                if f.endswith(".py"):
                    path = os.path.join(dirpath, f)
                    with open(path, encoding="utf-8") as fh:
                        text = fh.read()
                    rel = os.path.relpath(path, root)
                    if "os.environ[" in text or "os.putenv" in text or "os.environ.update" in text:
                        writers.append(rel)
                    if any(f'"{v}"' in text for v in ENVIRONMENT.values()):
                        readers.append(rel)
    with open(os.path.join(root, "cli.py"), encoding="utf-8") as fh:
        assert "os.environ[" not in fh.read()
    assert writers == [os.path.join("parties", "memory.py")]
    assert readers == [os.path.relpath(settings_mod.__file__, root)]
