"""`build_knowledge`: a collection's one-time DP knowledge release, charged to its ledger.

From a private corpus.jsonl to a release folder (`retriever.network.folder`): the DP fact
release of `synthgen.knowledge.facts`, one record per released subject, an index over them,
``facts.json`` and the card; one implementation for `retriever knowledge release` and
`retriever contributor build`. The private work folder (mode 0700, never inside the
release) receives the ledger, the exact private index that /answer reads, and
``private.json``. A work folder holding an unfinished cluster release (retired, see
docs/guides/knowledge.md) is refused (`check_no_cluster_release`), never resumed.

Privacy:
  Unit: one document of the private collection; add/remove-one. The release is
  (card epsilon, card delta)-DP (`synthgen.knowledge.facts`), charged to the scope
  (``release``, dataset) of the contributor's ledger before any noise is drawn; the scope's
  cap is the release's budget, so building again on the same ledger is refused instead of
  silently spending twice. Nothing private is printed or logged: counts, epsilon and delta.
"""

from __future__ import annotations

import dataclasses
import json
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
# what the retired cluster release left in a work folder's knowledge/ while unfinished
CLUSTER_RELEASE_FILES = ("knowledge_charge.json", "knowledge_state.json")


@dataclasses.dataclass(frozen=True)
class KnowledgeResult:
    """What a build released (public figures only)."""

    folder: KnowledgeFolder
    work: Path
    card: dict[str, Any]
    num_documents: int
    num_pairs: int
    release: Any = None  # the `synthgen.knowledge.facts.FactRelease`


def check_no_cluster_release(work: Path) -> None:
    """Refuses a work folder holding an unfinished cluster release (retired).

    Such a folder was charged for a cluster release whose records were never written (no
    ``private.json`` yet); resuming it as a fact release would release the collection again
    under another plan, and the code that could finish it is gone. A finished one is left
    to the ledger's refusal of a second release.

    Raises:
      ValueError: ``<work>/knowledge`` holds the retired release's charge or state file
        and the release was not finished.
    """
    knowledge_work = work / KNOWLEDGE_WORK
    left = [name for name in CLUSTER_RELEASE_FILES if (knowledge_work / name).is_file()]
    if left and not (work / PRIVATE_FILE).is_file():
        raise ValueError(
            f"{knowledge_work} holds an unfinished cluster release ({', '.join(left)}), "
            "which this version cannot finish: the cluster release (--mode clusters) was "
            "retired. Finish it with the previous version of dpsynth, or delete that "
            "folder to start over (the ledger keeps the charge already made, and a second "
            "release of the collection composes with it)"
        )


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
    encoder: str = "all-minilm-l6-v2",
    answer_index: bool = True,
    guarantees_add_up: bool = False,
) -> KnowledgeResult:
    """Builds a collection's release folder and private work folder.

    Args:
      private_corpus: corpus.jsonl (doc_id, text) of the private collection.
      out: the release folder (safe to ship).
      config: `synthgen.knowledge.facts.FactConfig`.
      contributor: the collection's (or contributor's) public name, on the card.
      work: the private work folder (default: beside `ledger` when given, else
        `default_contributor_work(out)`).
      ledger: the ledger (default: ``<work>/ledger.sqlite``).
      dataset: the collection's name in the ledger (default: the corpus file's stem).
      encoder: public encoder of the indexes.
      answer_index: also index the private corpus exactly, for a contributor's /answer.
      guarantees_add_up: release under `dataset` although other names of the ledger have
        charged the same documents (`PrivacyLedger.bind_documents`; refused otherwise).

    Raises:
      ValueError: a bad config, a work folder overlapping the release, an empty corpus, a
        release that could carry nothing (before any charge), or a work folder holding an
        unfinished cluster release (`check_no_cluster_release`).
      synthgen.privacy.BudgetExceededError: the ledger's release scope cannot pay
        (e.g. this collection was already released from this ledger).
      synthgen.privacy.ledger_documents.SharedDocumentsError: other names of the ledger
        have charged these documents and `guarantees_add_up` is False.
    """
    from retriever.data import read_corpus
    from synthgen.knowledge.facts import CHARGE_FILE, FactConfig, plan_facts
    from synthgen.privacy import BudgetExceededError, PrivacyLedger
    from synthgen.privacy.admission import admit
    from synthgen.privacy.ledger_documents import GUARANTEES_FLAG
    from synthgen.privacy.partition_selection import check_backend
    from synthgen.work_folder import check_apart, private_folder

    if not isinstance(config, FactConfig):
        raise TypeError(f"config must be a synthgen.knowledge.facts.FactConfig, got {config!r}")
    out = Path(out).absolute()
    if work is None:  # beside the ledger when one is given (synthgen.paths.default_work_dir)
        from synthgen.paths import default_work_dir

        work = default_work_dir(out, ledger) if ledger else default_contributor_work(out)
    work = Path(work).absolute()
    check_apart(out, work)
    check_no_cluster_release(work)
    doc_ids, texts = read_corpus(private_corpus)
    if not texts:
        raise ValueError(f"{private_corpus} holds no document")
    plan = plan_facts(config, len(texts))
    problems = plan.problems()
    if problems:  # refused before the ledger or the work folder is touched
        raise ValueError("; ".join(problems))
    check_backend(config.backend, installed=True)
    named = dataset is not None
    dataset = dataset or Path(private_corpus).stem
    private_folder(work)
    ledger_location = ledger or str(work / "ledger.sqlite")
    book = PrivacyLedger(ledger_location)
    # charged with a kept ref and not finished: a resume, not a second release
    charged = (work / KNOWLEDGE_WORK / CHARGE_FILE).is_file()
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
    # the release checks and charges once through its work folder, which knows a resume
    admit(
        book, RELEASE_TENANT, dataset, texts, plan, stage="knowledge-release",
        public_count=len(texts), guarantees_add_up=guarantees_add_up, check=False,
    )  # fmt: skip
    return _build_facts(
        private_corpus, out, config, texts, contributor=contributor, work=work,
        book=book, ledger_location=ledger_location, dataset=dataset, encoder=encoder,
        answer_index=answer_index,
    )  # fmt: skip


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
    from synthgen.privacy.receipts import ledger_payer
    from synthgen.work_folder import private_folder

    facts_work = private_folder(work / KNOWLEDGE_WORK)
    pay = ledger_payer(book, (RELEASE_TENANT, dataset), stage="knowledge-release")
    release = release_facts(texts, config, work=facts_work, pay=pay)
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
        "out": str(result.folder.path),
        "complete": True,
        "work": str(result.work),
        "synthetic_records": result.num_documents,
        "pairs": result.num_pairs,
        "epsilon": guarantee["epsilon"],
        "delta": guarantee["delta"],
        "records_needed": guarantee["records_needed"]["for_50_percent"],
    }
    if result.num_documents == 0:
        line["empty"] = True
        line["warning"] = (
            "the release holds no record: nothing was stated by enough records to pass "
            "the threshold; answers from it will abstain"
        )
    return json.dumps(line)
