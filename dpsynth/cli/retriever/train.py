"""`retriever train` and `retriever train-dp`: thin wrappers over `retriever.train`."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer

from dpsynth.cli.shared import admit_training_pairs, print_guarantee
from synthgen.command_line import (
    DpSgdDeltaOption,
    GuaranteesAddUpOption,
    KeepSecretWorkOption,
    LedgerOption,
    PairsLimitOption,
    SecretWorkDirOption,
    TargetEpsilonOption,
    TestSeedOption,
    usage_errors,
)

PairsOption = Annotated[Path, typer.Option(help="queries.jsonl (generator output or plain)")]
TowersOutOption = Annotated[Path, typer.Option(help="release folder: towers and provenance.json")]
EncoderOption = Annotated[str, typer.Option(help="base encoder: asset or folder")]
PlainCorpusOption = Annotated[Path | None, typer.Option(help="corpus.jsonl for plain pairs")]
DataOrderSeedOption = Annotated[int, typer.Option(help="data order")]
SyntheticMetadataOption = Annotated[
    Path | None,
    typer.Option(
        help="metadata.json of the DP release the pairs come from (default: the one "
        "beside --pairs, if it describes that file); without one the encoder is stated "
        "as trained on real data, with no privacy guarantee"
    ),
]
ResumeWorkDirOption = Annotated[
    Path | None,
    typer.Option(
        help="resume state (checkpoints), outside the release; the same command resumes "
        "from it (default: <ledger folder>/work/<out name>-<hash>)"
    ),
]
KeepWorkOption = Annotated[bool, typer.Option(help="keep the work folder after a finished run")]

PrivateQueriesOption = Annotated[Path, typer.Option(help="private queries.jsonl (query, doc_id)")]
PublicCorpusOption = Annotated[Path, typer.Option(help="public corpus.jsonl")]
DpOutOption = Annotated[Path, typer.Option(help="release folder: towers and privacy metadata")]
BaseEncoderOption = Annotated[str, typer.Option(help="base encoder")]
NoiseMultiplierOption = Annotated[float | None, typer.Option(help="sigma instead")]
ExpectedBatchOption = Annotated[int, typer.Option(help="expected batch size")]
DatasetOption = Annotated[str | None, typer.Option(help="default: the queries file name")]


def train(
    pairs: PairsOption,
    out: TowersOutOption,
    encoder: EncoderOption = "all-minilm-l6-v2",
    corpus: PlainCorpusOption = None,
    epochs: float = 1.0,
    batch_size: int = 32,
    learning_rate: float = 5e-5,
    temperature: float = 0.05,
    learn_temperature: bool = False,
    separate_towers: bool = False,
    limit: PairsLimitOption = None,
    seed: DataOrderSeedOption = 0,
    synthetic_metadata: SyntheticMetadataOption = None,
    work_dir: ResumeWorkDirOption = None,
    keep_work: KeepWorkOption = False,
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
    _print_trained(out, result, len(queries), batch_size, provenance["statement"])


def _print_trained(out: Path, result, num_pairs: int, batch_size: int, statement: str) -> None:
    """Prints the note on pairs left out of each epoch, if any, and the JSON summary."""
    if result.pairs_left_out_per_epoch:
        print(
            f"note: {num_pairs} pairs at batch {batch_size}: "
            f"{result.pairs_left_out_per_epoch} pairs per epoch fill no batch and are left "
            "out of it (each epoch reshuffles; use a batch size that divides the pairs, or "
            "more epochs, to train on every pair)",
            file=sys.stderr,
        )
    summary = {
        "out": str(out),
        "steps": result.steps_run,
        "pairs_left_out_per_epoch": result.pairs_left_out_per_epoch,
        "pairs_per_second": round(result.pairs_per_second, 2),
        "seconds": round(result.seconds, 1),
        "statement": statement,
    }
    print(json.dumps(summary))


def _private_pairs(queries: Path, corpus: Path) -> tuple[list[dict], list[str], dict[str, int]]:
    """The private query rows, the corpus texts and each doc_id's row in the corpus.

    Raises:
      ValueError: a query names a doc_id that is not in the corpus.
    """
    from retriever.data import read_corpus, read_queries

    rows = read_queries(queries)
    doc_ids, texts = read_corpus(corpus)
    row_of = {d: i for i, d in enumerate(doc_ids)}
    missing = sum(1 for r in rows if str(r["doc_id"]) not in row_of)
    if missing:
        raise ValueError(f"{missing} queries name a doc_id that is not in {corpus}")
    return rows, texts, row_of


def _dp_config(epsilon, noise_multiplier, delta, epochs, batch_size, clip_norm, lr, seed):
    """DP-Adafactor's settings; --noise-multiplier overrides --epsilon."""
    from synthgen.dp_train import DPConfig

    return DPConfig(
        batch_size=batch_size,
        epochs=epochs,
        clip_norm=clip_norm,
        learning_rate=lr,
        target_epsilon=None if noise_multiplier is not None else epsilon,
        noise_multiplier=noise_multiplier,
        delta=delta,
        physical_batch=16,
        microbatch=8,
        seed=seed,
    )


def train_dp(
    queries: PrivateQueriesOption,
    corpus: PublicCorpusOption,
    out: DpOutOption,
    encoder: BaseEncoderOption = "all-minilm-l6-v2",
    epsilon: TargetEpsilonOption = 8.0,
    noise_multiplier: NoiseMultiplierOption = None,
    delta: DpSgdDeltaOption = None,
    epochs: float = 1.0,
    batch_size: ExpectedBatchOption = 64,
    clip_norm: float = 1.0,
    learning_rate: float = 1e-3,
    ledger: LedgerOption = None,
    tenant: str = "default",
    dataset: DatasetOption = None,
    guarantees_add_up: GuaranteesAddUpOption = False,
    seed: TestSeedOption = None,
    work_dir: SecretWorkDirOption = None,
    keep_work: KeepSecretWorkOption = False,
) -> None:
    """Direct-DP baseline: DP-Adafactor on real pairs (frozen public document tower).

    The release folder --out gets the towers only; the resume state (noise key, sampler
    state, optimizer) stays in the secret --work-dir, which is deleted after a finished run
    (unless --keep-work) and resumed from when the same command is run again.
    """
    from retriever.encoders import load_encoder
    from retriever.train import RetrieverConfig, train_retriever_dp
    from synthgen.dp_train import plan_privacy
    from synthgen.paths import default_ledger_path, default_work_dir
    from synthgen.work_folder import check_apart, run_payer

    dp_config = _dp_config(
        epsilon, noise_multiplier, delta, epochs, batch_size, clip_norm, learning_rate, seed
    )
    ledger = ledger or default_ledger_path()
    work = work_dir if work_dir is not None else default_work_dir(out, ledger)
    where = "--work-dir" if work_dir is not None else "--ledger"  # the default's folder
    with usage_errors(ValueError, option=where):  # before the ledger sees the pairs
        check_apart(out, work)
    rows, texts, row_of = _private_pairs(queries, corpus)
    plan = plan_privacy(dp_config, len(rows))
    scope = (tenant, dataset or queries.stem)
    pairs = [{"document": texts[row_of[str(r["doc_id"])]], "query": r["query"]} for r in rows]
    book = admit_training_pairs(ledger, scope, pairs, plan, guarantees_add_up=guarantees_add_up)
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
    print_guarantee(out, result.steps_run, plan, work)
