"""`vfl predict`: score new rows with a networked model, asking the passive parties that serve it;
with ``--label-col`` also evaluate them (credit metrics), with ``--drift`` report every party's PSI
of its own inputs, with ``--points`` add scorecard points (:mod:`vfl.core.scorecard`)."""
from __future__ import annotations

import click

from datasets.loaders import DEFAULT_BATCH_ROWS
from parties.federation import load_federation
from parties.memory import return_freed_memory
from parties.network import check_prediction, load_active_model, predict_active
from vfl.commands.common import (
    VFLCommand,
    check_timeouts,
    federation_peers,
    max_bytes,
    net_options,
    security_from_options,
    setup_logging,
    write_report,
)
from vfl.commands.evaluation import echo_evaluation, predict_evaluation_options
from vfl.core.params import ALIGNMENTS, DEFAULT_PREDICTION, PREDICTIONS
from vfl.core.scorecard import PointsScale


@click.command(cls=VFLCommand)
@click.option("--model-dir", required=True, type=click.Path(file_okay=False), help="The active party's model.")
@click.option("--data", required=True, type=click.Path(),
              help="id and the active features: CSV, or a Parquet file or directory of Parquet files.")
@click.option("--id-col", default="id", show_default=True)
@click.option("--peer", "peer_specs", multiple=True, help="Passive party NAME=HOST:PORT; repeat for each.")
@click.option("--federation", "federation_file", type=click.Path(dir_okay=False),
              help="The federation file: the passive parties' addresses (docs/federation.md).")
@click.option("--out", required=True, type=click.Path(dir_okay=False),
              help="CSV of ids and probabilities (multiclass: prediction and proba_<class>; regression: prediction).")
@click.option("--points", "points_spec", metavar="PDO,BASE_SCORE,BASE_ODDS",
              help="Add scorecard points (binary models): BASE_SCORE points at good:bad odds BASE_ODDS, PDO more "
                   "each time the odds double (e.g. 20,600,50; docs/learner.md).")
@click.option("--prediction", type=click.Choice(PREDICTIONS), default=DEFAULT_PREDICTION, show_default=True,
              help="one-round: one batch of leaf masks per passive party; node: node-by-node routing.")
@click.option("--align", type=click.Choice(ALIGNMENTS), default=None,
              help="How the passive parties find the rows: salted hashes or PSI [default: as in training].")
@click.option("--timeout", default=60.0, show_default=True, help="Seconds any single call may take.")
@click.option("--connect-timeout", type=float, help="Seconds to wait for the peers [default: --timeout].")
@click.option("--output-json", type=click.Path(dir_okay=False),
              help="Write a JSON summary here (with --label-col its credit metrics, with --drift the drift report: "
                   "the evaluation run `vfl report --evaluation` reads).")
@click.option("--batch-rows", type=click.IntRange(1), default=DEFAULT_BATCH_ROWS, show_default=True,
              help="Rows read and scored at a time (bounded memory; the output is the same for any value).")
@predict_evaluation_options
@net_options
def predict(model_dir, data, id_col, peer_specs, out, prediction, align, timeout, connect_timeout, output_json,
            batch_rows, tls_dir, insecure, token_file, max_message_mb, log_level, federation_file=None,
            label_col=None, segment=None, drift=False, points_spec=None):
    """Score new rows with a model trained by `vfl party active` (passive parties must be serving)."""
    setup_logging(log_level)
    return_freed_memory()         # a long-lived driver: freed memory goes back to the system
    check_prediction(prediction)
    check_timeouts(timeout, connect_timeout)
    federation = load_federation(federation_file) if federation_file else None
    model = load_active_model(model_dir)
    points = PointsScale.parse(points_spec) if points_spec is not None else None
    model.check_points(points)              # before connecting
    _, peers = federation_peers(federation, model.active_party, peer_specs, active=False)
    sec = security_from_options(model.active_party, tls_dir, insecure, token_file)
    ids, proba, summary = predict_active(model_dir, data, id_col, peers, sec, out, timeout=timeout,
                                         prediction=prediction, max_frame_bytes=max_bytes(max_message_mb),
                                         connect_timeout=connect_timeout, align=align, batch_rows=batch_rows,
                                         drift=drift, label_col=label_col, segment=segment, points=points)
    if output_json:
        write_report(output_json, summary)
    click.echo(f"predicted {summary['n_rows']} rows in {summary['predict_seconds']:.2f} s "
               f"({summary['n_batches']} batch(es)); wrote {out}")
    echo_evaluation(summary)
