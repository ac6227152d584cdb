"""Receipts (`synthgen.privacy.receipts`): an algorithm draws no noise for an unpaid plan."""

import dataclasses

import numpy as np
import pytest

from synthgen import evolution, fewshot
from synthgen.lm_backends import TinyLM
from synthgen.privacy import BudgetExceededError, PrivacyLedger, Scope
from synthgen.privacy.events import event_to_json
from synthgen.privacy.receipts import Receipt, ledger_payer, paid

ROWS = [{"text": f"private example {i}", "label": "a"} for i in range(16)]
CONFIG = fewshot.FewShotConfig(public_pool_size=8, subsets=2, shots=1, max_new_tokens=3,
                               noise_multiplier=3.0)  # fmt: skip


def _plan():
    return fewshot.plan_for(ROWS, [{"label": "a"}], fewshot.DOCUMENT_TEMPLATE, CONFIG,
                            pool_field="label")  # fmt: skip


def _ledger(tmp_path, cap=10.0):
    ledger = PrivacyLedger(tmp_path / "l.sqlite")
    ledger.open_scope(Scope("t", "d", cap, 1e-3))
    return ledger


def test_a_ledger_payer_charges_the_plan_and_its_receipt_names_it(tmp_path):
    ledger, plan = _ledger(tmp_path), _plan()
    pay = ledger_payer(ledger, ("t", "d"), stage="fewshot-generate")
    pay.check(plan)
    assert ledger.charges("t", "d") == []  # a dry run
    receipt = paid(pay, plan, "one run")
    [charge] = ledger.charges("t", "d")
    assert receipt.scope == ("t", "d")
    assert (receipt.stage, receipt.charge_id) == (charge.stage, charge.id)
    assert receipt.event == event_to_json(plan.event) == charge.event
    assert receipt == Receipt.of(charge)  # what the ledger stored, not what was asked
    other = dataclasses.replace(plan, tokens=plan.tokens + 1)
    with pytest.raises(ValueError, match="another event"):
        receipt.check(other)
    with pytest.raises(ValueError, match="another event"):  # the same event, another relation
        dataclasses.replace(receipt, relation="REPLACE_ONE").check(plan)


def test_an_algorithm_refuses_a_receipt_for_another_plan_before_any_token(tmp_path):
    calls = []

    class SpyLM(TinyLM):  # every call that reads a prompt
        def score(self, *args, **kwargs):
            calls.append("score")
            return super().score(*args, **kwargs)

        def start(self, *args, **kwargs):
            calls.append("start")
            return super().start(*args, **kwargs)

    def wrong(plan, description):  # a payer that charged something else
        return Receipt("t", "d", "fewshot-generate", '{"other": 1}', 1)

    with pytest.raises(ValueError, match="another event"):
        fewshot.generate(SpyLM(), ROWS, [{"label": "a"}], fewshot.DOCUMENT_TEMPLATE, CONFIG,
                         pool_field="label", rng=np.random.default_rng(0), pay=wrong)  # fmt: skip
    assert calls == []
    fewshot.generate(SpyLM(), ROWS, [{"label": "a"}], fewshot.DOCUMENT_TEMPLATE, CONFIG,
                     pool_field="label", rng=np.random.default_rng(0),
                     pay=ledger_payer(_ledger(tmp_path), ("t", "d"), stage="s"))  # fmt: skip
    assert calls  # the spy sees the run once it is paid for


def test_a_payer_over_the_cap_refuses_before_the_run(tmp_path):
    ledger, plan = _ledger(tmp_path, cap=0.01), _plan()
    pay = ledger_payer(ledger, ("t", "d"), stage="fewshot-generate")
    with pytest.raises(BudgetExceededError):
        pay.check(plan)
    config = evolution.EvolutionConfig(num_samples=2, iterations=1, target_epsilon=1.0,
                                       delta=1e-4, public_size=8)  # fmt: skip
    with pytest.raises(BudgetExceededError):  # checked before any sample is drawn
        evolution.evolve(None, None, ["x"] * 8, config, rng=np.random.default_rng(0),
                         pay=ledger_payer(ledger, ("t", "d"), stage="evolution"))  # fmt: skip
    assert ledger.charges("t", "d") == []


def test_a_collection_payer_charges_the_asking_tenant_on_its_collection_only(tmp_path):
    from synthgen.privacy.accounting import laplace_event
    from synthgen.privacy.receipts import collection_payer

    ledger = _ledger(tmp_path, cap=1.0)
    ledger.open_scope(Scope("t", "other", 1.0, 1e-3))
    pay = collection_payer(ledger, "d")
    pay.check("t", stage="rag-answer", event=laplace_event(0.6), relation="ADD_OR_REMOVE_ONE",
              delta=1e-5)  # fmt: skip
    assert ledger.charges("t", "d") == []  # a dry run
    items = [("rag-token", laplace_event(0.6), "an answer")]
    pay.charge_all("t", items, relation="ADD_OR_REMOVE_ONE", delta=1e-5, ref="r1")
    assert len(ledger.charges("t", "d")) == 1 and ledger.charges("t", "other") == []
    assert pay.remaining("t") == pytest.approx(0.4, abs=0.01)  # PLD composes 0.6 a bit lower
    with pytest.raises(BudgetExceededError):  # the cap holds through the payer
        pay.charge_all("t", items, relation="ADD_OR_REMOVE_ONE", delta=1e-5, ref="r2")
    assert pay.document_filter() is None and not pay.has_collection_cap()
