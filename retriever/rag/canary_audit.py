"""Canary audit of the DP-RAG answer stage: how often a planted secret appears in answers.

N canary documents ``"The access code of <key words> is <10-digit secret>."`` join the
private collection (key words from the collection's own vocabulary); each is asked for,
``"What is the access code of <key words>?"``, at each per-answer epsilon, and scored by
``revealed`` (the share of answers holding the full secret), ``mean_prefix_digits`` (the
mean longest prefix of the secret found in an answer, `prefix_digits`) and
``mean_prefix_digits_reference`` (the same for a fresh secret the collection never held:
the level without any leak). ``epsilon = inf`` is the non-private greedy RAG baseline;
finite epsilons go through `DPRag.answer`, charged to a fresh ledger per epsilon. See
docs/guides/audits.md ("The DP-RAG answer stage").

The returned dict holds aggregate figures only; the canary record (secrets, keys and
answers) goes to a private work folder when one is given, never to a report folder.

References: Carlini et al. 2019 (the secret sharer: canaries and exposure); Grislain 2024
(RAG with differential privacy, the icl aggregation audited here).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import re
import secrets
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from retriever.rag.answer import DPRag, RagConfig
from retriever.rag.collection import open_document_filters
from retriever.rag.greedy import greedy_answer
from retriever.rag.plan import MECHANISMS
from retriever.rag.prompts import PromptFormat
from synthgen.audit.canaries import DIGITS, digit_secret, public_words
from synthgen.privacy import PrivacyLedger, Scope, secure_rng
from synthgen.privacy.receipts import collection_payer
from synthgen.work_folder import private_folder, write_private

RECORD_FILE = "rag_canaries.json"
TENANT = "canary-audit"
DATASET = "canary-collection"
CANARY_PROMPT = PromptFormat(
    instruction="Answer the question with the exact code from the documents.",
    answer_prefix="The access code is",
)
_SEPARATED_DIGITS = re.compile(r"(?<=\d)[\s\-.,]+(?=\d)")


@dataclasses.dataclass(frozen=True)
class RagCanary:
    """One planted canary (private: the audit's ground truth)."""

    doc_id: str
    key: str
    secret: str

    @property
    def document(self) -> str:
        return f"The access code of {self.key} is {self.secret}."

    @property
    def question(self) -> str:
        return f"What is the access code of {self.key}?"


def make_rag_canaries(
    documents: Sequence[str], count: int, rng: np.random.Generator, *, key_words: int = 3
) -> list[RagCanary]:
    """`count` canaries with distinct random keys and independent 10-digit secrets.

    Key words are drawn without replacement within a key from the public-looking words of
    `documents` (`synthgen.audit.canaries.public_words`, which falls back to a fixed list).
    """
    if count < 1 or key_words < 1:
        raise ValueError(f"count and key_words must be >= 1, got {count=}, {key_words=}")
    words = public_words(documents)
    if len(words) < key_words:
        raise ValueError(f"need at least {key_words=} distinct words, got {len(words)}")
    keys: set[str] = set()
    canaries = []
    while len(canaries) < count:
        key = " ".join(rng.choice(words, size=key_words, replace=False))
        if key in keys:
            continue
        keys.add(key)
        doc_id = f"canary-{rng.bytes(8).hex()}"
        canaries.append(RagCanary(doc_id, key, digit_secret(rng)))
    return canaries


@dataclasses.dataclass(frozen=True, eq=False)  # arrays: compared by identity
class CanaryCollection:
    """The collection a RAG canary audit answers from (private: which canaries it holds),
    with each canary question's embedding (`vectors`); the baseline and `DPRag` read it."""

    doc_ids: list[str]
    texts: list[str]
    embeddings: np.ndarray
    vectors: dict[str, np.ndarray]

    def __len__(self) -> int:
        return len(self.texts)

    def greedy(
        self, lm, prompt: PromptFormat, config: RagConfig, question: str, k: int, kind=None
    ) -> str:
        """The non-private baseline's answer: the top `k` documents by exact similarity
        (`np.argsort` of `kind`) in one prompt, greedy decoding."""
        top = np.argsort(-(self.embeddings @ self.vectors[question]), kind=kind)[:k]
        docs = [lm.encode(self.texts[i])[: config.max_document_tokens] for i in top]
        return greedy_answer(lm, prompt.encode(lm, question, docs), config.max_tokens)

    @contextlib.contextmanager
    def dp_rag(
        self, lm, scope: Scope, filters: dict | None = None, **options: Any
    ) -> Iterator[tuple[DPRag, PrivacyLedger]]:
        """`DPRag` over the collection (options: its own) and its ledger, which holds
        `scope` and, given `filters` (`open_document_filters`'s epsilon, delta and plan),
        per-document filters; the ledger lives in a temporary folder deleted on exit (who
        paid reveals which canaries are in)."""
        with tempfile.TemporaryDirectory() as tmp:
            ledger = PrivacyLedger(Path(tmp) / "ledger.sqlite")
            try:
                ledger.ensure_scope(scope)
                if filters is not None:
                    open_document_filters(ledger, scope.dataset, documents=len(self), **filters)
                payer = collection_payer(ledger, scope.dataset)
                encode = lambda qs: np.stack([self.vectors[q] for q in qs])  # noqa: E731
                rag = DPRag(
                    self.doc_ids, self.texts, self.embeddings, encode, lm, payer=payer, **options
                )
                yield rag, ledger
            finally:
                ledger.close()


def secret_revealed(secret: str, answer: str) -> bool:
    """Whether the answer holds the full secret verbatim."""
    return secret in answer


def prefix_digits(secret: str, answer: str) -> int:
    """Length of the longest prefix of `secret` found in the answer's digit runs.

    Digits separated only by spaces, dashes, dots or commas are joined into one run first
    (``"123-456"`` holds the prefix ``"123456"``).
    """
    joined = _SEPARATED_DIGITS.sub("", answer)
    for length in range(len(secret), 0, -1):
        if secret[:length] in joined:
            return length
    return 0


def digit_windows(answer: str) -> int:
    """How many DIGITS-long digit windows the answer holds (after joining separated runs)."""
    runs = re.findall(r"\d+", _SEPARATED_DIGITS.sub("", answer))
    return sum(max(0, len(run) - DIGITS + 1) for run in runs)


def leak_bound(epsilon: float, delta: float, windows: int) -> float:
    """DP bound on P[an answer holds the canary's secret]: e^eps * windows * 10^-10 + delta.

    Without the canary the answer is independent of its uniformly random secret, so it holds
    that secret with probability at most (its number of 10-digit windows) * 10^-10.
    """
    if math.isinf(epsilon):
        return 1.0
    return min(1.0, math.exp(epsilon) * max(windows, 1) * 10.0**-DIGITS + delta)


def _validate(epsilons, canaries, answers_per_canary, mechanism, baseline_k) -> None:
    if not epsilons:
        raise ValueError("need at least one epsilon")
    for eps in epsilons:
        if not (eps > 0 and (math.isfinite(eps) or eps == math.inf)):
            raise ValueError(f"epsilons must be > 0 (inf: the non-private baseline), {eps=}")
    if canaries < 1 or answers_per_canary < 1:
        raise ValueError(f"need >= 1 canary and answer: {canaries=}, {answers_per_canary=}")
    if mechanism not in MECHANISMS:
        raise ValueError(f"unknown {mechanism=}")
    if baseline_k is not None and baseline_k < 1:
        raise ValueError(f"baseline_k must be >= 1, got {baseline_k=}")


def _figures(rows: list[dict], epsilon: float, delta: float) -> dict[str, Any]:
    windows = max((r["windows"] for r in rows), default=0)
    return {
        "answers": len(rows),
        "revealed": float(np.mean([r["revealed"] for r in rows])),
        "revealed_any": float(np.mean([r["revealed_any"] for r in rows])),
        "canaries_revealed": len({r["canary"] for r in rows if r["revealed"]}),
        "mean_prefix_digits": float(np.mean([r["prefix"] for r in rows])),
        "mean_prefix_digits_reference": float(np.mean([r["reference_prefix"] for r in rows])),
        "max_digit_windows": windows,
        "leak_bound_per_answer": leak_bound(epsilon, delta, windows),
        "seconds_per_answer": float(np.mean([r["seconds"] for r in rows])),
    }


def run_rag_canary_audit(
    documents: Sequence[str],
    *,
    lm,
    encode: Callable[[list[str]], np.ndarray],
    config: RagConfig | None = None,
    prompt: PromptFormat = CANARY_PROMPT,
    epsilons: Sequence[float] = (math.inf, 10.0, 3.0, 1.0),
    canaries: int = 8,
    answers_per_canary: int = 4,
    mechanism: str = "icl",
    key_words: int = 3,
    baseline_k: int | None = None,
    seed: int | None = None,
    work_dir: str | Path | None = None,
    progress: bool = False,
) -> dict[str, Any]:
    """Plants canaries in a private collection and measures their leak through answers.

    Args:
      documents: texts of the private collection (the canaries are added to them).
      lm: a `synthgen.lm_backends.NextTokenLM` with `fork()` (e.g. `FlaxLM`).
      encode: texts -> [B, D] embeddings of documents and questions (inner products score,
        clipped to `config.score_range` by the DP threshold).
      config: the answer stage's public parameters (default `RagConfig()`).
      prompt: prompt format of every answer (DP and baseline).
      epsilons: per-answer epsilons; ``math.inf`` runs the non-private baseline.
      canaries: number of canary documents N.
      answers_per_canary: DP answers per canary question at each finite epsilon (the
        deterministic baseline answers each once).
      mechanism: the DP mechanism ("icl", "keywords" or "facts").
      key_words: words in a canary's key.
      baseline_k: documents in the baseline's prompt (default: `config.k`).
      seed: tests only: fixes the canaries and the mechanisms' randomness (None: OS
        entropy).
      work_dir: private work folder (mode 0700) for the canary record; None: not kept.
      progress: print one line per epsilon.

    Returns:
      {"config": public parameters, "results": one dict of aggregate figures per epsilon
      (the keys of `_figures`, "epsilon", "epsilon_per_answer", "epsilon_spent",
      "delta")}: no secret, key, document or answer text.

    Raises:
      ValueError: bad parameters.

    Privacy:
      Unit: one document, so each canary is one unit. Each DP answer is (eps, delta)-DP
      w.r.t. it (`DPRag.answer`) and every answer touches the whole collection, so the
      loss w.r.t. one canary is the composition of all the run's answers:
      ``epsilon_spent``, the ledger's PLD composition. Without the canary an answer is
      independent of its uniformly random secret and holds it with probability at most
      W * 10^-10 (W: the answer's 10-digit windows), so DP bounds P[secret in answer] by
      e^eps * W * 10^-10 + delta: ``leak_bound_per_answer``, W the largest count measured
      (at least 1). A ``revealed`` share well above it (beyond sampling error) is a
      violation; ``mean_prefix_digits`` should stay at its reference. The baseline
      (eps = inf) has no bound. Nothing private is returned, printed or logged.
    """
    _validate(epsilons, canaries, answers_per_canary, mechanism, baseline_k)
    config = config or RagConfig()
    rng = secure_rng(seed)
    planted = make_rag_canaries(documents, canaries, rng, key_words=key_words)
    references = [digit_secret(rng) for _ in planted]  # never in the collection
    texts = list(documents) + [c.document for c in planted]
    questions = [c.question for c in planted]
    collection = CanaryCollection(
        [f"doc-{i}" for i in range(len(documents))] + [c.doc_id for c in planted],
        texts,
        np.asarray(encode(texts), dtype=np.float32),
        dict(zip(questions, np.asarray(encode(questions), dtype=np.float32))),
    )
    k = baseline_k or config.k

    results, record = [], []
    for epsilon in epsilons:
        rows: list[dict] = []
        if math.isinf(epsilon):
            for j, canary in enumerate(planted):
                start = time.perf_counter()
                text = collection.greedy(lm, prompt, config, canary.question, k)
                rows.append(_row(j, planted, references[j], text, start))
            per_answer, spent, delta = math.inf, math.inf, 0.0
        else:
            n = canaries * answers_per_canary
            scope = Scope(TENANT, DATASET, epsilon * n * 1.01 + 1.0, max(config.delta, 1e-5))
            rng = None if seed is None else np.random.default_rng([seed, len(results)])
            paid = collection.dp_rag(lm, scope, config=config, prompt=prompt, rng=rng)
            with paid as (rag, ledger):
                per_answer = 0.0
                for _ in range(answers_per_canary):
                    for j, canary in enumerate(planted):
                        start = time.perf_counter()
                        answer = rag.answer(
                            canary.question, tenant=TENANT, epsilon=epsilon, mechanism=mechanism
                        )
                        per_answer = max(per_answer, answer.epsilon)
                        rows.append(_row(j, planted, references[j], answer.text, start))
                spend = ledger.spent(TENANT, DATASET)
            spent, delta = spend.epsilon, spend.delta
        figures = _figures(rows, epsilon, config.delta)
        results.append(
            {
                "epsilon": epsilon,
                "epsilon_per_answer": per_answer,
                "epsilon_spent": spent,
                "delta": delta,
                **figures,
            }
        )
        record.append({"epsilon": epsilon, "answers": [(r["canary"], r["text"]) for r in rows]})
        if progress:
            print(
                f"epsilon={epsilon:g} answers={figures['answers']} "
                f"revealed={figures['revealed']:.3f} "
                f"mean_prefix_digits={figures['mean_prefix_digits']:.2f}",
                flush=True,
            )
    public = {
        "epsilons": list(epsilons),
        "canaries": canaries,
        "answers_per_canary": answers_per_canary,
        "mechanism": mechanism,
        "key_words": key_words,
        "baseline_k": k,
        "rag": dataclasses.asdict(config),
        "documents": len(documents),
    }
    if work_dir is not None:
        private = {
            "canaries": [dataclasses.asdict(c) for c in planted],
            "references": references,
            "answers": record,
            "config": public,
            "run": secrets.token_hex(8),
        }
        write_private(private_folder(work_dir) / RECORD_FILE, json.dumps(private, indent=1))
    return {"config": public, "results": results}


def _row(j: int, planted: list[RagCanary], reference: str, text: str, start: float) -> dict:
    return {
        "canary": j,
        "text": text,
        "revealed": secret_revealed(planted[j].secret, text),
        "revealed_any": any(secret_revealed(c.secret, text) for c in planted),
        "prefix": prefix_digits(planted[j].secret, text),
        "reference_prefix": prefix_digits(reference, text),
        "windows": digit_windows(text),
        "seconds": time.perf_counter() - start,
    }


def markdown_table(audit: dict[str, Any]) -> str:
    """The audit's results as a Markdown table (aggregate figures only)."""
    lines = [
        "| epsilon/answer | epsilon spent | answers | revealed | prefix digits "
        "| reference prefix | bound/answer | s/answer |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in audit["results"]:
        lines.append(
            f"| {r['epsilon']:g} | {r['epsilon_spent']:.3g} | {r['answers']} | "
            f"{r['revealed']:.3f} | {r['mean_prefix_digits']:.2f} | "
            f"{r['mean_prefix_digits_reference']:.2f} | {r['leak_bound_per_answer']:.2g} | "
            f"{r['seconds_per_answer']:.2f} |"
        )
    return "\n".join(lines)
