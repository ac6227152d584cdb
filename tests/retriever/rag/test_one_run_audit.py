"""One-run power audit of DP-RAG answers on a byte-level copying LM: a planted leak reaches the
cap, DP answers stay under their claim, coins are fair, and nothing private is returned."""

import json
import math
import re

import numpy as np
import pytest

from retriever.rag import RagConfig, aggregation
from retriever.rag.accounting import bounded_range_epsilon
from retriever.rag.canary_audit import CANARY_PROMPT
from retriever.rag.config import plan_answer
from retriever.rag.one_run_audit import (
    RagPowerResult,
    answer_epsilon_for,
    cell_path,
    power_config,
    record_path,
    run_rag_power_cell,
    run_rag_power_cells,
)
from synthgen.lm_backends import TinyLM
from synthgen.privacy.individual import DocumentBudget
from tests.retriever.rag.test_canary_audit import DOCUMENTS
from tests.retriever.rag.test_canary_audit import bag_of_words as canary_bag_of_words

QUESTION = "Question: What is the access code of "


def bag_of_words(texts):
    """`test_canary_audit`'s public encoder in 4096 dimensions: a question and its own canary
    share 9 of 10 words (cosine 0.9), another canary's at most 8 (0.8)."""
    return canary_bag_of_words(texts, dim=4096)


class LeakLM(TinyLM):
    """TinyLM that copies a planted secret: when the prompt holds the document of the asked
    key, the next digit of its code is nearly certain (then EOS); otherwise TinyLM's bigram."""

    def fork(self):
        return LeakLM(self.floor)

    def _logprobs(self, row):
        text = self.decode(row)
        q = text.rfind(QUESTION)
        if q >= 0:
            key = text[q + len(QUESTION) : text.find("?", q)]
            found = re.search(rf"access code of {re.escape(key)} is (\d+)\.", text[:q])
            after = text.rfind(CANARY_PROMPT.answer_prefix)
            if found and after > q:
                secret, written = found.group(1), re.sub(r"\D", "", text[after:])
                counts = np.full(self.vocab_size, self.floor)
                counts[[self.BOS, self.PAD]] = 0.0
                if len(written) < len(secret):
                    counts[ord(secret[len(written)])] += 1e3
                else:
                    counts[self.EOS] += 1e3
                with np.errstate(divide="ignore"):
                    return np.log(counts / counts.sum()).astype(np.float32)
        return super()._logprobs(row)


def _config(**kwargs):
    return power_config(4, relevance_threshold=0.85, max_document_tokens=80, **kwargs)


def _cell(epsilon, canaries=200, **kwargs):
    return run_rag_power_cell(
        DOCUMENTS,
        lm=LeakLM(),
        encode=bag_of_words,
        epsilon=epsilon,
        canaries=canaries,
        digits=4,
        config=kwargs.pop("config", _config()),
        seed=kwargs.pop("seed", 0),
        **kwargs,
    )


def _no_noise(utilities, *, epsilon, sensitivity, rng, monotonic=False, log_base_measure=None):
    """The exponential mechanism with its noise and base measure off: the argmax."""
    return int(np.argmax(np.asarray(utilities, dtype=np.float64)))


def _assert_secret_free(result: RagPowerResult, record: dict) -> None:
    dumped = json.dumps(result.to_dict())
    for canary in record["canaries"]:
        assert canary["key"] not in dumped and canary["doc_id"] not in dumped
        assert not re.search(rf"(?<![\d.]){canary['secret']}(?!\d)", dumped)
    assert '"answers":' not in dumped and "coins" not in dumped


def test_greedy_rag_leaks_to_the_cap_and_keeps_nothing_private(tmp_path):
    work = tmp_path / "private"
    result = _cell(math.inf, work_dir=work)
    s = result.primary
    assert result.mechanism == "greedy" and not result.violation  # no claim without noise
    assert result.num_in + result.num_out == 200 and result.own_relevant == 1.0
    assert s.auroc > 0.99 and s.tpr_at_1pct_fpr > 0.95
    assert s.epsilon_one_run >= 0.9 * result.cap_one_run > 1.0
    assert s.epsilon_one_run_fdp >= 0.9 * result.cap_fdp
    # (a) the result holds aggregates only; the record stays in the private folder
    record = json.loads(record_path(work, math.inf).read_text())
    _assert_secret_free(result, record)
    assert sum(record["coins"]) == result.num_in and sorted(record["order"]) == list(range(200))
    assert work.stat().st_mode & 0o077 == 0
    assert record_path(work, math.inf).stat().st_mode & 0o077 == 0
    # every included canary's own answer holds its secret
    for canary, coin, answer in zip(record["canaries"], record["coins"], record["answers"]):
        assert (canary["secret"] in answer) == coin


def test_dp_cell_without_noise_leaks_and_with_noise_keeps_its_claim(tmp_path, monkeypatch):
    # (c) the real mechanism: every bound under the claim; the claim is one answer's
    # bounded-range composition (a record pays once), below the filter's target
    dp = _cell(2.0, work_dir=tmp_path)
    assert dp.mechanism == "icl" and dp.target_epsilon == 2.0 and dp.delta == 1e-6
    plan = plan_answer(_config(), "icl", dp.answer_epsilon)
    one_answer = bounded_range_epsilon(plan.token_epsilon, plan.max_releases, 1e-6)
    assert dp.claimed_epsilon == pytest.approx(one_answer) and dp.claimed_epsilon < 2.0
    assert dp.rho_cap == pytest.approx(DocumentBudget(2.0, 1e-6).rho_cap)
    assert dp.answer_rho <= dp.rho_cap and dp.answer_rho > 0.99 * dp.rho_cap
    assert not dp.violation
    assert max(dp.primary.epsilon_one_run, dp.primary.epsilon_one_run_fdp) <= dp.claimed_epsilon
    _assert_secret_free(dp, json.loads(record_path(tmp_path, 2.0).read_text()))
    # (b) the same DP path with the mechanisms' noise switched off leaks to the cap: the
    # retrieval (public tau, the filters) puts each included canary in its own answer
    monkeypatch.setattr(aggregation, "exponential_mechanism", _no_noise)
    noiseless = _cell(2.0)
    assert noiseless.primary.epsilon_one_run >= 0.9 * noiseless.cap_one_run
    assert noiseless.violation  # a leak far beyond 2 is reported as a defect


def test_coins_are_fair_and_cells_resume(tmp_path):
    # (d) coins: Binomial(400, 1/2) within 4 standard deviations, over several seeds
    ins = []
    for seed in range(3):
        result = _cell(math.inf, canaries=400, seed=seed)
        assert abs(result.num_in - 200) < 4 * 10
        ins.append(result.num_in)
    assert len(set(ins)) > 1  # the coins come from the seed
    logged = []
    first = run_rag_power_cells(
        tmp_path, DOCUMENTS, [math.inf], lm=LeakLM(), encode=bag_of_words, canaries=20,
        config=_config(), seed=5, log=logged.append,
    )  # fmt: skip
    assert cell_path(tmp_path, 20, math.inf).is_file()
    again = run_rag_power_cells(
        tmp_path, DOCUMENTS, [math.inf], lm=None, encode=None, canaries=20,
        config=_config(), log=logged.append,
    )  # fmt: skip
    assert again == first and "exists, skipped" in logged[-1]
    with pytest.raises(ValueError, match="num_documents"):
        run_rag_power_cells(
            tmp_path, DOCUMENTS[:-1], [math.inf], lm=None, encode=None, canaries=20,
            config=_config(),
        )  # fmt: skip
    with pytest.raises(ValueError, match="relevance_threshold: file 0.85 != asked 0.82"):
        run_rag_power_cells(tmp_path, DOCUMENTS, [math.inf], lm=None, encode=None, canaries=20)


def test_answer_epsilon_fills_the_filter():
    config = _config()
    cap = DocumentBudget(8.0, 1e-6).rho_cap
    for share in (1, 3):
        eps = answer_epsilon_for(config, cap / share)
        assert plan_answer(config, "icl", eps).document_rho() <= cap / share
        assert plan_answer(config, "icl", eps * 1.001).document_rho() > cap / share
    with pytest.raises(ValueError):
        answer_epsilon_for(config, 0.0)


def test_bad_input_is_refused():
    collection = RagConfig(k=1, max_tokens=5)  # collection accounting: no per-record claim
    for kwargs, match in (
        (dict(epsilon=0.0), "epsilon"),
        (dict(epsilon=float("nan")), "epsilon"),
        (dict(epsilon=-1.0), "epsilon"),
        (dict(epsilon=1.0, canaries=1), "canaries"),
        (dict(epsilon=1.0, digits=0), "digits"),
        (dict(epsilon=1.0, digits=11), "digits"),
        (dict(epsilon=1.0, delta=1e-3, canaries=1000), "delta"),
        (dict(epsilon=1.0, answers_per_record=0), "answers_per_record"),
        (dict(epsilon=1.0, config=collection), "individual accounting"),
        (dict(epsilon=1.0, digits=8, config=power_config(4)), "max_tokens"),
    ):
        with pytest.raises(ValueError, match=match):
            run_rag_power_cell(DOCUMENTS, lm=LeakLM(), encode=bag_of_words, **kwargs)
    with pytest.raises(ValueError, match="max_document_tokens"):
        _cell(1.0, config=power_config(4, max_document_tokens=12))
