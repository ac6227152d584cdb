"""`dpsynth.evaluation.single_fact_eval`: one DP answer per question over a list of documents.

The default assets are replaced by the byte-level TinyLM and a hashing encoder (no download,
no network): the test checks the plumbing (one answer per question, `retriever answer`'s
k and mechanism), not the accuracy, which `python -m dpsynth.evaluation.single_fact_eval`
measures with the real assets.
"""

from __future__ import annotations

import numpy as np

from dpsynth.evaluation import single_fact_eval
from dpsynth.evaluation.fact_world import make_world
from synthgen.lm_backends import TinyLM


class _HashEncoder:
    def encode(self, texts, **kwargs):
        out = np.zeros((len(texts), 16), np.float32)
        for row, text in enumerate(texts):
            for word in text.lower().split():
                out[row, sum(word.encode()) % 16] += 1.0
        return out / np.maximum(np.linalg.norm(out, axis=1, keepdims=True), 1e-6)


def test_each_question_gets_one_answer_with_the_cli_defaults(monkeypatch):
    world = make_world("people", facts_per_level=1)
    encoder = _HashEncoder()
    monkeypatch.setitem(
        single_fact_eval._LOADED, single_fact_eval.DEFAULT_ENCODER, (encoder, encoder)
    )
    monkeypatch.setitem(single_fact_eval._LOADED, single_fact_eval.DEFAULT_LM, TinyLM())
    rag, mechanism = single_fact_eval.make_single_rag(world.documents, 5.0, seed=0)
    assert mechanism == "facts" and rag.config.k == 64 and rag.config.max_tokens == 12
    questions = [q.question for q in world.questions[:2]]
    answers = single_fact_eval.single_answers(world.documents, questions, 5.0, seed=0)
    assert len(answers) == 2 and all(isinstance(a, str) and a for a in answers)
    # epsilon 10: `retriever answer`'s auto is facts again (not icl, which answered 0)
    rag, mechanism = single_fact_eval.make_single_rag(world.documents, 10.0, seed=0)
    assert mechanism == "facts" and rag.config.k == 64
    # the facts answers are the typed facts' values, whatever the LM (a byte-level one here)
    people = make_world("people", seed=0)
    asked = [q for q in people.questions if q.support == 50]
    answers = single_fact_eval.single_answers(
        people.documents, [q.question for q in asked], 10.0, seed=0
    )
    right = [a for a, q in zip(answers, asked, strict=True) if q.answer in a]
    assert len(right) >= len(asked) - 1, (answers, [q.answer for q in asked])
