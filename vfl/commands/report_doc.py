"""The model report's content (issue 34), as one JSON-ready document: what `vfl report` renders
to HTML (:mod:`vfl.commands.report_html`) or writes as JSON.

Inputs, all files a user already has:

* the trained model directory (the active party's model file; in a simulation's ``--save-model``
  directory also every passive party's, which then name their own features);
* an evaluation run: the ``--output-json`` of `vfl simulate` or of `vfl predict --label-col`
  (its ``credit`` section; its ``drift`` section is the last scoring batch's drift);
* optionally the training summary (`vfl party active --output-json`: alignment), a drift run
  (`vfl predict --drift --output-json`), passive parties' privacy ledgers, and the IV and
  explanation files of other tools (:func:`read_scores`).
"""
from __future__ import annotations

import json
import math
from pathlib import Path

from datasets.errors import InputError
from parties.dp_ledger import PrivacyLedger, summary
from parties.network import load_active_model
from vfl.core.credit_metrics import headline
from vfl.core.model import read_model_json

#: the report's sections, in order: (id, heading)
SECTIONS = (("summary", "Summary"), ("parties", "Parties and rows"), ("features", "Features per party"),
            ("parameters", "Parameters"), ("privacy", "Privacy"), ("metrics", "Test metrics"),
            ("importance", "Importance"), ("iv", "Information value"), ("explanations", "Explanations"),
            ("drift", "Drift of the last scoring batch"))

#: what each party learns, by mode (docs/threat-model.md, honest-but-curious)
THREAT_MODEL = {
    "he": {"active": "hashes of the passive parties' ids (salted); per node the decrypted gradient and hessian "
                     "sums per bin of passive features and which rows go left at each passive split; never a passive "
                     "raw value or threshold",
           "passive": "only ciphertexts of gradients; the instance space (the node of every training row at each "
                      "level); its own thresholds; nothing of the active party's features or labels"},
    "plain": {"active": "as in mode he",
              "passive": "the packed gradients in clear: mode plain is an oracle for tests, not a deployment"},
    "dp": {"active": "one locally differentially private release of each passive party's bucketed features "
                     "(epsilon per feature as printed); nothing else of passive data",
           "passive": "nothing of the labels or gradients; the active party's split requests on its released buckets"},
}
DRIFT_LEARNS = ("drift (vfl predict --drift): the active party learns one PSI per passive feature and scoring job "
                "(by position unless the passive party shares names), never counts or bins")


def _read_json(path, what: str) -> dict:
    p = Path(path)
    try:
        doc = json.loads(p.read_text())
    except OSError as exc:
        raise InputError(f"{what} {p}: cannot be read ({exc.strerror or exc})") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise InputError(f"{what} {p}: not JSON ({exc})") from None
    if not isinstance(doc, dict):
        raise InputError(f"{what} {p}: expected a JSON object")
    return doc


def read_scores(path, what: str) -> dict:
    """``{party: {feature: number}}`` from an IV or explanations file: that object itself, or under
    ``"iv"`` / ``"importance"`` / ``"global"``, or a list ``[{"party", "feature", "value"|"iv"}]``."""
    doc = _read_json(path, what)
    for key in ("iv", "importance", "global"):
        if key in doc:
            doc = doc[key]
            break
    if isinstance(doc, list):
        out: dict = {}
        for i, row in enumerate(doc):
            if not isinstance(row, dict) or "feature" not in row:
                raise InputError(f"{what} {path}: entry {i} needs a feature and a value")
            value = row.get("value", row.get("iv"))
            out.setdefault(str(row.get("party", "")), {})[str(row["feature"])] = value
        doc = out
    if not isinstance(doc, dict):
        raise InputError(f"{what} {path}: expected {{party: {{feature: number}}}}")
    for party, feats in doc.items():
        if not isinstance(feats, dict):
            raise InputError(f"{what} {path}: party {party!r}: expected {{feature: number}}")
        for f, v in feats.items():
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                raise InputError(f"{what} {path}: party {party!r}, feature {f!r}: {v!r} is not a finite number")
    return {str(p): {str(f): float(v) for f, v in feats.items()} for p, feats in doc.items()}


def _passive_files(model_dir: Path, model) -> dict:
    """The passive parties' model files in the directory (a simulation's save), by party."""
    out = {}
    for f in sorted(model_dir.glob("*.json")):
        try:
            d = read_model_json(f)
        except InputError:
            continue
        if d.get("role") == "passive" and d.get("model_id") == model.model_id:
            out[d.get("party")] = d
    return out


def _privacy(model, evaluation: dict, ledgers) -> dict:
    p = model.params
    mode = p.get("mode", "he")
    out = {"mode": mode, "scheme": p.get("scheme") if mode == "he" else None,
           "key_bits": p.get("key_bits") if mode == "he" else None,
           "encryption": p.get("encryption") if mode == "he" else None, "align": p.get("align"),
           "learned": {"active party": THREAT_MODEL.get(mode, THREAT_MODEL["he"])["active"],
                       "passive parties": THREAT_MODEL.get(mode, THREAT_MODEL["he"])["passive"],
                       "drift": DRIFT_LEARNS}}
    if mode == "dp":
        out["epsilon_per_party"] = evaluation.get("epsilon_per_party") or p.get("epsilon")
        out["epsilon_per_feature"] = evaluation.get("epsilon_per_feature") or p.get("epsilon_per_feature")
    if model.dp_model is not None:
        out["dp_model"] = {k: model.dp_model.get(k) for k in ("mechanism", "epsilon", "delta", "accounting")}
    if "privacy" in p:
        out["warning"] = p["privacy"]
    out["ledgers"] = {}
    for path in ledgers or ():
        doc = PrivacyLedger(path).read()
        out["ledgers"][str(path)] = {fp[:16]: r for fp, r in summary(doc).items()}
    return out


def build_report(model_dir, evaluation=None, training=None, drift=None, iv=None, explanations=None,
                 ledgers=(), title: str | None = None) -> dict:
    """The report document (see the module doc); every path optional but ``model_dir``."""
    model_dir = Path(model_dir)
    model = load_active_model(model_dir)       # an unfinished training (a checkpoint only): a clear error
    if model.n_rounds == 0:
        raise InputError(f"{model_dir}: the model has no trees: its training did not finish")
    ev = _read_json(evaluation, "evaluation run") if evaluation else {}
    tr = _read_json(training, "training summary") if training else {}
    if evaluation and not isinstance(ev.get("credit"), dict):
        raise InputError(f"evaluation run {evaluation}: it holds no credit metrics (field 'credit'): give the "
                         "--output-json of `vfl simulate`, or of `vfl predict --label-col COL` on labelled rows")
    if ev.get("model_id") not in (None, model.model_id):
        raise InputError(f"evaluation run {evaluation} scored model {ev.get('model_id')!r}, not {model.model_id!r} "
                         f"of {model_dir}")
    dr = ev.get("drift")
    if drift:
        d = _read_json(drift, "drift run")
        dr = d.get("drift", d) if isinstance(d.get("drift", d), dict) else None
        if not dr or "parties" not in dr:
            raise InputError(f"drift run {drift}: no drift report in it (run `vfl predict --drift --output-json FILE`)")
    passives = _passive_files(model_dir, model)
    features = {model.active_party: {"role": "active", "features": list(model.active_features),
                                     "categorical": sorted(model.categories)}}
    for p in model.passives:
        d = passives.get(p)
        features[p] = ({"role": "passive", "features": list(d.get("features", [])),
                        "categorical": sorted(d.get("categories") or {})} if d is not None else
                       {"role": "passive", "features": None,
                        "note": "held by the party itself; the active party knows only its splits' record ids"})
    imp_gain = model.feature_importance("gain")
    imp_split = model.feature_importance("split")
    importance = {"active": {f: {"gain": imp_gain["features"][f], "splits": imp_split["features"][f]}
                             for f in model.active_features},
                  "passive": {p: {"gain": imp_gain["parties"][p]["total"], "splits": imp_split["parties"][p]["total"]}
                              for p in model.passives}}
    alignment = tr.get("alignment") or ev.get("alignment") or {}
    credit = ev.get("credit")
    doc = {
        "title": title or f"Model report: {model.model_id}",
        "model_id": model.model_id, "model_dir": str(model_dir), "objective": model.objective,
        "classes": model.classes, "n_rounds": model.n_rounds, "best_iteration": model.best_iteration,
        "parties": {"active": model.active_party, "passive": list(model.passives), "alignment": alignment,
                    "n_train": ev.get("n_train", tr.get("n_train")), "n_test": ev.get("n_test"),
                    "n_scored": ev.get("n_rows")},
        "features": features,
        "parameters": dict(model.params),
        "privacy": _privacy(model, ev, ledgers),
        "metrics": credit,
        "headline": headline(credit) if credit else None,
        "importance": importance,
        "iv": read_scores(iv, "IV file") if iv else None,
        "explanations": read_scores(explanations, "explanations file") if explanations else None,
        "drift": dr,
        "drift_reference": "kept" if model.drift and (model.drift.get("features") or model.drift.get("score"))
        else (model.drift or {}).get("withheld", "no training counts (a model file from before drift counts)"),
        "sections": [{"id": i, "heading": h} for i, h in SECTIONS],
    }
    return doc
