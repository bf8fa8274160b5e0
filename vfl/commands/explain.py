"""``vfl explain``: per-decision explanations (grouped TreeSHAP) with reason codes and a summary plot.

Two ways to run it:

* against running passive servers, like ``vfl predict``: ``--data`` (the active party's rows) and
  ``--peer NAME=HOST:PORT`` (or ``--federation``); each batch is one ordinary one-round
  prediction session over gRPC (mutual TLS unless ``--insecure``);
* in one process, like ``vfl simulate``: ``--party NAME=PATH`` for every party of a model saved
  with ``vfl simulate --save-model`` (all parties' rows on this machine).
"""
from __future__ import annotations

import json

import click

from datasets.errors import InputError
from datasets.loaders import DEFAULT_BATCH_ROWS
from parties.federation import load_federation as load_federation_file
from parties.memory import return_freed_memory
from parties.network import load_active_model
from parties.network_explain import explain_active
from vfl.api import Federation
from vfl.commands.common import (
    VFLCommand,
    check_timeouts,
    federation_peers,
    max_bytes,
    net_options,
    security_from_options,
    setup_logging,
)
from vfl.core.explain import ADVERSE, Explanation, explanation_table, summary_plot
from vfl.core.files import write_text_atomic
from vfl.core.params import ALIGNMENTS


def _party_paths(specs) -> dict[str, str]:
    out = {}
    for spec in specs:
        name, sep, path = spec.partition("=")
        if not sep or not name or not path:
            raise click.UsageError(f"--party takes NAME=PATH, got {spec!r}")
        if name in out:
            raise click.UsageError(f"--party {name!r} given twice")
        out[name] = path
    return out


def _plot_target(ex: Explanation, classes, plot_class) -> tuple[int, str | None]:
    if ex.values.shape[1] == 1:
        if plot_class is not None:
            raise InputError("--plot-class is for a multiclass model")
        return 0, None
    labels = [str(c) for c in (classes if classes is not None else range(ex.values.shape[1]))]
    if plot_class is None:
        return 0, labels[0]
    if plot_class not in labels:
        raise InputError(f"--plot-class {plot_class!r} is not a class of the model ({', '.join(labels)})")
    return labels.index(plot_class), plot_class


@click.command(cls=VFLCommand)
@click.option("--model-dir", required=True, type=click.Path(file_okay=False), help="The model directory.")
@click.option("--data", type=click.Path(),
              help="Network: id and the active features (CSV, Parquet file or directory).")
@click.option("--peer", "peer_specs", multiple=True, help="Network: passive party NAME=HOST:PORT; repeat for each.")
@click.option("--federation", "federation_file", type=click.Path(dir_okay=False),
              help="Network: the federation file with the passive parties' addresses (docs/federation.md).")
@click.option("--party", "party_specs", multiple=True,
              help="In one process: NAME=PATH of every party's rows (a model saved by `vfl simulate --save-model`).")
@click.option("--id-col", default="id", show_default=True)
@click.option("--out", required=True, type=click.Path(dir_okay=False),
              help="CSV: id, base, one column per active feature and per passive party, margin (and reasons).")
@click.option("--top", type=click.IntRange(1), default=None,
              help="Add K reason codes per row: the players that pushed the score most towards the adverse side.")
@click.option("--adverse", type=click.Choice(ADVERSE), default="high", show_default=True,
              help="Which side of the score is adverse (high: e.g. the probability of default).")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False),
              help="Write a beeswarm-style summary plot here (PNG/SVG/PDF; needs matplotlib, extra [plot]).")
@click.option("--plot-class", default=None, help="Multiclass: the class the plot shows [default: the first].")
@click.option("--align", type=click.Choice(ALIGNMENTS), default=None,
              help="How the passive parties find the rows: salted hashes or PSI [default: as in training].")
@click.option("--timeout", default=60.0, show_default=True, help="Seconds any single call may take.")
@click.option("--connect-timeout", type=float, help="Seconds to wait for the peers [default: --timeout].")
@click.option("--batch-rows", type=click.IntRange(1), default=DEFAULT_BATCH_ROWS, show_default=True,
              help="Rows explained per prediction session.")
@click.option("--output-json", type=click.Path(dir_okay=False),
              help="Write a JSON summary here (the global view: mean |attribution| per player).")
@click.option("--passive-features", "passive_features", multiple=True, metavar="NAME|all",
              help="Network: passive party NAME (repeatable; 'all': every one) also splits its value among its own "
                   "features and keeps them in its --model-dir/explanations (opt-in at the party: its federation "
                   "entry says explain_features = true; this CSV still gets one value per passive party).")
@net_options
def explain(model_dir, data, peer_specs, federation_file, party_specs, id_col, out, top, adverse, plot_path,
            plot_class, align, timeout, connect_timeout, batch_rows, output_json, tls_dir, insecure, token_file,
            max_message_mb, log_level, passive_features=()):
    """Explain each decision: exact attributions per active feature and per passive party (grouped
    TreeSHAP from the one-round prediction's leaf masks: the passive parties answer a prediction)."""
    setup_logging(log_level)
    if party_specs:
        if data or peer_specs or federation_file:
            raise click.UsageError("--party (in one process) does not go with --data/--peer/--federation (network)")
        if passive_features:
            raise click.UsageError("--passive-features is for passive servers (network): in one process, use "
                                   "Federation.explanation(passive_features=...) (docs/explanations.md)")
        fed = Federation.load(model_dir, id_col)
        ids, ex = fed.explanation(_party_paths(party_specs), align=align, batch_rows=batch_rows)
        model = fed.model
        write_text_atomic(out, explanation_table(ex, ids, id_col, model.classes, top, adverse).to_csv(index=False))
        summary = {"model_id": model.model_id, "players": ex.players, **ex.summary(model.classes),
                   "bytes_sent": fed.bytes_report()}
    else:
        if not data:
            raise click.UsageError("give --data and --peer/--federation (network), or --party NAME=PATH for every "
                                   "party (in one process)")
        return_freed_memory()
        check_timeouts(timeout, connect_timeout)
        federation = load_federation_file(federation_file) if federation_file else None
        model = load_active_model(model_dir)
        _, peers = federation_peers(federation, model.active_party, peer_specs, active=False)
        sec = security_from_options(model.active_party, tls_dir, insecure, token_file)
        ex, summary = explain_active(model_dir, data, id_col, peers, sec, out, timeout=timeout,
                                     max_frame_bytes=max_bytes(max_message_mb), connect_timeout=connect_timeout,
                                     align=align, batch_rows=batch_rows, top=top, adverse=adverse,
                                     passive_features=True if "all" in passive_features else list(passive_features))
    if plot_path:
        target, name = _plot_target(ex, model.classes, plot_class)
        summary_plot(ex, plot_path, target, target_name=name)
        summary["plot"] = str(plot_path)
    if output_json:
        write_text_atomic(output_json, json.dumps(summary, indent=1, default=float))
    click.echo(f"explained {summary['n_rows']} rows; wrote {out}")
    target = next(iter(summary["mean_abs"]), None) if summary.get("mean_abs") else None
    if target is not None:
        click.echo(f"mean |attribution| ({target}): " + ", ".join(
            f"{p} {v:.4f}" for p, v in list(summary["mean_abs"][target].items())[:10]))
