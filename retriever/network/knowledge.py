"""`build_knowledge`: a collection's one-time DP knowledge release, charged to its ledger.

From a private corpus.jsonl to a release folder (`retriever.network.folder`): the DP
synthetic records of `synthgen.knowledge` (DP keywords, soft clusters, DP few-shot records
per cluster, self-filtered; DP-SynRAG), an index over them, and the card stating the
guarantee. One implementation for a single collection (`retriever knowledge release`) and
for every contributor of the network (`retriever contributor build`). The private work
folder (mode 0700, never inside the release) receives the
contributor's ledger (the release's charges; later its tenants' keys and /answer charges),
the exact index over the private corpus that /answer reads, and ``private.json``.

Privacy:
  Unit: one document of the private collection; add/remove-one. The release is
  (card epsilon, card delta)-DP (`synthgen.knowledge`), charged to the scope
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
    PRIVATE_FILE,
    KnowledgeFolder,
    make_card,
    write_knowledge_folder,
    write_private_record,
)

KNOWLEDGE_WORK = "knowledge"  # the release's private state, inside the work folder
RELEASE_TENANT = "release"  # the ledger tenant of the public release (everyone receives it)
FACTS_FILE = "facts.json"  # a fact release's released pairs and noisy counts (public)
FACT_GENERATOR = (
    "DP fact release: key-phrase pairs by a public wordfreq rule, DP set union "
    "(PipelineDP partition selection), one record per released phrase"
)
GENERATOR = (
    "DP-SynRAG (Mori et al. 2025): DP keywords (PipelineDP partition selection), soft "
    "clusters, DP few-shot records per cluster (Tang et al. 2024), self-filtered"
)


@dataclasses.dataclass(frozen=True)
class KnowledgeResult:
    """What a build released (public figures only)."""

    folder: KnowledgeFolder | None  # None: this shard is done, others are not
    work: Path
    card: dict[str, Any]
    num_documents: int
    num_topics: int
    release: Any = None  # the `synthgen.knowledge.KnowledgeRelease`


def cluster_generator(config) -> str:
    """What a cluster release's records are, in words: field votes or free text."""
    if config.fields:
        return (
            "DP-SynRAG-style (Mori et al. 2025): DP keywords (PipelineDP partition "
            "selection), soft clusters, one record per cluster whose fields ("
            + ", ".join(config.fields)
            + ") are each one DP vote over the cluster's released keywords"
        )
    return GENERATOR


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
    shard: tuple[int, int] = (0, 1),
    guarantees_add_up: bool = False,
) -> KnowledgeResult:
    """Builds a collection's release folder and private work folder (or one shard's part).

    Args:
      private_corpus: corpus.jsonl (doc_id, text) of the private collection.
      out: the release folder (created once every cluster is done; safe to ship).
      config: `synthgen.knowledge.facts.FactConfig` (the fact release, the default), or
        `synthgen.knowledge.KnowledgeConfig` (DP-SynRAG clusters and generated records).
      contributor: the collection's (or contributor's) public name, on the card.
      work: the private work folder (default: beside `ledger` when given, else
        `default_contributor_work(out)`).
      ledger: the ledger (default: ``<work>/ledger.sqlite``).
      dataset: the collection's name in the ledger (default: the corpus file's stem).
      lm: LM asset or path, ``"tiny"`` (test LM) or a loaded backend.
      encoder: public encoder of the indexes.
      answer_index: also index the private corpus exactly, for a contributor's /answer.
      seed: tests only: a fixed seed for the mechanisms (stated on the card).
      progress: show a progress bar on stderr (clusters done, epsilon of the release).
      lm_name: how the card names a loaded `lm` (default: its type).
      shard: (i, n): generate this shard's clusters; the release folder is written by
        whichever run finds every cluster done (the same bytes whatever the split).
      guarantees_add_up: release under `dataset` although other names of the ledger have
        charged the same documents (`PrivacyLedger.bind_documents`; refused otherwise).

    Raises:
      ValueError: a bad config, a work folder inside the release, or an empty corpus.
      synthgen.privacy.BudgetExceededError: the ledger's release scope cannot pay
        (e.g. this collection was already released from this ledger).
      synthgen.privacy.ledger_documents.SharedDocumentsError: other names of the ledger
        have charged these documents and `guarantees_add_up` is False.
    """
    from retriever.data import read_corpus
    from synthgen.knowledge import release_knowledge
    from synthgen.knowledge.release import CHARGE_FILE
    from synthgen.privacy import BudgetExceededError, PrivacyLedger, Scope
    from synthgen.privacy.ledger_documents import GUARANTEES_FLAG, bind_texts
    from synthgen.privacy.notices import announce_ledger, warn_weak_guarantee
    from synthgen.work_folder import private_folder

    out = Path(out).absolute()
    if work is None:  # beside the ledger when one is given (synthgen.paths.default_work_dir)
        from synthgen.paths import default_work_dir

        work = default_work_dir(out, ledger) if ledger else default_contributor_work(out)
    work = Path(work).absolute()
    if work == out or out in work.parents:
        raise ValueError(f"the private work folder must not be inside the release: {work=}")
    doc_ids, texts = read_corpus(private_corpus)
    if not texts:
        raise ValueError(f"{private_corpus} holds no document")
    named = dataset is not None
    dataset = dataset or Path(private_corpus).stem
    private_folder(work)
    ledger_location = ledger or str(work / "ledger.sqlite")
    book = PrivacyLedger(ledger_location)
    # charged with a kept ref and not finished: a resume (or another shard), not a second release
    from synthgen.knowledge.facts import CHARGE_FILE as FACTS_CHARGE_FILE

    charged = any((work / KNOWLEDGE_WORK / f).is_file() for f in (CHARGE_FILE, FACTS_CHARGE_FILE))
    resuming = charged and not (work / PRIVATE_FILE).is_file()
    released = {s.dataset for s in book.scopes() if s.tenant == RELEASE_TENANT}
    if dataset in released and book.charges(RELEASE_TENANT, dataset) and not resuming:
        other = "" if named else f" (by default a collection is named by its file: {dataset})"
        raise BudgetExceededError(  # one release per collection
            f"{dataset} was already released from this ledger ({ledger_location}): a second "
            f"release would compose with the first. If this is another collection{other}, "
            "give it its own name with --dataset NAME. Release other settings of the same "
            f"documents only deliberately, under another name with {GUARANTEES_FLAG}: the "
            "documents then lose both guarantees, and `synthgen ledger show` totals them"
        )
    bind_texts(book, dataset, texts, guarantees_add_up=guarantees_add_up)
    book.ensure_scope(Scope(RELEASE_TENANT, dataset, config.epsilon, config.delta))
    announce_ledger(book, dataset)
    warn_weak_guarantee(config.epsilon, config.delta, len(texts))
    from synthgen.knowledge.facts import FactConfig

    if isinstance(config, FactConfig):
        return _build_facts(
            private_corpus, out, config, texts, contributor=contributor, work=work,
            book=book, ledger_location=ledger_location, dataset=dataset, encoder=encoder,
            answer_index=answer_index,
        )  # fmt: skip
    if isinstance(lm, str):
        from retriever.network.engine import load_answer_lm

        model, _ = load_answer_lm(lm)  # "tiny" or an LM asset or path
    else:
        model = lm
    # clusters are ranked by the released counts (a record's rarest keywords first), as
    # measured (docs/results/tables.md); `synthgen.knowledge` can rank by an encoder instead
    encode = None
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(unit="cluster", desc=f"{contributor} release", file=sys.stderr)

    def on_cluster(done: int, total: int) -> None:
        if bar is not None:
            bar.total = total
            bar.n = done
            bar.set_postfix_str(f"eps={config.epsilon:g} charged once")
            bar.refresh()

    import numpy as np

    try:
        release = release_knowledge(
            model,
            texts,
            config,
            work=work / KNOWLEDGE_WORK,
            encode=encode,
            rng=None if seed is None else np.random.default_rng(seed),
            ledger=book,
            ledger_scope=(RELEASE_TENANT, dataset),
            shard=shard,
            on_cluster=on_cluster,
        )
    finally:
        if bar is not None:
            bar.close()
    plan = release.plan
    model_name = lm if isinstance(lm, str) else (lm_name or type(lm).__name__)
    card = make_card(
        contributor=contributor,
        epsilon=plan.epsilon,
        delta=plan.delta,
        generator=cluster_generator(config),
        model=str(model_name),
        encoder=encoder,
        num_documents=len(release.records),
        stages=plan.stages(),
        seeded=seed is not None,
    )
    if not release.complete:
        return KnowledgeResult(None, work, card, 0, len(release.clusters), release)
    metadata = {
        "privacy": {
            **plan.to_dict(),
            "ledger_scope": {"tenant": RELEASE_TENANT, "dataset": dataset},
            "rows_covered": "all rows of the private corpus",
        },
        "randomness": {"seeded": seed is not None},
        "post_processing": (
            "records are DP-released keywords and each field's DP-voted keywords"
            if config.fields
            else "records are DP-released keywords and the DP-generated texts the public "
            "LM's self-filter kept"
        ),
        "model": {"backend": str(model_name)},
        "generation": {
            "method": cluster_generator(config),
            "clusters": len(release.clusters),
            "generated_texts_kept": sum(r["generated"] for r in release.records),
            "keywords": {k: round(v, 3) for k, v in release.keyword_counts.items()},
        },
        "num_examples": len(release.records),
    }
    folder = write_knowledge_folder(
        out,
        [r["text"] for r in release.records],
        [r["topic"] for r in release.records],
        card,
        metadata=metadata,
    )
    _write_private_side(
        private_corpus, out, work, contributor=contributor, dataset=dataset,
        ledger_location=ledger_location, encoder=encoder, answer_index=answer_index,
    )  # fmt: skip
    return KnowledgeResult(folder, work, card, len(release.records), len(release.clusters), release)


def _write_private_side(
    private_corpus, out, work, *, contributor, dataset, ledger_location, encoder, answer_index
) -> None:
    """The work folder's side of a finished release: the exact private index that /answer
    reads (with `answer_index`) and ``private.json`` naming the corpus, ledger and release."""
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


def _build_facts(
    private_corpus,
    out,
    config,
    texts,
    *,
    contributor,
    work,
    book,
    ledger_location,
    dataset,
    encoder,
    answer_index,
) -> KnowledgeResult:
    """The fact release (`synthgen.knowledge.facts`): one charge, one selection, a folder."""
    from synthgen.knowledge.facts import release_facts
    from synthgen.work_folder import private_folder

    facts_work = private_folder(work / KNOWLEDGE_WORK)
    release = release_facts(
        texts, config, work=facts_work, ledger=book, ledger_scope=(RELEASE_TENANT, dataset)
    )
    plan = release.plan
    privacy = plan.to_dict()
    card = make_card(
        contributor=contributor,
        epsilon=config.epsilon,
        delta=config.delta,
        generator=FACT_GENERATOR,
        model=(
            "none (records are released subjects and their typed values)"
            if config.extractor == "typed"
            else "none (records are released key phrases and their partners)"
        ),
        encoder=encoder,
        num_documents=len(release.records),
        stages=privacy["stages"],
    )
    card["guarantee"]["singleton_release_probability"] = plan.singleton_probability
    card["guarantee"]["records_needed"] = privacy["records_needed"]
    metadata = {
        "privacy": {
            **privacy,
            "ledger_scope": {"tenant": RELEASE_TENANT, "dataset": dataset},
            "rows_covered": "all rows of the private corpus",
        },
        "generation": {"method": FACT_GENERATOR, "released_pairs": len(release.pairs)},
        "num_examples": len(release.records),
    }
    folder = write_knowledge_folder(
        out,
        [r["text"] for r in release.records],
        [r["topic"] for r in release.records],
        card,
        metadata=metadata,
        extra={  # before the card: a folder with a card is a whole fact release
            FACTS_FILE: json.dumps(
                {
                    "pairs": release.pairs,
                    "max_partners": config.max_partners,
                    "extractor": config.extractor,
                    "noise_stddev": plan.noise_stddev,
                },
                indent=1,
            )
        },
    )
    _write_private_side(
        private_corpus, out, work, contributor=contributor, dataset=dataset,
        ledger_location=ledger_location, encoder=encoder, answer_index=answer_index,
    )  # fmt: skip
    return KnowledgeResult(folder, work, card, len(release.records), len(release.pairs), release)


def summary(result: KnowledgeResult) -> str:
    """One JSON line: public figures of a build."""
    guarantee = result.card["guarantee"]
    line = {
        "out": None if result.folder is None else str(result.folder.path),
        "complete": result.folder is not None,
        "work": str(result.work),
        "synthetic_records": result.num_documents,
        "clusters": result.num_topics,
        "epsilon": guarantee["epsilon"],
        "delta": guarantee["delta"],
    }
    release = result.release
    requested = getattr(getattr(release, "plan", None), "config", None)
    if requested is not None and requested.epsilon > guarantee["epsilon"] * (1 + 1e-9):
        line["epsilon_requested"] = requested.epsilon
        line["epsilon_note"] = (
            "the stages' noise is set so that their composition stays within the requested "
            "epsilon; it composes to the (smaller) epsilon stated, which is the one charged"
        )
    if "records_needed" in guarantee:  # a fact release: pairs, not clusters
        line["pairs"] = line.pop("clusters")
        line["records_needed"] = guarantee["records_needed"]["for_50_percent"]
    if result.folder is not None and result.num_documents == 0:
        line["empty"] = True
        line["warning"] = (
            "the release holds no record: nothing was stated by enough records to pass "
            "the threshold; answers from it will abstain"
        )
    return json.dumps(line)
