"""``vfl screen``: federated WOE/IV of every feature of every party before training (issue 33).

Two ways, one command:

* simulation (``--active``/``--passive`` files or ``--dataset``): every party in this process, each
  passive party granting the screening (the user holds every table; ``--screen-epsilon`` lets them add
  the DP noise a party would);
* network (``--federation FILE`` and/or ``--peer``, with ``--data``): against running passive servers
  (``vfl party passive``), each granting screening in its federation entry (``screen = [...]``).

Outputs: a table on stdout, and with ``--out-dir`` ``screening.csv`` (one row per feature),
``screening_bins.csv`` (one row per bin), ``screening.json`` and ``screening_iv.png`` (IV by feature,
coloured by party; matplotlib, the ``plot`` extra). The files hold every party's per-bin counts: they
are written private (0600), like a model.
"""
from __future__ import annotations

import io
from pathlib import Path

import click

from datasets import load_active_passive, load_named
from parties.federation import load_federation
from parties.screen import MODES, ScreenParams, ScreenResult
from parties.screen_network import screen_remote
from vfl.api import federation_from_frames
from vfl.commands.common import (
    check_timeouts,
    federation_peers,
    max_bytes,
    net_options,
    security_from_options,
    setup_logging,
)
from vfl.compare import require_matplotlib
from vfl.core.files import check_writable_dir, write_files_atomic
from vfl.core.params import ALIGNMENTS, ENCRYPTIONS, SCHEMES, TrainParams

#: the figure's colours, one per party in order
PARTY_COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f")
#: the usual reading of an IV (Siddiqi): printed beside each feature
IV_BANDS = ((0.02, "useless"), (0.1, "weak"), (0.3, "medium"), (0.5, "strong"), (float("inf"), "suspicious"))


def iv_band(iv: float) -> str:
    for top, word in IV_BANDS:
        if iv < top:
            return word
    return IV_BANDS[-1][1]


def iv_chart(result: ScreenResult, title: str | None = None, top: int | None = None) -> bytes:
    """A horizontal bar chart of IV by feature (highest first), coloured by party, as PNG bytes."""
    plt = require_matplotlib()
    feats = sorted(result.features, key=lambda f: -f.iv)
    if top is not None:
        feats = feats[:top]
    parties = list(dict.fromkeys(f.party for f in result.features))
    colour = {p: PARTY_COLOURS[i % len(PARTY_COLOURS)] for i, p in enumerate(parties)}
    fig, ax = plt.subplots(figsize=(7.5, max(2.5, 0.28 * len(feats) + 1.2)))
    y = range(len(feats))
    ax.barh(list(y), [f.iv for f in feats], color=[colour[f.party] for f in feats])
    ax.set_yticks(list(y))
    ax.set_yticklabels([f"{f.party}:{f.feature}" for f in feats], fontsize=8)
    ax.invert_yaxis()
    for cut, style in ((0.02, ":"), (0.1, "--"), (0.3, "-.")):
        ax.axvline(cut, color="grey", linestyle=style, linewidth=0.8)
    ax.set_xlabel("information value (IV); lines at 0.02, 0.1, 0.3")
    handles = [plt.Rectangle((0, 0), 1, 1, color=colour[p]) for p in parties]
    ax.legend(handles, parties, title="party", loc="lower right", fontsize=8)
    ax.set_title(title or f"IV by feature ({result.n_rows} rows, {result.params.get('mode')} mode)", fontsize=10)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    return buf.getvalue()


def write_outputs(result: ScreenResult, out_dir, plot: bool = True, title: str | None = None) -> list[Path]:
    """``screening.csv``, ``screening_bins.csv``, ``screening.json`` and (``plot``) ``screening_iv.png``
    in ``out_dir``, all or none (0600: every party's per-bin counts)."""
    d = check_writable_dir(out_dir, "--out-dir")
    files = {d / "screening.csv": result.table().to_csv(index=False).encode(),
             d / "screening_bins.csv": result.bins_table().to_csv(index=False).encode()}
    if plot:
        files[d / "screening_iv.png"] = iv_chart(result, title)
    files[d / "screening.json"] = result.to_json().encode()
    return write_files_atomic(files)


def echo_result(result: ScreenResult, min_iv: float | None = None) -> None:
    click.echo(f"screened {len(result.features)} features over {result.n_rows} aligned rows "
               f"({result.n_events} events)")
    for f in sorted(result.features, key=lambda f: -f.iv):
        mark = "" if min_iv is None else ("  kept" if f.iv >= min_iv else "  dropped")
        click.echo(f"  {f.party}:{f.feature}: IV {f.iv:.4f} ({iv_band(f.iv)}), {len(f.groups) - 1} bins, "
                   f"missing {100 * f.missing_share:.1f}%{mark}")
        for note in f.notes:
            click.echo(f"      note: {note}")
    for p, info in result.parties.items():
        if info.get("epsilon") != "inf":
            click.echo(f"party {p}: its counts carry DP noise (epsilon {info['epsilon']})")


def screen_options(f):
    """How to screen (shared by both ways of running it)."""
    opts = [
        click.option("--mode", type=click.Choice(MODES), default="he", show_default=True,
                     help="he: the label encrypted; plain: no encryption (tests, trusted setups); dp: each passive "
                          "party releases its rows' bins once under randomised response (--dp-epsilon)."),
        click.option("--scheme", type=click.Choice(SCHEMES), default=TrainParams.default("scheme"), show_default=True),
        click.option("--key-bits", default=TrainParams.default("key_bits"), show_default=True),
        click.option("--encryption", type=click.Choice(ENCRYPTIONS), default=TrainParams.default("encryption"),
                     show_default=True),
        click.option("--bins", "max_bin", default=TrainParams.default("max_bin"), show_default=True,
                     help="Bins per feature (the training binner's quantile bins, --max-bin of training)."),
        click.option("--monotone", is_flag=True,
                     help="Pool adjacent bins until WOE is monotone (decided by the active party from the counts; "
                          "each passive party is told bin-index groups, never values)."),
        click.option("--min-share", default=0.0, show_default=True,
                     help="Pool any bin holding less than this share of the rows with a neighbour (e.g. 0.05)."),
        click.option("--align", type=click.Choice(ALIGNMENTS), default="hash", show_default=True),
        click.option("--dp-epsilon", "dp_epsilon", type=float, default=None,
                     help="Mode dp: epsilon per feature of each passive party's release (charged to its ledger)."),
        click.option("--min-iv", type=float, default=None,
                     help="Mark the features below this IV as dropped (what `--min-iv` of training would drop)."),
        click.option("--out-dir", type=click.Path(file_okay=False),
                     help="Write screening.csv, screening_bins.csv, screening.json and screening_iv.png here."),
        click.option("--no-plot", is_flag=True, help="No PNG chart (no matplotlib needed)."),
    ]
    for opt in reversed(opts):
        f = opt(f)
    return f


@click.command("screen")
@click.option("--dataset", default=None,
              help="Simulation: bundled 'breast_cancer', or a name from ../shared/datasets (default_credit, ...).")
@click.option("--active", "active", type=click.Path(),
              help="Simulation: the active party's table (id, label, features).")
@click.option("--passive", "passives", multiple=True, type=click.Path(),
              help="Simulation: a passive party's table; repeat for several.")
@click.option("--parties", default=2, show_default=True, help="Parties for a bundled dataset.")
@click.option("--screen-epsilon", type=float, default=None,
              help="Simulation: each passive party adds DP noise (this epsilon) to the counts it returns.")
@click.option("--data", type=click.Path(), help="Network: the active party's table (with --federation / --peer).")
@click.option("--name", default=None, help="Network: this party's name [default: the federation's active party].")
@click.option("--federation", "federation_file", type=click.Path(dir_okay=False),
              help="Network: the federation file (the passive parties' addresses; each grants screening in its "
                   "`screen` list).")
@click.option("--peer", "peer_specs", multiple=True, help="Network: passive party NAME=HOST:PORT (repeatable).")
@click.option("--timeout", default=60.0, show_default=True, help="Network: seconds any single call may take.")
@click.option("--id-col", default="id", show_default=True)
@click.option("--label-col", default="y", show_default=True)
@screen_options
@net_options
def screen_command(dataset, active, passives, parties, screen_epsilon, data, name, federation_file, peer_specs, timeout,
                   id_col, label_col, mode, scheme, key_bits, encryption, max_bin, monotone, min_share, align,
                   dp_epsilon, min_iv, out_dir, no_plot, tls_dir, insecure, token_file, max_message_mb, log_level):
    """Weight of evidence and information value of every feature of every party (binary labels).

    The active party encrypts each row's event indicator; each passive party sums the ciphertexts per
    bin of each of its features and keeps its bin edges; the active party decrypts the per-bin event
    and row counts. A passive party answers only if it granted screening (docs/screening.md)."""
    from_files = bool(dataset or active or passives)
    networked = bool(data or federation_file or peer_specs)
    if from_files == networked:
        raise click.UsageError("give either the simulation's tables (--dataset, or --active and --passive) or the "
                               "network's (--data with --federation / --peer)")
    params = ScreenParams(mode=mode, scheme=scheme, key_bits=key_bits, encryption=encryption, max_bin=max_bin,
                          monotone=monotone, min_share=min_share, align=align, dp_epsilon_per_feature=dp_epsilon)
    if out_dir:
        check_writable_dir(out_dir, "--out-dir")
        if not no_plot:
            require_matplotlib()            # fail before the screening, not after
    if from_files:
        if (active or passives) and not (active and passives):
            raise click.UsageError("--active and at least one --passive are needed together")
        frames = load_active_passive(active, list(passives), id_col=id_col, label_col=label_col) if active \
            else load_named(dataset, parties, id_col=id_col, label_col=label_col)
        fed = federation_from_frames(frames)
        for p in fed.passives.values():     # the simulation holds every table: each party grants it
            p.screen_allowed = True
            p.screen_epsilon = screen_epsilon
        result = fed.screen(params)
    else:
        setup_logging(log_level)
        check_timeouts(timeout, None)
        if not data:
            raise click.UsageError("--data (the active party's table) is needed with --federation / --peer")
        federation = load_federation(federation_file) if federation_file else None
        name, peers = federation_peers(federation, name, peer_specs, active=True)
        sec = security_from_options(name, tls_dir, insecure, token_file)
        result, wire = screen_remote(data, id_col, label_col, name, peers, params, sec, timeout=timeout,
                                     max_frame_bytes=max_bytes(max_message_mb))
        for pair, n in wire["bytes_sent"].items():
            click.echo(f"bytes {pair}: {n}")
    echo_result(result, min_iv)
    if out_dir:
        for path in write_outputs(result, out_dir, plot=not no_plot):
            click.echo(f"wrote {path}")
