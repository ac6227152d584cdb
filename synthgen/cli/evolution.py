"""`synthgen generate-docs-pe`: Private Evolution (`synthgen.evolution`), a thin wrapper.

Privacy: the guarantee is T Gaussian nearest-neighbour histograms (`synthgen.evolution`),
fixed by public options only (`--iterations`, `--epsilon` or `--noise`, `--votes`,
`--delta` or the declared `--public-size`); the LM sees public prompts only. `--limit` and
`--split` select rows by position, so the guarantee covers the selected rows; `--seed` is
for tests only (warned about and recorded in the metadata).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer

from synthgen.cli.common import (
    SEED_WARNING,
    BudgetOption,
    DatasetOption,
    ModelOption,
    SeedOption,
    ServerConcurrencyOption,
    ServerContextOption,
    ServerOption,
    ServerPromptOption,
    SplitOption,
    TenantOption,
    TopLogprobsOption,
)
from synthgen.command_line import GuaranteesAddUpOption, LedgerOption


def generate_docs_pe(
    private: Annotated[str, typer.Option(help="JSONL of private samples, or wiki-summaries-en")],
    text_field: Annotated[str, typer.Option(help="field of the private text")],
    num_samples: Annotated[int, typer.Option(help="synthetic samples to release")],
    out: Annotated[Path, typer.Option(help="output folder (released)")],
    epsilon: Annotated[float | None, typer.Option(help="target epsilon of the run")] = None,
    noise: Annotated[float | None, typer.Option(help="noise multiplier instead")] = None,
    iterations: Annotated[int, typer.Option(help="T: DP histograms (one per iteration)")] = 4,
    public_size: Annotated[
        int,
        typer.Option(
            help="declared public figure N for the private data's size: delta defaults to "
            "1/(10N) and must be below 1/N (never compared with the real count)"
        ),
    ] = 1000,
    delta: Annotated[float | None, typer.Option(help="below 1/N; default 1/(10N)")] = None,
    label_field: Annotated[
        str | None, typer.Option(help="label field: votes stay within a label (needs --labels)")
    ] = None,
    labels: Annotated[
        str | None,
        typer.Option(help="public comma-separated label list (rows with others are ignored)"),
    ] = None,
    votes: Annotated[int, typer.Option(help="k nearest votes per private sample")] = 1,
    threshold: Annotated[float, typer.Option(help="noisy counts below this x std -> 0")] = 2.0,
    population: Annotated[
        int | None, typer.Option(help="candidates per label per iteration (default: released)")
    ] = None,
    keep_share: Annotated[float, typer.Option(help="share of selected samples kept")] = 0.25,
    initial_prompt: Annotated[
        str | None, typer.Option(help="public prompt of the first population; may use {label}")
    ] = None,
    variation_prompt: Annotated[
        str | None, typer.Option(help="uses {text} (a synthetic sample), may use {label}")
    ] = None,
    max_new_tokens: Annotated[int, typer.Option()] = 96,
    temperature: Annotated[float, typer.Option()] = 1.0,
    top_p: Annotated[float, typer.Option()] = 0.95,
    batch_size: Annotated[int, typer.Option(help="prompts per batched LM call")] = 32,
    encoder: Annotated[
        str, typer.Option(help="embedding model: asset name or encoder folder")
    ] = "all-minilm-l6-v2",
    model: ModelOption = "smollm2-135m-instruct",
    server: ServerOption = None,
    server_model: Annotated[str | None, typer.Option(help="served model name")] = None,
    server_context: ServerContextOption = None,
    server_prompt: ServerPromptOption = "auto",
    top_logprobs: TopLogprobsOption = 20,
    server_concurrency: ServerConcurrencyOption = 8,
    limit: Annotated[
        int | None, typer.Option(help="first N private samples only (the guarantee covers those)")
    ] = None,
    split: SplitOption = "all",
    ledger: LedgerOption = None,
    tenant: TenantOption = "default",
    dataset: DatasetOption = None,
    guarantees_add_up: GuaranteesAddUpOption = False,
    budget: BudgetOption = None,
    seed: SeedOption = None,
) -> None:
    """Private Evolution: DP synthetic text whose cost does not grow with its length or number."""
    from tqdm import tqdm

    from retriever.encoders import load_encoder
    from synthgen import evolution
    from synthgen.corpora import load_rows, selection_note
    from synthgen.lm_backends import load_backend
    from synthgen.paths import default_ledger_path
    from synthgen.privacy import secure_rng
    from synthgen.privacy.admission import admit
    from synthgen.privacy.ledger import PrivacyLedger
    from synthgen.privacy.receipts import ledger_payer

    if (epsilon is None) == (noise is None):
        raise typer.BadParameter("give one of --epsilon and --noise")
    if bool(label_field) != bool(labels):
        raise typer.BadParameter(
            "--label-field and --labels go together: the label list is public and never "
            "read from the private rows"
        )
    if server is not None and server_context is None:
        raise typer.BadParameter("--server needs --server-context (the server's context length)")
    prompts = {"initial_prompt": initial_prompt, "variation_prompt": variation_prompt}
    label_set = tuple(x.strip() for x in (labels or "").split(",") if x.strip()) or ("",)
    config = evolution.EvolutionConfig(
        num_samples=num_samples, iterations=iterations, target_epsilon=epsilon,
        noise_multiplier=noise, delta=delta, public_size=public_size, labels=label_set,
        votes=votes, threshold=threshold, population=population, keep_share=keep_share,
        max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p,
        batch_size=batch_size, **{k: v for k, v in prompts.items() if v is not None},
    )  # fmt: skip
    plan = evolution.plan_evolution(config)
    name = dataset or Path(private).stem
    required = (text_field,) + ((label_field,) if label_field else ())
    rows = load_rows(private, required, limit, split)
    ledger_obj = PrivacyLedger(ledger or default_ledger_path())
    records = [
        {"text": r[text_field], "label": r[label_field] if label_field else ""} for r in rows
    ]
    admit(  # n: the declared public size N
        ledger_obj, tenant, name, records, plan, stage="evolution",
        public_count=plan.public_size, budget=budget, guarantees_add_up=guarantees_add_up,
    )  # fmt: skip
    if seed is not None:
        print(SEED_WARNING, file=sys.stderr)
    texts = list(rows[text_field])
    private_labels = [str(x) for x in rows[label_field]] if label_field else None
    options = {"prompt_format": server_prompt, "top_logprobs": top_logprobs,
               "concurrency": server_concurrency}  # fmt: skip
    lm, check = load_backend(model, server, server_model, server_context, options)
    if check is not None:
        print(f"server: {check.note}", file=sys.stderr)
    sampler = evolution.make_sampler(
        lm, max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p,
        batch_size=batch_size,
    )  # fmt: skip
    text_encoder = load_encoder(encoder)
    bars: dict[str, tqdm] = {}

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

    try:
        result = evolution.evolve(
            sampler, lambda batch: text_encoder.encode(list(batch)), texts, config,
            rng=secure_rng(seed), private_labels=private_labels, plan=plan, progress=progress,
            pay=ledger_payer(ledger_obj, (tenant, name), stage="evolution"),
        )  # fmt: skip
    finally:
        for bar in bars.values():
            bar.close()
        close = getattr(lm, "close", None)
        if callable(close):
            close()
    lm_name = model if server is None else f"{server} ({server_model or model})"
    evolution.write_output(
        out, result, config, model=lm_name, encoder=encoder, rows=selection_note(limit, split),
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
