"""`synthgen train-generator` and `synthgen generate-queries`: thin wrappers over querygen."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer

from dpsynth.cli.shared import admit_training_pairs, print_guarantee
from dpsynth.cli.synthgen.common import (
    SEED_WARNING,
    BudgetOption,
    ExpectedBatchOption,
    PresetOption,
    SeedOption,
    SplitOption,
    TenantOption,
    preset_with,
)
from synthgen.command_line import (
    DocumentsLimitOption,
    DpSgdDeltaOption,
    GuaranteesAddUpOption,
    KeepSecretWorkOption,
    LedgerOption,
    OutFolderOption,
    PairsLimitOption,
    SecretWorkDirOption,
    TargetEpsilonOption,
    usage_errors,
)
from synthgen.paths import default_ledger_path, default_work_dir

PairsOption = Annotated[
    str, typer.Option(help="JSONL with document/query fields, or wiki-summaries-en")
]
ReleaseOutOption = Annotated[
    Path,
    typer.Option(help="release folder: weights, configs, tokenizer, privacy metadata"),
]
BaseOption = Annotated[str | None, typer.Option(help="override the base model (asset or path)")]
NoiseMultiplierOption = Annotated[float | None, typer.Option(help="sigma instead of epsilon")]
PairsDatasetOption = Annotated[
    str | None, typer.Option(help="ledger dataset (default: pairs name)")
]


def train_generator(
    pairs: PairsOption,
    out: ReleaseOutOption,
    config: PresetOption = "tiny_t5",
    base: BaseOption = None,
    epsilon: TargetEpsilonOption = None,
    noise_multiplier: NoiseMultiplierOption = None,
    delta: DpSgdDeltaOption = None,
    epochs: float | None = None,
    batch_size: ExpectedBatchOption = None,
    limit: PairsLimitOption = None,
    split: SplitOption = "all",
    document_field: str = "document",
    query_field: str = "query",
    ledger: LedgerOption = None,
    tenant: TenantOption = "default",
    dataset: PairsDatasetOption = None,
    guarantees_add_up: GuaranteesAddUpOption = False,
    budget: BudgetOption = None,
    seed: SeedOption = None,
    work_dir: SecretWorkDirOption = None,
    keep_work: KeepSecretWorkOption = False,
) -> None:
    """DP-fine-tune a query generator on private (document, query) pairs.

    The release folder --out gets the generator only; the resume state (noise key, sampler
    state, optimizer) stays in the secret --work-dir, which is deleted after a finished run
    (unless --keep-work) and resumed from when the same command is run again. The printed
    summary states the guarantee only: the training loss and timings are statistics of the
    private data (not DP) and are never printed or released.
    """
    from synthgen import corpora, querygen
    from synthgen.work_folder import check_apart, run_payer

    cfg = _config(config, base, epsilon, noise_multiplier, delta, epochs, batch_size, seed)
    fields = (document_field, query_field)
    rows = corpora.load_rows(pairs, fields, limit, split)
    scope = (tenant, dataset or Path(pairs).stem)
    plan = querygen.dp_train.plan_privacy(cfg.dp, len(rows))
    ledger_path = ledger or default_ledger_path()
    work = work_dir if work_dir is not None else default_work_dir(out, ledger_path)
    where = "--work-dir" if work_dir is not None else "--ledger"  # the default's folder
    with usage_errors(ValueError, option=where):  # before the ledger sees the pairs
        check_apart(out, work)
    book = _admit(rows, fields, plan, ledger_path, scope, budget, guarantees_add_up)
    if seed is not None:
        print(SEED_WARNING, file=sys.stderr)
    pay = None if book is None else run_payer(book, scope, out_dir=out, work_dir=work)
    result = querygen.train_generator(
        cfg,
        rows,
        out,
        document_field=document_field,
        query_field=query_field,
        pay=pay,
        work_dir=work,
        keep_work=keep_work,
        plan=plan,
    )
    print_guarantee(out, result.steps_run, result.plan, work, seeded=seed is not None)


def _config(config, base, epsilon, noise_multiplier, delta, epochs, batch_size, seed):
    """The preset with the options given; --epsilon or --noise-multiplier replaces the
    preset's pair whole."""
    sigma = {"dp_target_epsilon": epsilon, "dp_noise_multiplier": noise_multiplier}
    return preset_with(
        config, sigma if epsilon is not None or noise_multiplier is not None else {},
        base=base, dp_delta=delta, dp_epochs=epochs, dp_batch_size=batch_size, dp_seed=seed,
    )  # fmt: skip


def _admit(rows, fields, plan, ledger_path, scope, budget, guarantees_add_up):
    """The ledger with the pairs admitted to `scope` (`admit_training_pairs`), or None for
    a non-private run, which is warned about and charges nothing."""
    if not plan.private:
        print(
            "warning: --noise-multiplier 0 is a NON-private run (epsilon = infinity); "
            "nothing is charged",
            file=sys.stderr,
        )
        return None
    document_field, query_field = fields
    pairs_read = [{"document": r[document_field], "query": r[query_field]} for r in rows]
    return admit_training_pairs(
        ledger_path, scope, pairs_read, plan, budget=budget, guarantees_add_up=guarantees_add_up
    )


def generate_queries(
    generator: Annotated[Path, typer.Option(help="folder written by train-generator")],
    documents: Annotated[
        str, typer.Option(help="JSONL with doc_id/document, or wiki-summaries-en")
    ],
    out: OutFolderOption,
    k: Annotated[int | None, typer.Option(help="queries per document")] = None,
    top_p: float | None = None,
    temperature: float | None = None,
    limit: DocumentsLimitOption = None,
    split: SplitOption = "all",
    seed: Annotated[
        int | None, typer.Option(help="sampling seed (needed with --shard: one stream for all)")
    ] = None,
    shard: Annotated[
        str | None,
        typer.Option(
            help="I/N: only shard I of N (whole batches, in order); join with merge-queries"
        ),
    ] = None,
) -> None:
    """Generate synthetic queries for public documents (post-processing: no budget)."""
    from synthgen import corpora, querygen
    from synthgen.command_line import parse_shard

    part = parse_shard(shard)
    if part is not None and seed is None:
        raise typer.BadParameter(
            "a shard needs --seed: every shard must draw from one sampling stream",
            param_hint="--seed",
        )
    docs = corpora.load_rows(documents, ("doc_id", "document"), limit, split)
    ds = querygen.generate_queries(
        generator,
        docs,
        out,
        queries_per_doc=k,
        top_p=top_p,
        temperature=temperature,
        seed=seed,
        shard=part,
    )
    meta = json.loads((out / "metadata.json").read_text())
    summary = {
        "out": str(out),
        "num_queries": len(ds),
        "epsilon": meta["privacy"]["epsilon"],
        "delta": meta["privacy"]["delta"],
    }
    print(json.dumps(summary))


def merge_queries(
    shards: Annotated[list[Path], typer.Argument(help="the shard folders of one job")],
    out: OutFolderOption,
) -> None:
    """Join `generate-queries --shard I/N` folders into the unsharded output (same bytes)."""
    from synthgen import querygen

    ds = querygen.merge_query_shards(shards, out)
    print(json.dumps({"out": str(out), "num_queries": len(ds), "shards": len(shards)}))
