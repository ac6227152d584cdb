"""`build_knowledge`: a contributor's one-time DP synthetic release, charged to its ledger.

From the contributor's private corpus.jsonl to a release folder (`retriever.network.folder`):
DP keyword topics and keyword-conditioned DP few-shot documents
(`synthgen.fewshot.topics`), an index over those documents, and the card stating the
guarantee. The private work folder (mode 0700, never inside the release) receives the
contributor's ledger (the release's charges; later its tenants' keys and /answer charges),
the exact index over the private corpus that /answer reads, and ``private.json``.

Privacy:
  Unit: one document of the private collection; add/remove-one. The release is
  (card epsilon, card delta)-DP (`synthgen.fewshot.topics`), charged to the scope
  (``release``, dataset) of the contributor's ledger before any noise is drawn; the scope's
  cap is the release's budget, so building again on the same ledger is refused instead of
  silently spending twice. Nothing private is printed or logged: counts, epsilon and delta.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

from retriever.network.folder import (
    KnowledgeFolder,
    make_card,
    write_knowledge_folder,
    write_private_record,
)

RELEASE_TENANT = "release"  # the ledger tenant of the public release (everyone receives it)
GENERATOR = (
    "keyword-conditioned DP few-shot generation: DP keyword topics (Gaussian sparse "
    "histogram), then DP few-shot documents per topic (Tang et al. 2024; DP-SynRAG-style)"
)


@dataclasses.dataclass(frozen=True)
class KnowledgeResult:
    """What a build released (public figures only)."""

    folder: KnowledgeFolder
    work: Path
    card: dict[str, Any]
    num_documents: int
    num_topics: int


def default_contributor_work(release: str | Path) -> Path:
    """The contributor's private work folder by default (`synthgen.paths.default_work_dir`)."""
    from synthgen.paths import default_work_dir

    return default_work_dir(release)


def build_knowledge(
    private_corpus: str | Path,
    out: str | Path,
    config,
    *,
    contributor: str,
    work: str | Path | None = None,
    ledger: str | None = None,
    dataset: str | None = None,
    lm: str | object = "smollm2-135m-instruct",
    encoder: str = "all-minilm-l6-v2",
    answer_index: bool = True,
    seed: int | None = None,
    progress: bool = True,
    lm_name: str | None = None,
) -> KnowledgeResult:
    """Builds a contributor's release folder and private work folder.

    Args:
      private_corpus: corpus.jsonl (doc_id, text) of the private collection.
      out: the release folder (created; safe to ship).
      config: `synthgen.fewshot.topics.TopicConfig` (epsilon, delta and generation).
      contributor: the contributor's public name (on the card).
      work: the private work folder (default `default_contributor_work(out)`).
      ledger: the contributor's ledger (default: ``<work>/ledger.sqlite``).
      dataset: the collection's name in the ledger (default: the corpus file's stem).
      lm: LM asset or path, ``"tiny"`` (test LM) or a loaded backend.
      encoder: encoder of the synthetic index (and of the private index).
      answer_index: also index the private corpus exactly, for /answer.
      seed: tests only: a fixed seed for the mechanisms (stated on the card).
      progress: show a progress bar on stderr.
      lm_name: how the card names a loaded `lm` (default: its type).

    Raises:
      ValueError: a bad config, a work folder inside the release, or an empty corpus.
      synthgen.privacy.BudgetExceededError: the ledger's release scope cannot pay
        (e.g. this collection was already released from this ledger).
    """
    from retriever.data import read_corpus
    from synthgen.fewshot.topics import release_topic_documents
    from synthgen.privacy import BudgetExceededError, PrivacyLedger, Scope, secure_rng
    from synthgen.work_folder import private_folder

    out = Path(out).absolute()
    work = Path(work).absolute() if work is not None else default_contributor_work(out)
    if work == out or out in work.parents:
        raise ValueError(f"the private work folder must not be inside the release: {work=}")
    doc_ids, texts = read_corpus(private_corpus)
    if not texts:
        raise ValueError(f"{private_corpus} holds no document")
    dataset = dataset or Path(private_corpus).stem
    private_folder(work)
    ledger_location = ledger or str(work / "ledger.sqlite")
    book = PrivacyLedger(ledger_location)
    book.ensure_scope(Scope(RELEASE_TENANT, dataset, config.epsilon, config.delta))
    if book.charges(RELEASE_TENANT, dataset):  # one release per collection and ledger
        raise BudgetExceededError(
            f"{dataset} was already released from this ledger ({ledger_location}): a second "
            "release would compose with the first; use a new collection name or ledger"
        )
    if isinstance(lm, str):
        from retriever.network.engine import load_answer_lm

        model, _ = load_answer_lm(lm)  # "tiny" or an LM asset or path
    else:
        model = lm
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(unit="tok", desc=f"{contributor} release", file=sys.stderr)

    def on_token(released: int, _plan) -> None:
        if bar is not None:
            bar.update(1)

    try:
        release = release_topic_documents(
            model,
            texts,
            config,
            rng=secure_rng(seed),
            ledger=book,
            ledger_scope=(RELEASE_TENANT, dataset),
            on_token=on_token,
        )
    finally:
        if bar is not None:
            bar.close()
    plan = release.plan
    stages = [
        {"stage": "topics", "epsilon": plan.topics.epsilon, "delta": plan.topics.delta},
        {
            "stage": "documents",
            "epsilon": plan.documents.epsilon,
            "delta": plan.documents.delta,
        },
    ]
    model_name = lm if isinstance(lm, str) else (lm_name or type(lm).__name__)
    card = make_card(
        contributor=contributor,
        epsilon=plan.epsilon,
        delta=plan.delta,
        generator=GENERATOR,
        model=str(model_name),
        encoder=encoder,
        num_documents=len(release.texts),
        stages=stages,
        seeded=seed is not None,
    )
    metadata = {
        "privacy": {
            **plan.to_dict(),
            "ledger_scope": {"tenant": RELEASE_TENANT, "dataset": dataset},
            "rows_covered": "all rows of the private corpus",
        },
        "randomness": {"seeded": seed is not None},
        "post_processing": "texts are decoded from DP-released tokens and stripped; topics "
        "are DP-released keywords",
        "model": {"backend": str(model_name)},
        "generation": {
            "method": GENERATOR,
            "tokens_released": release.tokens_released,
            "topics": {k: round(v, 3) for k, v in release.keyword_counts.items()},
        },
        "num_examples": len(release.texts),
    }
    folder = write_knowledge_folder(out, release.texts, release.topics, card, metadata=metadata)
    private_index = None
    if answer_index:
        from retriever.index_folder import build_index_folder

        private_index = work / "private_index"
        build_index_folder(private_corpus, private_index, encoder=encoder, kind="exact")
    write_private_record(
        work,
        {
            "contributor": contributor,
            "dataset": dataset,
            "private_corpus": str(Path(private_corpus).absolute()),
            "private_index": None if private_index is None else str(private_index),
            "ledger": ledger_location,
            "release": str(out),
        },
    )
    return KnowledgeResult(folder, work, card, len(release.texts), len(set(release.topics)))


def summary(result: KnowledgeResult) -> str:
    """One JSON line: public figures of a build."""
    guarantee = result.card["guarantee"]
    return json.dumps(
        {
            "out": str(result.folder.path),
            "work": str(result.work),
            "documents": result.num_documents,
            "topics": result.num_topics,
            "epsilon": guarantee["epsilon"],
            "delta": guarantee["delta"],
        }
    )
