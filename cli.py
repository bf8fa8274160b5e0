"""The ``vfl`` command line.

One error-translating group (:class:`VFLGroup`): every command raises the library's
errors (:class:`datasets.errors.VFLError`, ``OSError``) and the group turns them into
click's one-line ``Error: ...``; it also prints each distinct ``WeakKeyWarning`` once.
Choices come from the library's vocabulary (:mod:`vfl.core.params` enums), defaults from
the fields of :class:`vfl.core.params.TrainParams`, and one function
(:func:`train_params_from_options`) builds the parameters of `simulate` and `party active`.
"""
from __future__ import annotations

import dataclasses
import json
import sys
import warnings
from pathlib import Path

import click
from tqdm import tqdm

from crypto.cluster import dask_executor
from crypto.keys import WeakKeyWarning, check_key_bits
from datasets import SHARED_TASKS, load_active_passive, load_named
from datasets.errors import InputError, VFLError
from parties.dp_ledger import PrivacyLedger, summary
from parties.federation import load_federation
from parties.memory import return_freed_memory
from parties.network import serve_passive, train_active
from parties.passive_policy import passive_policy
from protocols.certs import make_certs
from protocols.units import format_bytes
from vfl.api import simulate as simulate_federation
from vfl.commands.common import (
    VFLCommand,
    check_timeouts,
    dask_options,
    federation_peers,
    max_bytes,
    min_iv_option,
    net_options,
    party_executor,
    passive_exchange_options,
    passive_exchange_policy,
    security_from_options,
    setup_logging,
    write_report,
)
from vfl.commands.compare import compare
from vfl.commands.evaluation import drift_option, echo_evaluation, passive_drift_option, segment_option
from vfl.commands.explain import explain as explain_command
from vfl.commands.predict import predict
from vfl.commands.progress import round_metrics, round_timing
from vfl.commands.report import report
from vfl.commands.screen import screen_command
from vfl.commands.serve import passive_online_options, serve
from vfl.commands.trees import trees
from vfl.commands.warm_start import echo_warm_start, warm_start_option
from vfl.core.dp_bins_file import read_dp_bins
from vfl.core.dp_budget import DP_TREES
from vfl.core.dp_noise import NOT_PRIVATE
from vfl.core.files import check_writable_dir, write_text_atomic
from vfl.core.params import (
    ALIGNMENTS,
    DEFAULT_PREDICTION,
    ENCRYPTIONS,
    MODES,
    OBJECTIVES,
    PREDICTIONS,
    SCHEMES,
    Mode,
    Objective,
    TrainParams,
    check_monotone,
)

#: how the scheme is named to the user
SCHEME_NAMES = {"paillier": "Paillier", "ou": "Okamoto-Uchiyama"}


class VFLGroup(click.Group):
    """The one place where library errors become CLI errors (exit code 1, ``Error: message``)
    and where ``WeakKeyWarning`` (a 1024-bit key) is shown: once per distinct message, as
    ``warning: ...`` on stderr, however often the parties generate keys."""

    command_class = VFLCommand
    group_class = type          # sub-groups are VFLGroups too

    def invoke(self, ctx):
        if ctx.parent is not None:          # a sub-group: the top group already translates
            return super().invoke(ctx)
        shown = set()
        show_other = warnings.showwarning

        def show(message, category, filename, lineno, file=None, line=None):
            if not issubclass(category, WeakKeyWarning):
                return show_other(message, category, filename, lineno, file, line)
            if str(message) not in shown:
                shown.add(str(message))
                click.echo(f"warning: {message}", err=True)

        with warnings.catch_warnings():
            warnings.simplefilter("always", WeakKeyWarning)
            warnings.showwarning = show
            try:
                return super().invoke(ctx)
            except BrokenPipeError:
                raise                       # `vfl ... | head`: click's own handling
            except (VFLError, OSError) as exc:
                raise click.ClickException(str(exc)) from exc


@click.group(cls=VFLGroup)
@click.version_option(package_name="vfl-boost")
def main():
    """Vertical federated gradient boosting (SecureBoost with Paillier; DP-only mode)."""


main.add_command(screen_command)


def _load_parties(dataset, active, passives, id_col, label_col, parties, allow_text_label=False,
                  categorical=None, weight_col=None):
    if active or passives:
        if not (active and passives):
            raise click.UsageError("--active and at least one --passive are needed together")
        return load_active_passive(active, list(passives), id_col=id_col, label_col=label_col,
                                   allow_text_label=allow_text_label, categorical=categorical, weight_col=weight_col)
    return load_named(dataset, parties, id_col=id_col, label_col=label_col)


def _echo_dp_model(result: dict) -> None:
    """The released model's privacy (``--dp-model``): epsilon (delta), mechanism, per-tree split."""
    d = result.get("dp_model")
    if not d:
        return
    if d["mechanism"] == "none":
        click.echo("privacy (released model): epsilon inf, the non-private model")
        return
    t = d["per_tree"]
    leaves = (f"leaf sums epsilon {t['leaf_gradient_epsilon']:.4g} + {t['leaf_hessian_epsilon']:.4g}"
              if d["mechanism"] == "laplace" else
              f"leaf sums sigma {t['leaf_gradient_sigma']:.4g} and {t['leaf_hessian_sigma']:.4g}")
    sk = d["sketch"]
    public = {p: r["public_features"] for p, r in sk.get("per_party", {}).items() if r["public_features"]}
    sketch = (f"sketch {sk['epsilon_spent']:.4g} of {sk['epsilon_total']:.4g} (public bins: "
              + ", ".join(f"{p} {k}" for p, k in public.items()) + ")") if public else \
        f"sketch {sk['epsilon_total']:.4g}"
    choice = (f"feature choice {t['feature_choice_epsilon']:.4g}, " if "feature_choice_epsilon" in t else "")
    click.echo(f"privacy (released model): epsilon {d['epsilon']:.4g}"
               + (f", delta {d['delta']:g}" if d.get("delta") else "") + f" per training row ({d['accounting']}); "
               f"{sketch}, per tree {d['n_trees']}x: {choice}splits "
               f"{t['split_epsilon_per_level']:.4g} per level x {t['levels']}, {leaves}")


_write_json = write_report          # a report: shareable (0644)


# --- hyperparameters: defaults from TrainParams, one function builds TrainParams -----------------
def _default(name: str):
    return TrainParams.default(name)


# CLI option name -> TrainParams field, where they differ
_OPTION_FIELDS = {"rounds": "n_estimators", "depth": "max_depth"}
# options of the credit group that describe a party's data, not training (see _credit_options)
_DATA_OPTIONS = ("categorical", "weight_col")


def train_params_from_options(options: dict) -> TrainParams:
    """THE TrainParams of `vfl simulate` and `vfl party active`, from their training and learner
    options (``_training_options``, ``_learner_options`` and ``--objective``); the key size is
    checked here for mode he (a 1024-bit key warns, see :class:`VFLGroup`)."""
    options = {k: v for k, v in options.items() if k not in _DATA_OPTIONS}
    if "monotone" in options:
        options["monotone_constraints"] = parse_monotone(options.pop("monotone"))
    if options.get("dp_bins") is not None:
        options["dp_bins"] = read_dp_bins(options["dp_bins"])
    params = TrainParams(**{_OPTION_FIELDS.get(k, k): v for k, v in options.items()})
    if params.mode == Mode.HE:
        check_key_bits(params.key_bits, SCHEME_NAMES[params.scheme])
    return params


def _learner_options(f):
    """Sampling and early-stopping options of `vfl simulate` and `vfl party active`."""
    for opt in reversed([
        click.option("--huber-slope", default=_default("huber_slope"), show_default=True,
                     help="pseudohuber objective's slope."),
        click.option("--subsample", default=_default("subsample"), show_default=True, help="Row fraction per tree."),
        click.option("--goss", is_flag=True, default=_default("goss"),
                     help="Gradient-based one-side sampling (LightGBM)."),
        click.option("--top-rate", default=_default("top_rate"), show_default=True,
                     help="GOSS: share of large-gradient rows kept."),
        click.option("--other-rate", default=_default("other_rate"), show_default=True,
                     help="GOSS: share of other rows sampled."),
        click.option("--early-stopping-rounds", type=int, default=_default("early_stopping_rounds"),
                     help="Stop when the validation metric has not improved for this many rounds."),
        click.option("--eval-metric", default=_default("eval_metric"),
                     help="Metric watched by early stopping (default per objective)."),
    ]):
        f = opt(f)
    return f


def parse_monotone(specs) -> dict | None:
    """``--monotone COL=+1`` options (repeatable; +1/-1, increasing/decreasing) as a dict."""
    out = {}
    for spec in specs or ():
        col, sep, value = str(spec).rpartition("=")
        if not sep or not col:
            raise InputError(f"--monotone {spec!r}: expected COLUMN=+1 or COLUMN=-1")
        if col in out:
            raise InputError(f"--monotone: column {col!r} is given twice")
        out[col] = value
    return check_monotone(out, "--monotone") if out else None


def _credit_options(f, active: bool = True):
    """Categorical columns, monotone constraints and (active party) sample weights."""
    options = [
        click.option("--categorical", "categorical", multiple=True,
                     help="A feature column to treat as categorical (repeatable; text columns always are)."),
        click.option("--monotone", "monotone", multiple=True,
                     help="COL=+1 or COL=-1: the prediction must increase (decrease) with COL (repeatable)."),
    ]
    if active:
        options += [
            click.option("--weight-col", default=None, help="Column of the active party's data holding sample "
                                                            "weights (>= 0; not a feature)."),
            click.option("--max-cat", default=_default("max_cat"), show_default=True,
                         help="Categorical: categories with their own bin (the rarer ones pooled)."),
            click.option("--cat-smooth", default=_default("cat_smooth"), show_default=True,
                         help="Categorical splits: smoothing of G/(H + cat_smooth)."),
            click.option("--min-data-per-group", default=_default("min_data_per_group"), show_default=True,
                         help="Categorical splits: samples per group of categories."),
            click.option("--max-cat-threshold", default=_default("max_cat_threshold"), show_default=True,
                         help="Categorical splits: categories going left at most."),
        ]
    for option in reversed(options):
        f = option(f)
    return f


def _training_options(f):
    """Hyperparameter options shared by `vfl simulate` and `vfl party active`."""
    options = [
        click.option("--mode", type=click.Choice(MODES), default=_default("mode"), show_default=True),
        click.option("--epsilon", type=float, default=_default("epsilon"),
                     help="Mode dp: each passive party's privacy budget, split evenly over its features "
                          "(inf: no noise)."),
        click.option("--epsilon-per-feature", type=float, default=_default("epsilon_per_feature"),
                     help="Mode dp: instead of --epsilon, what each feature of a party costs per row (its DP "
                          "bucket edges and its release; the party's total is this times its features). Every "
                          "feature is then released (no --dp-select: an integer K is refused)."),
        click.option("--dp-buckets", default=str(_default("dp_buckets")), show_default=True,
                     help="Mode dp: buckets per released feature: 'auto' (chosen from its epsilon, see "
                          "docs/dp.md) or an integer (at most that many; 32 with --no-dp-debias is the old "
                          "mechanism)."),
        click.option("--dp-debias/--no-dp-debias", default=_default("dp_debias"), show_default=True,
                     help="Mode dp: the active party debiases the noisy release (post-processing)."),
        click.option("--dp-select", default=_default("dp_select"), show_default=True,
                     help="Mode dp: release only K features per passive party (each at its epsilon / K), "
                          "chosen on a pilot of disjoint rows; 'auto': the pilot also picks K, from its gains and "
                          "each feature's channel at epsilon / K (no selection when the pilot is too "
                          "small); 'none': release every feature."),
        click.option("--dp-edge-share", type=float, default=_default("dp_edge_share"), show_default=True,
                     help="Mode dp: share of each passive party's epsilon spent on the DP histograms that place "
                          "its bucket edges (features with public bins from --dp-bins spend none)."),
        click.option("--dp-unsafe-noise-seed", type=int, default=_default("dp_unsafe_noise_seed"),
                     help="NOT PRIVATE, tests only: seed the DP noise so a run repeats (anyone knowing the seed "
                          "can invert it). Default: cryptographic noise; --seed never touches it."),
        click.option("--dp-model", type=float, default=_default("dp_model"),
                     help="Modes he/plain: train a differentially private released model with this total "
                          "epsilon per training row (inf: the non-private model); see docs/dp.md."),
        click.option("--dp-delta", type=float, default=_default("dp_delta"),
                     help="With --dp-model: (epsilon, delta)-DP with Gaussian leaves, accounted by dp-accounting "
                          "(default: pure epsilon, Laplace)."),
        click.option("--dp-clip", type=float, default=_default("dp_clip"),
                     help="With --dp-model: public gradient bound g* (required for objective regression)."),
        click.option("--dp-budget", default=_default("dp_budget"),
                     help="With --dp-model: relative budget shares 'sketch,splits,leaves' (default 0.1,0.2,0.7 "
                          "with --dp-trees selected: the splits share buys each tree's feature choice; 0.1,0,0.9 "
                          "with cyclic; 0.1,0.3,0.6 with exponential)."),
        click.option("--dp-trees", type=click.Choice(DP_TREES), default=_default("dp_trees"), show_default=True,
                     help="With --dp-model: 'selected': each tree splits on one feature chosen by the exponential "
                          "mechanism, halving its bins; 'cyclic': one feature per tree in turn over all parties' "
                          "features; 'exponential': split candidates of every feature."),
        click.option("--dp-bins", type=click.Path(dir_okay=False), default=None,
                     help="With --dp-model: JSON file {column: {\"lo\": x, \"hi\": y} or {\"edges\": [...]}} of "
                          "public bounds or bin edges; those features spend no sketch budget (simulate: any "
                          "party's columns, PARTY:COLUMN allowed; party active: its own)."),
        click.option("--rounds", "--trees", "rounds", default=_default("n_estimators"), show_default=True,
                     help="Boosting rounds (n_estimators): one tree each, one per class for multiclass. "
                          "(--trees: deprecated alias.)"),
        click.option("--depth", default=_default("max_depth"), show_default=True, help="max_depth."),
        click.option("--learning-rate", default=_default("learning_rate"), show_default=True),
        click.option("--max-bin", default=_default("max_bin"), show_default=True),
        click.option("--reg-lambda", default=_default("reg_lambda"), show_default=True),
        click.option("--min-child-weight", default=_default("min_child_weight"), show_default=True),
        click.option("--min-node-rows", default=_default("min_node_rows"), show_default=True,
                     help="No passive party builds a histogram of a node with fewer rows (a federation file's "
                          "min_node_rows raises it)."),
        click.option("--active-only-rounds", default=_default("active_only_rounds"), show_default=True,
                     help="The first rounds grow on the active party's own features only (no passive party "
                          "sees their instance space)."),
        click.option("--gamma", default=_default("gamma"), show_default=True),
        click.option("--key-bits", default=_default("key_bits"), show_default=True),
        click.option("--encryption", type=click.Choice(ENCRYPTIONS), default=_default("encryption"),
                     show_default=True, help="Encryption randomness: short-exponent 'fast' or full-length 'standard'."),
        click.option("--scheme", type=click.Choice(SCHEMES), default=_default("scheme"), show_default=True,
                     help="Mode he: Paillier, or Okamoto-Uchiyama 'ou' (ciphertexts mod n; docs/schemes.md)."),
        click.option("--seed", default=_default("seed"), show_default=True),
        click.option("--align", type=click.Choice(ALIGNMENTS), default=_default("align"), show_default=True,
                     help="Sample alignment: salted mmh3 hashes, or ECDH private set intersection (X25519)."),
    ]
    for option in reversed(options):
        f = option(f)
    return f


@main.command()
@click.option("--dataset", default="breast_cancer", show_default=True,
              help="Bundled 'breast_cancer', or a name from ../shared/datasets (breast, default_credit, ...).")
@click.option("--active", "--guest", "active", type=click.Path(),
              help="Active party (label holder) table: id, label, features; CSV, or a Parquet file or "
                   "directory of Parquet files. (--guest: deprecated alias.)")
@click.option("--passive", "--host", "passives", multiple=True, type=click.Path(),
              help="Passive party table (CSV or Parquet file/directory); repeat for several passive parties. "
                   "(--host: deprecated alias.)")
@click.option("--id-col", default="id", show_default=True)
@click.option("--label-col", default="y", show_default=True)
@click.option("--parties", default=2, show_default=True, help="Parties for the bundled dataset.")
@_training_options
@click.option("--test-size", default=0.2, show_default=True)
@click.option("--output-json", type=click.Path(dir_okay=False), help="Write a JSON summary here.")
@click.option("--predictions", type=click.Path(dir_okay=False), help="Write test ids and probabilities (CSV).")
@click.option("--save-model", type=click.Path(file_okay=False), help="Write one JSON model file per party.")
@click.option("--verbose", is_flag=True, help="Print the per-round time breakdown.")
@click.option("--quiet", is_flag=True, help="No progress bar.")
@click.option("--prediction", type=click.Choice(PREDICTIONS), default=DEFAULT_PREDICTION, show_default=True,
              help="Prediction protocol: one message of leaf masks per passive party, or node-by-node routing.")
@click.option("--objective", type=click.Choice(OBJECTIVES),
              default=None, help="Default: the shared dataset's task, else binary.")
@click.option("--validation-size", default=0.0, show_default=True,
              help="Fraction of the training rows held out for metric history and early stopping.")
@_learner_options
@_credit_options
@min_iv_option
@click.option("--jobs", type=click.IntRange(0, 256), default=None,
              help="Worker processes per party for the ciphertext work (0: all cores; default: "
                   "$VFL_N_JOBS, else all cores).")
@click.option("--link-mbps", type=click.FloatRange(0, min_open=True), default=None,
              help="Throughput of the links to the passive parties in Mbit/s, for the cost model that weighs "
                   "pre-shifted gradient copies' bytes against computation (default: simulation models 100 Mbit/s).")
@click.option("--dask", "dask_spec", default=None,
              help="Each party on its own Dask cluster: local:N (a LocalCluster of N processes per party on "
                   "loopback, dashboard off), or a scheduler address shared by all (tests; see docs/dask.md).")
@click.option("--dask-tls-dir", type=click.Path(file_okay=False), help="Certificates for a --dask scheduler address.")
@click.option("--dask-insecure", is_flag=True, help="Allow a non-TLS --dask scheduler address.")
@click.option("--dp-ledger-dir", type=click.Path(file_okay=False), default=None,
              help="Each passive party keeps its lifetime privacy ledger here (NAME.dp-ledger.json).")
@click.option("--dp-lifetime-epsilon", type=float, default=None,
              help="With --dp-ledger-dir: each passive party refuses what would take its dataset's total "
                   "epsilon above this.")
@segment_option
@drift_option
@warm_start_option
def simulate(dataset, active, passives, id_col, label_col, parties, test_size, output_json, predictions,
             save_model, verbose, quiet, prediction, validation_size, jobs, categorical=(), weight_col=None,
             link_mbps=None, dask_spec=None, dask_tls_dir=None, dask_insecure=False, dp_ledger_dir=None,
             dp_lifetime_epsilon=None, segment=None, drift=False, warm_start=None, **train_options):
    """Run a whole federation in one process and report time, test metric and bytes.

    --categorical, --monotone and --weight-col name columns of whichever party holds them
    (PARTY:COLUMN where several parties have a column of that name, e.g. passive1:x2)."""
    if train_options["objective"] is None:
        train_options["objective"] = (SHARED_TASKS.get(dataset, Objective.BINARY.value)
                                      if not (active or passives) else Objective.BINARY.value)
    if train_options["early_stopping_rounds"] is not None and not validation_size:
        raise click.UsageError("--early-stopping-rounds needs --validation-size")
    party_frames = _load_parties(dataset, active, passives, id_col, label_col, parties,
                                 allow_text_label=train_options["objective"] == Objective.MULTICLASS,
                                 categorical=list(categorical), weight_col=weight_col)
    params = train_params_from_options(train_options)
    if save_model:
        check_writable_dir(save_model, "--save-model directory")     # refused before training, not after
    mode = params.mode
    names = ", ".join(f"{pf.name} ({len(pf.feature_names) - (i == 0 and weight_col in pf.feature_names)} features)"
                      for i, pf in enumerate(party_frames))
    key = f", {params.key_bits}-bit {SCHEME_NAMES[params.scheme]}" if mode == Mode.HE else ""
    click.echo(f"parties: {names}; mode {mode}" + key
               + f"; objective {params.objective}")
    click.echo(f"alignment: {params.align}; prediction: {prediction}")
    if params.dp_unsafe_noise_seed is not None:
        click.echo(f"WARNING: {NOT_PRIVATE}: --dp-unsafe-noise-seed {params.dp_unsafe_noise_seed} seeds the DP noise; "
                   "the printed epsilon does not hold")
    bar = tqdm(total=params.n_estimators, desc="rounds", unit="round", disable=quiet, file=sys.stderr)

    def on_round(r, info):
        bar.update(1)
        if verbose:
            line = round_metrics(info, train=params.dp_model is None)
            bar.write(f"round {r + 1}: " + round_timing(info["timing"]) + (f"; {line}" if line else ""))

    executors = []

    def executor_for(party_name):
        executors.append(dask_executor(dask_spec, party_name, tls_dir=dask_tls_dir, insecure=dask_insecure))
        return executors[-1]

    try:
        fed, result, test_ids, proba = simulate_federation(party_frames, params, test_size=test_size,
                                                           seed=params.seed, on_round=on_round,
                                                           prediction=prediction,
                                                           validation_size=validation_size or None,
                                                           executor_for=executor_for if dask_spec else None,
                                                           link_mbps=link_mbps, categorical=list(categorical),
                                                           weight_col=weight_col, dp_ledger_dir=dp_ledger_dir,
                                                           dp_lifetime_epsilon=dp_lifetime_epsilon, n_jobs=jobs,
                                                           segment=segment, drift=drift, warm_start=warm_start)
        if dask_spec:
            result["dask"] = {"spec": dask_spec, "workers": {ex.name: ex.worker_peaks() for ex in executors}}
    finally:
        for ex in executors:
            ex.close()
    bar.close()
    for party, rep in result["alignment"].items():
        click.echo(f"aligned {party}: {rep['n_kept']} of {rep['n_rows']} rows kept")
    echo_warm_start(result)
    click.echo(f"train: {result['n_train']} rows, test: {result['n_test']} rows")
    click.echo(f"train time: {result['train_seconds']:.2f} s")
    if mode == Mode.DP:
        for p, e in result["epsilon_per_party"].items():
            click.echo(f"privacy {p}: epsilon {e} per row in total (each feature's release "
                       f"{result['epsilon_per_feature'][p]}-LDP)")
    _echo_dp_model(result)
    if result["test_auc"] is not None:
        click.echo(f"test AUC: {result['test_auc']:.4f}")
    if fed.active.label_mapping and any(c != i for c, i in fed.active.label_mapping.items()):
        click.echo("classes: " + ", ".join(f"{i} = {c!r}" for c, i in fed.active.label_mapping.items()))
    for key, label in (("test_accuracy", "test accuracy"), ("test_logloss", "test log loss"),
                       ("test_rmse", "test RMSE"), ("test_mae", "test MAE")):
        if result.get(key) is not None:
            click.echo(f"{label}: {result[key]:.4f}")
    echo_evaluation(result)
    if result.get("n_validation"):
        best = result["best_iteration"]
        click.echo(f"validation: {result['n_validation']} rows, {result['n_rounds']} rounds grown"
                   + (f", best iteration {best + 1} ({result['eval_metric']} "
                      f"{result['history']['validation'][result['eval_metric']][best]:.4f})"
                      if best is not None else ""))
    for pair, n in result["bytes_sent"].items():
        click.echo(f"bytes {pair}: {n} ({format_bytes(n)})")
    if verbose and result["crypto_seconds"]:
        click.echo("crypto: " + ", ".join(f"{k} {v:.3f}s" for k, v in result["crypto_seconds"].items()))
    if output_json:
        _write_json(output_json, result)
    if predictions:
        write_text_atomic(predictions, fed.model.prediction_table(test_ids, proba, id_col).to_csv(index=False))
    if save_model:
        paths = fed.save(save_model)
        click.echo("saved model files: " + ", ".join(str(p) for p in paths))


# --- network deployments: vfl certs, vfl party passive|active, vfl predict -------------------------
@main.command()
@click.option("--out", required=True, type=click.Path(file_okay=False), help="Directory for the files.")
@click.option("--federation", "federation_file", type=click.Path(dir_okay=False),
              help="The federation file: one certificate per party, with that party's name and its own hosts only.")
@click.option("--party", "parties", multiple=True, help="Party name; repeat for each party (without --federation).")
@click.option("--host", "hosts", multiple=True,
              help="Extra DNS name or IP address to put in every certificate (optional: peers are "
                   "verified by party name; never another party's name).")
@click.option("--days", default=825, show_default=True, help="Validity of the certificates.")
@click.option("--overwrite", is_flag=True, help="Replace existing certificates of these parties.")
def certs(out, parties, hosts, days, overwrite, federation_file=None):
    """Create a development CA (reused if DIR has one) and a certificate per party."""
    party_hosts = None
    if federation_file:
        if hosts:
            raise click.UsageError("--host goes into every certificate; with --federation each party's hosts come "
                                   "from its [parties.NAME] hosts")
        fed = load_federation(federation_file)
        for p in parties:
            fed.party(p, "--party")
        parties = parties or tuple(fed.parties)
        party_hosts = {p: fed.parties[p].hosts for p in parties}
    elif not parties:
        raise click.UsageError("give --federation FILE or at least one --party NAME")
    written = make_certs(out, parties, hosts, days, overwrite, party_hosts=party_hosts)
    for f in written:
        click.echo(f"wrote {f}")
    click.echo(f"give each party ca.pem and its own NAME.pem/NAME.key; keep {Path(out) / 'ca.key'} elsewhere")


@main.group("dp-ledger")
def dp_ledger_group():
    """A passive party's lifetime privacy ledger (docs/dp.md)."""


@dp_ledger_group.command("show")
@click.argument("path", type=click.Path(dir_okay=False, exists=True))
@click.option("--json", "as_json", is_flag=True, help="Print the whole ledger as JSON.")
def dp_ledger_show(path, as_json):
    """What every dataset in the ledger PATH has spent, per kind of charge."""
    doc = PrivacyLedger(path).read()
    if as_json:
        click.echo(json.dumps(doc, indent=1))
        return
    rows = summary(doc)
    if not rows:
        click.echo("no charges")
    for fp, r in rows.items():
        kinds = ", ".join(f"{k} {v:.6g}" if v != "inf" else f"{k} inf" for k, v in r["kinds"].items())
        total = r["epsilon"] if r["epsilon"] == "inf" else f"{r['epsilon']:.6g}"
        click.echo(f"dataset {fp[:16]}: epsilon {total} in {r['entries']} charge(s) ({kinds})")


@main.group()
def party():
    """Run one party of a federation as its own process (network mode)."""


@party.command("passive")
@click.option("--name", required=True, help="This party's name (as the active party's --peer NAME=...).")
@click.option("--listen", default="127.0.0.1:50051", show_default=True, help="HOST:PORT to serve on (port 0: any).")
@click.option("--data", required=True, type=click.Path(),
              help="The id column and this party's features (rows to train on and to score): CSV, or a "
                   "Parquet file or directory of Parquet files.")
@click.option("--id-col", default="id", show_default=True)
@click.option("--model-dir", required=True, type=click.Path(file_okay=False),
              help="Where this party keeps its lookup tables, one file per model.")
@click.option("--federation", "federation_file", type=click.Path(dir_okay=False),
              help="The federation file (docs/federation.md): who may train and predict against this party.")
@click.option("--allow-client", "allow_clients", multiple=True,
              help="Accept only clients whose certificate is for this name (repeatable; TLS only; required under "
                   "TLS without --federation).")
@click.option("--allow-align", "allow_align", multiple=True, type=click.Choice(ALIGNMENTS),
              help="Alignment methods this party accepts (repeatable) [default: hash and psi].")
@click.option("--allow-prediction", "allow_prediction", multiple=True, type=click.Choice(PREDICTIONS),
              help="Prediction protocols this party accepts (repeatable) [default: both].")
@click.option("--dp-max-epsilon-per-feature", type=float, default=None,
              help="Mode dp: refuse a noisy release with a larger budget per feature.")
@click.option("--validation-data", type=click.Path(),
              help="The id column and this party's features of the validation rows (CSV or Parquet).")
@click.option("--dp-bins", type=click.Path(dir_okay=False), default=None,
              help="For --dp-model and mode dp trainings: JSON file {column: {\"lo\": x, \"hi\": y} or "
                   "{\"edges\": [...]}} of this party's public bounds or bin edges (no budget spent on them).")
@click.option("--dp-ledger", type=click.Path(dir_okay=False), default=None,
              help="Lifetime privacy ledger file: every DP release and training of this party's dataset is "
                   "charged there (vfl dp-ledger show FILE) [default: MODEL_DIR/ledgers/dp-ledger.json].")
@click.option("--dp-lifetime-epsilon", type=float, default=None,
              help="Refuse any release or training that would take the dataset's total epsilon above this (a "
                   "training without DP counts as infinite) [default: DP releases capped by the federation "
                   "entry's dp_lifetime_epsilon, 10].")
@click.option("--reveal-budget", type=click.Path(dir_okay=False), default=None,
              help="Lifetime reveal budget file (trainings, split answers per row, prediction decisions; "
                   "docs/federation.md) [default: MODEL_DIR/ledgers/reveal-budget.json].")
@net_options
@dask_options
@passive_exchange_options
@lambda f: _credit_options(f, active=False)
@passive_drift_option
@passive_online_options
def party_passive(name, listen, data, id_col, model_dir, allow_clients, allow_align, allow_prediction,
                  dp_max_epsilon_per_feature, tls_dir, insecure, token_file, max_message_mb, log_level,
                  validation_data=None, dask_scheduler=None, dask_tls_dir=None, dask_insecure=False,
                  dask_via_scheduler=False, categorical=(), monotone=(), dp_bins=None, dp_ledger=None,
                  dp_lifetime_epsilon=None, federation_file=None, drift_answers=None, audit_log=None,
                  metrics_listen=None, reload_interval=1.0, log_format="text", require_active_only_rounds=0,
                  categorical_ordered=False, reveal_budget=None):
    """Serve training sessions, prediction requests and online scoring of an active party."""
    setup_logging(log_level, log_format)
    federation = load_federation(federation_file) if federation_file else None
    return_freed_memory()         # a long-lived driver: freed memory goes back to the system
    sec = security_from_options(name, tls_dir, insecure, token_file, allow_clients)
    host = listen.rsplit(":", 1)[0]
    dp_bins = read_dp_bins(dp_bins) if dp_bins is not None else None

    def ready(port):
        click.echo(f"{name}: listening on {host}:{port}")
        sys.stdout.flush()

    policy = passive_policy(allow_align, allow_prediction, dp_max_epsilon_per_feature, dp_ledger, dp_lifetime_epsilon) \
        | {k: v for k, v in (("drift_policy", drift_answers), ("reveal_budget_path", reveal_budget)) if v} \
        | passive_exchange_policy(require_active_only_rounds, categorical_ordered)
    executor = party_executor(name, dask_scheduler, dask_tls_dir, dask_insecure, "passive", dask_via_scheduler,
                              sec.ca_pem)
    try:
        serve_passive(name, listen, data, id_col, model_dir, sec, max_bytes(max_message_mb), on_ready=ready,
                      policy=policy, validation_data=validation_data, executor=executor,
                      categorical=list(categorical), monotone=parse_monotone(monotone), dp_bins=dp_bins,
                      federation=federation, metrics_listen=metrics_listen, reload_interval=reload_interval,
                      audit_log=audit_log if audit_log is not None else Path(model_dir) / "online-audit.jsonl")
    finally:
        if executor is not None:
            executor.close()


@party.command("active")
@click.option("--name", default=None, help="This party's name [default: the federation's active party, else 'active'].")
@click.option("--federation", "federation_file", type=click.Path(dir_okay=False),
              help="The federation file: the passive parties' addresses and min_node_rows (docs/federation.md).")
@click.option("--data", required=True, type=click.Path(),
              help="id, label, features: CSV, or a Parquet file or directory of Parquet files.")
@click.option("--id-col", default="id", show_default=True)
@click.option("--label-col", default="y", show_default=True)
@click.option("--peer", "peer_specs", multiple=True,
              help="Passive party NAME=HOST:PORT; repeat for each (default: the federation file's passive parties).")
@click.option("--model-dir", required=True, type=click.Path(file_okay=False),
              help="Where the model (and, during training, checkpoint.json) is written.")
@click.option("--resume", is_flag=True, help="Continue the interrupted training in --model-dir.")
@click.option("--force", is_flag=True, help="Replace a finished model in --model-dir.")
@click.option("--timeout", default=60.0, show_default=True, help="Seconds any single call may take.")
@click.option("--connect-timeout", type=float, help="Seconds to wait for the peers at start [default: --timeout].")
@_training_options
@click.option("--output-json", type=click.Path(dir_okay=False), help="Write a JSON summary here.")
@click.option("--quiet", is_flag=True, help="No progress bar.")
@click.option("--objective", type=click.Choice(OBJECTIVES), default=_default("objective"), show_default=True)
@click.option("--validation-data", type=click.Path(),
              help="Validation rows (CSV or Parquet): id, label, features (each passive party serves its own "
                   "with `vfl party passive --validation-data`).")
@_learner_options
@click.option("--link-mbps", type=click.FloatRange(0, min_open=True), default=None,
              help="Throughput of the links to the passive parties in Mbit/s, for the cost model that weighs "
                   "pre-shifted gradient copies' bytes against computation (default: measured on each round's "
                   "gradient message; 100 Mbit/s until measured).")
@_credit_options
@min_iv_option
@net_options
@dask_options
@warm_start_option
def party_active(name, data, id_col, label_col, peer_specs, model_dir, resume, force, timeout, connect_timeout,
                 output_json, quiet, validation_data, link_mbps, tls_dir, insecure, token_file, max_message_mb,
                 log_level, categorical=(), weight_col=None, dask_scheduler=None, dask_tls_dir=None,
                 dask_insecure=False, dask_via_scheduler=False, federation_file=None, warm_start=None,
                 **train_options):
    """Train with passive parties over the network (checkpoint after every tree)."""
    setup_logging(log_level)
    return_freed_memory()         # a long-lived driver: freed memory goes back to the system
    check_timeouts(timeout, connect_timeout)
    federation = load_federation(federation_file) if federation_file else None
    name, peers = federation_peers(federation, name, peer_specs, active=True)
    sec = security_from_options(name, tls_dir, insecure, token_file)
    params = train_params_from_options(train_options)
    if federation is not None and params.min_node_rows < federation.min_node_rows:
        params = dataclasses.replace(params, min_node_rows=federation.min_node_rows)
    if params.early_stopping_rounds is not None and validation_data is None:
        raise click.UsageError("--early-stopping-rounds needs --validation-data")
    with tqdm(total=params.n_estimators, desc="rounds", unit="round", disable=quiet, file=sys.stderr) as bar:

        def on_round(r, info):
            bar.n = r + 1
            bar.refresh()
            line = round_metrics(info, train=params.dp_model is None)
            if line and not quiet:
                bar.write(f"round {r + 1}: {line}")

        executor = party_executor(name, dask_scheduler, dask_tls_dir, dask_insecure, "active", dask_via_scheduler,
                                  sec.ca_pem)
        try:
            result = train_active(data, id_col, label_col, name, peers, params, model_dir, sec, timeout=timeout,
                                  resume=resume, force=force, align=params.align,
                                  max_frame_bytes=max_bytes(max_message_mb), connect_timeout=connect_timeout,
                                  on_round=on_round, validation_data=validation_data, executor=executor,
                                  link_mbps=link_mbps, categorical=list(categorical), weight_col=weight_col,
                                  warm_start=warm_start)
        finally:
            if executor is not None:
                executor.close()
    for p, rep in result["alignment"].items():
        click.echo(f"aligned {p}: {rep['n_kept']} of {rep['n_rows']} rows kept")
    if result["resumed_after_rounds"] is not None:
        click.echo(f"resumed after {result['resumed_after_rounds']} round(s)")
    echo_warm_start(result)
    click.echo(f"train time: {result['train_seconds']:.2f} s")
    if result.get("n_validation"):
        best, metric = result["best_iteration"], result["eval_metric"]
        last = result["history"]["validation"][metric]
        click.echo(f"validation: {result['n_validation']} rows, {result['n_rounds']} rounds grown, "
                   + (f"best iteration {best + 1} ({metric} {last[best]:.4f})" if best is not None
                      else f"{metric} {last[-1]:.4f} after the last round"))
    for pair, n in result["bytes_sent"].items():
        click.echo(f"bytes {pair}: {n} ({format_bytes(n)})")
    _echo_dp_model(result)
    click.echo(f"saved model {result['model_id']} to {result['model_path']}")
    if output_json:
        _write_json(output_json, result)


main.add_command(compare)
main.add_command(predict)
main.add_command(report)
main.add_command(trees)

main.add_command(serve)
main.add_command(explain_command)

if __name__ == "__main__":
    main()
