"""The answer stage end to end on the byte-level test LM: plans, refusals, per-stage charges."""

import numpy as np
import pytest

from retriever.rag import DPRag, PromptFormat, RagConfig, ScoreRange, make_plan
from synthgen.lm_backends import TinyLM
from synthgen.privacy import BudgetExceededError, PrivacyLedger, Scope, accounting

N = 24


class SpyLM(TinyLM):
    """TinyLM that records every prompt row it is given."""

    def __init__(self, seen=None):
        super().__init__()
        self.seen = [] if seen is None else seen

    def fork(self):
        return SpyLM(self.seen)

    def start(self, prompts, max_new_tokens):
        self.seen.extend(self.decode(p) for p in prompts)
        return super().start(prompts, max_new_tokens)


def _collection(seed=0):
    rng = np.random.default_rng(seed)
    emb = rng.normal(size=(N, 8))
    emb /= np.linalg.norm(emb, axis=1, keepdims=True)
    texts = [f"secret-{i} the answer is blue" for i in range(N)]
    return [f"d{i}" for i in range(N)], texts, emb.astype(np.float32)


def _rag(tmp_path, *, cap=10.0, score_share=0.0, seed=0, accountant="pld"):
    ids, texts, emb = _collection()
    ledger = PrivacyLedger(tmp_path / "ledger.sqlite")
    ledger.ensure_scope(Scope("alice", "records", cap, 1e-5, accountant=accountant))
    lm = SpyLM()
    rag = DPRag(
        ids,
        texts,
        emb,
        lambda qs: emb[:1],  # the question looks like document 0
        lm,
        ledger=ledger,
        dataset="records",
        config=RagConfig(
            k=4, max_tokens=5, score_range=ScoreRange(-1.0, 1.0), score_share=score_share
        ),
        prompt=PromptFormat(chat=False),
        rng=np.random.default_rng(seed),
    )
    return rag, ledger, lm


@pytest.mark.parametrize("mechanism", ["icl", "vote", "sparse-vote"])
@pytest.mark.parametrize("composition", ["pure", "bounded-range"])
def test_plan_worst_case_within_target(mechanism, composition):
    plan = make_plan(mechanism, 3.0, delta=1e-6, max_tokens=8, composition=composition)
    total = plan.worst_case_epsilon()
    assert total <= 3.0 * (1 + 1e-6)
    assert total >= 2.9  # the split uses the budget, not a fraction of it
    assert plan.retrieval_epsilon == pytest.approx(0.3)


@pytest.mark.parametrize("mechanism", ["icl", "vote", "sparse-vote"])
def test_answer_charges_each_stage_once(tmp_path, mechanism):
    rag, ledger, lm = _rag(tmp_path, score_share=0.05)
    answer = rag.answer("what is the answer?", tenant="alice", epsilon=2.0, mechanism=mechanism)
    charges = ledger.charges("alice", "records")
    stages = [c.stage for c in charges]
    assert stages[0] == "rag-retrieval" and stages[-1] == "rag-score"
    assert [c.stage for c in answer.charges] == [s.removeprefix("rag-") for s in stages]
    assert answer.epsilon <= 2.0 * (1 + 1e-6)
    assert answer.remaining_epsilon == pytest.approx(
        ledger.spent("alice", "records").epsilon_remaining
    )
    assert answer.selected_count is not None and answer.confidence is not None
    assert len({c.ref.split("/")[0] for c in charges}) == 1  # one release, one transaction
    # only the public prompt or selected documents entered a prompt; never a raw id
    assert all("d1" not in row.split() for row in lm.seen)


def test_refusal_changes_nothing(tmp_path):
    rag, ledger, lm = _rag(tmp_path, cap=1.0)
    rng_state = rag._rng.bit_generator.state
    with pytest.raises(BudgetExceededError):
        rag.answer("what is the answer?", tenant="alice", epsilon=5.0, mechanism="icl")
    assert ledger.charges("alice", "records") == []
    assert rag._rng.bit_generator.state == rng_state  # no noise drawn
    assert lm.seen == []  # no prompt built, so no document text left the collection


def test_budget_runs_out(tmp_path):
    rag, ledger, _ = _rag(tmp_path, cap=2.5)
    rag.answer("q?", tenant="alice", epsilon=2.0, mechanism="vote")
    before = ledger.charges("alice", "records")
    with pytest.raises(BudgetExceededError):
        rag.answer("q?", tenant="alice", epsilon=2.0, mechanism="vote")
    assert ledger.charges("alice", "records") == before


def test_sparse_vote_pays_only_released_tokens(tmp_path):
    rag, ledger, _ = _rag(tmp_path, accountant="basic")  # a privacy filter: sound
    plan = rag.plan("sparse-vote", 3.0)
    answer = rag.answer("q?", tenant="alice", epsilon=3.0, mechanism="sparse-vote")
    charged = {c.stage: c for c in ledger.charges("alice", "records")}
    assert answer.paid_tokens <= plan.max_releases
    if answer.paid_tokens:
        gate = accounting.event_from_json(charged["rag-gate"].event)
        assert gate.count == answer.paid_tokens
    else:
        assert "rag-gate" not in charged and "rag-tokens" not in charged
    # the realized charge is never more than the reserved worst case
    assert answer.epsilon <= plan.worst_case_epsilon() + 1e-9


def test_sparse_vote_free_when_voters_agree_with_public(tmp_path):
    """Documents that add nothing: voters agree with the public LM, the gate stays shut."""
    ids, _, emb = _collection()
    ledger = PrivacyLedger(tmp_path / "ledger.sqlite")
    ledger.ensure_scope(Scope("alice", "records", 100.0, 1e-5, accountant="basic"))
    rag = DPRag(
        ids,
        ["" for _ in ids],  # empty documents: every voter's prompt equals the public one
        emb,
        lambda qs: emb[:1],
        TinyLM(),
        ledger=ledger,
        dataset="records",
        config=RagConfig(k=8, max_tokens=6, score_range=ScoreRange(-1.0, 1.0), gate_share=0.5),
        # ':' is followed by 'b' most often in every prompt, so all greedy votes agree
        prompt=PromptFormat(chat=False, instruction="a:b a:b a:b"),
        rng=np.random.default_rng(3),
    )
    answer = rag.answer("a:b", tenant="alice", epsilon=50.0, mechanism="sparse-vote")
    stages = [c.stage for c in ledger.charges("alice", "records")]
    assert answer.paid_tokens == 0
    assert "rag-gate" not in stages and "rag-tokens" not in stages
    assert stages == ["rag-retrieval", "rag-gate-open"]


def test_bad_requests(tmp_path):
    rag, ledger, _ = _rag(tmp_path)
    for question in ("", "   "):
        with pytest.raises(ValueError):
            rag.answer(question, tenant="alice", epsilon=1.0)
    with pytest.raises(ValueError):
        rag.answer("q?", tenant="alice", epsilon=1.0, mechanism="majority")
    with pytest.raises(ValueError):
        rag.answer("q?", tenant="alice", epsilon=-1.0)
    with pytest.raises(KeyError):
        rag.answer("q?", tenant="mallory", epsilon=1.0)
    assert ledger.charges("alice", "records") == []


def test_sparse_vote_in_a_pld_scope_pays_its_worst_case_before_noise(tmp_path):
    rag, ledger, _ = _rag(tmp_path)
    plan = rag.plan("sparse-vote", 3.0)
    answer = rag.answer("q?", tenant="alice", epsilon=3.0, mechanism="sparse-vote")
    charged = {c.stage: c for c in ledger.charges("alice", "records")}
    assert accounting.event_from_json(charged["rag-gate"].event).count == plan.max_releases
    assert answer.epsilon == pytest.approx(plan.worst_case_epsilon())


def test_inconsistent_collection_is_refused():
    ids, texts, emb = _collection()
    with pytest.raises(ValueError):
        DPRag(ids[:-1], texts, emb, lambda q: emb[:1], TinyLM())
    bad = emb.copy()
    bad[3, 0] = np.nan
    with pytest.raises(ValueError):
        DPRag(ids, texts, bad, lambda q: emb[:1], TinyLM())
