"""The release loops of a DP-RAG answer, one per mechanism, and the score release.

`DPRag` charges the plan's worst case, selects the documents and builds the answer's rows
(`sessions.PromptRows`, a fixed public shape); each loop here returns ``(tokens or text,
abstained)`` after a public number of steps, stopping early only at the public deadline or
on a released token.

Privacy:
  Unit: one document of the private collection (add/remove-one); the rows are the selected
  documents' prompts, each document in at most one row. The DP releases: icl, one capped
  `aggregation.dp_icl_token` per step; keywords, one partition selection over the words the
  rows' answers share (`keyword_vote.release_answer_keywords`); facts, one partition
  selection over the values every document's own typed facts give, not over the rows
  (`fact_vote`: one document is one voter, no shared cap, so no group step); the score,
  the Laplace mechanism (`score`). Abstention and the public LM's final text are
  post-processing. Each mechanism's argument is in the docstring of its module.
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
from retriever.rag.sessions import Deadline, PromptRows, usable_rows
from synthgen.privacy import laplace_mechanism


def icl(lm, public_lm, config: RagConfig, rows: PromptRows, plan: AnswerPlan, rng, clock: Deadline):
    """(tokens, abstained); abstains when every released token is the public prompt's
    greedy token (the documents never moved the draw)."""
    tokens: list[int] = []
    moved = False
    # the private rows' batched session (always the public shape), the public prompt's own
    private = rows.start(lm, plan.max_tokens)
    public = public_lm.start([rows.public], plan.max_tokens)
    for _ in range(plan.max_tokens):
        if clock.check():
            break
        usable, weights = usable_rows(private, rows.weights)
        token = dp_icl_token(
            usable,
            public[0],
            epsilon=plan.token_epsilon,
            config=config.aggregation,
            rng=rng,
            weights=weights,
            capped=True,
        )
        moved = moved or token != int(np.argmax(public[0]))
        if token in lm.eos_ids:
            break
        tokens.append(token)
        if len(tokens) < plan.max_tokens:  # else no next token is drawn: skip the step
            private, public = lm.append(token), public_lm.append(token)
    return tokens, not moved


def voter_answers(lm, rows: PromptRows, clock: Deadline, steps: int) -> list[str]:
    """Each voter's own greedy answer (private; keywords' voters): every row decodes all
    `steps` steps whatever it says (the loop's length is public); padding rows decode too
    and are left out of the result."""
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
    """(answer text, abstained): the keywords many voters' answers share (one partition
    selection; `documents`: the text each row read, for its relevance and spelling checks),
    then the public LM's greedy answer from the question and those keywords only
    (post-processing); nothing released: the answer abstains."""
    keywords = release_answer_keywords(
        voter_answers(lm, rows, clock, config.voter_tokens),
        epsilon=plan.token_epsilon,
        delta=plan.token_delta,
        max_keywords=config.answer_keywords,
        question=question,
        word_tokens=lambda word: len(public_lm.encode(" " + word)),
        documents=documents,
    )
    if not keywords:
        return "", True
    # public inputs only: the public session, the document cut to the public bound
    # `DPRag._check_context` sized every prompt for
    document = public_lm.encode(keyword_document(keywords))[: config.max_document_tokens]
    text = greedy_answer(public_lm, prompt.encode(public_lm, question, [document]), plan.max_tokens)
    return final_answer(text, keywords), False


def facts(document_facts, question: str, config: RagConfig, plan: AnswerPlan):
    """(answer text, abstained): the value every document's typed facts give for the
    question (`fact_vote.fact_vote` at the plan's per-release (epsilon, delta), K =
    `config.answer_keywords`); abstains when no value leads the second by the gap."""
    value, _ = fact_vote(
        document_facts,
        question,
        epsilon=plan.token_epsilon,
        delta=plan.token_delta,
        max_votes=config.answer_keywords,
    )
    return value or "", value is None


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
