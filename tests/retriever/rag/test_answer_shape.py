"""The answer stage's public shape, wall-time bound, failure path and delta against n.

Time and memory are outputs (house privacy rule 9): however many documents the DP
threshold selects, every answer runs the same batch, prompt length and loop count.
"""

import time

import numpy as np
import pytest

from retriever.rag import DPRag, PromptFormat, RagConfig, ScoreRange
from retriever.rag import releases as releases_module
from retriever.rag.aggregation import AggregationConfig, token_probabilities, token_utilities
from retriever.rag.answer_types import AnswerFailedError
from synthgen.lm_backends import TinyLM
from synthgen.privacy import PrivacyLedger, Scope
from synthgen.privacy.receipts import collection_payer
from tests.retriever.rag.recording_lm import RecordingLM

N = 24
MECHANISMS = ["icl", "keywords"]


class ShapeLM(RecordingLM):
    """TinyLM that records the shape of every session it opens and every step it takes."""

    def start(self, prompts, max_new_tokens, *, length=None):
        padded = max(max(len(p) for p in prompts), length or 0)
        self.seen.append(("start", len(prompts), padded, max_new_tokens))
        return super().start(prompts, max_new_tokens)

    def append(self, token):
        self.seen.append(("append", len(self._rows)))
        return super().append(token)

    @property
    def eos_ids(self):
        return ()  # every answer runs its public number of steps


def _rag(tmp_path, lm, *, accountant="pld", delta=1e-6):
    rng = np.random.default_rng(0)
    emb = rng.normal(size=(N, 8)).astype(np.float32)
    emb /= np.linalg.norm(emb, axis=1, keepdims=True)
    texts = [f"record {i}: the patient has besox fever and a rash" for i in range(N)]
    ledger = PrivacyLedger(tmp_path / "ledger.sqlite")
    ledger.ensure_scope(Scope("alice", "records", 100.0, 1e-5, accountant=accountant))
    rag = DPRag(
        [f"d{i}" for i in range(N)],
        texts,
        emb,
        lambda qs: emb[:1],
        lm,
        payer=collection_payer(ledger, "records"),
        config=RagConfig(k=6, max_tokens=4, score_range=ScoreRange(-1.0, 1.0), delta=delta),
        prompt=PromptFormat(chat=False),
        rng=np.random.default_rng(1),
    )
    return rag, ledger


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_the_session_shape_does_not_depend_on_how_many_documents_were_selected(
    tmp_path, monkeypatch, mechanism
):
    log = []
    rag, _ = _rag(tmp_path, ShapeLM(log))
    shapes = []
    for selected in (0, 1, 3, 6, N):  # none, one, some, the cap, beyond the cap
        # the first `selected` documents score at the top of the range, the rest at the bottom
        scores = np.where(np.arange(N) < selected, 1.0, -1.0)
        monkeypatch.setattr(rag, "encode_question", lambda qs, s=scores: s[None, :])
        monkeypatch.setattr(rag, "embeddings", np.eye(N, dtype=np.float32))
        log.clear()
        rag.answer("what does the patient have?", tenant="alice", epsilon=5.0, mechanism=mechanism)
        shapes.append(list(log))
    # Sessions open at one shape; every step runs every row. (How many steps run depends
    # on released values only: an end token; keywords' public answer session opens only
    # when keywords were released, so only the private sessions are compared for it.)
    public = mechanism == "icl"
    starts = [[e for e in s if e[0] == "start" and (public or e[1] > 1)] for s in shapes]
    assert all(s == starts[0] for s in starts), starts
    assert {e[1] for s in shapes for e in s if e[1] > 1} == {rag.config.voters}


def test_padding_rows_count_for_nothing():
    rng = np.random.default_rng(0)
    rows = rng.normal(size=(5, 7))
    weights = np.array([1, 1, 0, 1, 0.0])
    config = AggregationConfig()
    np.testing.assert_allclose(
        token_utilities(rows, 7, config, weights), token_utilities(rows[[0, 1, 3]], 7, config)
    )
    with pytest.raises(ValueError):
        token_utilities(rows, 7, config, np.array([1, 0.5, 0, 1, 0]))


@pytest.mark.parametrize("epsilon", [0.5, 2.0])
def test_a_capped_row_set_stays_epsilon_dp_when_a_document_displaces_another(epsilon):
    """Under a public cap, adding a document can swap one row for another: the draw's
    log-probabilities still move by at most epsilon (sensitivity 2C), and would not under C."""
    config = AggregationConfig(beta=0.0)
    vocab = 6
    rest = np.log(np.tile([0.01, 0.95, 0.01, 0.01, 0.01, 0.01], (3, 1)))  # token 1 leads
    x = np.log(np.array([0.95, 0.01, 0.01, 0.01, 0.01, 0.01]))  # the new document
    d = np.log(np.array([0.01, 0.95, 0.01, 0.01, 0.01, 0.01]))  # the row it displaces
    public = np.log(np.full(vocab, 1.0 / vocab))
    before, after = np.vstack([rest, d[None]]), np.vstack([rest, x[None]])

    def gap(capped):
        p = token_probabilities(before, public, epsilon=epsilon, config=config, capped=capped)
        q = token_probabilities(after, public, epsilon=epsilon, config=config, capped=capped)
        return np.max(np.abs(np.log(p) - np.log(q)))

    assert gap(capped=True) <= epsilon + 1e-9
    assert gap(capped=False) > epsilon  # the swap needs the doubled sensitivity


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_a_passed_deadline_truncates_the_answer_and_charges_as_planned(tmp_path, mechanism):
    rag, ledger = _rag(tmp_path, ShapeLM())
    answer = rag.answer(
        "q?", tenant="alice", epsilon=2.0, mechanism=mechanism, deadline=time.monotonic() - 1
    )
    assert answer.truncated and answer.tokens == 0
    plan = rag.plan(mechanism, 2.0)
    assert len(ledger.charges("alice", "records")) == len(plan.stage_events())
    on_time = rag.answer("q?", tenant="alice", epsilon=2.0, mechanism=mechanism)
    assert not on_time.truncated
    if mechanism == "icl":  # keywords' 6 voters cannot clear its threshold: it abstains
        assert on_time.tokens == 4


@pytest.mark.parametrize("accountant", ["basic", "pld"])
@pytest.mark.parametrize(
    "mechanism, release", [("icl", "dp_icl_token"), ("keywords", "release_answer_keywords")]
)
def test_a_failure_after_the_check_charges_the_worst_case_and_withholds_its_text(
    tmp_path, monkeypatch, accountant, mechanism, release
):
    rag, ledger = _rag(tmp_path, ShapeLM(), accountant=accountant)

    def leaky(*args, **kwargs):
        raise ValueError("record 3: the patient has besox fever")

    monkeypatch.setattr(releases_module, release, leaky)
    with pytest.raises(AnswerFailedError) as caught:
        rag.answer("q?", tenant="alice", epsilon=3.0, mechanism=mechanism)
    assert "besox" not in str(caught.value) and caught.value.__context__ is None
    plan = rag.plan(mechanism, 3.0)
    charged = ledger.charges("alice", "records")
    assert sorted(c.stage for c in charged) == sorted(f"rag-{s}" for s, _ in plan.stage_events())


def test_a_per_answer_delta_of_one_over_n_is_refused(tmp_path):
    with pytest.raises(ValueError, match="1/n"):
        _rag(tmp_path, ShapeLM(), delta=1.0 / N)
    rag, _ = _rag(tmp_path, ShapeLM())
    with pytest.raises(ValueError, match="1/n"):
        rag.with_config(RagConfig(delta=0.1))


def test_best_selected_is_the_best_rows_of_the_selection_padded_to_a_fixed_shape():
    from retriever.rag.retrieval import best_selected, select

    scores = np.array([0.1, 0.9, 0.5, 0.7, 0.3, 0.8])
    for tau in (0.0, 0.4, 0.75, 0.95):
        for rows in (1, 3, 6, 9):
            indices, weights, selected = best_selected(scores, tau, rows)
            assert indices.shape == weights.shape == (rows,)
            real = select(scores, tau)[:rows]
            np.testing.assert_array_equal(indices[: int(weights.sum())], real)
            assert weights.sum() == len(real) and np.all(weights[len(real) :] == 0)
            np.testing.assert_array_equal(np.flatnonzero(selected), np.sort(select(scores, tau)))


def test_document_parts_make_the_same_prompt_as_encode():
    lm = TinyLM()
    for chat in (True, False):
        prompt = PromptFormat(chat=chat)
        prefix, suffix = prompt.document_parts(lm, "which disease?")
        doc = lm.encode("a record")
        assert prefix + doc + suffix == prompt.encode(lm, "which disease?", [doc])


class NanLM(ShapeLM):
    """Row 0 of every private session comes out as NaN (a numerical fault)."""

    def _poison(self, out):
        if len(out) > 1:
            out = out.copy()
            out[0] = np.nan
        return out

    def fork(self):
        return ShapeLM(self.seen)

    def start(self, prompts, max_new_tokens, *, length=None):
        return self._poison(super().start(prompts, max_new_tokens, length=length))

    def append(self, token):
        return self._poison(super().append(token))


def test_a_row_that_is_not_a_distribution_counts_as_padding_and_fails_nothing(tmp_path):
    rag, _ = _rag(tmp_path, NanLM())
    answer = rag.answer("q?", tenant="alice", epsilon=3.0, mechanism="icl")
    assert answer.tokens == 4


def test_a_document_the_tokenizer_refuses_is_refused_at_construction(tmp_path):
    class Picky(ShapeLM):
        def encode(self, text, *, bos=False):
            if "forbidden" in text:
                raise UnicodeError(f"cannot encode {text!r}")
            return super().encode(text, bos=bos)

    rng = np.random.default_rng(0)
    with pytest.raises(ValueError, match="position 1") as caught:
        DPRag(
            ["a", "b"],
            ["fine", "forbidden secret"],
            rng.normal(size=(2, 4)),
            lambda qs: np.ones((1, 4)),
            Picky(),
            config=RagConfig(delta=1e-3),
        )
    assert "secret" not in str(caught.value)


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_a_charge_that_fails_releases_nothing(tmp_path, monkeypatch, mechanism):
    """Every answer is charged before any noise: a ledger that fails to record the charge
    stops the answer before any prompt is built."""
    log = []
    rag, ledger = _rag(tmp_path, ShapeLM(log), accountant="basic")
    monkeypatch.setattr(ledger, "charge_all", lambda *a, **k: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        rag.answer("q?", tenant="alice", epsilon=3.0, mechanism=mechanism)
    assert log == []


def _naive_groups(scores, tau, buckets, groups, per_group):
    out = []
    for b in range(groups):
        members = [i for i in range(len(scores)) if buckets[i] == b and scores[i] >= tau]
        members.sort(key=lambda i: (-scores[i], i))
        out.append(members[:per_group])
    return out


def test_grouped_selection_is_each_buckets_best_and_one_document_moves_one_group():
    """Against a naive loop; and the brute-force neighbour check of the privacy claim:
    removing any one document changes at most one group (adding is the reverse)."""
    from retriever.rag.retrieval import grouped_selected

    rng = np.random.default_rng(0)
    for trial in range(40):
        n, groups, per_group = int(rng.integers(1, 40)), int(rng.integers(1, 6)), 1 + trial % 3
        scores = rng.choice([0.1, 0.5, 0.7, 0.9], size=n) if trial % 2 else rng.random(n)
        buckets = rng.integers(0, groups, size=n)
        tau = 0.4
        indices, weights, selected = grouped_selected(scores, tau, buckets, groups, per_group)
        assert indices.shape == (groups, per_group)
        got = [[int(i) for i in row if i >= 0] for row in indices]
        assert got == _naive_groups(scores, tau, buckets, groups, per_group)
        assert list(weights) == [1.0 if g else 0.0 for g in got]
        assert list(selected) == list(scores >= tau)
        ids = np.arange(n)
        for gone in range(n):
            keep = ids != gone
            smaller, _, _ = grouped_selected(scores[keep], tau, buckets[keep], groups, per_group)
            smaller_ids = [[int(ids[keep][i]) for i in row if i >= 0] for row in smaller]
            changed = sum(a != b for a, b in zip(got, smaller_ids, strict=True))
            assert changed <= 1


def test_grouped_selection_refuses_buckets_outside_the_groups():
    from retriever.rag.retrieval import grouped_selected

    with pytest.raises(ValueError, match="bucket"):
        grouped_selected(np.ones(3), 0.5, np.array([0, 1, 2]), 2, 2)
