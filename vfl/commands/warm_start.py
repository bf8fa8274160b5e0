"""``--warm-start MODEL_DIR`` of ``vfl simulate`` and ``vfl party active``: continue a saved model
with more rounds (issue 37; :mod:`parties.warm_start`, docs/learner.md)."""
from __future__ import annotations

import click

WARM_START_HELP = ("Continue the completed model saved in this directory with more rounds (--rounds is the "
                   "new total; the other training options as for the saved model; a new model is written, the "
                   "saved one is kept).")


def warm_start_option(f):
    """The ``--warm-start MODEL_DIR`` option (the command receives ``warm_start``)."""
    return click.option("--warm-start", "warm_start", type=click.Path(file_okay=False), default=None,
                        help=WARM_START_HELP)(f)


def echo_warm_start(result) -> None:
    """The line that says which model a training continued."""
    warm = result.get("warm_start")
    if warm:
        click.echo(f"warm start: continued model {warm['model_id']} after {warm['n_rounds']} round(s)")
