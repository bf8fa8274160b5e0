"""Feature importance: split count and total gain; the active party's view (passive
features only as (party, record)), each passive party's own named importance."""
import json

import numpy as np
import pandas as pd
import pytest

from protocols import messages as m
from protocols.serialization import loads
from vfl.api import ActiveParty, Federation, PassiveParty
from vfl.core.errors import InputError


def federation(n=300, seed=0, record=True):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 5))
    y = (2 * X[:, 2] + 0.7 * X[:, 0] + 0.3 * rng.normal(size=n) > 0).astype(int)   # b0 matters most
    ids = np.arange(n)
    a = pd.DataFrame({"id": ids, "y": y, "a0": X[:, 0], "a1": X[:, 1]})
    b = pd.DataFrame({"id": ids, "b0": X[:, 2], "b1": X[:, 3]})
    c = pd.DataFrame({"id": ids, "c0": X[:, 4]})
    fed = Federation(ActiveParty("a", a), [PassiveParty("b", b), PassiveParty("c", c)], record=record)
    fed.fit(mode="plain", n_estimators=5, max_depth=3)
    return fed


def split_nodes(model):
    return [n for rnd in model.rounds for t in rnd for n in t.nodes if not n.is_leaf]


def test_active_view_counts_every_split_and_hides_passive_features():
    fed = federation()
    model = fed.model
    nodes = split_nodes(model)
    imp = model.feature_importance("split")
    assert set(imp["features"]) == {"a0", "a1"} and set(imp["parties"]) == {"b", "c"}
    total = sum(imp["features"].values()) + sum(p["total"] for p in imp["parties"].values())
    assert total == len(nodes)
    gain = model.feature_importance("gain")
    assert sum(gain["features"].values()) + sum(p["total"] for p in gain["parties"].values()) == \
        pytest.approx(sum(n.gain for n in nodes))
    for party, entry in gain["parties"].items():
        mine = {n.record_id: n.gain for n in nodes if n.owner == party}
        assert entry["records"] == pytest.approx(mine)          # opaque (party, record) references
    assert "b0" not in json.dumps(imp) + json.dumps(gain)        # no passive feature name at all


def test_passive_party_reports_its_own_named_split_counts():
    fed = federation()
    active = fed.model.feature_importance("split")
    for name, party in fed.passives.items():
        own = party.feature_importance("split")
        assert set(own) == set(party.feature_names)
        assert sum(own.values()) == active["parties"][name]["total"] == len(party.records)
    assert max(fed.passives["b"].feature_importance("split"), key=fed.passives["b"].feature_importance("split").get) \
        == "b0"


def test_gain_importance_needs_the_active_party_to_share_gains():
    fed = federation()
    with pytest.raises(InputError, match=r"party 'b' does not know the gains of its splits"):
        fed.passives["b"].feature_importance("gain")
    assert not any(isinstance(loads(f), m.SplitGains) for _, _, f in fed.transport.log)   # opt-in only
    counts = fed.share_split_gains()
    msgs = {r: loads(f) for _, r, f in fed.transport.log if isinstance(loads(f), m.SplitGains)}
    assert set(msgs) == {"b", "c"}
    active = fed.model.feature_importance("gain")
    for name, party in fed.passives.items():
        assert counts[name] == len(party.records) == len(msgs[name].record_ids)
        own = party.feature_importance("gain")
        assert sum(own.values()) == pytest.approx(active["parties"][name]["total"])
        assert {int(r): g for r, g in zip(msgs[name].record_ids, msgs[name].gains)} == \
            pytest.approx(active["parties"][name]["records"])


def test_combined_importance_ranks_the_informative_feature_first():
    fed = federation()
    imp = fed.feature_importance("gain", share_gains=True)
    assert list(imp) == ["a:a0", "a:a1", "b:b0", "b:b1", "c:c0"]
    assert max(imp, key=imp.get) == "b:b0"
    assert imp["b:b0"] > imp["a:a0"] > imp["c:c0"]


def test_combined_importance_shares_nothing_by_default():
    """Issue 37: the default (split counts) sends no message; gain without consent is refused
    before anything is sent, and names one party's columns apart from another's of that name."""
    fed = federation()
    sent = len(fed.transport.log)
    imp = fed.feature_importance()
    assert len(fed.transport.log) == sent
    assert sum(imp.values()) == len(split_nodes(fed.model))
    with pytest.raises(InputError, match=r"party\(ies\) \['b', 'c'\] do not know.*share_gains=True"):
        fed.feature_importance("gain")
    assert len(fed.transport.log) == sent
    fed.feature_importance("gain", share_gains=True)

    def shared():
        return [r for _, r, f in fed.transport.log if isinstance(loads(f), m.SplitGains)]
    assert sorted(shared()) == ["b", "c"]               # one SplitGains per passive party
    fed.feature_importance("gain")                      # shared once: known from then on
    assert sorted(shared()) == ["b", "c"]


def test_combined_importance_prefixes_names_by_party():
    rng = np.random.default_rng(3)
    X = rng.normal(size=(200, 2))
    ids = np.arange(200)
    a = pd.DataFrame({"id": ids, "y": (X[:, 0] + X[:, 1] > 0).astype(int), "x0": rng.normal(size=200)})
    fed = Federation(ActiveParty("bank", a), [PassiveParty("telco", pd.DataFrame({"id": ids, "x0": X[:, 0]})),
                                              PassiveParty("shop", pd.DataFrame({"id": ids, "x0": X[:, 1]}))])
    fed.fit(mode="plain", n_estimators=3, max_depth=2)
    imp = fed.feature_importance()
    assert set(imp) == {"bank:x0", "telco:x0", "shop:x0"}
    assert imp["telco:x0"] > 0 and imp["shop:x0"] > 0


def test_importance_follows_the_rounds_used_by_prediction():
    fed = federation()
    model = fed.model
    model.best_iteration = 1                      # as if early stopping had picked round 2
    first_two = [n for rnd in model.rounds[:2] for t in rnd for n in t.nodes if not n.is_leaf]
    imp = model.feature_importance("split")
    assert sum(imp["features"].values()) + sum(p["total"] for p in imp["parties"].values()) == len(first_two)
    combined = fed.feature_importance("split")
    assert sum(v for k, v in combined.items() if k.startswith("b:")) == sum(1 for n in first_two if n.owner == "b")


def test_passive_gains_survive_its_model_file(tmp_path):
    fed = federation(record=False)
    fed.share_split_gains()
    fed.save(tmp_path)
    fed2 = Federation.load(tmp_path)
    assert fed2.passives["b"].feature_importance("gain") == pytest.approx(fed.passives["b"].feature_importance("gain"))


def test_bad_importance_kind():
    fed = federation(record=False)
    with pytest.raises(InputError, match=r"importance kind must be 'split' or 'gain', got 'cover'"):
        fed.model.feature_importance("cover")
    with pytest.raises(InputError, match=r"importance kind must be 'split' or 'gain'"):
        fed.passives["b"].feature_importance("weight")
    with pytest.raises(InputError, match=r"importance kind must be 'split' or 'gain', got 'cover'"):
        fed.feature_importance("cover")
    with pytest.raises(InputError, match=r"has no trained model"):
        PassiveParty("z", pd.DataFrame({"id": [1], "f": [1.0]})).feature_importance("split")
