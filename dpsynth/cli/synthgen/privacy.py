"""`synthgen privacy dpsgd|fewshot`: privacy calculators over `synthgen.privacy.accounting`."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from dpsynth.cli.shared import group_app
from dpsynth.cli.synthgen.common import DeclaredDeltaOption, FewShotMechanismOption
from synthgen.command_line import JsonOption, choice
from synthgen.privacy.figures import format_epsilon

FewShotNoiseOption = Annotated[
    float | None, typer.Option(help="sigma (gaussian) or per-token epsilon (rnm)")
]
TokensPerDrawOption = Annotated[
    int, typer.Option(help="tokens sharing one draw (1 = fresh draw per token)")
]

privacy_app = group_app("Privacy calculators (no data is touched).")


@privacy_app.command("dpsgd")
def privacy_dpsgd(
    num_examples: Annotated[int, typer.Option(help="private examples n")],
    batch_size: Annotated[int, typer.Option(help="expected (poisson) or exact (shuffle) batch")],
    epochs: Annotated[float, typer.Option(help="passes over the data; steps = ceil(E*n/B)")],
    delta: Annotated[float, typer.Option(help="target delta")],
    noise_multiplier: Annotated[float | None, typer.Option(help="sigma; prints epsilon")] = None,
    target_epsilon: Annotated[float | None, typer.Option(help="prints calibrated sigma")] = None,
    sampling: Annotated[
        str,
        choice("poisson", "shuffle", help="how batches are drawn"),
    ] = "poisson",
    accountant: Annotated[str, choice("pld", "rdp", help="the accountant")] = "pld",
    as_json: JsonOption = False,
) -> None:
    """Epsilon of DP-SGD for a noise multiplier, or the noise multiplier for a target epsilon."""
    from synthgen.privacy import accounting  # dp_accounting: loaded by the calculators only

    if (noise_multiplier is None) == (target_epsilon is None):
        raise typer.BadParameter("give exactly one of --noise-multiplier and --target-epsilon")
    if sampling not in accounting.SAMPLINGS:
        raise typer.BadParameter(f"--sampling must be one of {accounting.SAMPLINGS}")
    if accountant not in accounting.ACCOUNTANTS:
        raise typer.BadParameter(f"--accountant must be one of {accounting.ACCOUNTANTS}")
    steps = accounting.steps_for_epochs(num_examples, batch_size, epochs)
    accounting.check_delta(delta, num_examples)
    shape = dict(num_examples=num_examples, batch_size=batch_size, steps=steps)
    shape.update(sampling=sampling, accountant=accountant)
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
    eps = format_epsilon(eps)  # rounded up: never below the computed epsilon
    rest = f"steps={steps}, q={result['sampling_rate']:.4g}, {sampling}, {accountant})"
    if as_json:
        print(json.dumps(result))
    elif target_epsilon is not None:
        print(f"noise_multiplier={noise_multiplier:.4f} (epsilon={eps}, delta={delta:g}, {rest}")
    else:
        print(f"epsilon={eps} (delta={delta:g}, noise_multiplier={noise_multiplier:g}, {rest}")


@privacy_app.command("fewshot")
def privacy_fewshot(
    num_private: Annotated[int, typer.Option(help="private examples N (a declared public figure)")],
    sample_size: Annotated[int, typer.Option(help="examples drawn per token (all M subsets)")],
    tokens: Annotated[int, typer.Option(help="total released tokens T")],
    noise_multiplier: FewShotNoiseOption = None,
    target_epsilon: Annotated[float | None, typer.Option(help="prints calibrated noise")] = None,
    delta: DeclaredDeltaOption = None,
    mechanism: FewShotMechanismOption = "gaussian",
    tokens_per_draw: TokensPerDrawOption = 1,
    as_json: JsonOption = False,
) -> None:
    """Epsilon of DP few-shot generation (Tang et al. 2024), or the noise for a target.

    delta must be below 1/N and defaults to 1/(10N), as in `synthgen generate-docs`.
    """
    from synthgen.fewshot import resolve_delta
    from synthgen.privacy import accounting

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
            f"epsilon={format_epsilon(eps)} (delta={delta:g}, {noise_name}={noise_multiplier:.4g}, "
            f"tokens={tokens}, q={result['sampling_rate']:.4g}, {mechanism}, pld)"
        )
