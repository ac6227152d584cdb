"""One-run canary audit of the DP-RAG answer stage: a lower bound on its epsilon.

The query-generator power audits (`synthgen.audit.whitebox`, `synthgen.audit.blackbox`) with
the same design, for DP-RAG answers:

  1. m canaries (default 1,000) are made by `retriever.rag.canary_audit.make_rag_canaries`
     over the public base documents: ``"The access code of <key words> is <secret>."``,
     asked about as ``"What is the access code of <key words>?"``. The secret is the first
     `digits` digits of the canary's uniformly random 10-digit secret (`digits` is a public
     parameter: fewer digits, fewer answer tokens, faster cells).
  2. Each canary is included in the collection with probability 1/2 (a fair coin drawn
     from its own stream, `synthgen.audit.coins.draw_coins`); the collection is the base
     documents plus the included canaries.
  3. Every canary, in or out, is asked about exactly once, in a random order drawn from the
     canary-material stream (independent of the coins).
  4. Canary i's score is `prefix_digits(secret_i, answer_i)`: the longest prefix of its
     secret found in its own released answer (higher = "in"), a function of the canary and
     its one answer only.
  5. `synthgen.audit.whitebox.score_stats` (jax-privacy's `CanaryScoreAuditor`) gives the
     AUROC, the TPR at 1% FPR and the one-run epsilon lower bounds of the epsilon-count
     analysis (Steinke, Nasr & Jagielski 2023) and of the f-DP analysis (Mahloujifar et al.
     2024), at 95% by default; `statistical_cap` the most any attack on the same in/out
     counts can certify. A bound above the claim is a privacy defect (`violation`).

The claim: per record, for the whole run. A canary is one document of the collection
(add/remove-one). The DP cells answer under individual (per-document) accounting
(`retriever.rag.individual`, Feldman & Zrnic 2021): every document of the collection,
canaries included, has a Rényi filter whose target is exactly the claimed (epsilon, delta),
delta = `DELTA` (1e-6, the project's per-document delta) by default. The filter turns the
target into a zCDP cap rho_cap (`synthgen.privacy.individual.DocumentBudget`); a document
pays an answer's rho when it is active and scores at least the public relevance threshold
tau, and is left out of every answer it can no longer pay. By the filter theorem each
record's loss over ALL m answers, however adaptive, is at most rho_cap-zCDP, hence
(epsilon, delta)-DP by the RDP conversion (the filter's `target_epsilon`); the
Steinke et al. / Mahloujifar et al. theorems need exactly this, DP w.r.t. each canary's
inclusion. The per-answer epsilon (`answer_epsilon`) is the largest whose icl rho
(`AnswerPlan.document_rho`) fits `answers_per_record` times in rho_cap: with the default 1 a
canary spends its whole budget on the first answer it is relevant to (its own question,
unless another question scores it above tau first; the share of canary documents some
other canary's question reaches is `cross_relevant`, a property of the public canary
material, independent of the coins). Retrieval is the public threshold, so nothing else is
charged. With `answers_per_record` = 1 a record pays at most once, so its loss is also one
answer's: its icl tokens composed as bounded-range at delta (`record_epsilon`; 6.06 at a
target of 8). `claimed_epsilon` is the smaller of the two, the tightest the code
guarantees, so a bound between them counts as the violation it would be.

epsilon = inf is NOT the DP path with its noise removed: it is the non-private RAG
baseline (the top k documents by exact similarity in one prompt, greedy decoding; no tau,
no filters). It shows that the canaries and the score can see a leak when answers carry
the secret; the tests switch the DP path's noise off to show the same for the DP path.

What to expect. One document moves each icl token's probability by at most a factor
e^(token epsilon) over the whole vocabulary, with a base measure (the public prompt's
distribution) that does not favour the secret's digits, so a DP cell's bound is expected
far below its claim. The tests plant a leak (the mechanisms' noise switched off, and the
greedy baseline) to show that the same pipeline (public tau, filters, rows, score) reaches
the statistical cap when the answers do carry the secret.

Privacy:
  The canaries are the audit's own synthetic records; the base documents stand in for the
  private collection. The result (`RagPowerResult`) holds aggregates only: counts, rates,
  areas, epsilons, rho, seconds, and the 40-bin histograms / 101-point ROC of
  `score_stats`. The canaries (keys, secrets), the coins, the order, the answers and the
  per-canary scores stay in memory, and in a private work folder (mode 0700, file mode
  0600) when `work_dir` is given, never in the results folder. The cells' ledgers (which
  document paid for what, which reveals the coins) live in a temporary folder deleted on
  return. The epsilon = inf cell is NOT private.

References:
  Steinke, Nasr, Jagielski 2023, "Privacy Auditing with One (1) Training Run" (NeurIPS),
  arXiv:2305.08846. Mahloujifar, Melis, Chaudhuri 2024, "Auditing f-Differential Privacy in
  One Run", arXiv:2410.22235. Feldman & Zrnic 2021, "Individual Privacy Accounting via a
  Rényi Filter" (NeurIPS). Carlini et al. 2019 (digit-secret canaries). Grislain 2024 (the
  icl aggregation audited here).
"""

from __future__ import annotations

import dataclasses
import json
import math
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from retriever.rag.accounting import bounded_range_epsilon
from retriever.rag.canary_audit import (
    CANARY_PROMPT,
    CanaryCollection,
    RagCanary,
    make_rag_canaries,
    prefix_digits,
)
from retriever.rag.collection import open_document_filters
from retriever.rag.config import RagConfig, plan_answer
from retriever.rag.prompts import PromptFormat
from synthgen.audit.canaries import DIGITS
from synthgen.audit.cells import resumable_cells, settings_of
from synthgen.audit.claims import epsilon_tag
from synthgen.audit.coins import draw_coins, streams
from synthgen.audit.whitebox import CellResult, canary_figures, markdown_table
from synthgen.privacy import PrivacyLedger, Scope, calibration
from synthgen.privacy.individual import DocumentBudget
from synthgen.work_folder import private_folder, write_private

OBSERVABLE = "secret_prefix_digits"
DELTA = 1e-6  # the project's per-document delta (RagConfig.delta, --document-delta)
TENANT = "power-audit"
DATASET = "power-canaries"
MECHANISM = "icl"  # the one mechanism with a zCDP curve (individual accounting)
# Public cell settings, chosen for all-MiniLM-L6-v2 on 1,000 canaries (material seed 0)
# keyed by 4 words of a 200-record medical world (`dpsynth.evaluation.medical_world`, 128 words): a
# question's own canary scores >= 0.82 for 99.9% of the questions, another canary's question
# reaches 3.4% of the canary documents (3 key words: 99.8% and 9.1%); with SmolLM2-135M the
# canary documents are at most 33 tokens.
DIGITS_DEFAULT = 4
KEY_WORDS = 4
RELEVANCE = 0.82


def power_config(
    digits: int = DIGITS_DEFAULT,
    *,
    k: int = 1,
    relevance_threshold: float = RELEVANCE,
    max_document_tokens: int = 40,
) -> RagConfig:
    """The answer stage of a power cell: individual accounting, icl, digits + 1 tokens.

    One token for the space after the answer prefix, then one per digit (SmolLM2's tokenizer
    splits digits). Scores are cosine similarities on `ScoreRange(0, 1)`, so tau is a cosine.
    """
    return RagConfig(
        k=k,
        max_tokens=digits + 1,
        accounting="individual",
        relevance_threshold=relevance_threshold,
        max_document_tokens=max_document_tokens,
    )


@dataclasses.dataclass(frozen=True)
class RagPowerResult(CellResult):
    """The aggregate figures of one DP-RAG power cell (what a report may show).

    `claimed_epsilon` / `delta`: each record's (epsilon, delta) over the whole run (the
    filter's target; math.inf for the non-private cell). `answer_epsilon`: the per-answer
    epsilon the answers were asked at (pure composition of the tokens), `answer_rho` the
    rho each paying document is charged, `rho_cap` the filter's cap (inf without noise).
    `own_relevant` / `cross_relevant`: share of canary questions whose own canary scores
    at least tau, and of canary documents some other canary's question scores at least tau,
    over all m candidates (in and out: independent of the coins).
    """

    AUDIT = "DP-RAG (per-record filters)"  # named in the audit-power tables and plots

    num_documents: int
    digits: int
    key_words: int
    mechanism: str
    k: int
    max_tokens: int
    relevance_threshold: float
    answers_per_record: int
    answer_epsilon: float
    answer_rho: float
    rho_cap: float
    own_relevant: float
    cross_relevant: float
    seconds_per_answer: float


def record_epsilon(epsilon: float, plan, delta: float, answers_per_record: int) -> float:
    """The claim of a DP cell: the tightest (epsilon, `delta`) the code guarantees per record.

    The filter's target `epsilon` holds for any number of answers. With one answer per
    record (`answers_per_record` = 1) a record pays at most once, so its loss is also one
    answer's: `plan.max_releases` icl tokens, each `plan.token_epsilon`-bounded-range,
    composed at `delta` (Dong, Durfee & Rogers 2020; `bounded_range_epsilon`, adaptive),
    plus the Laplace score's epsilon if any. The smaller of the two is claimed, so a bound
    between them is reported as the violation it is.
    """
    if answers_per_record != 1:
        return epsilon
    one_answer = bounded_range_epsilon(plan.token_epsilon, plan.max_releases, delta)
    return min(epsilon, one_answer + plan.score_epsilon)


def answer_epsilon_for(config: RagConfig, rho: float, iterations: int = 60) -> float:
    """The largest per-answer epsilon whose icl plan charges a document at most `rho`.

    Args:
      config: the answer stage (individual accounting).
      rho: the zCDP budget one answer may take from a document.
      iterations: bisection steps.

    Raises:
      ValueError: not even a tiny epsilon fits (`rho` not > 0).
    """
    if not rho > 0:
        raise ValueError(f"rho must be > 0, got {rho=}")

    def charge(epsilon: float) -> float:
        return plan_answer(config, MECHANISM, epsilon).document_rho()

    def fits(epsilon: float) -> bool:
        return charge(epsilon) <= rho

    # document_rho grows with epsilon, without bound
    low, high = calibration.grow(fits, 0.0, 1.0)
    low = calibration.bisect(fits, low, high, iterations=iterations)
    if low == 0.0:
        raise ValueError(f"no per-answer epsilon fits {rho=}")
    return low


def _validate(epsilon, canaries, digits, delta, answers_per_record, config) -> None:
    if isinstance(epsilon, bool) or math.isnan(epsilon) or not epsilon > 0:
        raise ValueError(f"epsilon must be > 0 (inf: the non-private baseline), {epsilon=}")
    if not (isinstance(canaries, int) and canaries >= 2):
        raise ValueError(f"canaries must be an integer >= 2 (some in, some out), {canaries=}")
    if not (isinstance(digits, int) and 1 <= digits <= DIGITS):
        raise ValueError(f"digits must be an integer in [1, {DIGITS}], got {digits=}")
    if not 0 < delta < 1 or 2 * canaries * delta > 1:
        raise ValueError(f"delta must be in (0, 1/(2 m)] for m canaries: {delta=}, {canaries=}")
    if not (isinstance(answers_per_record, int) and answers_per_record >= 1):
        raise ValueError(f"answers_per_record must be an integer >= 1, {answers_per_record=}")
    if math.isfinite(epsilon) and not config.individual:
        raise ValueError(
            "the claim is per record over the whole run: the DP cells need individual "
            f"accounting (RagConfig(accounting='individual')), got {config.accounting=}"
        )
    if config.max_tokens < digits:
        raise ValueError(f"max_tokens {config.max_tokens} cannot hold {digits=} digits")


def _make_canaries(documents, m, digits, key_words, rng, lm, config) -> list[RagCanary]:
    """m canaries with `digits`-digit secrets; each must fit a prompt's document whole."""
    made = make_rag_canaries(documents, m, rng, key_words=key_words)
    made = [dataclasses.replace(c, secret=c.secret[:digits]) for c in made]
    longest = max(len(lm.encode(c.document)) for c in made)  # public: the canary material
    if longest > config.max_document_tokens:
        raise ValueError(
            f"a canary document has {longest} tokens, more than max_document_tokens="
            f"{config.max_document_tokens}: its secret would be cut from every prompt"
        )
    return made


def _relevance(questions: np.ndarray, canaries: np.ndarray, config: RagConfig):
    """(own_relevant, cross_relevant) over all candidates (see `RagPowerResult`)."""
    scores = questions @ canaries.T
    normalised = config.score_range.normalise(scores.ravel()).reshape(scores.shape)
    hit = normalised >= config.relevance_threshold
    own = np.diag(hit).copy()
    np.fill_diagonal(hit, False)
    return float(own.mean()), float(hit.any(axis=0).mean())


def run_rag_power_cell(
    documents: Sequence[str],
    *,
    lm,
    encode: Callable[[list[str]], np.ndarray],
    epsilon: float,
    canaries: int = 1000,
    digits: int = DIGITS_DEFAULT,
    config: RagConfig | None = None,
    delta: float = DELTA,
    answers_per_record: int = 1,
    key_words: int = KEY_WORDS,
    prompt: PromptFormat = CANARY_PROMPT,
    significance: float = 0.05,
    model: str = "",
    seed: int | None = None,
    work_dir: str | Path | None = None,
    progress: bool = False,
) -> RagPowerResult:
    """Runs one power cell: plants m canaries by coin, asks each once, audits the claim.

    Args:
      documents: the public base collection (the included canaries are added to it); its
        words also make the canaries' keys.
      lm: a `synthgen.lm_backends.NextTokenLM` with `fork()` (e.g. `FlaxLM`).
      encode: maps a list of texts to [B, D] embeddings (documents and questions); inner
        products are the similarity scores.
      epsilon: the claimed per-record epsilon of the whole run; math.inf: the non-private
        greedy RAG baseline.
      canaries: m, each included with probability 1/2.
      digits: digits of each secret (public).
      config: the answer stage (default `power_config(digits)`); finite epsilons need
        individual accounting. Its k is also the baseline's number of documents.
      delta: the claim's delta (each document filter's delta and the bounds').
      answers_per_record: how many answers each record's filter can pay for: each answer
        charges rho_cap / answers_per_record (1: all of it on the first).
      key_words: words in a canary's key.
      prompt: the prompt format of every answer.
      significance: level of each bound (0.05: 95%).
      model: a public label for the report.
      seed: None (production): a 128-bit audit seed from OS entropy, and OS entropy for
        every answer's mechanism; fixed seeds are for tests only.
      work_dir: private work folder for the canary record (keys, secrets, coins, order,
        answers); None: nothing is kept.
      progress: a tqdm bar over the answers.

    Returns:
      The `RagPowerResult` (aggregates only).

    Raises:
      ValueError: bad parameters (checked before any canary is planted), or a canary
        document longer than `config.max_document_tokens`.

    Privacy:
      Unit: one document (add/remove-one); a canary is one document. Each DP cell is, for
      every record, (epsilon, delta)-DP over all its answers by the individual Rényi filter
      (Feldman & Zrnic 2021; see the module docstring), the claim every bound is compared
      with. Coins, canaries, answers and scores stay in memory or in `work_dir`; the
      ledger lives in a temporary folder deleted on return.
    """
    start_time = time.perf_counter()
    config = config or power_config(digits)
    _validate(epsilon, canaries, digits, delta, answers_per_record, config)
    material, coin_rng, mechanism_seed = streams(seed)
    planted = _make_canaries(documents, canaries, digits, key_words, material, lm, config)
    order = material.permutation(canaries)  # public: independent of the coins
    coins = draw_coins(coin_rng, canaries)

    canary_vectors = np.asarray(encode([c.document for c in planted]), np.float32)
    questions = [c.question for c in planted]
    question_vectors = np.asarray(encode(questions), np.float32)
    own_relevant, cross_relevant = _relevance(question_vectors, canary_vectors, config)
    base_vectors = np.asarray(encode(list(documents)), np.float32).reshape(
        len(documents), canary_vectors.shape[1]
    )
    included = [c for c, x in zip(planted, coins) if x]
    collection = CanaryCollection(
        [f"doc-{i}" for i in range(len(documents))] + [c.doc_id for c in included],
        list(documents) + [c.document for c in included],
        np.concatenate([base_vectors, canary_vectors[coins]]),
        dict(zip(questions, question_vectors)),
    )

    answers: list[str] = [""] * canaries
    todo = order
    if progress:
        from tqdm import tqdm

        todo = tqdm(order, desc=f"rag power eps={epsilon_tag(epsilon)}", unit="answer")
    answer_start = time.perf_counter()
    if math.isinf(epsilon):
        answer_epsilon = answer_rho = cap = claim = math.inf
        for j in todo:
            answers[j] = collection.greedy(
                lm, prompt, config, questions[j], config.k, kind="stable"
            )
        mechanism = "greedy"
    else:
        cap = DocumentBudget(epsilon, delta).rho_cap
        answer_epsilon = answer_epsilon_for(config, cap / answers_per_record)
        plan = plan_answer(config, MECHANISM, answer_epsilon)
        answer_rho = plan.document_rho()
        claim = record_epsilon(epsilon, plan, delta, answers_per_record)
        with tempfile.TemporaryDirectory() as tmp:  # the ledger: who paid reveals the coins
            ledger = PrivacyLedger(Path(tmp) / "ledger.sqlite")
            # the tenant's quota only (basic: O(1) per charge); the claim is the filters'
            ledger.ensure_scope(Scope(TENANT, DATASET, 1e9, 0.5, accountant="basic"))
            open_document_filters(
                ledger, DATASET, documents=len(collection), epsilon=epsilon, delta=delta, plan=plan
            )
            rag = collection.dp_rag(
                lm,
                ledger,
                DATASET,
                config=config,
                prompt=prompt,
                rng=None if seed is None else np.random.default_rng(mechanism_seed),
            )
            try:
                for j in todo:
                    answer = rag.answer(
                        questions[j], tenant=TENANT, epsilon=answer_epsilon, mechanism=MECHANISM
                    )
                    answers[j] = answer.text
            finally:
                ledger.close()
        mechanism = MECHANISM
    answer_seconds = time.perf_counter() - answer_start

    scores = np.array([prefix_digits(c.secret, a) for c, a in zip(planted, answers)], np.float64)
    figures = canary_figures(
        {OBSERVABLE: scores},
        coins,
        target_epsilon=epsilon,
        claimed_epsilon=claim,
        delta=delta,
        significance=significance,
    )
    if work_dir is not None:
        _write_record(work_dir, epsilon, planted, coins, order, answers)
    del scores, coins, answers, included, collection
    return RagPowerResult(
        model=model,
        num_documents=len(documents),
        digits=digits,
        key_words=key_words,
        mechanism=mechanism,
        k=config.voters if math.isfinite(epsilon) else config.k,
        max_tokens=config.max_tokens,
        relevance_threshold=config.relevance_threshold,
        answers_per_record=answers_per_record,
        answer_epsilon=answer_epsilon,
        answer_rho=answer_rho,
        rho_cap=cap,
        own_relevant=own_relevant,
        cross_relevant=cross_relevant,
        seconds=time.perf_counter() - start_time,
        seconds_per_answer=answer_seconds / canaries,
        **figures,
    )


def record_path(work_dir: str | Path, epsilon: float) -> Path:
    """The private canary record of the cell at `epsilon` inside `work_dir`."""
    return Path(work_dir) / f"rag_power_eps{epsilon_tag(epsilon)}.json"


def _write_record(work_dir, epsilon, planted, coins, order, answers) -> None:
    path = record_path(private_folder(work_dir), epsilon)
    record = {
        "epsilon": epsilon,
        "canaries": [dataclasses.asdict(c) for c in planted],
        "coins": [bool(x) for x in coins],
        "order": [int(j) for j in order],
        "answers": list(answers),
    }
    write_private(path, json.dumps(record))


# ---- cells, resumable -------------------------------------------------------------------------


def cell_path(out_dir: str | Path, num_canaries: int, epsilon: float) -> Path:
    return Path(out_dir) / f"rag_power_m{num_canaries}_eps{epsilon_tag(epsilon)}.json"


def run_rag_power_cells(
    out_dir: str | Path,
    documents: Sequence[str],
    epsilons: Sequence[float],
    *,
    lm,
    encode: Callable[[list[str]], np.ndarray],
    canaries: int = 1000,
    digits: int = DIGITS_DEFAULT,
    config: RagConfig | None = None,
    delta: float = DELTA,
    model: str = "",
    seed: int | None = None,
    work_dir: str | Path | None = None,
    progress: bool = False,
    log: Callable[[str], None] = print,
) -> list[RagPowerResult]:
    """Runs (or reads back) one cell per claimed epsilon; resumable by cell.

    Every cell writes ``rag_power_m<m>_eps<tag>.json`` (aggregates only) into `out_dir`; a
    cell whose file exists is read back instead of run. An interrupted cell is re-run
    whole, with fresh coins (they never touch the results folder). Cell k uses seed + k
    (tests); None draws every cell's audit seed from OS entropy. The other arguments are
    `run_rag_power_cell`'s.

    Returns:
      One `RagPowerResult` per epsilon, in order.
    """
    answers = config or power_config(digits)

    def run(epsilon: float, k: int) -> RagPowerResult:
        return run_rag_power_cell(
            documents,
            lm=lm,
            encode=encode,
            epsilon=epsilon,
            canaries=canaries,
            digits=digits,
            config=config,
            delta=delta,
            model=model,
            seed=None if seed is None else seed + k,
            work_dir=work_dir,
            progress=progress,
        )

    expect = settings_of(
        run_rag_power_cell,
        num_documents=len(documents),
        num_canaries=canaries,
        digits=digits,
        delta=delta,
        max_tokens=answers.max_tokens,
        relevance_threshold=answers.relevance_threshold,
    )
    return resumable_cells(
        epsilons,
        lambda epsilon: cell_path(out_dir, canaries, epsilon),
        run,
        RagPowerResult,
        expect=expect,
        log=log,
        describe=lambda r: f"{r.seconds:.1f} s ({r.seconds_per_answer:.2f} s/answer)",
    )


def format_table(results: Sequence[RagPowerResult]) -> str:
    """A Markdown table: one row per cell."""
    head = (
        "| claimed eps (delta) | per-answer eps | canaries in/out | "
        f"{CellResult.FIGURES} | s/answer | ok |"
    )
    return markdown_table(
        head,
        (
            f"| {epsilon_tag(r.claimed_epsilon)} ({r.delta:g}) | {r.answer_epsilon:.3g} | "
            f"{r.num_in}/{r.num_out} | {r.figure_cells(r.primary)} | "
            f"{r.seconds_per_answer:.2f} | {'VIOLATION' if r.violation else 'yes'} |"
            for r in results
        ),
    )
