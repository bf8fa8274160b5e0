"""``vfl compare``: plain, HE and DP (at several epsilons) with the references, on a named data
set or on your own tables; a thin click wrapper over :func:`vfl.compare.run_comparison`."""
from __future__ import annotations

import click

from vfl.commands.common import VFLCommand
from vfl.compare import EPSILON_SCOPES, CompareConfig, format_epsilons, format_table, run_comparison, tables_entry

_COMPARE = CompareConfig()      # the defaults of `vfl compare` (its hyperparameters: TrainParams')


@click.command(cls=VFLCommand)
@click.option("--dataset", "datasets", multiple=True,
              help="A named data set; repeatable. Default: breast_cancer (bundled), plus default_credit and "
                   "give_credit when the shared datasets directory exists ($VFL_SHARED_DATASETS, else "
                   "../shared/datasets next to the source tree).")
@click.option("--active", type=click.Path(),
              help="Your own data instead of --dataset: the active party's table (id, a binary label, features): "
                   "CSV, or a Parquet file or directory of Parquet files.")
@click.option("--passive", "passives", multiple=True, type=click.Path(),
              help="A passive party's table (id, features); repeat for each (with --active).")
@click.option("--id-col", default="id", show_default=True, help="The id column of --active/--passive tables.")
@click.option("--label-col", default="y", show_default=True, help="The label column of the --active table.")
@click.option("--name", "tables_name",
              help="Names your tables' data set in the outputs [default: the --active file's name].")
@click.option("--modes", default=",".join(_COMPARE.modes), show_default=True,
              help="Comma list of plain, he, dp, dp_old (the old DP mechanism: max-bin buckets, no "
                   "debiasing), dp_select (dp with --dp-select), dp_all (dp releasing every feature: "
                   "--dp-select none), local (active party alone), xgboost (centralized), "
                   "dp-model (the DP released model; or --dp-model).")
@click.option("--epsilons", default=format_epsilons(_COMPARE.epsilons), show_default=True,
              help="DP budgets to sweep.")
@click.option("--epsilon-scope", type=click.Choice(EPSILON_SCOPES), default=_COMPARE.epsilon_scope,
              show_default=True, help="Whether an epsilon is each passive party's total or per feature.")
@click.option("--seeds", default=_COMPARE.seeds, show_default=True,
              help="Seeds 0..N-1 (train/test split, DP pilot rows; DP noise is fresh).")
@click.option("--he-seeds", default=_COMPARE.he_seeds, show_default=True,
              help="HE runs only for the first N seeds (HE grows plain's trees exactly; it costs time).")
@click.option("--rounds", "--trees", "rounds", default=_COMPARE.n_estimators, show_default=True,
              help="Boosting rounds (n_estimators). (--trees: deprecated alias.)")
@click.option("--depth", default=_COMPARE.max_depth, show_default=True)
@click.option("--learning-rate", default=_COMPARE.learning_rate, show_default=True)
@click.option("--max-bin", default=_COMPARE.max_bin, show_default=True, help="Bins in every mode (DP: buckets q).")
@click.option("--key-bits", default=_COMPARE.key_bits, show_default=True, help="Paillier key size of the HE runs.")
@click.option("--test-size", default=_COMPARE.test_size, show_default=True)
@click.option("--out-dir", default="compare_results", show_default=True, type=click.Path(file_okay=False))
@click.option("--no-plots", is_flag=True, help="Only CSV/JSON (no matplotlib needed).")
@click.option("--dp-select", "dp_select", default=_COMPARE.dp_select, show_default=True,
              help="Arm dp_select: features released per passive party ('auto' or an integer).")
@click.option("--quiet", is_flag=True, help="No line per run.")
@click.option("--dp-model", "dp_model", is_flag=True,
              help="Add the dp-model arm: the DP released model (--dp-model) at every --epsilons value, with its "
                   "own depth/learning rate/split settings (vfl.compare.DP_MODEL_SETTINGS).")
def compare(out_dir, quiet, **options):
    """Compare plain, HE and DP (at several epsilons) on the same splits: CSV, JSON and PNG figures.

    On a named data set (--dataset) or on your own tables (--active FILE --passive FILE ..., as
    `vfl simulate` takes them)."""
    doc = run_comparison(config_from_command(**options), out_dir,
                         progress=None if quiet else lambda s: click.echo(s, err=True))
    click.echo(format_table(doc["summary"]))
    for note in doc["notes"]:
        click.echo(f"note: {note}")
    click.echo("wrote: " + ", ".join(doc["files"]))


def config_from_command(active=None, passives=(), id_col="id", label_col="y", tables_name=None,
                        **options) -> CompareConfig:
    """The CompareConfig of `vfl compare`'s parameters (also used by benchmarks/compare_modes.py):
    your own tables (--active/--passive) or the named data sets."""
    if active or passives:
        if not (active and passives):
            raise click.UsageError("--active and at least one --passive are needed together")
        if options.get("datasets"):
            raise click.UsageError("give either --dataset or your own tables (--active/--passive), not both")
        options["tables"] = tables_entry(active, passives, tables_name, id_col, label_col)
    elif tables_name:
        raise click.UsageError("--name names your own tables: give it with --active/--passive")
    return compare_config_from_options(**options)


def compare_config_from_options(datasets, modes, epsilons, epsilon_scope, seeds, he_seeds, rounds, depth,
                                learning_rate, max_bin, key_bits, test_size, no_plots,
                                dp_select=_COMPARE.dp_select, dp_model=False, tables=None) -> CompareConfig:
    """The CompareConfig of `vfl compare`'s options (also used by benchmarks/compare_modes.py);
    ``dp_model``: add the dp-model arm; ``tables``: your own tables (:func:`vfl.compare.tables_entry`)."""
    arms = [x.strip() for x in modes.split(",") if x.strip()]
    arms += ["dp-model"] if dp_model and "dp-model" not in arms else []
    return CompareConfig(datasets=tuple(datasets), modes=tuple(arms),
                         epsilons=epsilons, epsilon_scope=epsilon_scope, seeds=seeds, he_seeds=he_seeds,
                         n_estimators=rounds, max_depth=depth, learning_rate=learning_rate, max_bin=max_bin,
                         key_bits=key_bits, test_size=test_size, plots=not no_plots, dp_select=dp_select,
                         tables=tables)
