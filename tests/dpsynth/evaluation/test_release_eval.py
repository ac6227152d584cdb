"""`dpsynth.evaluation.release_eval`: the stream cells that pay nothing per answer."""

from __future__ import annotations

import json

import numpy as np
import pytest

from dpsynth.evaluation.medical_world import MedicalWorldConfig, make_world
from dpsynth.evaluation.release_eval import (
    accuracy_by_support,
    answer_stream,
    retrieval_answerer,
    support_bin,
)
from dpsynth.evaluation.stream_eval import zipf_stream

WORLD = make_world(MedicalWorldConfig(num_diseases=4, num_records=60, seed=2))


def test_support_bins_cover_every_support():
    assert [support_bin(s) for s in (1, 4, 5, 29, 30, 100, 10**6)] == [
        "1-4", "1-4", "5-14", "15-29", "30-99", "100+", "100+"
    ]  # fmt: skip
    with pytest.raises(ValueError):
        support_bin(0)


def test_a_repeated_question_is_answered_once_and_the_stream_resumes(tmp_path):
    stream = zipf_stream(WORLD, 40, seed=0)
    calls = []

    def answer(question):
        calls.append(question)
        return WORLD.diseases[0].name

    rows = answer_stream("c", answer, stream, out_dir=tmp_path, others=[], progress=False)
    assert len(rows) == 40 and len(calls) == len({q.question for q in stream})
    assert [r["correct"] for r in rows] == [q.disease == WORLD.diseases[0].name for q in stream]
    path = tmp_path / "c.jsonl"
    path.write_text("".join(path.read_text().splitlines(True)[:25]) + '{"cut')  # interrupted
    calls.clear()
    again = answer_stream("c", answer, stream, out_dir=tmp_path, others=[], progress=False)
    assert [json.dumps(r, sort_keys=True) for r in again[:25]] == [
        json.dumps(r, sort_keys=True) for r in rows[:25]
    ]
    assert len(again) == 40 and set(calls) <= {q.question for q in stream[25:]}
    by = accuracy_by_support(again)
    assert set(by) == {"1-4", "5-14", "15-29", "30-99", "100+"}


def test_retrieval_answerer_reads_the_top_k_records():
    class Lm:
        eos_ids = (0,)

        def encode(self, text, bos=False):
            return [ord(c) % 250 + 1 for c in text]

        def decode(self, ids):
            return "".join(chr(i) for i in ids)

        def start(self, prompts, max_new):
            self.prompt = prompts[0]
            out = np.full((1, 256), -10.0)
            out[0, 0] = 0.0
            return out

    class Prompt:
        def encode(self, lm, question, docs):
            seen.append(len(docs))
            return [1]

    seen = []
    vectors = np.eye(3)
    answer = retrieval_answerer(Lm(), Prompt(), ["a", "b", "c"], vectors,
                                lambda qs: np.array([[0.0, 1.0, 0.0]]), k=2)  # fmt: skip
    assert answer("q") == "" and seen == [2]
    nothing = retrieval_answerer(Lm(), Prompt(), [], None, lambda qs: None, k=0)
    assert nothing("q") == "" and seen == [2, 0]


def test_the_dp_rag_evaluations_references_run(tmp_path):
    """evaluate_world's no-rag and non-private rag cells (the references every DP cell and
    the network demo are read against) answer on the tiny LM."""
    from dpsynth.evaluation.rag_eval import EvalConfig, evaluate_world
    from retriever.rag import DPRag, RagConfig, ScoreRange
    from synthgen.lm_backends import TinyLM

    texts = [r.text for r in WORLD.records]
    vectors = np.random.default_rng(0).normal(size=(len(texts), 8))
    config = RagConfig(k=4, max_tokens=3, score_range=ScoreRange(-10.0, 10.0))
    rag = DPRag([r.doc_id for r in WORLD.records], texts, vectors,
                lambda qs: np.ones((len(qs), 8)), TinyLM(), config=config)  # fmt: skip
    out = evaluate_world(WORLD, WORLD.questions(), rag,
                         EvalConfig(epsilons=(), mechanisms=()), tmp_path)  # fmt: skip
    assert set(out) == {"no-rag", "rag"} and all(len(v) == 4 for v in out.values())


def test_the_references_run_on_sparse_term_overlap_vectors(tmp_path):
    """make_rag(encoder="overlap") keeps the document matrix sparse; the non-private rag
    cell reads each question's top records from it, a question vector at a time."""
    from scipy import sparse

    from dpsynth.evaluation.rag_eval import EvalConfig, evaluate_world, make_rag
    from retriever.lexical import WIDTH
    from retriever.rag import RagConfig, ScoreRange
    from synthgen.lm_backends import TinyLM

    config = RagConfig(k=4, max_tokens=3, score_range=ScoreRange(0.0, 1.0))
    rag = make_rag(WORLD, tmp_path, lm=TinyLM(), encoder="overlap", config=config)
    assert sparse.issparse(rag.embeddings) and rag.embeddings.shape == (len(WORLD.records), WIDTH)
    out = evaluate_world(WORLD, WORLD.questions(), rag,
                         EvalConfig(epsilons=(), mechanisms=()), tmp_path)  # fmt: skip
    assert set(out) == {"no-rag", "rag"} and all(len(v) == 4 for v in out.values())
