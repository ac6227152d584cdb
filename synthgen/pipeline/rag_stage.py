"""The main job's DP-RAG stage: a few questions answered over a private collection.

Privacy:
  Privacy unit: one record of the private collection (add/remove-one). Every answer is
  (epsilon, delta)-DP (`retriever.rag.DPRag`: DP retrieval threshold, DP token aggregation;
  Grislain 2024, Koga et al. 2024), charged to the run's ledger before any noise is drawn;
  the collection's scope caps the total. The questions are public (generated from the
  fictional world's disease descriptions), the answers are releases. The sensitivity
  assumes an encoder that does not depend on the collection: the run's encoder is trained
  on the generate stage's DP synthetic release (checked from its provenance.json, as
  `retriever answer` does), and δ and the scope's δ cap are below 1/n for n records.

  Individual accounting (``rag.accounting = "individual"``, icl only): each record has its
  own (document_epsilon, document_delta) filter in the ledger over all answers of all
  tenants (individual Rényi filter, Feldman & Zrnic 2021); an answer charges only the
  records that score at least the public ``rag.relevance_threshold`` and that their filter
  still admits, and the tenant's scope becomes a quota. A run folder keeps the accounting
  it started with: switching would leave answers out of the statement.
"""

from __future__ import annotations

import json

from synthgen.pipeline.context import StageContext, open_run_scope
from synthgen.privacy.receipts import collection_payer

RAG_DATASET = "medical-records"


def _check_accounting_unchanged(ledger, individual: bool) -> None:
    """Refuses to switch the accounting of the run's collection: per-document filters
    opened after collection-accounting answers would not count them, and collection
    answers on a collection with filters would charge no record."""
    from synthgen.privacy.document_filters import DocumentFilters

    has_filters = DocumentFilters(ledger.store).get(RAG_DATASET) is not None
    charged = any(
        ledger.charges(scope.tenant, scope.dataset)
        for scope in ledger.scopes()
        if scope.dataset == RAG_DATASET
    )
    if individual and not has_filters and charged:
        raise ValueError(
            f"the run's ledger already charged {RAG_DATASET} under collection accounting; "
            "per-document filters would not count those answers: restore "
            "rag.accounting='collection' or start a new run folder (--out)"
        )
    if not individual and has_filters:
        raise ValueError(
            f"the run's ledger holds per-document filters for {RAG_DATASET} (individual "
            "accounting): restore rag.accounting='individual' or start a new run folder (--out)"
        )


def _tell(ctx: StageContext, ledger, stated, records: int) -> None:
    """Logs which ledger holds the collection's charges, and a warning for each weak
    guarantee among `stated` ((epsilon, delta, what) over `records` records)."""
    from synthgen.privacy.notices import guarantee_lines, ledger_lines

    lines = ledger_lines(ledger, RAG_DATASET, option=None)
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


def release_and_answer(ctx: StageContext, world, questions) -> dict:
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
    from retriever.rag.medical import answer_is_correct
    from retriever.typed_answers import TypedFactAnswerer
    from synthgen.knowledge.facts import FactConfig, release_facts
    from synthgen.privacy.ledger import PrivacyLedger
    from synthgen.privacy.ledger_types import Scope
    from synthgen.privacy.receipts import ledger_payer

    cfg = ctx.config.rag
    work = ctx.run.private / "knowledge"
    _check_no_cluster_release(work)
    ledger = PrivacyLedger(ctx.run.ledger)
    open_run_scope(ledger, Scope("release", RAG_DATASET, cfg.release_epsilon, cfg.delta_cap))
    _tell(ctx, ledger, [(cfg.release_epsilon, cfg.delta_cap, None)], len(world.records))
    config = FactConfig(
        cfg.release_epsilon, cfg.delta_cap, max_pairs=RELEASE_MAX_PAIRS,
        extractor=RELEASE_EXTRACTOR,
    )  # fmt: skip
    texts = [r.text for r in world.records]
    ctx.log("rag", f"releasing the facts of {len(texts)} private records once")
    pay = ledger_payer(ledger, ("release", RAG_DATASET), stage="knowledge-release")
    release = release_facts(texts, config, work=work, pay=pay)
    out = ctx.run.root / "rag"
    out.mkdir(parents=True, exist_ok=True)
    (out / "release.jsonl").write_text("".join(json.dumps(r) + "\n" for r in release.records))
    ctx.log("rag", f"released {len(release.records)} synthetic records at eps={config.epsilon:.3g}")
    answerer = TypedFactAnswerer(release.records, release.plan.noise_stddev)
    answers = []
    for q in questions:
        found = answerer.answer(q.question)
        answers.append(
            {
                "question": q.question,
                "expected": q.answer,
                "answer": found.answer,
                "abstained": found.abstained,
                "correct": not found.abstained and answer_is_correct(found.answer, q.answer),
                "epsilon": 0.0,
                "delta": 0.0,
                "mechanism": "release",
            }
        )
    (out / "answers.json").write_text(json.dumps(answers, indent=1, ensure_ascii=False))
    return {
        "enabled": True,
        "mode": "release",
        "lm": None,  # answered from the release's counts: no LM reads or writes
        "mechanism": f"release (DP fact release: {RELEASE_EXTRACTOR}, K = {RELEASE_MAX_PAIRS})",
        "accounting": "release",
        "records": len(texts),
        "synthetic_records": len(release.records),
        "questions": len(answers),
        "epsilon_per_answer": 0.0,
        "release_epsilon": config.epsilon,
        "release_delta": config.delta,
        "correct": sum(a["correct"] for a in answers),
        "abstained": sum(a["abstained"] for a in answers),
        "collection_epsilon_spent": ledger.spent("release", RAG_DATASET).epsilon,
        "answers": answers,
    }


def answer_questions(ctx: StageContext) -> dict:
    """Answers `rag.questions` questions at `rag.epsilon` each; writes `rag/answers.json`.

    In individual accounting the collection's per-document filters are opened (or checked,
    on a resumed run) before the tenant's scope, and the summary records the per-document
    target and the filters' aggregate summary (never a record's own figure).
    """
    from retriever.evaluate import load_towers
    from retriever.rag import DPRag, RagConfig
    from retriever.rag.answer import plan_answer
    from retriever.rag.collection import check_delta, check_encoder, open_document_filters
    from retriever.rag.defaults import resolve
    from retriever.rag.medical import MedicalWorldConfig, answer_is_correct, make_world
    from synthgen.lm_backends import FlaxLM
    from synthgen.privacy.document_filters import DocumentFilters
    from synthgen.privacy.ledger import PrivacyLedger
    from synthgen.privacy.ledger_types import Scope

    cfg = ctx.config.rag
    if not cfg.enabled:
        return {"enabled": False}
    # k: the config's (small worlds); the trained encoder scores: dense retrieval
    mechanism, _ = resolve(cfg.mechanism, cfg.k, cfg.epsilon, accounting=cfg.accounting)
    world = make_world(
        MedicalWorldConfig(
            num_diseases=cfg.num_diseases,
            symptom_pool=max(60, 2 * cfg.num_diseases + 2),
            num_records=cfg.num_records,
            seed=cfg.world_seed,
        )
    )
    # The first questions in the world's (public) disease order: choosing by how many records
    # a disease has would branch on the private collection.
    questions = world.questions()[: cfg.questions]
    if cfg.mode == "release":
        return release_and_answer(ctx, world, questions)
    encoder = str(ctx.run.root / "encoder")
    check_encoder(encoder)  # trained on the DP synthetic release: its provenance says so
    check_delta(cfg.delta, len(world.records), "rag.delta")
    check_delta(cfg.delta_cap, len(world.records), "rag.delta_cap")
    rag_config = RagConfig(
        k=cfg.k,
        max_tokens=cfg.max_tokens,
        delta=cfg.delta,
        accounting=cfg.accounting,
        relevance_threshold=cfg.relevance_threshold,
    )
    tenant = ctx.config.privacy.tenant
    ledger = PrivacyLedger(ctx.run.ledger)
    _check_accounting_unchanged(ledger, cfg.individual)
    filters = DocumentFilters(ledger.store)
    if cfg.individual:
        check_delta(cfg.document_delta, len(world.records), "rag.document_delta")
        # the same settings again (a resumed run) are a no-op; others are refused
        open_document_filters(
            ledger,
            RAG_DATASET,
            documents=len(world.records),
            epsilon=cfg.document_epsilon,
            delta=cfg.document_delta,
            plan=plan_answer(rag_config, mechanism, cfg.epsilon),
        )
    open_run_scope(ledger, Scope(tenant, RAG_DATASET, cfg.epsilon_cap, cfg.delta_cap))
    stated = [(cfg.epsilon, cfg.delta, "per answer")]
    if cfg.individual:
        stated.append((cfg.document_epsilon, cfg.document_delta, "per document"))
    else:
        stated.append((cfg.epsilon_cap, cfg.delta_cap, "scope cap"))
    _tell(ctx, ledger, stated, len(world.records))
    question_encoder, doc_encoder = load_towers(encoder)
    texts = [r.text for r in world.records]
    embeddings = doc_encoder.encode(texts, max_len=128, progress=ctx.progress)
    ctx.log("rag", f"loading {cfg.lm}; {len(texts)} private records, {len(questions)} questions")
    rag = DPRag(
        [r.doc_id for r in world.records],
        texts,
        embeddings,
        lambda qs: question_encoder.encode(qs, max_len=64),
        FlaxLM.load(cfg.lm),
        payer=collection_payer(ledger, RAG_DATASET),
        config=rag_config,
    )
    out = ctx.run.root / "rag"
    out.mkdir(parents=True, exist_ok=True)
    done_path = out / "answers.json"
    # Each answer is written as soon as it is released: an interrupted stage resumes after
    # the last written answer instead of paying for it again.
    answers = json.loads(done_path.read_text()) if done_path.is_file() else []
    for number, question in enumerate(questions, start=1):
        if number <= len(answers):
            continue
        answer = rag.answer(
            question.question, tenant=tenant, epsilon=cfg.epsilon, mechanism=mechanism
        )
        correct = answer_is_correct(answer.text, question.answer)
        ctx.log("rag", f"question {number}/{len(questions)}: epsilon={answer.epsilon:.3g}")
        answers.append(
            {
                "question": question.question,
                "expected": question.answer,
                "answer": answer.text,
                "abstained": answer.abstained,
                "correct": correct,
                "epsilon": answer.epsilon,
                "delta": answer.delta,
                "mechanism": answer.mechanism,
            }
        )
        tmp = done_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(answers, indent=1, ensure_ascii=False))
        tmp.replace(done_path)
    spend = ledger.spent(tenant, RAG_DATASET)
    summary = {
        "enabled": True,
        "lm": cfg.lm,
        "mechanism": mechanism,
        "accounting": cfg.accounting,
        "records": len(texts),
        "questions": len(answers),
        "epsilon_per_answer": cfg.epsilon,
        "correct": sum(a["correct"] for a in answers),
        "abstained": sum(a.get("abstained", False) for a in answers),
        "collection_epsilon_spent": spend.epsilon,
        "answers": answers,
    }
    if cfg.individual:
        record = filters.get(RAG_DATASET)
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
