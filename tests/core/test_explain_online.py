"""Explanations of online scoring (issues 32 and 35): ``vfl serve`` explains from the decisions
scoring gathered (each party's left/right at its own nodes), deriving the passive parties' leaf
masks itself. The reference is the explanations of one-round prediction (``Federation.explanation``)
of the same rows, and the decisions are computed independently from every party's own table."""
import contextlib
import time

import numpy as np
import pytest
from test_explain import OBJECTIVES, _fit, _truth

from datasets.errors import InputError
from parties.online_active import MicroBatcher, ModelVersion, OnlineScorer
from protocols import alignment
from protocols import messages as m
from protocols.serialization import dumps, loads
from vfl.core.explain import explain_decisions, explanation_table, reason_records, unpack_leaf_bits
from vfl.core.flat_trees import FlatTrees
from vfl.core.leafmask import leaf_masks

pytest.importorskip("fastapi")     # vfl.serving (extra serve)
from vfl.serving import ReasonCodes  # noqa: E402


def _decisions(fed, frames, flat: FlatTrees) -> dict:
    """Every party's decisions at its own nodes (FlatTrees order), from the parties' own data."""
    _, _, decide = _truth(fed, frames)
    model = fed.model
    trees = model._flat_trees(None)
    n = len(frames["a"])
    out = {}
    for p, idx in flat.nodes.items():
        cols = []
        for g in idx.tolist():
            t = int(np.searchsorted(flat.offsets, g, side="right") - 1)
            nd = trees[t][1].nodes[g - int(flat.offsets[t])]
            cols.append(np.asarray(decide(t, nd), dtype=bool))
        out[p] = np.stack(cols, axis=1) if cols else np.zeros((n, 0), dtype=bool)
    return out


@pytest.mark.parametrize("categorical", [False, True])
def test_leaf_masks_derived_from_decisions_equal_the_passive_partys_encoding(categorical):
    fed, frames = _fit("binary", categorical=categorical, n_estimators=4, max_depth=3)
    model = fed.model
    flat = FlatTrees(model)
    dec = _decisions(fed, frames, flat)
    for p in model.passives:
        sk = model.skeleton(p)
        want = unpack_leaf_bits(leaf_masks(sk, flat.nodes[p], dec[p]), sk)
        got = flat.leaf_masks(p, dec[p])
        assert got.shape == want.shape and got.shape[1] == int(flat.is_leaf.sum())
        np.testing.assert_array_equal(got, want)
        assert not got.all()            # the masks do exclude leaves
    with pytest.raises(InputError, match="decisions at"):
        flat.leaf_masks("b", dec["b"][:, :-1])


@pytest.mark.parametrize("objective", OBJECTIVES)
def test_explaining_the_decisions_of_scoring_equals_the_explanation_of_one_round_prediction(objective):
    fed, frames = _fit(objective, categorical=True)
    model = fed.model
    flat = FlatTrees(model)
    dec = _decisions(fed, frames, flat)
    raw = flat.raw(dec)
    ids, want = fed.explanation(frames)
    got = explain_decisions(model, flat, dec, raw)
    assert got.players == want.players
    np.testing.assert_allclose(got.values, want.values, rtol=0, atol=1e-12)
    np.testing.assert_array_equal(got.base, want.base)
    np.testing.assert_array_equal(got.margin, want.margin)
    assert got.additivity_error() < 1e-9
    assert np.abs(got.values).max() > 0.01


@pytest.mark.parametrize("objective", OBJECTIVES)
@pytest.mark.parametrize("adverse", ["high", "low"])
def test_served_reasons_equal_the_explanation_tables_reason_codes(objective, adverse):
    """What ``POST /v1/score?explain=true`` answers per applicant (:class:`ReasonCodes`) against
    ``Federation.explain(top=K)`` of the same rows."""
    fed, frames = _fit(objective)
    model = fed.model
    v = ModelVersion(model, "in memory", 0.0)
    v.trees = FlatTrees(model)
    dec = _decisions(fed, frames, v.trees)
    explainer = ReasonCodes(top=2, adverse=adverse)
    explainer.prepare(v)
    served = explainer(v, v.trees.raw(dec), dec)
    table = fed.explain(frames, top=2, adverse=adverse)
    K = model.n_targets
    names = [str(c) for c in model.classes] if K > 1 else [None]
    assert len(served) * K == len(table)
    for i, got in enumerate(served):
        for k, name in enumerate(names):
            row = table.iloc[i * K + k]
            reasons = got["reasons"][name] if K > 1 else got["reasons"]
            base = got["base"][name] if K > 1 else got["base"]
            margin = got["margin"][name] if K > 1 else got["margin"]
            want = [(row[f"reason_{r}"], row[f"reason_{r}_value"]) for r in (1, 2)
                    if isinstance(row[f"reason_{r}"], str)]
            assert [x["player"] for x in reasons] == [w[0] for w in want]
            np.testing.assert_allclose([x["value"] for x in reasons], [w[1] for w in want], rtol=0, atol=1e-9)
            assert all(x["kind"] == ("party" if x["player"] in model.passives else "feature") for x in reasons)
            assert base == pytest.approx(row["base"], abs=1e-12) and margin == pytest.approx(row["margin"], abs=1e-12)
            players = [c for c in table.columns if c in list(model.active_features) + list(model.passives)]
            assert abs(base + float(row[players].sum()) - margin) < 1e-9
    assert any(got["reasons"] for got in served)
    with pytest.raises(InputError, match="explain-top"):
        ReasonCodes(top=0)
    with pytest.raises(InputError, match="adverse"):
        ReasonCodes(adverse="sideways")


def test_an_applicant_unknown_at_a_partner_is_explained_with_the_decisions_it_answered():
    """An applicant a passive party does not know: it answers by its own default (missing-value)
    directions (``serve_decisions`` on a NaN row); the explanation uses exactly those decisions and
    equals that of one-round prediction with that party's features of the applicant missing."""
    fed, frames = _fit("binary")
    model = fed.model
    flat = FlatTrees(model)
    n = len(frames["a"])
    unknown = np.arange(n) % 3 == 0
    missing = dict(frames)
    missing["b"] = frames["b"].copy()
    missing["b"].loc[unknown, [c for c in frames["b"].columns if c != "id"]] = np.nan
    dec = _decisions(fed, frames, flat)
    dec["b"] = np.where(unknown[:, None], _decisions(fed, missing, flat)["b"], dec["b"])
    got = explain_decisions(model, flat, dec, flat.raw(dec))
    _, want = fed.explanation(missing)
    np.testing.assert_allclose(got.values, want.values, rtol=0, atol=1e-12)
    np.testing.assert_array_equal(got.margin, want.margin)
    _, full = fed.explanation(frames)
    assert not np.allclose(got.values[unknown], full.values[unknown])      # the unknown rows did change
    np.testing.assert_allclose(got.values[~unknown], full.values[~unknown], rtol=0, atol=1e-12)


def test_explanation_table_and_records_agree_on_player_names():
    fed, frames = _fit("binary")
    _, ex = fed.explanation(frames)
    recs = reason_records(ex, 4)
    table = explanation_table(ex, np.arange(ex.n_rows), top=4)
    assert [r["player"] for r in recs[0]] == [table.loc[0, f"reason_{j + 1}"] for j in range(len(recs[0]))]


class _RecordingPartners:
    """A transport for :class:`OnlineScorer` whose passive parties answer from their own tables
    (the decisions of :func:`_decisions`), recording every message sent to them as bytes. A
    ``ServeOpen`` is answered like the real passive server does (``passive_online._open``): an
    ``Ack`` carrying the default side of each of the party's nodes, from the party's own plan."""

    def __init__(self, decisions: dict, ids: list, parties: dict):
        self.decisions, self.row = decisions, {h.tobytes(): i for i, h in enumerate(ids)}
        self.parties = parties
        self.sent: list[tuple[str, str, bytes]] = []
        self.peers = {p: "in memory" for p in decisions}

    @contextlib.contextmanager
    def deadline(self, seconds):
        yield

    def reset(self, peer):
        pass

    def call(self, peer, message):
        frame = dumps(message)
        self.sent.append((peer, type(message).__name__, frame))
        message = loads(frame)
        if isinstance(message, m.ServeOpen):
            party = self.parties[peer]
            defaults = "".join("1" if d else "0" for d in party.serve_defaults(party.serve_plan(message)))
            return m.Ack({"default_left": defaults})
        rows = [self.row[h.tobytes()] for h in message.hashes]
        return m.ScoreResponse(np.packbits(self.decisions[peer][rows], axis=1), np.ones(len(rows), dtype=bool))


@pytest.mark.parametrize("objective", ["binary", "multiclass"])
def test_explain_sends_the_passive_parties_the_very_messages_of_plain_scoring(objective):
    """The same ``ScoreRequest`` bytes with and without ``explain``; only the explained request's
    future carries the decisions, and they give ``Federation.explanation``'s values."""
    fed, frames = _fit(objective)
    model = fed.model
    v = ModelVersion(model, "in memory", 0.0)
    v.owners = model.node_owners()
    v.trees = FlatTrees(model)
    for p in v.owners:
        v.skeletons[p] = model.skeleton(p)
        v.channels[p] = f"channel{p}"
    dec = _decisions(fed, frames, v.trees)
    ids = frames["a"]["id"].tolist()[:10]
    X = frames["a"][list(model.active_features)].to_numpy(dtype=np.float64)[:10]
    hashes = alignment.hash_ids(ids, bytes.fromhex(model.salt))
    partners = _RecordingPartners({p: dec[p][:10] for p in v.owners}, list(hashes), fed.passives)
    scorer = OnlineScorer(partners)
    scorer.open_all(v, 10.0)
    batcher = MicroBatcher(scorer, max_rows=64, max_wait=0.0, workers=1)
    try:
        sent = []
        results = []
        for explain in (False, True):
            start = len(partners.sent)
            results.append(batcher.submit(v, ids, X, time.monotonic() + 60, explain=explain).result(timeout=60))
            sent.append(sorted((p, k, f) for p, k, f in partners.sent[start:]))
    finally:
        batcher.close()
    assert sent[0] == sent[1] and {k for _, k, _ in sent[1]} == {"ScoreRequest"} and len(sent[1]) == len(v.owners)
    (raw0, _, _, none), (raw1, _, _, used) = results
    assert none is None and set(used) == set(v.trees.nodes)
    np.testing.assert_array_equal(raw0, raw1)
    got = explain_decisions(model, v.trees, used, raw1)
    _, want = fed.explanation({p: f.iloc[:10] for p, f in frames.items()})
    np.testing.assert_allclose(got.values, want.values, rtol=0, atol=1e-12)
    np.testing.assert_array_equal(got.margin, want.margin)
