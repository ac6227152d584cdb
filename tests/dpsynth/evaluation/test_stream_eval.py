"""The multi-question stream: Zipf draws that extend, summaries that count refusals and
abstentions as wrong, and a resumed stream that answers only what is missing."""

from collections import Counter

import numpy as np
import pytest

from dpsynth.evaluation.medical_world import MedicalWorldConfig, make_world
from dpsynth.evaluation.stream_eval import (
    run_stream,
    single_answer_accuracy,
    stream_summary,
    zipf_stream,
)
from synthgen.privacy import BudgetExceededError

WORLD = make_world(MedicalWorldConfig(num_diseases=8, num_records=120, seed=1))


def test_zipf_stream_extends_and_favours_the_most_recorded_diseases():
    long, short = zipf_stream(WORLD, 400, seed=3), zipf_stream(WORLD, 50, seed=3)
    assert long[:50] == short
    counts = Counter(q.disease for q in long)
    top = max(WORLD.support, key=lambda d: (WORLD.support[d], d))
    assert counts.most_common(1)[0][0] == top
    assert len({q.question for q in long if q.disease == top}) > 1  # paraphrases
    uniform = Counter(q.disease for q in zipf_stream(WORLD, 400, exponent=0.0, seed=3))
    assert max(uniform.values()) < counts[top]
    with pytest.raises(ValueError):
        zipf_stream(WORLD, 0)


def test_summary_counts_refusals_and_abstentions_as_wrong():
    rows = [
        {"correct": True, "refused": False, "abstained": False},
        {"correct": False, "refused": False, "abstained": True},
        {"correct": False, "refused": True, "abstained": False},
        {"correct": False, "refused": True, "abstained": False},
    ]
    summary = stream_summary(rows, window=2)
    assert summary["answered"] == 2 and summary["refused"] == 2 and summary["abstained"] == 1
    assert summary["accuracy"] == 0.25 and summary["accuracy_first"] == 0.5
    assert summary["accuracy_last"] == 0.0 and summary["accuracy_answered"] == 0.5


class _Answer:
    def __init__(self, text):
        self.text, self.abstained, self.reused = text, False, False


class _ScriptedRag:
    """Answers with the disease's name until `budget` answers, then refuses."""

    class config:  # noqa: N801 - mimics RagConfig's attribute
        individual = False

    def __init__(self, budget):
        self.budget, self.asked = budget, []

    def answer(self, question, *, tenant, epsilon):
        self.asked.append(question)
        if len(self.asked) > self.budget:
            raise BudgetExceededError("spent")
        disease = next(q.disease for q in STREAM if q.question == question)
        return _Answer(disease)


STREAM = zipf_stream(WORLD, 12, seed=0)


def test_a_resumed_stream_answers_only_the_missing_questions(tmp_path):
    others = [d.name for d in WORLD.diseases]
    first = _ScriptedRag(budget=5)
    rows = run_stream(
        "s", first, STREAM[:7], epsilon=1.0, out_dir=tmp_path, others=others, progress=False
    )
    assert [r["refused"] for r in rows] == [False] * 5 + [True] * 2
    assert all(r["correct"] for r in rows[:5])
    with (tmp_path / "s.jsonl").open("a") as f:
        f.write('{"index": 7, "cut')  # an interrupted write
    second = _ScriptedRag(budget=0)
    rows = run_stream(
        "s", second, STREAM, epsilon=1.0, out_dir=tmp_path, others=others, progress=False
    )
    assert len(second.asked) == 5 and len(rows) == 12
    assert stream_summary(rows)["answered"] == 5
    assert np.all([r["index"] for r in rows] == np.arange(12))


def test_single_answer_accuracy_is_weighted_by_the_stream():
    top = STREAM[0].disease  # the stream asks some diseases more than others
    cells = [{"disease": top, "correct": True}, {"disease": "Nothing asked", "correct": False}]
    single = single_answer_accuracy(cells, STREAM)
    share = sum(q.disease == top for q in STREAM) / len(STREAM)
    assert single == {"uniform": 0.5, "stream_mix": share, "diseases": 2}
    assert 0.5 != share  # the weighting matters here


class _ReusingRag(_ScriptedRag):
    """Answers like `_ScriptedRag`, marking a question asked before as reused."""

    def answer(self, question, *, tenant, epsilon):
        again = question in self.asked
        answer = super().answer(question, tenant=tenant, epsilon=epsilon)
        answer.reused = again
        return answer


def test_reused_answers_are_recorded_and_counted(tmp_path):
    others = [d.name for d in WORLD.diseases]
    rows = run_stream(
        "r", _ReusingRag(budget=100), STREAM, epsilon=1.0, out_dir=tmp_path, others=others,
        progress=False,
    )  # fmt: skip
    repeats = len(STREAM) - len({q.question for q in STREAM})
    assert repeats > 0 and sum(r["reused"] for r in rows) == repeats
    assert stream_summary(rows)["reused"] == repeats
