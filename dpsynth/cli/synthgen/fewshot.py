"""`synthgen generate-docs` and `synthgen generate-queries-fewshot`: thin wrappers over fewshot.

Privacy: the guarantee is fixed by declared public figures only (`--public-pool-size`, the
public `--labels`); see `synthgen.fewshot`. `--limit` and `--split` select rows by their
position in the whole file or corpus, so the guarantee covers the selected rows only (it is
stated for adding or removing one selected row); `--seed` makes the mechanism's randomness
reproducible and is for tests only (warned about and recorded in the metadata).
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
    FewShotMechanismOption,
    ModelOption,
    ResampleOption,
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
from synthgen.command_line import (
    GuaranteesAddUpOption,
    LedgerOption,
    OutFolderOption,
    TargetEpsilonOption,
)

STAGE = "fewshot-generate"  # the few-shot commands' ledger stage

PoolSizeOption = Annotated[
    int,
    typer.Option(
        help="declared public lower bound N on the private examples of every pool (label): "
        "each example is sampled with probability q = subsets * shots / N, delta defaults "
        "to 1/(10 N x pools); a smaller real pool is refused (its size is never shown)"
    ),
]
DeltaOption = Annotated[
    float | None, typer.Option(help="below 1/N (N = declared pool size x pools); default 1/(10N)")
]
DocsLabelFieldOption = Annotated[
    str | None,
    typer.Option(help="label field: one label per synthetic example (needs --labels)"),
]
DocsNoiseOption = Annotated[
    float | None, typer.Option(help="sigma (gaussian) or per-token eps (rnm) instead")
]
DocsLimitOption = Annotated[
    int | None,
    typer.Option(help="first N private examples only (the guarantee covers those only)"),
]
PublicVocabOption = Annotated[int | None, typer.Option(help="RVP: top-K public tokens")]
DocsLabelsOption = Annotated[
    str | None,
    typer.Option(
        help="public comma-separated label list (required with --label-field; rows with "
        "other labels are ignored)"
    ),
]


def _check_options(epsilon, noise, label_field=None, labels=None) -> None:
    """Refuses a run without --epsilon or --noise, and --label-field without --labels (or
    the reverse), before anything is read."""
    if epsilon is None and noise is None:
        raise typer.BadParameter("give --epsilon (or --noise)")
    if label_field and not labels:
        raise typer.BadParameter(
            "--label-field needs --labels: a public comma-separated label list (the label "
            "set is never read from the private rows)"
        )
    if labels and not label_field:
        raise typer.BadParameter("--labels needs --label-field")


def _config(**values):
    from synthgen.fewshot import FewShotConfig

    mechanism = values["mechanism"]
    epsilon, noise = values.pop("epsilon"), values.pop("noise")
    if noise is not None:
        values["noise_multiplier" if mechanism == "gaussian" else "token_epsilon"] = noise
    return FewShotConfig(target_epsilon=None if noise is not None else epsilon, **values)


def _warn_top_k(lm, cfg) -> None:
    """Warns where a server's top-k log-probs are fewer than the public candidates."""
    top_k = getattr(lm, "top_logprobs", None)
    if top_k is not None and (cfg.public_vocab is None or cfg.public_vocab > top_k):
        print(
            f"warning: the server returns {top_k} log-probs per prompt and the other tokens "
            "share the rest uniformly, so candidates past its top-k are tokens the model did "
            f"not rank: use --public-vocab {top_k} or less",
            file=sys.stderr,
        )


def _token_progress(bar, cfg):
    """The `on_token` callback: advances `bar` and shows the spend so far after each text."""
    from synthgen.privacy import accounting

    shown = {"eps": 0.0}

    def on_token(released: int, plan) -> None:
        bar.update(1)
        if released % cfg.max_new_tokens == 0:
            # An upper bound on any example's spend so far (the worst pool's rate).
            shown["eps"] = accounting.fewshot_epsilon(
                plan.delta,
                sampling_rate=plan.sampling_rate,
                tokens=min(released, plan.tokens),
                mechanism=plan.mechanism,
                noise_multiplier=plan.noise_multiplier,
                token_epsilon=plan.token_epsilon,
                tokens_per_draw=plan.tokens_per_draw,
            )
        bar.set_postfix_str(f"eps so far <= {shown['eps']:.3g}", refresh=False)

    return on_token


BAR_FORMAT = "generate: {n}/{total} tokens{postfix}"


def _generate(lm, private, targets, template, cfg, pool_field, plan, seed, pay):
    """Generates with a progress bar; closes the bar, also on an error."""
    from tqdm import tqdm

    from synthgen import fewshot
    from synthgen.privacy import secure_rng

    # counts only: a server's time per token grows with the private shots (no padding)
    bar = tqdm(total=len(targets) * cfg.max_new_tokens, file=sys.stderr, bar_format=BAR_FORMAT)
    try:
        return fewshot.generate(
            lm,
            private,
            targets,
            template,
            cfg,
            pool_field=pool_field,
            rng=secure_rng(seed),
            pay=pay,
            plan=plan,
            on_token=_token_progress(bar, cfg),
        )
    finally:
        bar.close()  # also on an error, whose line then stays the last one


def _run(
    lm_args, private, targets, template, cfg, pool_field, out, ledger_args, seed, columns, rows
):
    """Plans, checks the budget, loads the LM, generates with a progress bar, writes."""
    from synthgen import fewshot
    from synthgen.privacy.receipts import ledger_payer

    lm_args, lm_name = lm_options(*lm_args)
    plan = fewshot.plan_for(private, targets, template, cfg, pool_field=pool_field)
    if seed is not None:
        print(SEED_WARNING, file=sys.stderr)
    ledger, scope, admission = ledger_args
    # n: the declared public figure the plan's delta bound uses (never the private count)
    book = admit_run(ledger, scope, private, plan, stage=STAGE,
                     public_count=plan.public_pool_size * plan.pools, **admission)  # fmt: skip
    with load_lm(*lm_args, warn_unchecked=True) as lm:
        _warn_top_k(lm, cfg)
        pay = ledger_payer(book, scope, stage=STAGE)
        result = _generate(lm, private, targets, template, cfg, pool_field, plan, seed, pay)
    fewshot.write_output(
        str(out),
        columns(targets, result.texts),
        result,
        cfg,
        model=lm_name,
        template=template,
        rows=rows,
        seeded=seed is not None,
    )
    summary = {
        "out": str(out),
        "num_examples": len(result.texts),
        "epsilon": plan.epsilon,
        "delta": plan.delta,
        "noise_multiplier": plan.noise_multiplier,
        "token_epsilon": plan.token_epsilon,
        "tokens_released": result.tokens_released,
        "seeded": seed is not None,
    }
    print(json.dumps(summary))


def _doc_rows(private, text_field, label_field, limit, split) -> list[dict]:
    """The private rows as {text, label}; the label is "" without --label-field."""
    from synthgen.corpora import load_rows

    required = (text_field,) + ((label_field,) if label_field else ())
    rows = load_rows(private, required, limit, split)
    return [
        {"text": r[text_field], "label": str(r[label_field]) if label_field else ""} for r in rows
    ]


def _doc_targets(header, label_field, labels, num_examples):
    """The document template and the public targets: the labels in turn, one per example."""
    import dataclasses

    from synthgen import fewshot

    template = fewshot.DOCUMENT_TEMPLATE
    if header is not None:
        template = dataclasses.replace(template, header=header)
    elif not label_field:
        template = dataclasses.replace(template, header="Here are example paragraphs.\n\n")
    label_set = [label.strip() for label in (labels or "").split(",") if label.strip()]
    if label_field and not label_set:
        raise typer.BadParameter("--labels holds no label")
    return template, fewshot.round_robin_targets(label_set or [""], num_examples)


def _doc_columns(targets, texts) -> dict:
    return {"label": [t["label"] for t in targets], "text": texts}


def _query_rows(private, documents, limit, split):
    """The private (document, query) pairs and the public documents to write queries for."""
    from synthgen.corpora import load_rows

    pairs = load_rows(private, ("document", "query"), None, split)
    docs = load_rows(documents, ("doc_id", "document"), limit, split)
    private_rows = [{"document": r["document"], "query": r["query"]} for r in pairs]
    targets = [{"doc_id": d["doc_id"], "document": d["document"]} for d in docs]
    return private_rows, targets


def _query_columns(targets, texts) -> dict:
    return {
        "doc_id": [t["doc_id"] for t in targets],
        "document": [t["document"] for t in targets],
        "query": texts,
    }


def generate_docs(
    private: Annotated[str, typer.Option(help="JSONL of private examples, or wiki-summaries-en")],
    text_field: TextFieldOption,
    num_examples: Annotated[int, typer.Option(help="synthetic examples to generate")],
    out: OutFolderOption,
    public_pool_size: PoolSizeOption,
    epsilon: TargetEpsilonOption = None,
    label_field: DocsLabelFieldOption = None,
    delta: DeltaOption = None,
    mechanism: FewShotMechanismOption = "gaussian",
    noise: DocsNoiseOption = None,
    shots: Annotated[int, typer.Option(help="expected private examples per prompt")] = 4,
    subsets: Annotated[int, typer.Option(help="M prompts per token")] = 10,
    public_vocab: PublicVocabOption = None,
    public_prior: Annotated[float, typer.Option(help="weight of the public prior")] = 0.0,
    max_new_tokens: int = 64,
    shot_tokens: Annotated[int, typer.Option(help="tokens kept per private example")] = 96,
    resample: ResampleOption = "token",
    model: ModelOption = "smollm2-135m-instruct",
    server: ServerOption = None,
    server_model: ServerModelOption = None,
    server_context: ServerContextOption = None,
    server_prompt: ServerPromptOption = "auto",
    top_logprobs: TopLogprobsOption = 20,
    server_concurrency: ServerConcurrencyOption = 8,
    labels: DocsLabelsOption = None,
    header: Annotated[str | None, typer.Option(help="prompt header; may use {label}")] = None,
    limit: DocsLimitOption = None,
    split: SplitOption = "all",
    ledger: LedgerOption = None,
    tenant: TenantOption = "default",
    dataset: DatasetOption = None,
    guarantees_add_up: GuaranteesAddUpOption = False,
    budget: BudgetOption = None,
    seed: SeedOption = None,
) -> None:
    """DP few-shot generation of synthetic (label, text) examples from a frozen LM."""
    from synthgen.corpora import selection_note

    _check_options(epsilon, noise, label_field, labels)
    cfg = _config(
        public_pool_size=public_pool_size, subsets=subsets, shots=shots, shot_tokens=shot_tokens,
        max_new_tokens=max_new_tokens, mechanism=mechanism, epsilon=epsilon, noise=noise,
        delta=delta, public_vocab=public_vocab, public_prior=public_prior, resample=resample,
    )  # fmt: skip
    private_rows = _doc_rows(private, text_field, label_field, limit, split)
    template, targets = _doc_targets(header, label_field, labels, num_examples)
    lm_args = (model, server, server_model, server_context, server_prompt, top_logprobs,
               server_concurrency)  # fmt: skip
    admission = {"budget": budget, "guarantees_add_up": guarantees_add_up}
    ledger_args = (ledger, (tenant, dataset or Path(private).stem), admission)
    _run(lm_args, private_rows, targets, template, cfg, "label" if label_field else None, out,
         ledger_args, seed, _doc_columns, selection_note(limit, split))  # fmt: skip


def generate_queries_fewshot(
    private: Annotated[str, typer.Option(help="JSONL of private (document, query) pairs")],
    documents: Annotated[str, typer.Option(help="JSONL with doc_id/document (public)")],
    out: OutFolderOption,
    public_pool_size: PoolSizeOption,
    epsilon: TargetEpsilonOption = None,
    delta: DeltaOption = None,
    mechanism: FewShotMechanismOption = "gaussian",
    noise: Annotated[float | None, typer.Option(help="sigma or per-token eps instead")] = None,
    shots: int = 2,
    subsets: int = 10,
    public_vocab: PublicVocabOption = 100,
    public_prior: float = 0.0,
    max_new_tokens: int = 16,
    shot_tokens: int = 64,
    resample: ResampleOption = "token",
    model: ModelOption = "smollm2-135m-instruct",
    server: ServerOption = None,
    server_model: ServerModelOption = None,
    server_context: ServerContextOption = None,
    server_prompt: ServerPromptOption = "auto",
    top_logprobs: TopLogprobsOption = 20,
    server_concurrency: ServerConcurrencyOption = 8,
    limit: Annotated[int | None, typer.Option(help="first N (public) documents only")] = None,
    split: SplitOption = "all",
    ledger: LedgerOption = None,
    tenant: str = "default",
    dataset: DatasetOption = None,
    guarantees_add_up: GuaranteesAddUpOption = False,
    budget: BudgetOption = None,
    seed: SeedOption = None,
) -> None:
    """Training-free DP synthetic queries for public documents (few-shot over private pairs)."""
    from synthgen import fewshot
    from synthgen.corpora import selection_note

    _check_options(epsilon, noise)
    cfg = _config(
        public_pool_size=public_pool_size, subsets=subsets, shots=shots, shot_tokens=shot_tokens,
        max_new_tokens=max_new_tokens, mechanism=mechanism, epsilon=epsilon, noise=noise,
        delta=delta, public_vocab=public_vocab, public_prior=public_prior, resample=resample,
        stop_at_newline=True,
    )  # fmt: skip
    private_rows, targets = _query_rows(private, documents, limit, split)
    lm_args = (model, server, server_model, server_context, server_prompt, top_logprobs,
               server_concurrency)  # fmt: skip
    admission = {"budget": budget, "guarantees_add_up": guarantees_add_up}
    ledger_args = (ledger, (tenant, dataset or Path(private).stem), admission)
    _run(lm_args, private_rows, targets, fewshot.QUERY_TEMPLATE, cfg, None, out, ledger_args, seed,
         _query_columns, selection_note(None, split))  # fmt: skip
