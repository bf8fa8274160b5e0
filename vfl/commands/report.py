"""`vfl report`: one shareable document for a model-risk review (issue 34) from a trained model
directory and an evaluation run: a self-contained HTML page (no network needed to open it) or
JSON. Written atomically, readable by all (0644: a report is meant to be shared)."""
from __future__ import annotations

import json

import click

from vfl.commands.report_doc import build_report
from vfl.commands.report_html import render_html
from vfl.core.files import write_text_atomic

#: a report is shareable: readable by everyone, unlike the toolkit's other files (0600)
REPORT_MODE = 0o644


@click.command()
@click.option("--model-dir", required=True, type=click.Path(file_okay=False),
              help="The trained model: `vfl simulate --save-model DIR` or `vfl party active --model-dir DIR`.")
@click.option("--evaluation", type=click.Path(dir_okay=False),
              help="The evaluation run: --output-json of `vfl simulate`, or of `vfl predict --label-col COL` "
                   "(its credit metrics; its drift, if run with --drift).")
@click.option("--training", type=click.Path(dir_okay=False),
              help="The training summary (`vfl party active --output-json`): rows aligned per party.")
@click.option("--drift", "drift_file", type=click.Path(dir_okay=False),
              help="The last scoring batch's drift: --output-json of `vfl predict --drift` [default: the "
                   "evaluation run's].")
@click.option("--iv", type=click.Path(dir_okay=False),
              help="Information values, JSON {party: {feature: IV}} (e.g. from a WOE/IV screening).")
@click.option("--explanations", type=click.Path(dir_okay=False),
              help="Explanations, JSON {party: {feature: mean |contribution|}}.")
@click.option("--dp-ledger", "ledgers", multiple=True, type=click.Path(dir_okay=False),
              help="A passive party's lifetime privacy ledger (repeatable): its spending goes into the report.")
@click.option("--title", default=None, help="The report's title [default: the model id].")
@click.option("--format", "fmt", type=click.Choice(["html", "json"]), default="html", show_default=True)
@click.option("--out", required=True, type=click.Path(dir_okay=False), help="The report file to write.")
def report(model_dir, evaluation, training, drift_file, iv, explanations, ledgers, title, fmt, out):
    """Write one model report: data, parameters, privacy, test metrics with ROC/KS/calibration/lift
    plots, importance, IV and explanations (when given), and drift."""
    doc = build_report(model_dir, evaluation=evaluation, training=training, drift=drift_file, iv=iv,
                       explanations=explanations, ledgers=ledgers, title=title)
    text = render_html(doc) if fmt == "html" else json.dumps(doc, indent=1)
    write_text_atomic(out, text, mode=REPORT_MODE)
    click.echo(f"wrote {out} ({fmt}, {len(doc['sections'])} sections)")
