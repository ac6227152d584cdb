"""`retriever train` and `retriever train-dp`: thin wrappers over `retriever.train`."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer

from synthgen.command_line import GuaranteesAddUpOption, LedgerOption


def train(
    pairs: Annotated[Path, typer.Option(help="queries.jsonl (generator output or plain)")],
    out: Annotated[Path, typer.Option(help="release folder: towers and provenance.json")],
    encoder: Annotated[str, typer.Option(help="base encoder: asset or folder")] = (
        "all-minilm-l6-v2"
    ),
    corpus: Annotated[Path | None, typer.Option(help="corpus.jsonl for plain pairs")] = None,
    epochs: Annotated[float, typer.Option()] = 1.0,
    batch_size: Annotated[int, typer.Option()] = 32,
    learning_rate: Annotated[float, typer.Option()] = 5e-5,
    temperature: Annotated[float, typer.Option()] = 0.05,
    learn_temperature: Annotated[bool, typer.Option()] = False,
    separate_towers: Annotated[bool, typer.Option()] = False,
    limit: Annotated[int | None, typer.Option(help="first N pairs only")] = None,
    seed: Annotated[int, typer.Option(help="data order")] = 0,
    synthetic_metadata: Annotated[
        Path | None,
        typer.Option(
            help="metadata.json of the DP release the pairs come from (default: the one "
            "beside --pairs, if it describes that file); without one the encoder is stated "
            "as trained on real data, with no privacy guarantee"
        ),
    ] = None,
    work_dir: Annotated[
        Path | None,
        typer.Option(
            help="resume state (checkpoints), outside the release; the same command resumes "
            "from it (default: <ledger folder>/work/<out name>-<hash>)"
        ),
    ] = None,
    keep_work: Annotated[
        bool, typer.Option(help="keep the work folder after a finished run")
    ] = False,
) -> None:
    """Train a dual encoder with in-batch softmax (non-private: for synthetic pairs).

    The release folder --out gets the towers and provenance.json: trained on a DP release's
    synthetic pairs (its metadata.json beside --pairs, or --synthetic-metadata), the
    encoder is post-processing of that release; otherwise it has no privacy guarantee.
    """
    from retriever.data import read_pairs
    from retriever.encoders import load_encoder
    from retriever.provenance import for_pairs_file
    from retriever.train import RetrieverConfig, train_retriever

    config = RetrieverConfig(
        batch_size=batch_size,
        epochs=epochs,
        learning_rate=learning_rate,
        temperature=temperature,
        learn_temperature=learn_temperature,
        separate_towers=separate_towers,
        seed=seed,
    )
    queries, documents, doc_ids = read_pairs(pairs, corpus, limit)
    provenance = for_pairs_file(pairs, metadata=synthetic_metadata, num_pairs=len(queries))
    result = train_retriever(
        load_encoder(encoder),
        queries,
        documents,
        config,
        doc_ids=doc_ids,
        out_dir=out,
        provenance=provenance,
        work_dir=work_dir,
        keep_work=keep_work,
    )
    if result.pairs_left_out_per_epoch:
        print(
            f"note: {len(queries)} pairs at batch {batch_size}: "
            f"{result.pairs_left_out_per_epoch} pairs per epoch fill no batch and are left "
            "out of it (each epoch reshuffles; use a batch size that divides the pairs, or "
            "more epochs, to train on every pair)",
            file=sys.stderr,
        )
    print(
        json.dumps(
            {
                "out": str(out),
                "steps": result.steps_run,
                "pairs_left_out_per_epoch": result.pairs_left_out_per_epoch,
                "pairs_per_second": round(result.pairs_per_second, 2),
                "seconds": round(result.seconds, 1),
                "statement": provenance["statement"],
            }
        )
    )


def train_dp(
    queries: Annotated[Path, typer.Option(help="private queries.jsonl (query, doc_id)")],
    corpus: Annotated[Path, typer.Option(help="public corpus.jsonl")],
    out: Annotated[Path, typer.Option(help="release folder: towers and privacy metadata")],
    encoder: Annotated[str, typer.Option(help="base encoder")] = "all-minilm-l6-v2",
    epsilon: Annotated[float | None, typer.Option(help="target epsilon")] = 8.0,
    noise_multiplier: Annotated[float | None, typer.Option(help="sigma instead")] = None,
    delta: Annotated[float | None, typer.Option(help="default 1/(2n)")] = None,
    epochs: Annotated[float, typer.Option()] = 1.0,
    batch_size: Annotated[int, typer.Option(help="expected batch size")] = 64,
    clip_norm: Annotated[float, typer.Option()] = 1.0,
    learning_rate: Annotated[float, typer.Option()] = 1e-3,
    ledger: LedgerOption = None,
    tenant: Annotated[str, typer.Option()] = "default",
    dataset: Annotated[str | None, typer.Option(help="default: the queries file name")] = None,
    guarantees_add_up: GuaranteesAddUpOption = False,
    seed: Annotated[int | None, typer.Option(help="tests only; default OS entropy")] = None,
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
    """Direct-DP baseline: DP-Adafactor on real pairs (frozen public document tower).

    The release folder --out gets the towers only; the resume state (noise key, sampler
    state, optimizer) stays in the secret --work-dir, which is deleted after a finished run
    (unless --keep-work) and resumed from when the same command is run again.
    """
    from retriever.data import read_corpus, read_queries
    from retriever.encoders import load_encoder
    from retriever.train import RetrieverConfig, train_retriever_dp
    from synthgen import dp_train
    from synthgen.paths import default_ledger_path, default_work_dir
    from synthgen.privacy.admission import admit
    from synthgen.privacy.ledger import PrivacyLedger
    from synthgen.work_folder import run_payer

    if noise_multiplier is not None:
        epsilon = None
    dp_config = dp_train.DPConfig(
        batch_size=batch_size,
        epochs=epochs,
        clip_norm=clip_norm,
        learning_rate=learning_rate,
        target_epsilon=epsilon,
        noise_multiplier=noise_multiplier,
        delta=delta,
        physical_batch=16,
        microbatch=8,
        seed=seed,
    )
    rows = read_queries(queries)
    doc_ids, texts = read_corpus(corpus)
    row_of = {d: i for i, d in enumerate(doc_ids)}
    missing = sum(1 for r in rows if str(r["doc_id"]) not in row_of)
    if missing:
        raise ValueError(f"{missing} queries name a doc_id that is not in {corpus}")
    plan = dp_train.plan_privacy(dp_config, len(rows))
    book = PrivacyLedger(ledger or default_ledger_path())
    scope = (tenant, dataset or queries.stem)
    pairs = [{"document": texts[row_of[str(r["doc_id"])]], "query": r["query"]} for r in rows]
    # the run checks its budget through its work folder, which knows a resume
    admit(
        book, *scope, pairs, plan, stage="dp-train", public_count=len(rows),
        guarantees_add_up=guarantees_add_up, check=False,
    )  # fmt: skip
    work = work_dir if work_dir is not None else default_work_dir(out, book.path)
    result = train_retriever_dp(
        load_encoder(encoder),
        [r["query"] for r in rows],
        [row_of[str(r["doc_id"])] for r in rows],
        texts,
        RetrieverConfig(),
        dp_config,
        out_dir=out,
        pay=run_payer(book, scope, out_dir=out, work_dir=work),
        keep_work=keep_work,
        plan=plan,
    )
    summary = {
        "out": str(out),
        "steps": result.steps_run,
        "epsilon": plan.epsilon,
        "delta": plan.delta,
        "noise_multiplier": plan.noise_multiplier,
    }
    if work.exists():
        summary["work_dir"] = str(work)  # secret: kept, or an unfinished run to resume
    print(json.dumps(summary))
