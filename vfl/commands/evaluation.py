"""What the evaluating commands (`vfl simulate`, `vfl predict`) share for issue 34: the options
``--segment``, ``--drift`` (and `vfl predict`'s ``--label-col``) and the lines that print the
credit metrics (:mod:`vfl.core.credit_metrics`) and the drift report (:mod:`parties.drift`)."""
from __future__ import annotations

import click

from parties.drift import format_drift
from parties.federation import DRIFT_POLICIES


def segment_option(f):
    return click.option("--segment", default=None,
                        help="A column of the active party's data: the credit metrics are also given per value of "
                             "it (e.g. a region or a product).")(f)


def drift_option(f):
    return click.option("--drift", is_flag=True,
                        help="Every party computes the PSI of its own inputs on these rows against its training "
                             "counts (the active party also the score's); PSI >= 0.1 is flagged '!', >= 0.25 '!!'. "
                             "The exit code does not change.")(f)


def passive_drift_option(f):
    """`vfl party passive --drift-answers`: how this party answers drift requests."""
    return click.option("--drift-answers", "drift_answers", type=click.Choice(DRIFT_POLICIES), default=None,
                        help="How this party answers `vfl predict --drift`: one PSI per feature position, with its "
                             "feature names, or not at all [default: its federation entry's drift, else positions; "
                             "with both, the stricter].")(f)


def predict_evaluation_options(f):
    """`vfl predict`: ``--label-col`` (evaluate), ``--segment`` and ``--drift``."""
    f = drift_option(f)
    f = segment_option(f)
    return click.option("--label-col", default=None,
                        help="Evaluate: the --data column holding the true label (credit metrics: KS, Gini, deciles, "
                             "calibration; the column is not a feature).")(f)


def _fmt(v, spec=".4f") -> str:
    return "n/a" if v is None else format(v, spec)


def credit_lines(report: dict | None) -> list[str]:
    """The credit metrics as lines: KS (its threshold), Gini, Brier and the decile lift per model
    (per class for multiclass; RMSE, MAE and the top decile for regression), then per segment."""
    if not report:
        return []

    def one(r, label):
        if "per_class" in r:
            return [line for c, v in r["per_class"].items() for line in one(v, f"{label} class {c}")]
        if "ks" not in r:
            top = r["deciles"][0] if r["deciles"] else {}
            return [f"{label}: RMSE {_fmt(r['rmse'])}, MAE {_fmt(r['mae'])}, top decile mean "
                    f"{_fmt(top.get('event_rate'))} (lift {_fmt(top.get('lift'), '.2f')})"]
        top = r["deciles"][0] if r["deciles"] else {}
        return [f"{label}: KS {_fmt(r['ks'])} at score {_fmt(r['ks_threshold'])}, Gini {_fmt(r['gini'])}, "
                f"Brier {_fmt(r['brier'])}, top decile lift {_fmt(top.get('lift'), '.2f')} "
                f"(captures {_fmt(top.get('cum_capture'), '.1%')} of {r['events']} events in {r['n']} rows)"]
    lines = one(report["overall"], "credit")
    for value, r in (report.get("segments") or {}).items():
        lines += one(r, f"credit [{report['segment']}={value}]")
    return lines


def echo_evaluation(result: dict) -> None:
    """Print ``result``'s credit metrics and drift report (where present)."""
    for line in credit_lines(result.get("credit")):
        click.echo(line)
    if result.get("drift"):
        for line in format_drift(result["drift"]):
            click.echo(line)
