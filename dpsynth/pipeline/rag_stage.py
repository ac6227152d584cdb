"""The main job's DP-RAG stage: a few questions answered over a private collection.

Privacy:
  Privacy unit: one record of the private collection (add/remove-one). Every answer is
  (epsilon, delta)-DP (`retriever.rag.DPRag`; Grislain 2024, Koga et al. 2024), charged to
  the run's ledger before any noise is drawn; the collection is admitted as `retriever
  answer` admits it (`PrivateCollection.admit`): a collection cap over every tenant caps the
  total, and every answer is the one event pinned on it. The
  questions are public, the answers releases. The sensitivity assumes an encoder that does
  not depend on the collection (the run's is trained on the DP synthetic release, checked
  from its provenance.json), and δ and the scope's δ cap are below 1/n for n records.

  Individual accounting (``rag.accounting = "individual"``, icl only): each record has its
  own filter over all answers of all tenants (Feldman & Zrnic 2021) and pays only for
  answers it scores at least ``rag.relevance_threshold`` in while its filter admits them;
  the tenant's scope becomes a quota. A run folder keeps the accounting it started with.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from dpsynth.pipeline.context import StageContext, check_run_scope, open_run_scope
from synthgen.privacy.figures import format_epsilon
from synthgen.privacy.receipts import collection_payer

RAG_DATASET = "medical-records"  # the packaged sample collections' name in the ledger


@dataclasses.dataclass(frozen=True)
class Collection:
    """The stage's private collection and its public questions.

    `name` is the collection's name in the run's ledger; `questions` are (question, expected
    answer or None) pairs, public."""

    name: str
    doc_ids: list[str]
    texts: list[str]
    questions: list[tuple[str, str | None]]


def read_collection(cfg) -> Collection:
    """`cfg.records` (a corpus JSONL of doc_id and text) with the first `cfg.questions` of
    `cfg.questions_file`, or the packaged sample collection `cfg.sample` with its first
    questions, which are in its fictional world's (public) disease order: choosing by how
    many records a disease has would branch on the private collection."""
    from dpsynth.pipeline.sample_collections import sample_files
    from retriever.data import read_corpus

    records, questions = (
        (cfg.records, cfg.questions_file) if cfg.records is not None else sample_files(cfg.sample)
    )
    doc_ids, texts = read_corpus(records)
    return Collection(cfg.dataset_name, doc_ids, texts, read_questions(questions)[: cfg.questions])


def read_questions(path) -> list[tuple[str, str | None]]:
    """The public questions of `path`: a JSONL of {"question", optional "answer"} lines, or
    plain text, one question per line (no expected answer)."""
    questions = []
    for number, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        if line.lstrip().startswith("{"):
            row = json.loads(line)
            if not isinstance(row.get("question"), str) or not row["question"].strip():
                raise ValueError(f'{path}:{number}: a JSON line needs a non-empty "question"')
            answer = row.get("answer")
            questions.append((row["question"], None if answer is None else str(answer)))
        else:
            questions.append((line.strip(), None))
    if not questions:
        raise ValueError(f"{path} holds no question")
    return questions


def _count_correct(answers: list[dict]) -> int | None:
    """How many answers name their expected answer (None: no question has one)."""
    scored = [a["correct"] for a in answers if a["correct"] is not None]
    return sum(scored) if scored or not answers else None


def _answer_row(
    question: str, expected: str | None, answer: str, abstained: bool, spent: dict
) -> dict:
    """One row of answers.json, `spent` (epsilon, delta, mechanism) last; "correct" says
    whether the answer names the expected answer (None: no expected answer given), by
    `retriever.answer_match.answer_is_correct`."""
    from retriever.answer_match import answer_is_correct

    correct = None if expected is None else not abstained and answer_is_correct(answer, expected)
    return {
        "question": question,
        "expected": expected,
        "answer": answer,
        "abstained": abstained,
        "correct": correct,
        **spent,
    }


def _check_accounting_unchanged(ledger, dataset: str, individual: bool) -> None:
    """Refuses to switch the accounting of the run's collection: per-document filters
    opened after collection-accounting answers would not count them, and collection
    answers on a collection with filters would charge no record."""
    from synthgen.privacy.document_filters import DocumentFilters

    has_filters = DocumentFilters(ledger.store).get(dataset) is not None
    charged = any(
        ledger.charges(scope.tenant, scope.dataset)
        for scope in ledger.scopes()
        if scope.dataset == dataset
    )
    if individual and not has_filters and charged:
        raise ValueError(
            f"the run's ledger already charged {dataset} under collection accounting; "
            "per-document filters would not count those answers: restore "
            "rag.accounting='collection' or start a new run folder (--out)"
        )
    if not individual and has_filters:
        raise ValueError(
            f"the run's ledger holds per-document filters for {dataset} (individual "
            "accounting): restore rag.accounting='individual' or start a new run folder (--out)"
        )


def answer_plan(cfg):
    """(mechanism, `RagConfig`, the plan of one answer) of a rag section: public values.
    k is the config's (small collections); the trained encoder scores: dense retrieval."""
    from retriever.rag import RagConfig
    from retriever.rag.answer import plan_answer
    from retriever.rag.defaults import resolve

    mechanism, _ = resolve(cfg.mechanism, cfg.k, cfg.epsilon, accounting=cfg.accounting)
    config = RagConfig(
        k=cfg.k,
        max_tokens=cfg.max_tokens,
        delta=cfg.delta,
        accounting=cfg.accounting,
        relevance_threshold=cfg.relevance_threshold,
    )
    return mechanism, config, plan_answer(config, mechanism, cfg.epsilon)


def answers_that_fit(cfg, tenant: str = "pipeline") -> int:
    """How many of `cfg.questions` answers fit a new scope of `cfg`'s caps (public)."""
    from synthgen.privacy.calibration import bisect
    from synthgen.privacy.ledger_types import Scope

    scope = Scope(tenant, cfg.dataset_name, cfg.epsilon_cap, cfg.delta_cap)
    plan = answer_plan(cfg)[2]

    def fits(answers: int) -> bool:
        try:
            _check_answers_fit(None, scope, plan, answers)
        except ValueError:
            return False
        return True

    if fits(cfg.questions):
        return cfg.questions
    return bisect(fits, 0, cfg.questions, integer=True)  # 0 answers always fit


def _answered(path: Path, questions: list[tuple[str, str | None]]) -> list[dict]:
    """The answers an interrupted stage already released (`rag/answers.json`), refused when
    they answer other questions than the first of `questions` (edited since)."""
    answers = json.loads(path.read_text()) if path.is_file() else []
    if [a["question"] for a in answers] != [q for q, _ in questions[: len(answers)]]:
        raise ValueError(
            f"{path} answers other questions than the config's (the questions changed "
            "since): restore them, or start a new run folder (--out)"
        )
    return answers


def _check_answers_fit(ledger, scope, plan, answers: int) -> None:
    """Refuses, before anything is written or charged, questions whose `answers` answers at
    `plan`'s worst case cannot all fit `scope`'s cap (with what the run already spent on it):
    every answer is the same public event, so this is known from public values."""
    import tempfile

    from dp_accounting import dp_event

    from retriever.rag.answer import RELATION
    from synthgen.privacy import BudgetExceededError, PrivacyLedger

    if answers <= 0:
        return
    stored = ledger is not None and any(
        (s.tenant, s.dataset) == (scope.tenant, scope.dataset) for s in ledger.scopes()
    )  # None: a new run's ledger
    with tempfile.TemporaryDirectory() as folder:
        book = ledger if stored else PrivacyLedger(Path(folder) / "check.sqlite")
        if not stored:  # the scope the stage would open, alone in a scratch ledger
            book.open_scope(scope)
        try:
            book.check(
                scope.tenant, scope.dataset, stage="rag-answer", relation=RELATION,
                event=dp_event.SelfComposedDpEvent(plan.worst_case_event(), answers),
                delta=plan.delta,
            )  # fmt: skip
        except BudgetExceededError:
            raise ValueError(
                f"{answers} answers at epsilon={plan.epsilon:g} do not fit the cap of "
                f"({scope.tenant}, {scope.dataset}), epsilon={scope.epsilon_cap:g}: answer "
                "fewer questions (rag.questions) or raise rag.epsilon_cap; nothing was charged"
            ) from None
        finally:
            if not stored:
                book.close()


def _tell(ctx: StageContext, ledger, dataset: str, stated, records: int) -> None:
    """Logs which ledger holds the collection's charges, and a warning for each weak
    guarantee among `stated` ((epsilon, delta, what) over `records` records)."""
    from synthgen.privacy.notices import guarantee_lines, ledger_lines

    lines = ledger_lines(ledger, dataset, option=None)
    for epsilon, delta, what in stated:
        lines += guarantee_lines(epsilon, delta, records, what=what)
    for line in lines:
        ctx.log("rag", line)


# the medical world's fact release, as measured on it (docs/results/tables.md): typed
# facts, one per record (each listed symptom with the diagnosis after it), answered from
# the released counts with no LM (pairs of key phrases, K = 16, with the LM: 0.307)
RELEASE_MAX_PAIRS, RELEASE_EXTRACTOR = 1, "typed"
CLUSTER_CHARGE_FILE = "knowledge_charge.json"  # the retired cluster release's, in knowledge/


def _check_no_cluster_release(work) -> None:
    """Refuses a run folder whose release mode ran the retired cluster release: its ledger
    holds that release's charge, and a fact release would be a second release."""
    if (work / CLUSTER_CHARGE_FILE).is_file():
        raise ValueError(
            f"this run folder's rag stage made a cluster release ({work / CLUSTER_CHARGE_FILE}),"
            " which was retired: rerun it with the previous version of dpsynth, or start a new "
            "run folder (--out) for the fact release"
        )


def release_and_answer(ctx: StageContext, collection: Collection) -> dict:
    """Release mode: the collection's facts released once, then every question answered
    from the release (`retriever.typed_answers`: the value the released counts support for
    the subjects the question names, or an abstention; no LM), charged nothing. Writes
    ``rag/release.jsonl`` (the synthetic records) and ``rag/answers.json``; the private
    state stays in the run's private folder.

    Privacy:
      The release is (release_epsilon, delta_cap)-DP per record (`synthgen.knowledge.facts`:
      DP set union over typed facts, K = 1 per record), charged once to the scope
      ("release", the collection) before any noise; the answers are post-processing.
    """
    from retriever.typed_answers import TypedFactAnswerer
    from synthgen.knowledge.facts import FactConfig, plan_facts, release_facts
    from synthgen.privacy.ledger import PrivacyLedger
    from synthgen.privacy.ledger_documents import bind_texts
    from synthgen.privacy.ledger_types import Scope
    from synthgen.privacy.receipts import ledger_payer

    cfg = ctx.config.rag
    work = ctx.run.private / "knowledge"
    _check_no_cluster_release(work)
    ledger, dataset, texts = PrivacyLedger(ctx.run.ledger), collection.name, collection.texts
    config = FactConfig(
        cfg.release_epsilon, cfg.delta_cap, max_pairs=RELEASE_MAX_PAIRS,
        extractor=RELEASE_EXTRACTOR,
    )  # fmt: skip
    problems = plan_facts(config, len(texts)).problems()  # public: before anything is written
    if problems:
        raise ValueError("; ".join(problems))
    bind_texts(ledger, dataset, texts)  # the records, bound to their name before any charge
    open_run_scope(ledger, Scope("release", dataset, cfg.release_epsilon, cfg.delta_cap))
    _tell(ctx, ledger, dataset, [(cfg.release_epsilon, cfg.delta_cap, None)], len(texts))
    ctx.log("rag", f"releasing the facts of {len(texts)} private records once")
    pay = ledger_payer(ledger, ("release", dataset), stage="knowledge-release")
    release = release_facts(texts, config, work=work, pay=pay)
    out = ctx.run.root / "rag"
    out.mkdir(parents=True, exist_ok=True)
    (out / "release.jsonl").write_text("".join(json.dumps(r) + "\n" for r in release.records))
    ctx.log(
        "rag",
        f"released {len(release.records)} synthetic records at "
        f"eps={format_epsilon(config.epsilon)}",
    )
    answerer = TypedFactAnswerer(release.records, release.plan.noise_stddev)
    answers, spent = [], {"epsilon": 0.0, "delta": 0.0, "mechanism": "release"}
    for question, expected in collection.questions:
        found = answerer.answer(question)
        answers.append(_answer_row(question, expected, found.answer, found.abstained, spent))
    (out / "answers.json").write_text(json.dumps(answers, indent=1, ensure_ascii=False))
    return {
        "enabled": True,
        "mode": "release",
        "dataset": dataset,
        "lm": None,  # answered from the release's counts: no LM reads or writes
        "mechanism": f"release (DP fact release: {RELEASE_EXTRACTOR}, K = {RELEASE_MAX_PAIRS})",
        "accounting": "release",
        "records": len(texts),
        "synthetic_records": len(release.records),
        "questions": len(answers),
        "epsilon_per_answer": 0.0,
        "release_epsilon": config.epsilon,
        "release_delta": config.delta,
        "correct": _count_correct(answers),
        "abstained": sum(a["abstained"] for a in answers),
        "collection_epsilon_spent": ledger.spent("release", dataset).epsilon,
        "answers": answers,
    }


RESTORE_RAG = (
    "restore the run's rag settings (rag.epsilon, rag.mechanism, rag.delta, rag.max_tokens) "
    "or start a new run folder (--out)"
)


def _admit(ledger, collection: Collection, scope, plan, cfg, *, room: bool) -> None:
    """`PrivateCollection.admit` for the run's `scope` (the path of `retriever answer` and
    `retriever serve`): the records bound to their name, in collection accounting a
    collection cap at the scope's caps (every tenant of the run's ledger together) and the
    pinned answer event checked, in individual accounting the per-record filters; each of
    the run's scopes refused, before anything is written, if the ledger holds it with
    other caps (`check_run_scope`). `room`: check room for one more answer (False: none
    is left to give, and nothing more will be charged)."""
    from retriever.rag.collection import PrivateCollection, check_delta

    caps = (
        {} if cfg.individual else {"cap_epsilon": scope.epsilon_cap, "cap_delta": scope.delta_cap}
    )
    private = PrivateCollection.of(
        collection.name, collection.texts, doc_ids=collection.doc_ids, **caps
    )
    for run_scope in (scope, private.cap):
        if run_scope is not None:
            check_run_scope(ledger, run_scope)
    target = None
    if cfg.individual:
        check_delta(cfg.document_delta, private.documents, "rag.document_delta")
        target = (cfg.document_epsilon, cfg.document_delta)
    # the same filters again (a resumed run) are a no-op; others are refused
    private.admit(ledger, scope, plan, document_target=target, room=room, restore=RESTORE_RAG)


def answer_questions(ctx: StageContext) -> dict:
    """Answers `rag.questions` questions at `rag.epsilon` each; writes `rag/answers.json`.

    In individual accounting the collection's per-document filters are opened (or checked,
    on a resumed run) before the tenant's scope, and the summary records the per-document
    target and the filters' aggregate summary (never a record's own figure).
    """
    from retriever.rag.collection import check_delta, check_encoder, pin_answer_event
    from synthgen.privacy.document_filters import DocumentFilters
    from synthgen.privacy.ledger import PrivacyLedger
    from synthgen.privacy.ledger_types import Scope

    cfg = ctx.config.rag
    if not cfg.enabled:
        return {"enabled": False}
    mechanism, rag_config, plan = answer_plan(cfg)
    collection = read_collection(cfg)
    dataset, texts, questions = collection.name, collection.texts, collection.questions
    if cfg.mode == "release":
        return release_and_answer(ctx, collection)
    encoder = str(ctx.run.root / "encoder")
    check_encoder(encoder)  # trained on the DP synthetic release: its provenance says so
    check_delta(cfg.delta, len(texts), "rag.delta")
    check_delta(cfg.delta_cap, len(texts), "rag.delta_cap")
    tenant = ctx.config.privacy.tenant
    ledger = PrivacyLedger(ctx.run.ledger)
    _check_accounting_unchanged(ledger, dataset, cfg.individual)
    done_path = ctx.run.root / "rag" / "answers.json"
    answers = _answered(done_path, questions)
    done = len(answers)
    scope = Scope(tenant, dataset, cfg.epsilon_cap, cfg.delta_cap)
    _check_answers_fit(ledger, scope, plan, len(questions) - done)
    _admit(ledger, collection, scope, plan, cfg, room=done < len(questions))
    filters = DocumentFilters(ledger.store)
    stated = [(cfg.epsilon, cfg.delta, "per answer")]
    if cfg.individual:
        stated.append((cfg.document_epsilon, cfg.document_delta, "per document"))
    else:
        stated.append((cfg.epsilon_cap, cfg.delta_cap, "scope cap"))
    _tell(ctx, ledger, dataset, stated, len(texts))
    if done < len(questions):  # a finished stage resumed loads no model
        rag = _load_rag(ctx, collection, encoder, ledger, rag_config)
        if not cfg.individual:  # the one event of every answer
            pin_answer_event(ledger, dataset, plan, restore=RESTORE_RAG)
        _answer_the_rest(ctx, rag, mechanism, questions, answers, done_path)
    spend = ledger.spent(tenant, dataset)
    summary = {
        "enabled": True,
        "dataset": dataset,
        "lm": cfg.lm,
        "mechanism": mechanism,
        "accounting": cfg.accounting,
        "records": len(texts),
        "questions": len(answers),
        "epsilon_per_answer": cfg.epsilon,
        "correct": _count_correct(answers),
        "abstained": sum(a.get("abstained", False) for a in answers),
        "collection_epsilon_spent": spend.epsilon,
        "answers": answers,
    }
    if cfg.individual:
        record = filters.get(dataset)
        # the filters' summary (exhausted records, epsilons spent) is not DP: it stays in
        # the run's ledger for the operator (`synthgen ledger documents`), not in metrics
        ctx.log(
            "rag",
            f"per record: target epsilon={record.budget.epsilon:g} delta={record.budget.delta:g}",
        )
        del summary["collection_epsilon_spent"]  # no collection cap: the tenant's quota
        summary.update(
            quota_epsilon_spent=spend.epsilon,
            document_target={
                "epsilon": record.budget.epsilon,
                "delta": record.budget.delta,
                "relevance_threshold": cfg.relevance_threshold,
                "answers_per_document": record.answers_per_document,
            },
        )
    return summary


def _load_rag(ctx: StageContext, collection, encoder: str, ledger, rag_config):
    """The stage's `DPRag`: the run's encoder towers, the records' embeddings, `rag.lm`
    (an asset or path, or ``"tiny"``, the byte-level test model, as the other commands)."""
    from retriever.evaluate import load_towers
    from retriever.network.local import load_answer_lm
    from retriever.rag import DPRag

    cfg = ctx.config.rag
    question_encoder, doc_encoder = load_towers(encoder)
    embeddings = doc_encoder.encode(collection.texts, max_len=128, progress=ctx.progress)
    ctx.log(
        "rag",
        f"loading {cfg.lm}; {len(collection.texts)} private records, "
        f"{len(collection.questions)} questions",
    )
    lm, prompt = load_answer_lm(cfg.lm)
    return DPRag(
        collection.doc_ids,
        collection.texts,
        embeddings,
        lambda qs: question_encoder.encode(qs, max_len=64),
        lm,
        payer=collection_payer(ledger, collection.name),
        config=rag_config,
        prompt=prompt,
    )


def _answer_the_rest(
    ctx: StageContext, rag, mechanism: str, questions: list, answers: list, done_path
) -> None:
    """Answers the questions after `answers` (those already written), each charged by `rag`
    first and written as soon as it is released: an interrupted stage resumes after the
    last written answer instead of paying for it again."""
    cfg, tenant = ctx.config.rag, ctx.config.privacy.tenant
    done_path.parent.mkdir(parents=True, exist_ok=True)
    for number, (question, expected) in enumerate(questions, start=1):
        if number <= len(answers):
            continue
        answer = rag.answer(question, tenant=tenant, epsilon=cfg.epsilon, mechanism=mechanism)
        ctx.log(
            "rag", f"question {number}/{len(questions)}: epsilon={format_epsilon(answer.epsilon)}"
        )
        spent = {"epsilon": answer.epsilon, "delta": answer.delta, "mechanism": answer.mechanism}
        answers.append(_answer_row(question, expected, answer.text, answer.abstained, spent))
        tmp = done_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(answers, indent=1, ensure_ascii=False))
        tmp.replace(done_path)
