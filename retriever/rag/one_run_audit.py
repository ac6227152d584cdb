"""One-run canary audit of the DP-RAG answer stage: a lower bound on its epsilon.

The power audits' design (`synthgen.audit.whitebox`, `synthgen.audit.blackbox`) for DP-RAG
answers: m canaries, each planted in the collection by a fair coin, each asked about once;
a canary's score is the longest prefix of its secret in its own answer, and
`synthgen.audit.whitebox.score_stats` turns the scores into one-run epsilon lower bounds.
The DP cells answer under per-document Rényi filters whose target is the claimed
(epsilon, delta); epsilon = inf is the non-private greedy RAG baseline, not the DP path
without noise. The steps and the argument behind the claim: see docs/guides/audits.md
("How a DP-RAG cell runs and what it claims").

Privacy:
  The canaries are the audit's own synthetic records; the base documents stand in for the
  private collection. A `RagPowerResult` holds aggregates only (counts, rates, epsilons,
  rho, seconds, `score_stats`'s histograms and ROC). The canaries, coins, order, answers
  and per-canary scores stay in memory, or in a private `work_dir` (mode 0700, files
  0600), never in the results folder; the cells' ledgers (who paid reveals the coins) live
  in a temporary folder deleted on return. The epsilon = inf cell is NOT private.

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
from retriever.rag.config import RagConfig, plan_answer
from retriever.rag.prompts import PromptFormat
from synthgen.audit.canaries import DIGITS
from synthgen.audit.cells import resumable_cells, settings_of
from synthgen.audit.claims import epsilon_tag
from synthgen.audit.coins import draw_coins, streams
from synthgen.audit.whitebox import CellResult, canary_figures, markdown_table
from synthgen.privacy import Scope, calibration
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

    The filter's target `epsilon` holds for any number of answers; with one answer per
    record, a record's loss is also one answer's: `plan.max_releases` icl tokens, each
    `plan.token_epsilon`-bounded-range, composed at `delta` (Dong, Durfee & Rogers 2020),
    plus the Laplace score's epsilon if any. The smaller of the two is claimed.
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

    def fits(epsilon: float) -> bool:  # document_rho grows with epsilon, without bound
        return plan_answer(config, MECHANISM, epsilon).document_rho() <= rho

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
      documents: the public base collection (the included canaries join it); its words
        make the canaries' keys.
      lm: a `synthgen.lm_backends.NextTokenLM` with `fork()` (e.g. `FlaxLM`).
      encode: texts -> [B, D] embeddings (documents and questions); inner products score.
      epsilon: the claimed per-record epsilon of the whole run; math.inf: the non-private
        greedy RAG baseline.
      canaries: m, each included with probability 1/2; `digits`: digits per secret.
      config: the answer stage (default `power_config(digits)`; finite epsilons need
        individual accounting); its k is also the baseline's number of documents.
      delta: the claim's delta (each document filter's and the bounds').
      answers_per_record: answers each record's filter can pay for (each charges
        rho_cap / answers_per_record).
      key_words, prompt, significance, model: words per canary key, the answers' prompt
        format, each bound's level (0.05: 95%), a public label for the report.
      seed: None (production): the audit seed and every answer's noise from OS entropy;
        fixed seeds are for tests only.
      work_dir: private folder for the canary record (None: nothing is kept).
      progress: a tqdm bar over the answers.

    Returns:
      The `RagPowerResult` (aggregates only).

    Raises:
      ValueError: bad parameters (before any canary is planted), or a canary document
        longer than `config.max_document_tokens`.

    Privacy:
      Unit: one document; a canary is one document. A DP cell is, for every record,
      (epsilon, delta)-DP over all its answers by the individual Rényi filter (Feldman &
      Zrnic 2021; docs/guides/audits.md), the claim every bound is compared with. Coins,
      canaries, answers and scores stay in memory or in `work_dir`; the ledger lives in a
      temporary folder deleted on return.
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
        # the tenant's quota only (basic: O(1) per charge); the claim is the filters'
        scope = Scope(TENANT, DATASET, 1e9, 0.5, accountant="basic")
        filters = dict(epsilon=epsilon, delta=delta, plan=plan)
        rng = None if seed is None else np.random.default_rng(mechanism_seed)
        paid = collection.dp_rag(lm, scope, filters, config=config, prompt=prompt, rng=rng)
        asked = dict(tenant=TENANT, epsilon=answer_epsilon, mechanism=MECHANISM)
        with paid as (rag, _):
            for j in todo:
                answers[j] = rag.answer(questions[j], **asked).text
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
