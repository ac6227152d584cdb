"""The DP-RAG answer stage: one object from a question to a charged, private answer.

`DPRag` holds the private collection (texts and their embeddings), the question encoder,
the LM and the collection's payer (`synthgen.privacy.receipts.CollectionPayer`: it charges
this collection's answers to the tenant that asks, and nothing else; the answer stage never
holds the ledger). `answer(question, tenant=, epsilon=, mechanism=)`:

1. plans the answer (`retriever.rag.plan`) and asks the payer whether its worst case fits
   the tenant's remaining budget: a refused request draws no noise and puts no document in
   any prompt;
2. scores the question against every private document (exact inner products) and draws
   the DP threshold (`retriever.rag.retrieval`); only the selected documents' text enters
   prompts;
3. releases the answer through the chosen mechanism (the loops are in
   `retriever.rag.releases`): token by token (icl), with one batched KV-cache step per
   token for all private prompts and a separate session for the public prompt
   (`retriever.rag.aggregation`), or once per answer over the keywords of the voters' own
   answers (keywords, `retriever.rag.keyword_vote`), or once over the typed facts every
   document states (facts, `retriever.rag.fact_vote`: no LM reads a document; a question no
   kind rule reads is answered by keywords at the same event); an answer the private
   documents did not move abstains with `ABSTENTION_TEXT` (post-processing);
4. optionally releases a confidence score through the Laplace mechanism.

Every stage of the plan's worst case is charged in one ledger transaction after step 1 and
before any noise is drawn in steps 2-4.

Under individual (per-document) accounting the payers are chosen and charged first
(`retriever.rag.individual.answer_individually`), then steps 3-4 run at the same shape.

Nothing returned (text, noisy count and score, charges) depends on the collection except
through these mechanisms; no document id, raw score, logit or text is returned or logged.

Time and memory are outputs too (Privacy rule 9). Every answer runs at one public shape:
the private session always holds `RagConfig.voters` rows (the best-scored selected
documents, then padding rows holding the public prompt and a public filler document,
masked out of every count and sum), every prompt is padded to the public length of a
prompt with a document of `max_document_tokens` tokens, and the loops run the public
number of steps. How many documents the threshold selected (not DP) sets neither the batch,
the compiled program nor the loop counts. The fixed shape also makes a row's numerics
independent of which other rows share its batch, so one document cannot flip another
voter's argmax through float rounding. The selection itself is a partition over all N
scores (`retrieval.best_selected`), documents are tokenized once at construction, and a
row that is not a distribution (a numerical fault) counts as padding instead of failing
the answer; the score stage sums over all N with the selection as a mask. Remote LM
backends (`synthgen.openai_backend`) ignore the padding: their timing is the server's,
and a server's prefix cache would serve the identical padding rows faster than documents,
so the latency of a remote answer can reveal M.
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
from retriever.rag.answer_types import ABSTENTION_TEXT, Answer, AnswerFailedError, StageCharge
from retriever.rag.config import RagConfig, plan_answer
from retriever.rag.fact_vote import document_facts
from retriever.rag.individual import answer_individually, check_individual
from retriever.rag.plan import AnswerPlan
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

RELATION = "ADD_OR_REMOVE_ONE"


class DPRag:
    """Answers questions over a private collection with DP, charged to a tenant's budget.

    Args:
      doc_ids: ids of the private documents (never released).
      texts: their texts.
      embeddings: [N, D] document embeddings, a numpy array or a scipy.sparse matrix
        (kept sparse: `retriever.lexical.OverlapEncoder`'s hashed term vectors); inner
        products with the question embedding are the similarity scores.
      encode_question: maps a list of questions to [B, D] embeddings.
      lm: a `synthgen.lm_backends.NextTokenLM` with `fork()`.
      payer: the collection's payer (`synthgen.privacy.receipts.collection_payer(ledger,
        name)`; None: nothing charged, for experiments only).
      config: public parameters.
      prompt: prompt format.
      rng: tests only; production draws a fresh OS-entropy generator per answer.
      answers: released answers to hand out again when the same question is asked at
        the same event (`retriever.rag.reuse.ReleasedAnswers`; None: every question is
        answered and charged).
      document_cache: True to compute every document's keys and values once, here (an
        LM with `document_kv`, e.g. `FlaxLM`; about 3 MB per document for SmolLM2-135M
        at 64 tokens), so an answer runs only the question after them (SmolLM2-135M, 32
        rows: the prefill goes from 12 s to 3 s). Every document is computed before any
        answer, so an answer's work does not depend on which it reads. Used while
        `config.max_document_tokens` is the width it was built with. Or another DPRag's
        `document_kv` over the same documents, LM parameters and prompt (checked by a
        digest of the documents' token ids). The keys derive from the private documents:
        memory only, never saved or logged.

    Privacy:
      Privacy unit: one document of the private collection (add/remove-one). Each answer
      is (epsilon, delta)-DP for the requested epsilon and the config's delta: the
      threshold, the tokens and the score are DP mechanisms composed by the plan
      (`retriever.rag.plan`), and everything else is post-processing of their outputs.
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
        _check_delta(config, len(doc_ids))
        check_individual(config, payer)
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
        self._kv = self._document_kv(document_cache) if document_cache else None
        self.answers = answers
        self._facts = None  # private: the documents' typed facts (`_document_facts`)

    def with_config(self, config: RagConfig) -> DPRag:
        """The same collection, encoder, LM sessions, payer and lock under `config`."""
        _check_delta(config, len(self.doc_ids))
        check_individual(config, self.payer)
        other = copy.copy(self)
        other.config = config
        return other

    # ---- planning and budget --------------------------------------------------------

    def plan(self, mechanism: str, epsilon: float) -> AnswerPlan:
        return plan_answer(self.config, mechanism, float(epsilon))

    def validate(self, question: str, mechanism: str, epsilon: float) -> AnswerPlan:
        """The answer's plan, or ValueError for what `answer` refuses before any charge
        (empty question, bad epsilon or mechanism, a question too long for the LM's
        context); decided from public lengths and parameters only."""
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
        """Read-only: whether the tenant's scopes admit `plan`'s worst case (raises
        BudgetExceededError, KeyError without a scope, UnsupportedEventError when its
        accountant cannot compose the event)."""
        self.payer.check(
            tenant,
            stage="rag-answer",
            event=plan.worst_case_event(),
            relation=RELATION,
            delta=plan.delta,
        )

    def remaining(self, tenant: str) -> float | None:
        if self.payer is None:
            return None
        return self.payer.remaining(tenant)

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
        budget check (post-processing of a release).

        `deadline` (a `time.monotonic()` instant) bounds the answer's wall time: once it
        passes, no further token is decoded and the answer returns `truncated` (charged
        as planned). Every step has the same public shape, so when the deadline strikes
        does not depend on the collection.

        Raises:
          BudgetExceededError: the answer's worst case does not fit the tenant's remaining
            budget; raised before any noise is drawn or any document enters a prompt.
          ValueError: an empty question, a bad epsilon or mechanism, or a question too
            long for the LM's context (decided from public lengths only).
          AnswerFailedError: the answer failed after its budget check; it was charged its
            worst case, and nothing was released (the failure's text is withheld).

        Privacy:
          Privacy unit: one document (add/remove-one). The answer is (epsilon, delta)-DP
          with delta = config.delta: the plan's worst case composes to at most `epsilon`
          (PLD). Every answer (icl, keywords, facts) is charged that worst case before
          any noise is drawn.
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
        stages = plan.stage_events()
        ref = secrets.token_hex(16) if self.payer is not None else None
        if self.payer is not None:
            self.check_budget(tenant, plan)
        # every event is fixed by the plan: charged before any noise is drawn
        charges = self._charge(tenant, plan.mechanism, stages, plan.delta, ref)
        failed = False
        try:
            released = self._release(question, plan, deadline)
        except Exception:  # noqa: BLE001 - re-raised below without its private text
            failed = True
        if failed:  # outside the except block: the new error carries no context
            raise AnswerFailedError(
                "the answer failed after its budget check; it was charged its worst case "
                "and released nothing"
            )
        return self._assemble(tenant, plan, released, stages, charges, ref)

    def _assemble(self, tenant, plan, released, stages, charges, ref) -> Answer:
        """The `Answer` from the releases (post-processing) and the recorded charges."""
        tokens, paid, _, abstained, truncated, count, confidence = released
        mechanism = plan.mechanism
        total = accounting.epsilon(accounting.compose([e for _, e in stages]), plan.delta)
        if abstained:
            text = ABSTENTION_TEXT
        elif isinstance(tokens, str):  # keywords and facts release whole answer text
            text, tokens = tokens, self.lm.encode(tokens)
        else:
            text = clean_answer_text(self.lm.decode(tokens))
        return Answer(
            text=text,
            mechanism=mechanism,
            tokens=len(tokens),
            paid_tokens=paid,
            charges=charges,
            epsilon=total,
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
        """The mechanisms' releases: (tokens, paid, stages, abstained, truncated, noisy
        count, confidence); the stages are the plan's (`_answer` charges the plan's)."""
        rng = self._rng if self._rng is not None else secure_rng()
        scores = self._scores(question)
        tau = self._threshold(scores, plan.retrieval_epsilon, rng)
        c = self.config
        if c.documents_per_voter > 1:  # private: used only below
            buckets = self._id_hashes % c.voters
            selection = grouped_selected(
                scores, tau, buckets, c.voters, c.documents_per_voter, c.score_range
            )
        else:
            selection = best_selected(scores, tau, c.voters, c.score_range)
        released = self._decode(question, plan, scores, selection, rng, deadline)
        released[2].insert(0, ("retrieval", accounting.pure_epsilon_event(plan.retrieval_epsilon)))
        return released

    def _decode(self, question, plan: AnswerPlan, scores, selection, rng, deadline):
        """The token (and score) releases from a selection (indices, weights, selected):
        (tokens, paid, stages, abstained, truncated, noisy count, confidence)."""
        mechanism = plan.mechanism
        indices, weights, selected = selection
        rows = self._rows(question, indices, weights)
        clock = Deadline(deadline)
        lm, public, c = self.lm, self.public_lm, self.config
        if mechanism == "icl":
            tokens, paid, stages, abstained = releases.icl(lm, public, c, rows, plan, rng, clock)
        elif mechanism == "facts" and question_kinds(question):
            tokens, paid, stages, abstained = releases.facts(
                self._document_facts(), question, c, plan
            )
        elif mechanism in ("keywords", "facts"):  # facts: a question no kind rule reads
            read = self._read_texts(indices, weights)  # private: the voters' own texts
            tokens, paid, stages, abstained = releases.keywords(
                lm, public, c, self.prompt, question, rows, plan, clock, read
            )
        else:  # make_plan refuses any other mechanism
            raise ValueError(f"no release for mechanism {mechanism!r}")
        count = confidence = None
        if plan.score_epsilon > 0:
            count, confidence = releases.score(c, scores, selected, plan.score_epsilon, rng)
            stages.append(("score", accounting.laplace_event(plan.score_epsilon)))
        return tokens, paid, stages, abstained, clock.passed, count, confidence

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

    def _threshold(self, scores: np.ndarray, epsilon: float, rng) -> float:
        c = self.config
        if c.top_p is not None:
            return dp_top_p_threshold(scores, c.top_p, epsilon, rng, score_range=c.score_range)
        return dp_top_k_threshold(scores, c.k, epsilon, rng, score_range=c.score_range)

    def _charge(
        self, tenant, mechanism, stages, delta, ref, documents=None
    ) -> tuple[StageCharge, ...]:
        if self.payer is None:
            return tuple(StageCharge(stage, *_standalone(event, delta)) for stage, event in stages)
        recorded = self.payer.charge_all(
            tenant,
            [(f"rag-{stage}", event, f"rag answer ({mechanism})") for stage, event in stages],
            relation=RELATION,
            delta=delta,
            ref=ref,
            documents=documents,
        )
        return tuple(
            StageCharge(stage, c.epsilon, c.delta) for (stage, _), c in zip(stages, recorded)
        )

    @property
    def document_kv(self):
        """The collection's precomputed keys and values (None: not cached), to pass as
        `document_cache` to another `DPRag` over the same documents, LM and prompt."""
        return self._kv

    def _document_kv(self, given):
        return document_keys(self.lm, self.prompt, self._tokens, self.config, given)

    def _document_facts(self):
        """Every document's typed facts (`fact_vote.document_facts`), computed at the first
        facts answer (under the answer lock), kept in memory only."""
        if self._facts is None:
            self._facts = document_facts(self.texts)
        return self._facts

    def _read_texts(self, indices: np.ndarray, weights: np.ndarray) -> list[str]:
        """The text each document row reads (its documents cut to `max_document_tokens`
        tokens, as its prompt holds them), padding rows left out as `voter_answers`
        leaves them out. Python work that grows with the selected count (microseconds
        against the decoding), as `sessions.build_rows`'s joining of groups."""
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


def _check_delta(config: RagConfig, num_documents: int) -> None:
    """Refuses a per-answer delta of at least 1/n for n documents: a delta that large
    allows releasing one document outright (the rule DP-SGD's configs follow too)."""
    if not config.delta < 1.0 / max(num_documents, 1):
        raise ValueError(
            f"the per-answer delta must be below 1/n for n = {num_documents} documents: "
            f"{config.delta=}"
        )
