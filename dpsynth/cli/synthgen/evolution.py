"""`synthgen generate-docs-pe`: Private Evolution (`synthgen.evolution`), a thin wrapper.

Privacy: the guarantee is T Gaussian nearest-neighbour histograms (`synthgen.evolution`),
fixed by public options only (`--iterations`, `--epsilon` or `--noise`, `--votes`,
`--delta` or the declared `--public-size`); the LM sees public prompts only. `--limit` and
`--split` select rows by position, so the guarantee covers the selected rows; `--encoder`
must be public or DP-trained (a DP-trained one's guarantee composes with the run's, as
DP-RAG's); `--seed` is for tests only (warned about and recorded in the metadata).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer

from dpsynth.cli.shared import admit_run
from dpsynth.cli.synthgen.common import (
    SEED_WARNING,
    BudgetOption,
    DatasetOption,
    DeclaredDeltaOption,
    ModelOption,
    SeedOption,
    ServerConcurrencyOption,
    ServerContextOption,
    ServerModelOption,
    ServerOption,
    ServerPromptOption,
    SplitOption,
    TenantOption,
    TextFieldOption,
    TopLogprobsOption,
    lm_options,
    load_lm,
)
from synthgen.command_line import GuaranteesAddUpOption, LedgerOption, usage_errors

STAGE = "evolution"  # the ledger stage of `generate-docs-pe`


PublicSizeOption = Annotated[
    int,
    typer.Option(
        help="declared public figure N for the private data's size: delta defaults to "
        "1/(10N) and must be below 1/N; more private samples than N are refused"
    ),
]
LabelFieldOption = Annotated[
    str | None, typer.Option(help="label field: votes stay within a label (needs --labels)")
]
LabelsOption = Annotated[
    str | None,
    typer.Option(help="public comma-separated label list (rows with others are ignored)"),
]
PopulationOption = Annotated[
    int | None, typer.Option(help="candidates per label per iteration (default: released)")
]
InitialPromptOption = Annotated[
    str | None, typer.Option(help="public prompt of the first population; may use {label}")
]
VariationPromptOption = Annotated[
    str | None, typer.Option(help="uses {text} (a synthetic sample), may use {label}")
]
EncoderOption = Annotated[str, typer.Option(help="embedding model: asset name or encoder folder")]
LimitOption = Annotated[
    int | None, typer.Option(help="first N private samples only (the guarantee covers those)")
]


def _check_options(epsilon, noise, label_field, labels, encoder) -> str:
    """Refuses contradicting or missing options, and an encoder whose provenance does not
    show it public or DP-trained (the votes' sensitivity holds it fixed), before any read;
    returns why the encoder qualifies (for the release's metadata)."""
    from retriever.provenance import collection_independence

    with usage_errors(ValueError, option="--encoder"):  # a provenance.json that is not JSON
        why = collection_independence(encoder)
    if why is None:
        raise typer.BadParameter(
            f"{encoder} is neither an asset nor an encoder folder whose provenance.json "
            "shows it public or DP-trained",
            param_hint="--encoder",
        )
    if (epsilon is None) == (noise is None):
        raise typer.BadParameter("give one of --epsilon and --noise")
    if bool(label_field) != bool(labels):
        raise typer.BadParameter(
            "--label-field and --labels go together: the label list is public and never "
            "read from the private rows"
        )
    return why


def _config_and_plan(
    num_samples, iterations, epsilon, noise, delta, public_size, labels, votes, threshold,
    population, keep_share, initial_prompt, variation_prompt, max_new_tokens, temperature,
    top_p, batch_size,
):  # fmt: skip
    """The run's `EvolutionConfig` (the prompts that were given) and its release plan."""
    from synthgen import evolution

    prompts = {"initial_prompt": initial_prompt, "variation_prompt": variation_prompt}
    label_set = tuple(x.strip() for x in (labels or "").split(",") if x.strip()) or ("",)
    config = evolution.EvolutionConfig(
        num_samples=num_samples, iterations=iterations, target_epsilon=epsilon,
        noise_multiplier=noise, delta=delta, public_size=public_size, labels=label_set,
        votes=votes, threshold=threshold, population=population, keep_share=keep_share,
        max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p,
        batch_size=batch_size, **{k: v for k, v in prompts.items() if v is not None},
    )  # fmt: skip
    return config, evolution.plan_evolution(config)


def _progress(bars: dict, plan):
    """The `progress` callback: one bar for the LM's work and one for the histograms."""
    from tqdm import tqdm

    def progress(stage: str, done: int, total: int) -> None:
        key = "histogram" if stage == "histogram" else "lm"
        bar = bars.get(key)
        if bar is None or bar.total != total or bar.desc != stage:
            if bar is not None:
                bar.close()
            # the histogram bar shows counts only: its timing would be private work's
            fmt = "{desc}: {n}/{total} {postfix}" if stage == "histogram" else None
            bar = bars[key] = tqdm(total=total, desc=stage, unit="sample", file=sys.stderr,
                                   bar_format=fmt)  # fmt: skip
        bar.n = done
        bar.set_postfix_str(f"eps {plan.epsilon:.3g} charged" if stage == "histogram" else "")
        bar.refresh()

    return progress


def _evolve(lm, encoder, rows, text_field, label_field, config, plan, seed, pay):
    """Runs Private Evolution with progress bars; closes them, also on an error."""
    from retriever.encoders import load_encoder
    from synthgen import evolution
    from synthgen.privacy import secure_rng

    texts = list(rows[text_field])
    private_labels = [str(x) for x in rows[label_field]] if label_field else None
    sampler = evolution.make_sampler(
        lm, max_new_tokens=config.max_new_tokens, temperature=config.temperature,
        top_p=config.top_p, batch_size=config.batch_size,
    )  # fmt: skip
    text_encoder = load_encoder(encoder)
    bars: dict = {}
    try:
        return evolution.evolve(
            sampler, lambda batch: text_encoder.encode(list(batch)), texts, config,
            rng=secure_rng(seed), private_labels=private_labels, plan=plan,
            progress=_progress(bars, plan), pay=pay,
        )  # fmt: skip
    finally:
        for bar in bars.values():
            bar.close()


def _write(out, result, config, plan, lm_name, encoder, rows, seed) -> None:
    """Writes the release and prints the LM's speed (stderr) and the summary (stdout);
    `encoder`: (name, why it qualifies)."""
    from synthgen import evolution

    name, why = encoder
    evolution.write_output(
        out, result, config, model=lm_name, encoder=name, encoder_provenance=why, rows=rows,
        seeded=seed is not None,
    )  # fmt: skip
    rate = result.samples_generated / max(result.generation_seconds, 1e-9)
    print(
        f"LM: {result.samples_generated} samples in {result.generation_seconds:.1f} s "
        f"({rate:.2f} samples/s, public prompts only)",
        file=sys.stderr,
    )
    print(json.dumps({
        "out": str(out), "num_examples": len(result.texts), "epsilon": plan.epsilon,
        "delta": plan.delta, "noise_multiplier": plan.noise_multiplier,
        "iterations": plan.iterations, "seeded": seed is not None,
    }))  # fmt: skip


def _admit(rows, text_field, label_field, config, plan, ledger, scope, budget, guarantees_add_up):
    """The run's payer, with the private rows bound to `scope` and admitted before any
    compute (n: the declared N, refused below their count before the ledger sees them)."""
    from synthgen.evolution.generation import check_private_size
    from synthgen.privacy.receipts import ledger_payer

    records = [
        {"text": r[text_field], "label": r[label_field] if label_field else ""} for r in rows
    ]
    with usage_errors(ValueError, option="--public-size"):
        labels = [r["label"] for r in records] if label_field else None
        check_private_size(config, labels, len(rows))
    book = admit_run(
        ledger, scope, records, plan, stage=STAGE, public_count=plan.public_size,
        budget=budget, guarantees_add_up=guarantees_add_up,
    )  # fmt: skip
    return ledger_payer(book, scope, stage=STAGE)


def generate_docs_pe(
    private: Annotated[str, typer.Option(help="JSONL of private samples, or wiki-summaries-en")],
    text_field: TextFieldOption,
    num_samples: Annotated[int, typer.Option(help="synthetic samples to release")],
    out: Annotated[Path, typer.Option(help="output folder (released)")],
    epsilon: Annotated[float | None, typer.Option(help="target epsilon of the run")] = None,
    noise: Annotated[float | None, typer.Option(help="noise multiplier instead")] = None,
    iterations: Annotated[int, typer.Option(help="T: DP histograms (one per iteration)")] = 4,
    public_size: PublicSizeOption = 1000,
    delta: DeclaredDeltaOption = None,
    label_field: LabelFieldOption = None,
    labels: LabelsOption = None,
    votes: Annotated[int, typer.Option(help="k nearest votes per private sample")] = 1,
    threshold: Annotated[float, typer.Option(help="noisy counts below this x std -> 0")] = 2.0,
    population: PopulationOption = None,
    keep_share: Annotated[float, typer.Option(help="share of selected samples kept")] = 0.25,
    initial_prompt: InitialPromptOption = None,
    variation_prompt: VariationPromptOption = None,
    max_new_tokens: int = 96,
    temperature: float = 1.0,
    top_p: float = 0.95,
    batch_size: Annotated[int, typer.Option(help="prompts per batched LM call")] = 32,
    encoder: EncoderOption = "all-minilm-l6-v2",
    model: ModelOption = "smollm2-135m-instruct",
    server: ServerOption = None,
    server_model: ServerModelOption = None,
    server_context: ServerContextOption = None,
    server_prompt: ServerPromptOption = "auto",
    top_logprobs: TopLogprobsOption = 20,
    server_concurrency: ServerConcurrencyOption = 8,
    limit: LimitOption = None,
    split: SplitOption = "all",
    ledger: LedgerOption = None,
    tenant: TenantOption = "default",
    dataset: DatasetOption = None,
    guarantees_add_up: GuaranteesAddUpOption = False,
    budget: BudgetOption = None,
    seed: SeedOption = None,
) -> None:
    """Private Evolution: DP synthetic text whose cost does not grow with its length or number."""
    from synthgen.corpora import load_rows, selection_note

    encoder_note = _check_options(epsilon, noise, label_field, labels, encoder)
    lm_args, lm_name = lm_options(model, server, server_model, server_context, server_prompt,
                                  top_logprobs, server_concurrency)  # fmt: skip
    config, plan = _config_and_plan(
        num_samples, iterations, epsilon, noise, delta, public_size, labels, votes, threshold,
        population, keep_share, initial_prompt, variation_prompt, max_new_tokens, temperature,
        top_p, batch_size,
    )  # fmt: skip
    rows = load_rows(private, (text_field,) + ((label_field,) if label_field else ()), limit, split)
    pay = _admit(rows, text_field, label_field, config, plan, ledger,
                 (tenant, dataset or Path(private).stem), budget, guarantees_add_up)  # fmt: skip
    if seed is not None:
        print(SEED_WARNING, file=sys.stderr)
    with load_lm(*lm_args) as lm:
        result = _evolve(lm, encoder, rows, text_field, label_field, config, plan, seed, pay)
    rows_note = selection_note(limit, split)
    _write(out, result, config, plan, lm_name, (encoder, encoder_note), rows_note, seed)
