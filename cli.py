"""The ``vfl`` command line."""
from __future__ import annotations

import json
import sys
import warnings
from pathlib import Path

import click

from vfl.errors import VFLError


def _fail(exc: Exception):
    raise click.ClickException(str(exc))


@click.group()
@click.version_option(package_name="vfl-boost")
def main():
    """Vertical federated gradient boosting (SecureBoost with Paillier; DP-only mode)."""


def _load_parties(dataset, guest, hosts, id_col, label_col, parties, allow_text_label=False):
    from datasets import breast_cancer_parties, load_guest_host, load_shared
    if guest or hosts:
        if not (guest and hosts):
            raise click.UsageError("--guest and at least one --host are needed together")
        return load_guest_host(guest, list(hosts), id_col=id_col, label_col=label_col,
                               allow_text_label=allow_text_label)
    if dataset == "breast_cancer":
        return breast_cancer_parties(parties, id_col=id_col, label_col=label_col)
    return load_shared(dataset)


def _fmt_bytes(n: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024


@main.command()
@click.option("--dataset", default="breast_cancer", show_default=True,
              help="Bundled 'breast_cancer', or a name from ../shared/datasets (breast, default_credit, ...).")
@click.option("--guest", type=click.Path(dir_okay=False), help="Guest (active party) CSV: id, label, features.")
@click.option("--host", "hosts", multiple=True, type=click.Path(dir_okay=False),
              help="Host (passive party) CSV; repeat for several hosts.")
@click.option("--id-col", default="id", show_default=True)
@click.option("--label-col", default="y", show_default=True)
@click.option("--parties", default=2, show_default=True, help="Parties for the bundled dataset.")
@click.option("--mode", type=click.Choice(["he", "plain", "dp"]), default="he", show_default=True)
@click.option("--epsilon", type=float, default=None,
              help="Mode dp: each passive party's privacy budget, split evenly over its features (inf: no noise).")
@click.option("--epsilon-per-feature", type=float, default=None,
              help="Mode dp: the budget per released feature instead (a party's total is this times its features).")
@click.option("--trees", default=10, show_default=True, help="Boosting rounds (n_estimators).")
@click.option("--depth", default=4, show_default=True, help="max_depth.")
@click.option("--learning-rate", default=0.3, show_default=True)
@click.option("--max-bin", default=32, show_default=True)
@click.option("--reg-lambda", default=1.0, show_default=True)
@click.option("--min-child-weight", default=1.0, show_default=True)
@click.option("--gamma", default=0.0, show_default=True)
@click.option("--key-bits", default=2048, show_default=True)
@click.option("--encryption", type=click.Choice(["fast", "standard"]), default="fast", show_default=True,
              help="Paillier randomness: short-exponent 'fast' or phe-style 'standard'.")
@click.option("--test-size", default=0.2, show_default=True)
@click.option("--seed", default=0, show_default=True)
@click.option("--output-json", type=click.Path(dir_okay=False), help="Write a JSON summary here.")
@click.option("--predictions", type=click.Path(dir_okay=False), help="Write test ids and probabilities (CSV).")
@click.option("--save-model", type=click.Path(file_okay=False), help="Write one JSON model file per party.")
@click.option("--verbose", is_flag=True, help="Print the per-tree time breakdown.")
@click.option("--quiet", is_flag=True, help="No progress bar.")
@click.option("--align", type=click.Choice(["hash", "psi"]), default="hash", show_default=True,
              help="Sample alignment: salted mmh3 hashes, or ECDH private set intersection (X25519).")
@click.option("--prediction", type=click.Choice(["one-round", "node"]), default="one-round", show_default=True,
              help="Prediction protocol: one message of leaf masks per passive party, or node-by-node routing.")
@click.option("--objective", type=click.Choice(["binary", "multiclass", "regression", "pseudohuber"]),
              default=None, help="Default: the shared dataset's task, else binary.")
@click.option("--huber-slope", default=1.0, show_default=True, help="pseudohuber objective's slope.")
@click.option("--validation-size", default=0.0, show_default=True,
              help="Fraction of the training rows held out for metric history and early stopping.")
@click.option("--early-stopping-rounds", type=int, default=None,
              help="Stop when the validation metric has not improved for this many rounds.")
@click.option("--eval-metric", default=None, help="Metric watched by early stopping (default per objective).")
@click.option("--subsample", default=1.0, show_default=True, help="Row fraction per tree.")
@click.option("--goss", is_flag=True, help="Gradient-based one-side sampling (LightGBM).")
@click.option("--top-rate", default=0.2, show_default=True, help="GOSS: share of large-gradient rows kept.")
@click.option("--other-rate", default=0.1, show_default=True, help="GOSS: share of other rows sampled.")
def simulate(dataset, guest, hosts, id_col, label_col, parties, mode, trees, depth, learning_rate, max_bin,
             reg_lambda, min_child_weight, gamma, key_bits, encryption, test_size, seed, output_json,
             predictions, save_model, verbose, quiet, align="hash", prediction="one-round",
             epsilon=None, epsilon_per_feature=None, objective=None, huber_slope=1.0, validation_size=0.0,
             early_stopping_rounds=None, eval_metric=None, subsample=1.0, goss=False, top_rate=0.2,
             other_rate=0.1):
    """Run a whole federation in one process and report time, test metric and bytes."""
    from tqdm import tqdm

    from crypto.keys import WeakKeyWarning
    from vfl.api import simulate as run
    from vfl.params import TrainParams

    try:
        if objective is None:
            from datasets import SHARED_TASKS
            objective = SHARED_TASKS.get(dataset, "binary") if not (guest or hosts) else "binary"
        if early_stopping_rounds is not None and not validation_size:
            raise click.UsageError("--early-stopping-rounds needs --validation-size")
        party_frames = _load_parties(dataset, guest, hosts, id_col, label_col, parties,
                                     allow_text_label=objective == "multiclass")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", WeakKeyWarning)
            params = TrainParams(n_estimators=trees, max_depth=depth, learning_rate=learning_rate,
                                 max_bin=max_bin, reg_lambda=reg_lambda, min_child_weight=min_child_weight,
                                 gamma=gamma, mode=mode, key_bits=key_bits, encryption=encryption, seed=seed,
                                 align=align, epsilon=epsilon, epsilon_per_feature=epsilon_per_feature,
                                 objective=objective, huber_slope=huber_slope, subsample=subsample, goss=goss,
                                 top_rate=top_rate, other_rate=other_rate,
                                 early_stopping_rounds=early_stopping_rounds, eval_metric=eval_metric)
            from crypto.keys import check_key_bits
            if mode == "he":
                check_key_bits(key_bits)
        for w in caught:
            click.echo(f"warning: {w.message}", err=True)
        names = ", ".join(f"{pf.name} ({len(pf.feature_names)} features)" for pf in party_frames)
        click.echo(f"parties: {names}; mode {mode}" + (f", {key_bits}-bit Paillier" if mode == "he" else "")
                   + f"; objective {params.objective}")
        click.echo(f"alignment: {align}; prediction: {prediction}")
        bar = tqdm(total=trees, desc="trees", unit="tree", disable=quiet, file=sys.stderr)

        def on_round(r, info):
            bar.update(1)
            if verbose:
                t = info["timing"]
                val = info.get("validation")
                bar.write(f"tree {r + 1}: " + ", ".join(f"{k} {v:.3f}s" for k, v in t.items())
                          + ("; validation " + ", ".join(f"{k} {v:.4f}" for k, v in val.items()) if val else ""))

        with warnings.catch_warnings():
            warnings.simplefilter("ignore", WeakKeyWarning)
            fed, result, test_ids, proba = run(party_frames, params, test_size=test_size, seed=seed,
                                               on_round=on_round, prediction=prediction,
                                               validation_size=validation_size or None)
        bar.close()
    except VFLError as exc:
        _fail(exc)
    except OSError as exc:
        _fail(exc)
    for party, rep in result["alignment"].items():
        click.echo(f"aligned {party}: {rep['n_kept']} of {rep['n_rows']} rows kept")
    click.echo(f"train: {result['n_train']} rows, test: {result['n_test']} rows")
    click.echo(f"train time: {result['train_seconds']:.2f} s")
    if mode == "dp":
        for p, e in result["epsilon_per_party"].items():
            click.echo(f"privacy {p}: epsilon {e} per row in total (each feature's release "
                       f"{result['epsilon_per_feature'][p]}-LDP)")
    if result["test_auc"] is not None:
        click.echo(f"test AUC: {result['test_auc']:.4f}")
    if fed.active.label_mapping and any(c != i for c, i in fed.active.label_mapping.items()):
        click.echo("classes: " + ", ".join(f"{i} = {c!r}" for c, i in fed.active.label_mapping.items()))
    for key, label in (("test_accuracy", "test accuracy"), ("test_logloss", "test log loss"),
                       ("test_rmse", "test RMSE"), ("test_mae", "test MAE")):
        if result.get(key) is not None:
            click.echo(f"{label}: {result[key]:.4f}")
    if result.get("n_validation"):
        best = result["best_iteration"]
        click.echo(f"validation: {result['n_validation']} rows, {result['n_rounds']} rounds grown"
                   + (f", best iteration {best + 1} ({result['eval_metric']} "
                      f"{result['history']['validation'][result['eval_metric']][best]:.4f})"
                      if best is not None else ""))
    for pair, n in result["bytes_sent"].items():
        click.echo(f"bytes {pair}: {n} ({_fmt_bytes(n)})")
    if verbose and result["crypto_seconds"]:
        click.echo("crypto: " + ", ".join(f"{k} {v:.3f}s" for k, v in result["crypto_seconds"].items()))
    try:
        if output_json:
            Path(output_json).write_text(json.dumps(result, indent=1, default=float))
        if predictions:
            import pandas as pd
            model = fed.model
            if model.objective == "binary":
                out = pd.DataFrame({id_col: test_ids, "proba": proba})
            elif model.objective == "multiclass":
                classes = model.classes or list(range(model.n_targets))
                out = pd.DataFrame({id_col: test_ids,
                                    "prediction": [classes[i] for i in proba.argmax(axis=1)]})
                for i, c in enumerate(classes):
                    out[f"proba_{c}"] = proba[:, i]
            else:
                out = pd.DataFrame({id_col: test_ids, "prediction": proba})
            out.to_csv(predictions, index=False)
        if save_model:
            paths = fed.save(save_model)
            click.echo("saved model files: " + ", ".join(str(p) for p in paths))
    except OSError as exc:
        _fail(exc)


@main.command()
@click.option("--dataset", "datasets", multiple=True,
              help="Repeatable. Default: breast_cancer, plus default_credit and give_credit when "
                   "../shared/datasets exists.")
@click.option("--modes", default="plain,he,dp,local,xgboost", show_default=True,
              help="Comma list of plain, he, dp, local (active party alone), xgboost (centralized).")
@click.option("--epsilons", default="0.5,1,2,4,8,inf", show_default=True, help="DP budgets to sweep.")
@click.option("--epsilon-scope", type=click.Choice(["party", "feature"]), default="party", show_default=True,
              help="Whether an epsilon is each passive party's total or per feature.")
@click.option("--seeds", default=3, show_default=True, help="Seeds 0..N-1 (train/test split and DP noise).")
@click.option("--he-seeds", default=1, show_default=True,
              help="HE runs only for the first N seeds (HE grows plain's trees exactly; it costs time).")
@click.option("--trees", default=10, show_default=True)
@click.option("--depth", default=4, show_default=True)
@click.option("--learning-rate", default=0.3, show_default=True)
@click.option("--max-bin", default=32, show_default=True, help="Bins in every mode (DP: buckets q).")
@click.option("--key-bits", default=1024, show_default=True, help="Paillier key size of the HE runs.")
@click.option("--test-size", default=0.2, show_default=True)
@click.option("--out-dir", default="compare_results", show_default=True, type=click.Path(file_okay=False))
@click.option("--no-plots", is_flag=True, help="Only CSV/JSON (no matplotlib needed).")
@click.option("--quiet", is_flag=True, help="No line per run.")
def compare(datasets, modes, epsilons, epsilon_scope, seeds, he_seeds, trees, depth, learning_rate, max_bin,
            key_bits, test_size, out_dir, no_plots, quiet):
    """Compare plain, HE and DP (at several epsilons) on the same splits: CSV, JSON and PNG figures."""
    from vfl.compare import CompareConfig, format_table, run_comparison

    cfg = CompareConfig(datasets=tuple(datasets), modes=tuple(x.strip() for x in modes.split(",") if x.strip()),
                        epsilons=epsilons, epsilon_scope=epsilon_scope, seeds=seeds, he_seeds=he_seeds,
                        n_estimators=trees, max_depth=depth, learning_rate=learning_rate, max_bin=max_bin,
                        key_bits=key_bits, test_size=test_size, plots=not no_plots)
    try:
        doc = run_comparison(cfg, out_dir, progress=None if quiet else lambda s: click.echo(s, err=True))
    except VFLError as exc:
        _fail(exc)
    except OSError as exc:
        _fail(exc)
    click.echo(format_table(doc["summary"]))
    for note in doc["notes"]:
        click.echo(f"note: {note}")
    click.echo("wrote: " + ", ".join(doc["files"]))


if __name__ == "__main__":
    main()
