"""The answer stage end to end on the byte-level test LM: plans, refusals, per-stage charges."""

import numpy as np
import pytest

from retriever.rag import (
    AggregationConfig,
    DPRag,
    PromptFormat,
    RagConfig,
    ScoreRange,
    make_plan,
)
from retriever.rag import releases as releases_module
from retriever.rag.answer_types import ABSTENTION_TEXT
from retriever.rag.text import unreadable_count
from synthgen.lm_backends import TinyLM
from synthgen.privacy import BudgetExceededError, PrivacyLedger, Scope, accounting
from synthgen.privacy.receipts import collection_payer
from tests.retriever.rag.recording_lm import RecordingLM

N = 24


class SpyLM(RecordingLM):
    """TinyLM that records every prompt row it is given."""

    def start(self, prompts, max_new_tokens, **kwargs):
        self.seen.extend(self.decode(p) for p in prompts)
        return super().start(prompts, max_new_tokens)


class SessionLM(RecordingLM):
    """TinyLM that records each session's decoded rows and its number of new tokens."""

    def start(self, prompts, max_new_tokens, **kwargs):
        self.seen.append(([self.decode(p) for p in prompts], max_new_tokens))
        return super().start(prompts, max_new_tokens, **kwargs)


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
        payer=collection_payer(ledger, "records"),
        config=RagConfig(
            k=4, max_tokens=5, score_range=ScoreRange(-1.0, 1.0), score_share=score_share
        ),
        prompt=PromptFormat(chat=False),
        rng=np.random.default_rng(seed),
    )
    return rag, ledger, lm


@pytest.mark.parametrize("mechanism", ["icl", "keywords", "facts"])
@pytest.mark.parametrize("composition", ["pure", "bounded-range"])
def test_plan_worst_case_within_target(mechanism, composition):
    plan = make_plan(mechanism, 3.0, delta=1e-6, max_tokens=8, composition=composition)
    total = plan.worst_case_epsilon()
    assert total <= 3.0 * (1 + 1e-6)
    assert total >= 2.9  # the split uses the budget, not a fraction of it
    assert plan.retrieval_epsilon == pytest.approx(0.3)


@pytest.mark.parametrize("mechanism", ["icl", "keywords", "facts"])
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
    rag.answer("q?", tenant="alice", epsilon=2.0, mechanism="keywords")
    before = ledger.charges("alice", "records")
    with pytest.raises(BudgetExceededError):
        rag.answer("q?", tenant="alice", epsilon=2.0, mechanism="keywords")
    assert ledger.charges("alice", "records") == before


@pytest.mark.parametrize("mechanism", ["vote", "sparse-vote", "answer-vote"])
def test_a_retired_mechanism_is_refused_by_name_before_any_charge(tmp_path, mechanism):
    rag, ledger, lm = _rag(tmp_path)
    for ask in (
        lambda: make_plan(mechanism, 3.0, delta=1e-6, max_tokens=8),
        lambda: rag.answer("q?", tenant="alice", epsilon=3.0, mechanism=mechanism),
    ):
        with pytest.raises(ValueError, match=f"the {mechanism} mechanism was retired") as err:
            ask()
        assert "facts" in str(err.value) and "keywords" in str(err.value)
    assert ledger.charges("alice", "records") == [] and lm.seen == []


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


def test_inconsistent_collection_is_refused():
    ids, texts, emb = _collection()
    with pytest.raises(ValueError):
        DPRag(ids[:-1], texts, emb, lambda q: emb[:1], TinyLM())
    bad = emb.copy()
    bad[3, 0] = np.nan
    with pytest.raises(ValueError):
        DPRag(ids, texts, bad, lambda q: emb[:1], TinyLM())


def _plain_rag(tmp_path, texts, *, config, instruction="a:b a:b a:b", seed=0, lm=None):
    ids, _, emb = _collection()
    ledger = PrivacyLedger(tmp_path / "ledger.sqlite")
    ledger.ensure_scope(Scope("alice", "records", 1000.0, 1e-5, accountant="basic"))
    return DPRag(
        ids,
        texts,
        emb,
        lambda qs: emb[:1],
        lm or TinyLM(),
        payer=collection_payer(ledger, "records"),
        config=config,
        prompt=PromptFormat(chat=False, instruction=instruction),
        rng=np.random.default_rng(seed),
    )


def test_keywords_abstaining_is_charged_its_worst_case(tmp_path):
    """At epsilon 1 a keyword needs far more than 8 agreeing voters: nothing is released."""
    rag = _plain_rag(
        tmp_path,
        [f"x:{i % 3}" for i in range(N)],
        config=RagConfig(k=8, max_tokens=5, score_range=ScoreRange(-1.0, 1.0)),
    )
    plan = rag.plan("keywords", 1.0)
    assert plan.vote_summary(8)["release_possible"] is False
    answer = rag.answer("q", tenant="alice", epsilon=1.0, mechanism="keywords")
    assert answer.abstained and answer.text == ABSTENTION_TEXT and answer.tokens == 0
    # abstaining is post-processing: the answer is charged its whole worst case all the same
    assert answer.epsilon == pytest.approx(plan.worst_case_epsilon(), rel=1e-6)


def test_icl_abstains_when_the_documents_never_move_the_draw(tmp_path):
    """Documents equal to no document and a sharp public base measure: the released text is
    the public prompt's greedy text, so the answer abstains."""
    rag = _plain_rag(
        tmp_path,
        ["" for _ in range(N)],
        config=RagConfig(
            k=8,
            max_tokens=1,  # after ':' the public prompt says 'b' (4 counts to <= 2): no tie
            score_range=ScoreRange(-1.0, 1.0),
            aggregation=AggregationConfig(beta=60.0),
        ),
    )
    answer = rag.answer("a:b", tenant="alice", epsilon=1.0, mechanism="icl")
    assert answer.abstained and answer.text == ABSTENTION_TEXT


def test_icl_answers_when_the_documents_move_the_draw(tmp_path):
    """Every document continues ':' with 'Q', the public prompt with 'b': at a large epsilon
    and a faded public power the documents win and the answer does not abstain."""
    rag = _plain_rag(
        tmp_path,
        [":Q :Q :Q :Q" for _ in range(N)],
        config=RagConfig(
            k=8,
            max_tokens=1,
            score_range=ScoreRange(-1.0, 1.0),
            aggregation=AggregationConfig(beta=1.0, beta_fade_epsilon=10.0),
        ),
        instruction="a:b",
    )
    answer = rag.answer("a:", tenant="alice", epsilon=50.0, mechanism="icl")
    assert not answer.abstained
    assert answer.text == "Q"


def test_answer_text_never_holds_a_split_multibyte_character(tmp_path, monkeypatch):
    """A released byte sequence that ends inside 'é' (0xC3 0xA9) decodes without U+FFFD."""
    released = iter([ord("c"), ord("a"), ord("f"), 0xC3])
    monkeypatch.setattr(releases_module, "dp_icl_token", lambda *a, **kw: next(released))
    rag = _plain_rag(
        tmp_path,
        ["" for _ in range(N)],
        config=RagConfig(k=4, max_tokens=4, score_range=ScoreRange(-1.0, 1.0)),
    )
    answer = rag.answer("q", tenant="alice", epsilon=5.0, mechanism="icl")
    assert TinyLM().decode([ord("c"), ord("a"), ord("f"), 0xC3]) == "caf\ufffd"
    assert answer.text == "caf"
    assert unreadable_count(answer.text) == 0


def test_keywords_release_the_voters_shared_keyword_and_the_lm_answers_from_it(tmp_path):
    """Every document answers 'Qx' after ':': 24 voters share the keyword 'qx', one
    partition selection at epsilon 20 releases it, and the public LM's answer is written
    from a prompt that holds the keywords and no document. The voters decode
    `voter_tokens` steps (public), the final answer `max_tokens`."""
    lm = SessionLM(eos_after_newline=50.0)  # its forks, the public session's, record too
    rag = _plain_rag(
        tmp_path,
        [":Qx\n :Qx\n :Qx\n" for _ in range(N)],
        config=RagConfig(k=N, max_tokens=3, score_range=ScoreRange(-1.0, 1.0)),
        instruction="a:b",
        lm=lm,
    )
    answer = rag.answer("a:", tenant="alice", epsilon=20.0, mechanism="keywords")
    seen, lengths = [rows for rows, _ in lm.seen], [new for _, new in lm.seen]
    assert not answer.abstained and answer.text
    assert [c.stage for c in answer.charges] == ["retrieval", "tokens"]
    assert answer.paid_tokens == 1
    final = seen[-1]
    assert len(final) == 1 and "qx" in final[0] and ":Qx" not in final[0]
    assert lengths[0] == RagConfig().voter_tokens and len(seen[0]) == N
    with pytest.raises(ValueError, match="voter_tokens"):
        RagConfig(voter_tokens=0)


def test_keywords_count_only_what_the_voters_documents_spell(tmp_path):
    """The public instruction says 'Zz' after ':' four times, each document 'Qx' three
    times: every voter (a bigram copier) answers 'Zz', a word no document holds, so no
    voter has a key and the answer abstains; with the documents saying it more often
    than the instruction, the documents' word is released."""
    config = RagConfig(k=N, max_tokens=3, score_range=ScoreRange(-1.0, 1.0))
    lm = TinyLM(eos_after_newline=50.0)

    def keywords_answer(document):  # every one of the N documents is `document`
        rag = _plain_rag(
            tmp_path,
            [document for _ in range(N)],
            config=config,
            instruction=":Zz\n :Zz\n :Zz\n :Zz\n",
            lm=lm,
        )
        return rag.answer("a:", tenant="alice", epsilon=20.0, mechanism="keywords")

    made_up = keywords_answer(":Qx\n :Qx\n :Qx\n")
    assert made_up.abstained
    said = keywords_answer(":Qx\n :Qx\n :Qx\n :Qx\n :Qx\n")
    assert not said.abstained and "qx" in said.text.lower()


def test_keywords_abstain_when_the_voters_disagree(tmp_path):
    rag = _plain_rag(
        tmp_path,
        [f":w{i}x\n" for i in range(N)],
        config=RagConfig(k=N, max_tokens=4, score_range=ScoreRange(-1.0, 1.0)),
        instruction="a",
        lm=TinyLM(eos_after_newline=50.0),
    )
    answer = rag.answer("a:", tenant="alice", epsilon=5.0, mechanism="keywords")
    assert answer.abstained and answer.text == ABSTENTION_TEXT


def test_grouped_keywords_voters_each_read_a_group_of_documents(tmp_path):
    """documents_per_voter = 2: k = 24 documents make 12 voters, each prompt holds its
    group's documents (the answer's shape: 12 rows), and the shared keyword is released
    (kept with probability 1 - 1e-6 or more at 12 agreeing voters)."""
    lm = SessionLM(eos_after_newline=50.0)
    config = RagConfig(k=N, max_tokens=3, score_range=ScoreRange(-1.0, 1.0), documents_per_voter=2)
    assert config.voters == 12
    rag = _plain_rag(
        tmp_path,
        [f"r{i} :Qx\n :Qx\n :Qx\n" for i in range(N)],
        config=config,
        instruction="a",
        lm=lm,
    )
    answer = rag.answer("a:", tenant="alice", epsilon=20.0, mechanism="keywords")
    assert not answer.abstained
    voters, _ = lm.seen[0]
    assert len(voters) == 12
    # every document read once, by one voter; a voter reads at most two
    read = [[i for i in range(N) if f"r{i} " in row] for row in voters]
    flat = sorted(i for row in read for i in row)
    assert all(len(row) <= 2 for row in read) and len(flat) == len(set(flat))
    assert any(len(row) > 1 for row in read)
    with pytest.raises(ValueError, match="keywords only"):
        rag.answer("a:", tenant="alice", epsilon=20.0, mechanism="icl")


def test_the_answer_stage_holds_its_collection_payer_never_the_ledger(tmp_path):
    rag, ledger, _ = _rag(tmp_path)
    held = [v for v in vars(rag).values() if isinstance(v, PrivacyLedger)]
    assert held == [] and rag.payer.dataset == rag.dataset == "records"
    rag.answer("what colour?", tenant="alice", epsilon=1.0)
    assert {c.dataset for c in ledger.charges("alice", "records")} == {"records"}


def test_collection_accounting_refuses_an_answer_with_no_share_for_its_dp_threshold():
    # the plan would charge no retrieval stage while the answer draws a DP threshold
    with pytest.raises(ValueError, match="retrieval_share"):
        RagConfig(retrieval_share=0.0)
    assert RagConfig(accounting="individual", retrieval_share=0.0).individual  # public tau


def test_a_collection_cap_holds_every_answer_to_one_event_at_the_charge(tmp_path):
    """A library caller that never pins: the first answer's charge pins its event on the
    collection cap, in the charge's transaction, and an answer at another event is
    refused there, nothing charged (an adaptive choice of events under a cap is a PLD
    filter, which the accountant does not cover)."""
    from retriever.rag.plan import answer_event_shape
    from synthgen.privacy import COLLECTION
    from synthgen.privacy.ledger_types import EventShapeError

    ids, texts, emb = _collection()
    ledger = PrivacyLedger(tmp_path / "ledger.sqlite")
    ledger.ensure_scope(Scope(COLLECTION, "records", 20.0, 1e-5))
    ledger.ensure_scope(Scope("alice", "records", 20.0, 1e-5))
    rag = DPRag(ids, texts, emb, lambda qs: emb[:1], TinyLM(),
                payer=collection_payer(ledger, "records"), config=RagConfig(k=4, max_tokens=2),
                prompt=PromptFormat(chat=False), rng=np.random.default_rng(0))  # fmt: skip
    first = rag.answer("q", tenant="alice", epsilon=1.0)
    assert ledger.event_shape(COLLECTION, "records") == answer_event_shape(rag.plan("icl", 1.0))
    charges = ledger.charges("alice", "records")
    with pytest.raises(EventShapeError):
        rag.answer("q", tenant="alice", epsilon=2.0)
    assert ledger.charges("alice", "records") == charges
    assert rag.answer("q", tenant="alice", epsilon=1.0).epsilon == first.epsilon
    # a first charge refused by a cap pins nothing (one transaction); nor does a charge over
    # earlier charges, which must be compared with the event first (pin_answer_event)
    for name, cap in (("small", 0.5), ("earlier", 20.0)):
        ledger.ensure_scope(Scope(COLLECTION, name, cap, 1e-5))
        ledger.ensure_scope(Scope("alice", name, 20.0, 1e-5))
        other = DPRag(ids, texts, emb, lambda qs: emb[:1], TinyLM(),
                      payer=collection_payer(ledger, name), config=RagConfig(k=4, max_tokens=2),
                      prompt=PromptFormat(chat=False))  # fmt: skip
        if name == "earlier":
            ledger.charge("alice", name, stage="rag-retrieval", relation="ADD_OR_REMOVE_ONE",
                          event=accounting.pure_epsilon_event(0.1))  # fmt: skip
        refusal = BudgetExceededError if name == "small" else ValueError
        with pytest.raises(refusal):
            other.answer("q", tenant="alice", epsilon=1.0)
        assert ledger.event_shape(COLLECTION, name) is None
