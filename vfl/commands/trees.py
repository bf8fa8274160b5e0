"""``vfl trees MODEL_DIR``: the trees of a model as text and one figure per tree, as the active
party sees them (a passive party's split is ``party:record#k``, no threshold), or with ``--party
NAME`` a passive party's own view: its record table, thresholds included
(:mod:`vfl.core.tree_dump`)."""
from __future__ import annotations

import io
from pathlib import Path

import click

from datasets.errors import InputError
from parties.network import load_active_model
from parties.passive import PassiveParty
from vfl.commands.common import VFLCommand
from vfl.compare import require_matplotlib
from vfl.core.files import REPORT_MODE, check_writable_dir, write_bytes_atomic, write_text_atomic
from vfl.core.model import read_model_json
from vfl.core.tree_dump import active_view, passive_view, plot_tree


def passive_models(model_dir: Path, party: str, model_id: str | None = None) -> list[PassiveParty]:
    """The model files of passive party ``party`` in ``model_dir`` (its ``--model-dir``: one
    ``<model_id>.json`` per model, or a ``Federation.save`` directory: ``party.json``), checked."""
    found = []
    for f in sorted(model_dir.glob("*.json")):
        content = read_model_json(f)
        if content.get("role") == "passive" and content.get("party") == party:
            if model_id is None or content.get("model_id") == model_id:
                found.append(PassiveParty.from_model_dict(content, str(f)))
    if not found:
        raise InputError(f"no model file of passive party {party!r}" + (f" for model {model_id}" if model_id else "")
                         + f" in {model_dir}")
    return found


def write_tree_figures(model, out_dir: Path) -> list[Path]:
    """``tree_r<round>[_c<class>].png`` per tree (0644: shareable)."""
    plt = require_matplotlib()
    paths = []
    for r, trees in enumerate(model.rounds):
        for k, tree in enumerate(trees):
            leaves = max(sum(1 for n in tree.nodes if n.is_leaf), 1)
            fig, ax = plt.subplots(figsize=(max(4.0, 1.6 * leaves), 1.2 + 1.1 * (tree.max_depth + 1)), dpi=100)
            name = f"tree_r{r + 1}" + (f"_c{k}" if len(trees) > 1 else "")
            plot_tree(tree, ax, f"{model.active_party}'s view: round {r + 1}"
                      + (f", class {k}" if len(trees) > 1 else ""))
            buf = io.BytesIO()
            fig.savefig(buf, format="png", bbox_inches="tight")
            plt.close(fig)
            paths.append(write_bytes_atomic(out_dir / f"{name}.png", buf.getvalue(), REPORT_MODE))
    return paths


@click.command(cls=VFLCommand)
@click.argument("model_dir", type=click.Path(file_okay=False))
@click.option("--party", help="Show this passive party's own view (its record table, thresholds included) from its "
                              "model files in MODEL_DIR [default: the active party's view of the trees].")
@click.option("--model-id", help="With --party: only this model (a passive --model-dir holds one file per model).")
@click.option("--out", "out_dir", type=click.Path(file_okay=False),
              help="Also write the text (trees.txt or PARTY-records.txt) and, for the active view, one PNG per "
                   "tree here (matplotlib: pip install 'vfl-boost[plot]').")
def trees(model_dir, party, model_id, out_dir):
    """Print a model's trees as the active party sees them, or a passive party's own splits."""
    model_dir = Path(model_dir)
    if not model_dir.is_dir():
        raise InputError(f"model directory {model_dir} does not exist")
    if model_id is not None and party is None:
        raise click.UsageError("--model-id goes with --party (a passive party's model files)")
    out = Path(out_dir) if out_dir else None
    if out is not None:
        check_writable_dir(out, "--out directory")
    if party is None:
        model = load_active_model(model_dir)
        text = active_view(model)
        files = []
        if out is not None:
            files = [write_text_atomic(out / "trees.txt", text + "\n", REPORT_MODE)] + write_tree_figures(model, out)
    else:
        text = "\n\n".join(passive_view(p.name, p.model_id, p.records)
                           for p in passive_models(model_dir, party, model_id))
        files = [write_text_atomic(out / f"{party}-records.txt", text + "\n", REPORT_MODE)] if out else []
    click.echo(text)
    if files:
        click.echo("wrote: " + ", ".join(str(f) for f in files), err=True)
