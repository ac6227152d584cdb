"""`retriever knowledge release|preview|audit|answer`: release a collection once, then answer
for free.

Thin wrappers over `retriever.network.knowledge.build_knowledge` (the one-time DP release,
`synthgen.knowledge`) and `retriever.knowledge_base.KnowledgeBase` (ordinary RAG over the
release, nothing charged).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer

from dpsynth.cli.retriever.options import (
    FactCorpusOption,
    GuaranteesAddUpOption,
    MaxPairsOption,
    QuestionOption,
    ReleaseDatasetOption,
    ReleaseOutOption,
)
from dpsynth.cli.shared import admit_run, group_app
from synthgen.command_line import (
    LedgerOption,
    choice,
    positive,
    probability,
    refusals,
    usage_errors,
)

AUDIT_TENANT, AUDIT_STAGE = "audit", "knowledge-audit"  # where `knowledge audit` is charged
AuditBudgetOption = Annotated[
    float | None,
    typer.Option(
        help="epsilon cap of the collection's audit scope if new (default: this audit's "
        "epsilon, i.e. one audit)",
        callback=positive,
    ),
]
# The fact release's settings, as `preview` and `audit` take them (`release` has its own help).
ReleaseDelta = Annotated[float, typer.Option(help="the release's delta", callback=probability)]
ReleaseK = Annotated[
    int, typer.Option(help="the release's K (facts per record)", callback=positive)
]
ReleaseExtractor = Annotated[str, typer.Option(help="the release's extractor: typed or phrases")]

# `release`'s own options
ReleaseEpsilonOption = Annotated[
    float, typer.Option(help="per-record epsilon of the whole release", callback=positive)
]
WholeReleaseDelta = Annotated[
    float, typer.Option(help="delta of the whole release (< 1/n)", callback=probability)
]
DryRunOption = Annotated[
    bool,
    typer.Option(
        "--dry-run",
        help="print how many records a fact needs at this epsilon, delta and n; "
        "read and charge nothing else",
    ),
]
ExtractorOption = Annotated[
    str,
    typer.Option(
        help="typed (subject and typed value: IP addresses, versions, time windows, "
        "teams, names...) or phrases (pairs of key phrases, the release before issue 69)"
    ),
]
BackendOption = Annotated[
    str,
    choice(
        "local",
        "beam",
        help="where extraction and selection run: local, or Apache Beam's "
        "DirectRunner (pip install 'dpsynth[beam]')",
    ),
]
WorkOption = Annotated[
    Path | None, typer.Option(help="private work folder (default: beside the ledger)")
]
EncoderOption = Annotated[
    str, typer.Option(help="public encoder of the index over the released records")
]

knowledge_app = group_app(
    "Release a private collection's facts once (DP set union); answer from them for free."
)


@knowledge_app.command("release")
def release(
    private_corpus: FactCorpusOption,
    out: ReleaseOutOption,
    epsilon: ReleaseEpsilonOption,
    delta: WholeReleaseDelta = 1e-6,
    dry_run: DryRunOption = False,
    max_pairs: MaxPairsOption = 1,
    extractor: ExtractorOption = "typed",
    backend: BackendOption = "local",
    ledger: LedgerOption = None,
    dataset: ReleaseDatasetOption = None,
    guarantees_add_up: GuaranteesAddUpOption = False,
    work: WorkOption = None,
    encoder: EncoderOption = "all-minilm-l6-v2",
    as_json: Annotated[bool, typer.Option("--json", help="print the guarantee as JSON")] = False,
) -> None:
    """Release the collection's facts once; answer from them for free after.

    Each record's facts (typed: a subject and its typed value; or pairs of key phrases, by a
    public rule); the facts many records state are released (PipelineDP partition
    selection) and written as one record per subject. One charge on the ledger (tenant
    "release", the collection) before any noise; a second release of the same collection
    from the same ledger is refused. A release that could carry nothing is refused before
    the charge, with the records a fact would need. (The cluster release, --mode clusters,
    was retired: see the knowledge guide.)
    """
    from retriever.data import read_corpus
    from retriever.network.knowledge import build_knowledge, summary
    from synthgen.knowledge import plan_facts

    config = _fact_config(epsilon, delta, max_pairs, extractor, backend)
    _, texts = read_corpus(private_corpus)
    plan = plan_facts(config, len(texts))
    if dry_run:
        _print_plan(plan, as_json)
        return
    problems = plan.problems()
    if problems:
        print(f"error: refused before any charge: {'; '.join(problems)}", file=sys.stderr)
        raise typer.Exit(2)
    result = build_knowledge(
        private_corpus,
        out,
        config,
        contributor=dataset or private_corpus.stem,
        work=work,
        ledger=ledger,
        dataset=dataset,
        encoder=encoder,
        answer_index=False,
        guarantees_add_up=guarantees_add_up,
    )
    _print_release(json.loads(summary(result)), as_json)


def _print_release(line: dict, as_json: bool) -> None:
    """The release's summary line (`retriever.network.knowledge.summary`), as JSON or in
    words (with a warning on stderr when it released nothing)."""
    if as_json:
        print(json.dumps(line))
        return
    if line.get("empty"):
        print(f"warning: {line['warning']}", file=sys.stderr)
    print(
        f"released {line['synthetic_records']} synthetic records from {line['pairs']} fact "
        f"pairs to {line['out']}: ({line['epsilon']:.4g}, {line['delta']:.3g})-DP per record"
    )


@knowledge_app.command("preview")
def preview(
    private_corpus: FactCorpusOption,
    epsilon: Annotated[
        float, typer.Option(help="the release's epsilon you plan", callback=positive)
    ] = 10.0,
    delta: ReleaseDelta = 1e-6,
    max_pairs: ReleaseK = 1,
    extractor: ReleaseExtractor = "typed",
    top: Annotated[int, typer.Option(help="facts listed, most stated first")] = 30,
    as_json: Annotated[bool, typer.Option("--json", help="print the preview as JSON")] = False,
) -> None:
    """Preview what a fact release would read from your records: NOT DP, for your eyes only.

    Runs the release's public rule over your private records as the release would, and
    prints exact counts: the records that yield a fact, the kinds of value read, the facts
    most records state, and how many facts a release at --epsilon would carry. Nothing is
    charged, written or released; do not share the output (it is your data's own counts).
    Settings chosen by looking at it are chosen on private data, outside the card's
    guarantee: preview a sample you will not release (a held-out part, an older export).
    """
    from retriever.data import read_corpus
    from synthgen.knowledge.preview import preview_facts

    config = _fact_config(epsilon, delta, max_pairs, extractor)
    _, texts = read_corpus(private_corpus)
    with refusals(ValueError):
        found = preview_facts(texts, config)
    print(
        "warning: operator preview, NOT DP: exact counts of your private records, for your "
        "eyes only; nothing is charged or released, and settings chosen from it are outside "
        "the release's guarantee (preview a sample you will not release)",
        file=sys.stderr,
    )
    if as_json:
        print(json.dumps(found.to_dict(top)))
        return
    print(
        f"{found.records_with_facts} of {found.records} records yield a fact "
        f"({extractor}, K={max_pairs}); {len(found.facts)} distinct facts"
    )
    if found.kinds:
        print("kinds read: " + ", ".join(f"{k} {n}" for k, n in found.kinds.items()))
    print(
        f"at epsilon={epsilon:g}, delta={delta:g} a fact needs about {found.records_needed} "
        f"records: {found.likely_released} facts would likely be released "
        f"({found.expected_released:.1f} expected)"
    )
    for key, n in found.facts[:top]:
        print(f"  {n:>6d}  {key}")


@knowledge_app.command("baseline")
def baseline(
    private_corpus: FactCorpusOption,
    questions: Annotated[
        Path, typer.Option(help='questions JSONL: {"question", "answer" (optional)} per line')
    ],
    max_pairs: ReleaseK = 1,
    k: Annotated[int, typer.Option(help="records the retrieval ceiling reads")] = 4,
    as_json: Annotated[bool, typer.Option("--json", help="print the summary as JSON")] = False,
) -> None:
    """The non-private ceilings on your collection: NOT DP, for your eyes only.

    For each question: whether the BM25 top-k records hold the expected answer, and the
    typed fact release's reader on exact counts (no noise, no threshold). A question it
    cannot answer, no release can. Nothing is charged, written or released.
    """
    from retriever.data import read_corpus
    from retriever.fact_baseline import fact_baseline
    from synthgen.corpora import read_jsonl

    _, texts = read_corpus(private_corpus)
    rows = read_jsonl(questions, required=("question",))
    with refusals(ValueError):
        found = fact_baseline(
            texts,
            [str(r["question"]) for r in rows],
            [r.get("answer") or None for r in rows],
            max_pairs=max_pairs,
            k=k,
        )
    print(
        "warning: non-private baseline, NOT DP: exact counts and texts of your private "
        "records, for your eyes only; nothing is charged or released",
        file=sys.stderr,
    )
    summary = found.summary()
    if as_json:
        print(json.dumps(summary))
        return
    for row in found.rows:
        right = "" if row.typed_right is None else (" (right)" if row.typed_right else " (wrong)")
        hit = "" if row.retrieval_hit is None else f"; top-{k} holds it: {row.retrieval_hit}"
        print(f"{row.question} -> {row.typed_answer or 'abstains'}{right}{hit}")
    print(json.dumps(summary))


def _audit_payer(ledger, dataset, texts, config, budget, guarantees_add_up, collection):
    """Admits the audit's release of `texts` (tenant "audit", stage "knowledge-audit": the
    records bound, the scope opened, the charge dry-run) and returns its payer. A release of
    the planted `collection` that should not run is refused first: the ledger is untouched."""
    from synthgen.knowledge import plan_facts
    from synthgen.privacy.receipts import ledger_payer

    problems = collection.problems(config)
    if problems:
        raise ValueError(f"refused before any charge: {'; '.join(problems)}")
    scope = (AUDIT_TENANT, dataset)
    book = admit_run(
        ledger, scope, texts, plan_facts(config, len(texts)), stage=AUDIT_STAGE,
        public_count=len(texts), budget=budget, guarantees_add_up=guarantees_add_up,
    )  # fmt: skip
    return ledger_payer(book, scope, stage=AUDIT_STAGE)


@knowledge_app.command("audit")
def audit(
    private_corpus: FactCorpusOption,
    epsilon: Annotated[
        float, typer.Option(help="the release's epsilon: the claim audited", callback=positive)
    ],
    delta: ReleaseDelta = 1e-6,
    max_pairs: ReleaseK = 1,
    extractor: ReleaseExtractor = "typed",
    canaries: Annotated[
        int, typer.Option(help="canary records planted, each with probability 1/2")
    ] = 500,
    seed: Annotated[int | None, typer.Option(help="the canaries and coins (public)")] = None,
    ledger: LedgerOption = None,
    dataset: ReleaseDatasetOption = None,
    budget: AuditBudgetOption = None,
    guarantees_add_up: GuaranteesAddUpOption = False,
    as_json: Annotated[bool, typer.Option("--json", help="print the result as JSON")] = False,
) -> None:
    """Audit a fact release of your own collection: plant canaries, release once, bound epsilon.

    Each canary is a record stating a fact about invented names, included with probability
    1/2; the release runs once with your settings, each canary is scored on what was
    released, and jax-privacy's one-run auditor gives a lower bound on epsilon at 95%. A
    bound above --epsilon, or included canaries released more often than the card's
    single-record probability allows, is a leak (exit code 1; a refusal exits 2);
    "inconclusive" when no run with this many canaries could bound above the claim. The
    audit is itself a release of the collection at the same (epsilon, delta), charged once
    to the ledger (tenant "audit", the collection) before any noise; nothing of it is
    written but this summary.
    """
    from retriever.data import read_corpus
    from synthgen.audit.fact_release import audit_planted, plant
    from synthgen.privacy.errors import BudgetExceededError

    _, texts = read_corpus(private_corpus)
    config = _fact_config(epsilon, delta, max_pairs, extractor)
    with refusals(ValueError, BudgetExceededError):  # exit 2 for every refusal: 1 is a leak
        collection = plant(texts, config, canaries=canaries, seed=seed)
        pay = _audit_payer(
            ledger, dataset or private_corpus.stem, texts, config, budget, guarantees_add_up,
            collection,
        )  # fmt: skip
        result = audit_planted(collection, config, pay=pay)
    _print_audit(result, as_json)
    if result.leak:
        raise typer.Exit(1)


def _print_audit(result, as_json: bool) -> None:
    """The audit's result (`synthgen.audit.fact_release.AuditResult`), as JSON or in words."""
    import dataclasses

    if as_json:
        line = {**dataclasses.asdict(result), "leak": result.leak, "verdict": result.verdict}
        print(json.dumps(line))
        return
    print(
        f"{result.canaries} canaries ({result.included} included): released "
        f"{result.included_released} included, {result.excluded_released} excluded; "
        f"epsilon lower bound {result.epsilon_lower_bound:.3g} (f-DP "
        f"{result.epsilon_lower_bound_fdp:.3g}) at 95% against the claim "
        f"{result.claimed_epsilon:g}, at most {result.epsilon_cap:.3g} with this many "
        f"canaries; the card's single-record check p = {result.card_check_p:.3g}: "
        f"{_shout_verdict(result.verdict)}"
    )
    if result.verdict == "inconclusive":
        print(
            "  the bounds cannot exceed the claim with this many canaries (--canaries "
            "raises the cap); the card check found nothing",
            file=sys.stderr,
        )


def _print_plan(plan, as_json: bool) -> None:
    """The dry run: what a fact release at these public figures can carry."""
    c = plan.config
    summary = {
        "records": plan.num_records,
        "epsilon": c.epsilon,
        "delta": c.delta,
        "max_pairs": c.max_pairs,
        "extractor": c.extractor,
        "threshold": plan.threshold,
        "records_needed_50": plan.records_needed(0.5),
        "records_needed_90": plan.records_needed(0.9),
        "singleton_release_probability": plan.singleton_probability,
        "release_probability": plan.table(),
        "problems": plan.problems(),
    }
    if as_json:
        print(json.dumps(summary))
        return
    print(
        f"{plan.num_records} records, epsilon={c.epsilon:g}, delta={c.delta:g}, "
        f"K={c.max_pairs} {c.extractor} facts per record: threshold {plan.threshold:.1f}"
    )
    print("records stating a fact -> probability it is released")
    for row in plan.table():
        print(f"  {row['records']:>5d} -> {row['released']:.3f}")
    print(
        f"a fact needs {summary['records_needed_50']} records (50%), "
        f"{summary['records_needed_90']} (90%); one record's fact: at most "
        f"{plan.singleton_probability:.2g}"
    )
    for problem in summary["problems"]:
        print(f"refused: {problem}")


@knowledge_app.command("answer")
def answer(
    knowledge: Annotated[Path, typer.Option(help="a release folder (knowledge release)")],
    question: QuestionOption,
    lm: Annotated[str, typer.Option(help="public LM asset or path; 'tiny': the test LM")] = (
        "smollm2-135m-instruct"
    ),
    k: Annotated[
        int, typer.Option(help="synthetic records read per answer (SmolLM2-135M: 1 is best)")
    ] = 1,
    retrieval: Annotated[
        str,
        choice(
            "bm25", "dense", help="the records' words (BM25) or the release's index encoder (dense)"
        ),
    ] = "bm25",
    as_json: Annotated[bool, typer.Option("--json", help="print the answer as JSON")] = False,
) -> None:
    """Answer a question from a release: ordinary RAG, nothing charged."""
    from retriever.knowledge_base import RETRIEVALS, KnowledgeBase

    if retrieval not in RETRIEVALS:
        raise typer.BadParameter(f"--retrieval must be one of {', '.join(RETRIEVALS)}")
    base = KnowledgeBase.open(knowledge, lm=lm, k=k, retrieval=retrieval)
    result = base.answer(question).to_dict()
    if as_json:
        print(json.dumps(result))
        return
    print(result["answer"])
    print(f"(charged nothing: {result['statement']})", file=sys.stderr)


def _shout_verdict(verdict: str) -> str:
    """The verdict's keyword in capitals, its explanation as written."""
    for keyword in ("no leak found", "inconclusive", "leak"):
        if verdict.startswith(keyword):
            return keyword.upper() + verdict[len(keyword) :]
    return verdict


def _fact_config(
    epsilon: float, delta: float, max_pairs: int, extractor: str, backend: str = "local"
):
    """The fact release's config, or one clear error naming the bad option."""
    from synthgen.knowledge import FactConfig

    with usage_errors(ValueError):
        return FactConfig(epsilon, delta, max_pairs, extractor=extractor, backend=backend)
