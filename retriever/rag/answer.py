"""The DP-RAG answer stage: one object from a question to a charged, private answer.

`DPRag.answer` plans the answer (`retriever.rag.plan`) and charges its worst case through
the collection's payer (`synthgen.privacy.receipts.CollectionPayer`: the answer stage never
holds the ledger) before any noise is drawn or any document enters a prompt; a refused
request draws nothing. It then draws the DP threshold (`retriever.rag.retrieval`), releases
the answer through the chosen mechanism (`retriever.rag.releases`; an answer the private
documents did not move abstains with `ABSTENTION_TEXT`) and optionally a Laplace confidence
score. Under individual accounting `retriever.rag.individual` picks and charges the payers
first. Every answer runs at one public shape (`RagConfig.voters` rows, padded to a public
prompt length, public loop counts), so time and memory do not follow how many documents
were selected (Privacy rule 9); remote LM backends ignore the padding, so their latency can
reveal it. See docs/guides/dp_rag.md ("How an answer is made", "Time and memory do not
depend on the collection").

Nothing returned (text, noisy count and score, charges) depends on the collection except
through these mechanisms; no document id, raw score, logit or text is returned or logged.
"""

from __future__ import annotations

import copy
import dataclasses
import secrets
import threading
import zlib
from collections.abc import Sequence

import numpy as np
from scipy import sparse

from retriever.rag import releases
from retriever.rag.answer_types import ABSTENTION_TEXT, Answer, StageCharge, after_charge
from retriever.rag.config import RagConfig, plan_answer
from retriever.rag.fact_vote import document_facts
from retriever.rag.individual import answer_individually, check_individual
from retriever.rag.plan import RELATION, AnswerPlan, answer_event_shape
from retriever.rag.prompts import PromptFormat
from retriever.rag.question_kinds import question_kinds
from retriever.rag.retrieval import (
    best_selected,
    dp_top_k_threshold,
    dp_top_p_threshold,
    grouped_selected,
)
from retriever.rag.reuse import ReleasedAnswers
from retriever.rag.sessions import (
    Deadline,
    PromptRows,
    build_rows,
    document_keys,
    tokenize_documents,
)
from retriever.rag.text import clean_answer_text
from synthgen.privacy import accounting, secure_rng
from synthgen.privacy.receipts import CollectionPayer


class DPRag:
    """Answers questions over a private collection with DP, charged to a tenant's budget.

    Args:
      doc_ids: ids of the private documents (never released).
      texts: their texts.
      embeddings: [N, D] document embeddings, a numpy array or a scipy.sparse matrix (kept
        sparse); inner products with the question embedding are the similarity scores.
      encode_question: maps a list of questions to [B, D] embeddings.
      lm: a `synthgen.lm_backends.NextTokenLM` with `fork()`.
      payer: the collection's payer (`synthgen.privacy.receipts.collection_payer(ledger,
        name)`; None: nothing charged, for experiments only).
      config, prompt: public parameters and prompt format.
      rng: tests only; production draws a fresh OS-entropy generator per answer.
      answers: released answers to hand out again for the same question at the same event
        (`retriever.rag.reuse.ReleasedAnswers`; None: every question is answered).
      document_cache: True to compute every document's keys and values once, before any
        answer (an LM with `document_kv`), or another DPRag's `document_kv` over the same
        documents, LM and prompt (`sessions.document_keys`). Memory only, never saved or
        logged. See docs/guides/dp_rag.md ("Faster answers").

    Privacy:
      Privacy unit: one document (add/remove-one). Each answer is (epsilon, delta)-DP for
      the requested epsilon and the config's delta: the threshold, the tokens and the
      score are DP mechanisms composed by the plan, the rest post-processing.
    """

    def __init__(
        self,
        doc_ids: Sequence[str],
        texts: Sequence[str],
        embeddings: np.ndarray,
        encode_question,
        lm,
        *,
        payer: CollectionPayer | None = None,
        config: RagConfig = RagConfig(),
        prompt: PromptFormat | None = None,
        rng: np.random.Generator | None = None,
        document_cache=False,
        answers: ReleasedAnswers | None = None,
    ) -> None:
        if sparse.issparse(embeddings):  # e.g. term overlap: kept sparse, never densified
            embeddings = sparse.csr_matrix(embeddings, dtype=np.float32)
            stored = embeddings.data
        else:
            embeddings = stored = np.asarray(embeddings, dtype=np.float32)
        if embeddings.ndim != 2 or not embeddings.shape[0] == len(texts) == len(doc_ids):
            raise ValueError(
                f"need one embedding row per document: {embeddings.shape=}, {len(texts)=}, "
                f"{len(doc_ids)=}"
            )
        if not np.all(np.isfinite(stored)):
            raise ValueError("document embeddings must be finite")
        if len(set(doc_ids)) != len(doc_ids):
            raise ValueError("doc_ids must be unique")
        _check_config(config, payer, len(doc_ids))
        self.doc_ids, self.texts = [str(d) for d in doc_ids], list(texts)
        self._position = {d: i for i, d in enumerate(self.doc_ids)}
        self._tokens = tokenize_documents(lm, self.texts)
        # public, a function of each document's id alone: its group for grouped voters
        self._id_hashes = np.array([zlib.crc32(d.encode()) for d in self.doc_ids], np.int64)
        self.embeddings = embeddings
        self.encode_question = encode_question
        self.lm, self.public_lm = lm, lm.fork()
        self.payer = payer
        self.dataset = payer.dataset if payer is not None else "private"  # its public name
        self.config, self.prompt = config, prompt or PromptFormat()
        self._rng = rng
        self._lock = threading.Lock()  # one answer at a time: the LM sessions are shared
        if document_cache and config.documents_per_voter > 1:
            raise ValueError("document_cache keys one document per row: documents_per_voter 1")
        self._kv = None
        if document_cache:
            self._kv = document_keys(lm, self.prompt, self._tokens, config, document_cache)
        self.answers = answers
        self._facts = None  # private: the documents' typed facts (`_document_facts`)

    def with_config(self, config: RagConfig) -> DPRag:
        """The same collection, encoder, LM sessions, payer and lock under `config`."""
        _check_config(config, self.payer, len(self.doc_ids))
        other = copy.copy(self)
        other.config = config
        return other

    # ---- planning and budget --------------------------------------------------------

    def plan(self, mechanism: str, epsilon: float) -> AnswerPlan:
        return plan_answer(self.config, mechanism, float(epsilon))

    def validate(self, question: str, mechanism: str, epsilon: float) -> AnswerPlan:
        """The answer's plan, or ValueError for what `answer` refuses before any charge (an
        empty question, a bad epsilon or mechanism, a question too long for the context)."""
        if not isinstance(question, str) or not question.strip():
            raise ValueError("the question must be non-empty text")
        plan = self.plan(mechanism, float(epsilon))
        if self.config.documents_per_voter > 1 and plan.mechanism not in ("keywords", "facts"):
            raise ValueError(
                f"documents_per_voter > 1 is measured for keywords only, not {plan.mechanism}"
            )
        if self.config.individual:
            self._document_rho(plan)
        self._check_context(question)
        return plan

    def check_budget(self, tenant: str, plan: AnswerPlan) -> None:
        """Read-only: raises unless the tenant's scopes admit `plan`'s worst case
        (BudgetExceededError, KeyError, UnsupportedEventError)."""
        self.payer.check(
            tenant,
            stage="rag-answer",
            event=plan.worst_case_event(),
            relation=RELATION,
            delta=plan.delta,
        )

    def remaining(self, tenant: str) -> float | None:
        return None if self.payer is None else self.payer.remaining(tenant)

    # ---- the answer -----------------------------------------------------------------

    def answer(
        self,
        question: str,
        *,
        tenant: str,
        epsilon: float,
        mechanism: str = "icl",
        deadline: float | None = None,
    ) -> Answer:
        """Answers `question` for `tenant` at per-answer `epsilon` with `mechanism`.

        With `answers` (`retriever.rag.reuse`), a question asked again at the same event
        gets the answer released before (`Answer.reused`), charged nothing and without a
        budget check (post-processing of a release). `deadline` (a `time.monotonic()`
        instant) bounds the wall time: once it passes, no further token is decoded and the
        answer returns `truncated`, charged as planned (every step has the same public
        shape, so when it strikes does not depend on the collection).

        Raises:
          BudgetExceededError: the worst case does not fit the tenant's remaining budget
            (before any noise is drawn or any document enters a prompt).
          ValueError: what `validate` refuses.
          AnswerFailedError: the answer failed after its budget check; it was charged its
            worst case, and nothing was released (the failure's text is withheld).

        Privacy:
          Privacy unit: one document (add/remove-one). The answer is (epsilon, delta)-DP,
          delta = config.delta: the plan's worst case composes (PLD) to at most `epsilon`
          and is charged before any noise is drawn.
        """
        plan = self.validate(question, mechanism, epsilon)
        event = None
        if self.answers is not None:
            if self.answers.scope == "shared" and not self.config.individual:
                raise ValueError(
                    "shared released answers need individual accounting: under collection "
                    "accounting a tenant's cap bounds what it learns (use scope 'tenant')"
                )
            event = (self.dataset, self.config, self.prompt, plan)  # public values
            earlier = self.answers.get(tenant, question, event)
            if earlier is not None:  # post-processing of a release: nothing is charged
                return dataclasses.replace(earlier, remaining_epsilon=self.remaining(tenant))
        with self._lock:
            if self.config.individual:
                answer = answer_individually(self, question, tenant, plan, deadline)
            else:
                answer = self._answer(question, tenant, plan, deadline)
        if self.answers is not None:
            self.answers.put(tenant, question, event, answer)
        return answer

    def _answer(
        self, question: str, tenant: str, plan: AnswerPlan, deadline: float | None
    ) -> Answer:
        ref = secrets.token_hex(16) if self.payer is not None else None
        if self.payer is not None:
            self.check_budget(tenant, plan)
        # every event is fixed by the plan: charged before any noise is drawn
        charges = self._charge(tenant, plan, ref)
        released = after_charge(lambda: self._release(question, plan, deadline))
        return self._assemble(tenant, plan, released, charges, ref)

    def _assemble(self, tenant, plan, released, charges, ref) -> Answer:
        """The `Answer` from the releases (post-processing) and the recorded charges."""
        tokens, abstained, truncated, count, confidence = released
        if abstained:
            text = ABSTENTION_TEXT
        elif isinstance(tokens, str):  # keywords and facts release whole answer text
            text, tokens = tokens, self.lm.encode(tokens)
        else:
            text = clean_answer_text(self.lm.decode(tokens))
        return Answer(
            text=text,
            mechanism=plan.mechanism,
            tokens=len(tokens),
            paid_tokens=plan.max_releases,
            charges=charges,
            epsilon=plan.worst_case_epsilon(),
            delta=plan.delta,
            remaining_epsilon=self.remaining(tenant),
            selected_count=count,
            confidence=confidence,
            ref=ref,
            abstained=abstained,
            truncated=truncated,
        )

    def _scores(self, question: str) -> np.ndarray:
        """[N] similarity of the question to every document (private; a numpy array,
        sparse embeddings included)."""
        return np.asarray(self.embeddings @ np.asarray(self.encode_question([question]))[0])

    def _release(self, question: str, plan: AnswerPlan, deadline: float | None):
        """The mechanisms' releases (`_decode`), from the DP threshold's selection."""
        rng = self._rng if self._rng is not None else secure_rng()
        scores = self._scores(question)
        c = self.config
        if c.top_p is not None:
            kind, size = dp_top_p_threshold, c.top_p
        else:
            kind, size = dp_top_k_threshold, c.k
        tau = kind(scores, size, plan.retrieval_epsilon, rng, score_range=c.score_range)
        if c.documents_per_voter > 1:  # private: used only below
            buckets = self._id_hashes % c.voters
            selection = grouped_selected(
                scores, tau, buckets, c.voters, c.documents_per_voter, c.score_range
            )
        else:
            selection = best_selected(scores, tau, c.voters, c.score_range)
        return self._decode(question, plan, scores, selection, rng, deadline)

    def _decode(self, question, plan: AnswerPlan, scores, selection, rng, deadline):
        """The token (and score) releases from a selection (indices, weights, selected):
        (tokens or text, abstained, truncated, noisy count, confidence)."""
        mechanism = plan.mechanism
        indices, weights, selected = selection
        rows = self._rows(question, indices, weights)
        clock = Deadline(deadline)
        lm, public, c = self.lm, self.public_lm, self.config
        if mechanism == "icl":
            tokens, abstained = releases.icl(lm, public, c, rows, plan, rng, clock)
        elif mechanism == "facts" and question_kinds(question):
            tokens, abstained = releases.facts(self._document_facts(), question, c, plan)
        elif mechanism in ("keywords", "facts"):  # facts: a question no kind rule reads
            read = self._read_texts(indices, weights)  # private: the voters' own texts
            tokens, abstained = releases.keywords(
                lm, public, c, self.prompt, question, rows, plan, clock, read
            )
        else:  # make_plan refuses any other mechanism
            raise ValueError(f"no release for mechanism {mechanism!r}")
        count = confidence = None
        if plan.score_epsilon > 0:
            count, confidence = releases.score(c, scores, selected, plan.score_epsilon, rng)
        return tokens, abstained, clock.passed, count, confidence

    # ---- individual (per-document) accounting ----------------------------------------

    def _document_rho(self, plan: AnswerPlan) -> float:
        """The plan's per-document rho, or ValueError when no document could ever pay it
        or the mechanism has no zCDP curve (public parameters only)."""
        rho = plan.document_rho()
        cap = self.payer.document_filter().budget.rho_cap
        if rho > cap:
            raise ValueError(
                f"an answer at epsilon={plan.epsilon:g} costs each document rho={rho:.4g}, "
                f"more than a document's whole filter (rho cap {cap:.4g}): ask at a smaller "
                "epsilon"
            )
        return rho

    def _check_context(self, question: str) -> None:
        """Refuses, from public lengths only, a question whose prompts could overflow."""
        limit = getattr(self.lm, "max_context", None)
        if limit is None:
            return
        c = self.config  # every private prompt holds up to documents_per_voter documents
        g = c.documents_per_voter
        longest = len(self.prompt.encode(self.lm, question, [[0]] * g)) + g * (
            c.max_document_tokens - 1
        )
        decoded = max(c.max_tokens, c.voter_tokens)  # keywords' voters decode voter_tokens
        if longest + decoded > limit:
            raise ValueError(
                f"question too long for the LM context: up to {longest} prompt tokens + "
                f"{decoded} answer tokens > {limit}"
            )

    def _charge(self, tenant, plan: AnswerPlan, ref, documents=None) -> tuple[StageCharge, ...]:
        """Charges the plan's worst case, stage by stage, in one transaction; in collection
        accounting that transaction also holds the collection cap to one answer event (its
        pinned shape, pinned there if none is), so a caller varying the event adaptively
        never composes under a cap what its accountant does not cover."""
        stages = plan.stage_events()
        if self.payer is None:
            return tuple(StageCharge(s, *_standalone(e, plan.delta)) for s, e in stages)
        recorded = self.payer.charge_all(
            tenant,
            [(f"rag-{s}", event, f"rag answer ({plan.mechanism})") for s, event in stages],
            relation=RELATION,
            delta=plan.delta,
            ref=ref,
            documents=documents,
            event_shape=None if self.config.individual else answer_event_shape(plan),
        )
        return tuple(
            StageCharge(stage, c.epsilon, c.delta) for (stage, _), c in zip(stages, recorded)
        )

    @property
    def document_kv(self):
        """The collection's precomputed keys and values (None: not cached), to pass as
        `document_cache` to another `DPRag` over the same documents, LM and prompt."""
        return self._kv

    def _document_facts(self):
        """Every document's typed facts (`fact_vote.document_facts`), computed at the first
        facts answer (under the answer lock), kept in memory only."""
        if self._facts is None:
            self._facts = document_facts(self.texts)
        return self._facts

    def _read_texts(self, indices: np.ndarray, weights: np.ndarray) -> list[str]:
        """The text each document row reads (cut as its prompt holds it), padding rows left
        out as `voter_answers` leaves them out (microseconds of Python work per selected
        document, as `sessions.build_rows`'s joining of groups)."""
        width = self.config.max_document_tokens
        texts = []
        for row, w in zip(indices, weights, strict=True):
            if w:
                group = np.atleast_1d(row)
                texts.append(
                    "\n".join(self.lm.decode(self._tokens[int(i)][:width]) for i in group if i >= 0)
                )
        return texts

    def _rows(self, question: str, indices: np.ndarray, weights: np.ndarray) -> PromptRows:
        return build_rows(
            self.lm, self.prompt, question, self._tokens, indices, weights, self.config, self._kv
        )


def _standalone(event, delta: float) -> tuple[float, float]:
    if isinstance(event, accounting.EpsilonDeltaDpEvent):
        return event.epsilon, event.delta
    return accounting.epsilon(event, delta), delta


def _check_config(config: RagConfig, payer: CollectionPayer | None, num_documents: int) -> None:
    """Refuses a per-answer delta of at least 1/n for n documents (it allows releasing one
    document outright; DP-SGD's configs refuse it too) and an accounting mode the payer's
    collection is not in (`check_individual`)."""
    if not config.delta < 1.0 / max(num_documents, 1):
        raise ValueError(
            f"the per-answer delta must be below 1/n for n = {num_documents} documents: "
            f"{config.delta=}"
        )
    check_individual(config, payer)
