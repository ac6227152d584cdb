"""`synthgen train-generator` and `synthgen generate-queries`: thin wrappers over querygen."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer

from synthgen.cli.common import (
    SEED_WARNING,
    BudgetOption,
    PresetOption,
    SeedOption,
    SplitOption,
)
from synthgen.command_line import GuaranteesAddUpOption, LedgerOption
from synthgen.paths import default_ledger_path, default_work_dir
from synthgen.privacy.ledger import PrivacyLedger

# jax, flax and datasets are imported inside the commands so that `synthgen --help` and
# the calculators start fast.


def train_generator(
    pairs: Annotated[
        str, typer.Option(help="JSONL with document/query fields, or wiki-summaries-en")
    ],
    out: Annotated[
        Path,
        typer.Option(help="release folder: weights, configs, tokenizer, privacy metadata"),
    ],
    config: PresetOption = "tiny_t5",
    base: Annotated[
        str | None, typer.Option(help="override the base model (asset or path)")
    ] = None,
    epsilon: Annotated[float | None, typer.Option(help="target epsilon")] = None,
    noise_multiplier: Annotated[float | None, typer.Option(help="sigma instead of epsilon")] = None,
    delta: Annotated[float | None, typer.Option(help="default 1/(2n)")] = None,
    epochs: Annotated[float | None, typer.Option()] = None,
    batch_size: Annotated[int | None, typer.Option(help="expected batch size")] = None,
    limit: Annotated[int | None, typer.Option(help="first N pairs only")] = None,
    split: SplitOption = "all",
    document_field: Annotated[str, typer.Option()] = "document",
    query_field: Annotated[str, typer.Option()] = "query",
    ledger: LedgerOption = None,
    tenant: Annotated[str, typer.Option(help="ledger tenant")] = "default",
    dataset: Annotated[
        str | None, typer.Option(help="ledger dataset (default: pairs name)")
    ] = None,
    guarantees_add_up: GuaranteesAddUpOption = False,
    budget: BudgetOption = None,
    seed: SeedOption = None,
    work_dir: Annotated[
        Path | None,
        typer.Option(
            help="SECRET work folder: resume state incl. the noise key and sampler state; "
            "never ship it (default: <ledger folder>/work/<out name>-<hash>)"
        ),
    ] = None,
    keep_work: Annotated[
        bool, typer.Option(help="keep the secret work folder after a finished run")
    ] = False,
) -> None:
    """DP-fine-tune a query generator on private (document, query) pairs.

    The release folder --out gets the generator only; the resume state (noise key, sampler
    state, optimizer) stays in the secret --work-dir, which is deleted after a finished run
    (unless --keep-work) and resumed from when the same command is run again. The printed
    summary states the guarantee only: the training loss and timings are statistics of the
    private data (not DP) and are never printed or released.
    """
    from synthgen import corpora, querygen
    from synthgen.config_files import querygen_preset
    from synthgen.privacy.admission import admit
    from synthgen.work_folder import run_payer

    cfg = querygen_preset(config)
    changes: dict = {}
    if base is not None:
        changes["base"] = base
    if epsilon is not None or noise_multiplier is not None:
        changes.update(dp_target_epsilon=epsilon, dp_noise_multiplier=noise_multiplier)
    for name, value in (
        ("dp_delta", delta),
        ("dp_epochs", epochs),
        ("dp_batch_size", batch_size),
        ("dp_seed", seed),
    ):
        if value is not None:
            changes[name] = value
    cfg = cfg.replace(**changes)
    rows = corpora.load_rows(pairs, (document_field, query_field), limit, split)
    scope_name = dataset or Path(pairs).stem
    plan = querygen.dp_train.plan_privacy(cfg.dp, len(rows))
    ledger_path = ledger or default_ledger_path()
    work = work_dir if work_dir is not None else default_work_dir(out, ledger_path)
    ledger_obj = None
    if plan.private:
        ledger_obj = PrivacyLedger(ledger_path)
        pairs_read = [{"document": r[document_field], "query": r[query_field]} for r in rows]
        # the run checks its budget through its work folder, which knows a resume
        admit(
            ledger_obj, tenant, scope_name, pairs_read, plan, stage="dp-train",
            public_count=len(rows), budget=budget, guarantees_add_up=guarantees_add_up,
            check=False,
        )  # fmt: skip
    else:
        print(
            "warning: --noise-multiplier 0 is a NON-private run (epsilon = infinity); "
            "nothing is charged",
            file=sys.stderr,
        )
    if seed is not None:
        print(SEED_WARNING, file=sys.stderr)
    result = querygen.train_generator(
        cfg,
        rows,
        out,
        document_field=document_field,
        query_field=query_field,
        pay=None
        if ledger_obj is None
        else run_payer(ledger_obj, (tenant, scope_name), out_dir=out, work_dir=work),
        work_dir=work,
        keep_work=keep_work,
        plan=plan,
    )
    summary = {
        "out": str(out),
        "steps": result.steps_run,
        "epsilon": result.plan.epsilon,
        "delta": result.plan.delta,
        "noise_multiplier": result.plan.noise_multiplier,
        "seeded": seed is not None,
    }
    if work.exists():
        summary["work_dir"] = str(work)  # secret: kept, or an unfinished run to resume
    print(json.dumps(summary))


def generate_queries(
    generator: Annotated[Path, typer.Option(help="folder written by train-generator")],
    documents: Annotated[
        str, typer.Option(help="JSONL with doc_id/document, or wiki-summaries-en")
    ],
    out: Annotated[Path, typer.Option(help="output folder")],
    k: Annotated[int | None, typer.Option(help="queries per document")] = None,
    top_p: Annotated[float | None, typer.Option()] = None,
    temperature: Annotated[float | None, typer.Option()] = None,
    limit: Annotated[int | None, typer.Option(help="first N documents only")] = None,
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
    if part is not None:
        if seed is None:
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
    print(
        json.dumps(
            {
                "out": str(out),
                "num_queries": len(ds),
                "epsilon": meta["privacy"]["epsilon"],
                "delta": meta["privacy"]["delta"],
            }
        )
    )


def merge_queries(
    shards: Annotated[list[Path], typer.Argument(help="the shard folders of one job")],
    out: Annotated[Path, typer.Option(help="output folder")],
) -> None:
    """Join `generate-queries --shard I/N` folders into the unsharded output (same bytes)."""
    from synthgen import querygen

    ds = querygen.merge_query_shards(shards, out)
    print(json.dumps({"out": str(out), "num_queries": len(ds), "shards": len(shards)}))
