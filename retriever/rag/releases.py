"""The release loops of a DP-RAG answer, one per mechanism, and the score release.

`retriever.rag.answer.DPRag` selects the documents and builds the answer's rows
(`retriever.rag.sessions.PromptRows`, a fixed public shape); each loop here then releases the
answer from those rows and returns ``(tokens or text, paid releases, stages, abstained)``,
where ``stages`` are the DP events of the answer (`DPRag` charges the plan's worst case,
these events, before any noise is drawn). Every loop runs a public number of steps
(`AnswerPlan.max_tokens`) or stops at the public deadline; nothing else ends it early but a
released token.

Privacy:
  Unit: one document of the private collection (add/remove-one); the rows are the selected
  documents' prompts, each document in at most one row.

  * ``icl``: one DP in-context token per step from the rows' next-token distributions
    against the public prompt's (`retriever.rag.aggregation.dp_icl_token`, capped
    sensitivity); the public prompt's greedy token decides abstention (post-processing).
  * ``keywords``: one DP partition selection over the words the rows' answers share
    (`keyword_vote.release_answer_keywords`); the public LM then answers from the question
    and the released keywords only (post-processing).
  * ``facts``: not over the rows: one DP partition selection over the values every
    document's own typed facts give for the question (`retriever.rag.fact_vote`; one
    document is one voter, no cap shared with others, so no group step).
  * ``score``: (count, sum of normalised scores) of the selection through the Laplace
    mechanism (see `score`).

Each mechanism's own argument (sensitivity, calibration, references) is in the docstring of
the module that implements it: `retriever.rag.aggregation`, `retriever.rag.keyword_vote`,
`retriever.rag.fact_vote`; the score's is in `score` below.
"""

from __future__ import annotations

import numpy as np

from retriever.rag.aggregation import dp_icl_token
from retriever.rag.config import RagConfig
from retriever.rag.fact_vote import fact_vote
from retriever.rag.greedy import greedy_answer
from retriever.rag.keyword_vote import final_answer, keyword_document, release_answer_keywords
from retriever.rag.plan import AnswerPlan
from retriever.rag.prompts import PromptFormat
from retriever.rag.sessions import Deadline, PromptRows, Sessions, usable_rows
from synthgen.privacy import laplace_mechanism


def icl(lm, public_lm, config: RagConfig, rows: PromptRows, plan: AnswerPlan, rng, clock: Deadline):
    """(tokens, paid, stages, abstained); abstains when every released token is the
    public prompt's greedy token (the documents never moved the draw)."""
    tokens: list[int] = []
    moved = False
    session = Sessions(lm, public_lm, rows, plan.max_tokens)
    for _ in range(plan.max_tokens):
        if clock.check():
            break
        private, weights = usable_rows(session.private, rows.weights)
        token = dp_icl_token(
            private,
            session.public[0],
            epsilon=plan.token_epsilon,
            config=config.aggregation,
            rng=rng,
            weights=weights,
            capped=True,
        )
        moved = moved or token != int(np.argmax(session.public[0]))
        if token in lm.eos_ids:
            break
        tokens.append(token)
        session.append(token, last=len(tokens) == plan.max_tokens)
    stages = [("tokens", plan.token_block_event(plan.max_tokens))]
    return tokens, plan.max_tokens, stages, not moved


def voter_answers(
    lm, rows: PromptRows, plan: AnswerPlan, clock: Deadline, steps: int | None = None
) -> list[str]:
    """Each voter's own greedy answer (private; keywords' voters): the best `config.voters`
    selected documents decode all `steps` (default `max_tokens`) steps whatever they say (the
    loop's length is public); padding rows decode too and are left out of the result."""
    steps = plan.max_tokens if steps is None else steps
    answers: list[list[int]] = [[] for _ in rows.prompts]
    logprobs = rows.start(lm, steps)
    ended = np.zeros(len(rows.prompts), bool)
    for step in range(steps):
        if clock.check():
            break
        greedy = np.argmax(logprobs, axis=1)
        for row, token in enumerate(greedy):
            ended[row] |= int(token) in lm.eos_ids
            if not ended[row]:
                answers[row].append(int(token))
        if step + 1 < steps:
            logprobs = lm.append([int(t) for t in greedy])
    texts = [lm.decode(a) for a in answers]
    return [text for text, w in zip(texts, rows.weights, strict=True) if w]


def keywords(
    lm,
    public_lm,
    config: RagConfig,
    prompt: PromptFormat,
    question: str,
    rows: PromptRows,
    plan: AnswerPlan,
    clock: Deadline,
    documents: list[str] | None = None,
):
    """(answer text, paid, stages, abstained): the keywords many voters' answers share
    (`keyword_vote.release_answer_keywords`, one partition selection; `documents`: the
    text each document row read, for its relevance and spelling checks), then the public
    LM's greedy answer from the question and those keywords only (post-processing);
    nothing released: the answer abstains."""
    keywords = release_answer_keywords(
        voter_answers(lm, rows, plan, clock, config.voter_tokens),
        epsilon=plan.token_epsilon,
        delta=plan.token_delta,
        max_keywords=config.answer_keywords,
        question=question,
        word_tokens=lambda word: len(public_lm.encode(" " + word)),
        documents=documents,
    )
    stages = [("tokens", plan.token_block_event(1))]
    if not keywords:
        return "", 1, stages, True
    # public inputs only: the public session, the document cut to the public bound
    # `DPRag._check_context` sized every prompt for
    document = public_lm.encode(keyword_document(keywords))[: config.max_document_tokens]
    text = greedy_answer(public_lm, prompt.encode(public_lm, question, [document]), plan.max_tokens)
    return final_answer(text, keywords), 1, stages, False


def facts(document_facts, question: str, config: RagConfig, plan: AnswerPlan):
    """(answer text, paid, stages, abstained): the value the documents' typed facts give
    for the question (`fact_vote.fact_vote`, one partition selection over every document
    at the plan's per-release (epsilon, delta), K = `config.answer_keywords`); nothing
    released, or no value ahead of the second by the gap: the answer abstains."""
    value, _ = fact_vote(
        document_facts,
        question,
        epsilon=plan.token_epsilon,
        delta=plan.token_delta,
        max_votes=config.answer_keywords,
    )
    stages = [("tokens", plan.token_block_event(1))]
    return ("", 1, stages, True) if value is None else (value, 1, stages, False)


def score(config: RagConfig, scores, selected, epsilon: float, rng) -> tuple[float, float]:
    """Noisy (count, mean similarity) of the selected documents.

    Privacy: (count, sum of normalised scores in [0, 1]) has L1 sensitivity 2 under
    add/remove-one given the threshold; Laplace(2 / epsilon) per coordinate is
    epsilon-DP (Dwork et al. 2006). The mean is post-processing.
    """
    normalised = config.score_range.normalise(scores)
    count, total = laplace_mechanism(
        np.array([selected.sum(), normalised @ selected]),
        sensitivity=2.0,
        epsilon=epsilon,
        rng=rng,
    )
    mean = float(np.clip(total / count, 0.0, 1.0)) if count >= 1 else 0.0
    return float(max(count, 0.0)), mean
