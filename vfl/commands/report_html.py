"""The model report as one self-contained HTML file: a Jinja2 template (``templates/report.html.j2``)
with inline CSS and the figures drawn by matplotlib as inline base64 PNGs, so the page opens
with no network access and nothing beside it. Both are optional extras (``pip install
vfl-boost[report]``), imported only when a report is rendered."""
from __future__ import annotations

import base64
import io
from pathlib import Path

from datasets.errors import InputError

TEMPLATE_DIR = Path(__file__).resolve().parent / "templates"
TEMPLATE = "report.html.j2"
#: bars drawn in one figure at most (the tables list them all)
MAX_BARS = 30


def _libs():
    try:
        import jinja2
        from matplotlib.figure import Figure
    except ImportError as exc:
        raise InputError(f"the HTML report needs Jinja2 and matplotlib ({exc.name} is missing): "
                         "pip install 'vfl-boost[report]', or use --format json") from None
    return jinja2, Figure


def _png(fig) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def _binary_parts(overall: dict) -> list[tuple[str, dict]]:
    if "per_class" in overall:
        return [(f"class {c}", r) for c, r in overall["per_class"].items()]
    return [("", overall)] if "ks" in overall else []


def _metric_figures(Figure, credit: dict) -> list[dict]:
    """ROC, KS, calibration and lift figures of the evaluation's overall metrics."""
    overall = credit["overall"]
    parts = _binary_parts(overall)
    figs = []
    if parts:
        fig = Figure(figsize=(4.2, 3.6))
        ax = fig.subplots()
        for label, r in parts:
            ax.plot(r["roc"]["fpr"], r["roc"]["tpr"],
                    label=f"{label} AUC {r['auc']:.3f}".strip() if r["auc"] is not None else label or "ROC")
        ax.plot([0, 1], [0, 1], color="grey", linestyle=":", linewidth=1)
        ax.set(xlabel="false-positive rate", ylabel="true-positive rate", title="ROC")
        ax.legend(loc="lower right", fontsize=8)
        figs.append({"title": "ROC curve", "src": _png(fig)})
        fig = Figure(figsize=(4.2, 3.6))
        ax = fig.subplots()
        for label, r in parts:
            k = r["ks_curve"]
            ax.plot(k["score"], k["non_events"], label=f"{label} non-events".strip())
            ax.plot(k["score"], k["events"], label=f"{label} events".strip())
            if r["ks_threshold"] is not None:
                ax.axvline(r["ks_threshold"], color="grey", linestyle="--", linewidth=1)
        ax.set(xlabel="score", ylabel="cumulative share of rows", title="KS: " + ", ".join(
            f"{label} {r['ks']:.3f}".strip() for label, r in parts if r["ks"] is not None))
        ax.legend(loc="lower right", fontsize=8)
        figs.append({"title": "KS plot", "src": _png(fig)})
        fig = Figure(figsize=(4.2, 3.6))
        ax = fig.subplots()
        for label, r in parts:
            bins = r["calibration"]
            ax.plot([b["mean_predicted"] for b in bins], [b["event_rate"] for b in bins], marker="o",
                    label=f"{label} Brier {r['brier']:.4f}".strip() if r["brier"] is not None else label)
        ax.plot([0, 1], [0, 1], color="grey", linestyle=":", linewidth=1)
        ax.set(xlabel="mean predicted probability", ylabel="observed event rate", title="Calibration")
        ax.legend(loc="upper left", fontsize=8)
        figs.append({"title": "Calibration (reliability) plot", "src": _png(fig)})
    deciles = [(label, r["deciles"]) for label, r in parts] if parts else [("", overall.get("deciles", []))]
    fig = Figure(figsize=(4.2, 3.6))
    ax = fig.subplots()
    for label, rows in deciles:
        ax.plot([d["decile"] for d in rows], [d["lift"] for d in rows], marker="o", label=f"{label} lift".strip())
        ax.plot([d["decile"] for d in rows], [d["cum_lift"] for d in rows], linestyle="--",
                label=f"{label} cumulative lift".strip())
    ax.axhline(1.0, color="grey", linestyle=":", linewidth=1)
    ax.set(xlabel="decile (1: highest scores)", ylabel="lift", title="Lift by decile")
    ax.legend(fontsize=8)
    figs.append({"title": "Lift chart", "src": _png(fig)})
    return figs


def _bars(Figure, items: list[tuple[str, float]], title: str, xlabel: str, lines=()) -> str:
    items = sorted(items, key=lambda kv: -abs(kv[1]))[:MAX_BARS][::-1]
    fig = Figure(figsize=(6.4, 0.6 + 0.26 * max(len(items), 1)))
    ax = fig.subplots()
    ax.barh([k for k, _ in items], [v for _, v in items], color="#3a6ea5")
    for x, style in lines:
        ax.axvline(x, color="#c0392b", linestyle=style, linewidth=1)
    ax.set(xlabel=xlabel, title=title)
    ax.tick_params(axis="y", labelsize=8)
    return _png(fig)


def _scores_items(scores: dict) -> list[tuple[str, float]]:
    return [(f"{p}:{f}" if p else f, v) for p, feats in scores.items() for f, v in feats.items()]


def render_html(doc: dict) -> str:
    """The report document (:func:`vfl.commands.report_doc.build_report`) as one HTML page."""
    jinja2, Figure = _libs()
    figures: dict = {}
    if doc.get("metrics"):
        figures["metrics"] = _metric_figures(Figure, doc["metrics"])
    imp = [(f, v["gain"]) for f, v in doc["importance"]["active"].items()]
    imp += [(f"{p} (all its features)", v["gain"]) for p, v in doc["importance"]["passive"].items()]
    figures["importance"] = [{"title": "Gain importance", "src": _bars(Figure, imp, "Gain importance", "total gain")}]
    for key, title, xlabel, lines in (("iv", "Information value", "IV", ((0.02, ":"), (0.1, "--"))),
                                      ("explanations", "Mean |contribution|", "mean absolute contribution", ())):
        if doc.get(key):
            figures[key] = [{"title": title, "src": _bars(Figure, _scores_items(doc[key]), title, xlabel, lines)}]
    dr = doc.get("drift")
    if dr:
        items = [(f"{p}:{e['feature']}", e["psi"]) for p, sec in dr["parties"].items()
                 for e in sec.get("features", []) if e["psi"] is not None]
        items += [(f"score:{e['feature']}", e["psi"]) for e in dr["score"].get("features", []) if e["psi"] is not None]
        figures["drift"] = [{"title": "PSI per input", "src": _bars(
            Figure, items, "PSI of each input and of the score", "PSI",
            ((dr["thresholds"]["moderate"], "--"), (dr["thresholds"]["major"], "-")))}]
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(TEMPLATE_DIR)),
                             autoescape=jinja2.select_autoescape(["html", "j2"]))
    env.filters["num"] = lambda v, spec=".4f": "n/a" if v is None else (format(v, spec) if isinstance(v, (int, float))
                                                                      and not isinstance(v, bool) else str(v))
    return env.get_template(TEMPLATE).render(doc=doc, figures=figures)
