"""One battery for every DP plan: the `ReleasePlan` contract (`synthgen.privacy.release_plan`).

dp-accounting's pattern (`privacy_accountant_test.PrivacyAccountantTest`): one abstract test
class states the contract, and each plan class gets a subclass that only says how to build a
small plan and which relation its charge passes to the ledger. `ReleasePlanBattery` has no
``Test`` prefix, so pytest collects only the subclasses, each of which runs every test.
"""

from __future__ import annotations

import ast
import dataclasses
import json
import math
import types
from pathlib import Path

import pytest
from dp_accounting import NeighboringRelation, dp_event

from synthgen.privacy import accountants
from synthgen.privacy.events import as_relation, event_from_json, event_to_json
from synthgen.privacy.release_plan import ReleasePlan

ROOT = Path(__file__).resolve().parents[3]
# classes named *Plan that are no DP release (what the battery need not cover), and why
NOT_RELEASES = {
    "ReleasePlan": "the protocol itself",
    "PairsPlan": "public sizes of a user's pairs file, no mechanism",
}


def composed_epsilon(plan, accountant: str = "pld") -> float:
    """The plan's event composed under its relation at its delta."""
    return accountants.epsilon(
        plan.event, plan.delta, accountant=accountant, relation=plan.relation
    )


def within_stated_epsilon(plan, accountant: str = "pld") -> bool:
    """Whether the plan's event composes to at most its stated epsilon (1e-9 relative)."""
    return composed_epsilon(plan, accountant) <= plan.epsilon * (1 + 1e-9)


class ReleasePlanBattery:
    """The contract every plan class meets; subclass it once per plan class.

    Subclasses set `plan_class` and implement `make_plan` (a small plan, the cheap way) and
    `charged_relation` (the relation the mechanism's analysis assumes, read from its module;
    a payer charges `plan.relation`, so the two must agree). `accountant` is the accountant
    kind the plan states its epsilon with.
    """

    plan_class: type
    accountant = "pld"

    def make_plan(self):
        raise NotImplementedError

    def charged_relation(self) -> NeighboringRelation | str:
        raise NotImplementedError

    def plan_accountant(self, plan) -> str:
        return self.accountant

    @pytest.fixture(scope="class")
    @classmethod
    def plan(cls):
        return cls().make_plan()  # once per class: a plan may calibrate

    def test_is_a_release_plan(self, plan):
        assert type(plan) is self.plan_class
        assert isinstance(plan, ReleasePlan)
        assert isinstance(plan.relation, NeighboringRelation)
        assert isinstance(plan.event, dp_event.DpEvent)
        assert math.isfinite(plan.epsilon) and plan.epsilon > 0
        assert 0 < plan.delta < 1

    def test_relation_is_the_one_charged(self, plan):
        assert plan.relation is as_relation(self.charged_relation())

    def test_event_composes_within_the_stated_epsilon(self, plan):
        accountant = self.plan_accountant(plan)
        assert within_stated_epsilon(plan, accountant), (
            composed_epsilon(plan, accountant),
            plan.epsilon,
        )

    def test_a_plan_stating_less_than_its_event_fails_the_bound(self, plan):
        accountant = self.plan_accountant(plan)
        spent = composed_epsilon(plan, accountant)
        doctored = types.SimpleNamespace(
            epsilon=spent * 0.99, delta=plan.delta, relation=plan.relation, event=plan.event
        )
        assert not within_stated_epsilon(doctored, accountant)

    def test_to_dict_is_json_and_agrees_with_the_plan(self, plan):
        out = json.loads(json.dumps(plan.to_dict(), allow_nan=False))
        assert out["epsilon"] == plan.epsilon
        assert out["delta"] == plan.delta
        assert out["neighboring_relation"] == plan.relation.name
        if "dp_event" in out:  # where the metadata holds the event, it is the charged one
            assert out["dp_event"] == json.loads(event_to_json(plan.event))

    def test_is_immutable(self, plan):
        assert dataclasses.is_dataclass(plan) and plan.__dataclass_params__.frozen
        names = [f.name for f in dataclasses.fields(plan)] + ["epsilon", "delta", "relation"]
        for name in names:
            with pytest.raises(AttributeError):
                setattr(plan, name, getattr(plan, name))

    def test_event_survives_the_json_round_trip(self, plan):
        event = plan.event
        assert event_from_json(event_to_json(event)) == event


# ---- one subclass per plan class ---------------------------------------------------------


class TestPrivacyPlanPoisson(ReleasePlanBattery):
    sampling = "poisson"

    @property
    def plan_class(self):
        from synthgen.dp_plan import PrivacyPlan

        return PrivacyPlan

    def make_plan(self):
        from synthgen import dp_train

        config = dp_train.DPConfig(
            batch_size=32,
            epochs=1,
            noise_multiplier=1.0,
            target_epsilon=None,
            sampling=self.sampling,
            accountant=self.accountant,
        )
        return dp_train.plan_privacy(config, 640)

    def charged_relation(self):
        # dp_train charges plan.relation: it must be the relation the accountant analyses
        # the sampling under
        from synthgen.privacy.dpsgd_accounting import neighboring_relation

        return neighboring_relation(self.sampling)

    def plan_accountant(self, plan) -> str:
        assert plan.accountant == self.accountant
        return plan.accountant

    def test_relation_follows_the_sampling(self, plan):
        expected = {"poisson": "ADD_OR_REMOVE_ONE", "shuffle": "REPLACE_ONE"}[self.sampling]
        assert plan.relation.name == expected


class TestAuditRunsPlan(ReleasePlanBattery):
    """The query-generator audit's runs on private pairs, charged as one release."""

    @property
    def plan_class(self):
        from synthgen.audit.querygen_audit import AuditRunsPlan

        return AuditRunsPlan

    def make_plan(self):
        from dpsynth.config_files import querygen_preset
        from synthgen.audit.querygen_audit import audit_runs_plan

        return audit_runs_plan(querygen_preset("tiny_llama"), [8.0, 3.0], 640)

    def charged_relation(self):
        # each run is a Poisson-sampled DP-SGD run (the preset's sampling)
        from synthgen.privacy.dpsgd_accounting import neighboring_relation

        return neighboring_relation("poisson")

    def test_states_at_most_the_sum_of_its_runs(self, plan):
        assert [run.epsilon for run in plan.runs] == pytest.approx([8.0, 3.0], rel=1e-2)
        for run in plan.runs:  # each run alone, at the plan's delta, spends less than all
            alone = accountants.epsilon(run.event, plan.delta, relation=plan.relation)
            assert alone < plan.epsilon
        assert plan.epsilon <= sum(run.epsilon for run in plan.runs)
        assert plan.delta == pytest.approx(sum(run.delta for run in plan.runs))

    def test_an_inf_run_cannot_be_charged(self):
        from dpsynth.config_files import querygen_preset
        from synthgen.audit.querygen_audit import audit_runs_plan

        with pytest.raises(ValueError, match="inf is not private"):
            audit_runs_plan(querygen_preset("tiny_llama"), [math.inf, 8.0], 640)


class TestPrivacyPlanShuffle(TestPrivacyPlanPoisson):
    sampling = "shuffle"
    accountant = "rdp"  # the plan's own accountant kind, not the default PLD


class TestFewShotPlan(ReleasePlanBattery):
    mechanism = "gaussian"

    @property
    def plan_class(self):
        from synthgen.fewshot.plan import FewShotPlan

        return FewShotPlan

    def make_plan(self):
        from synthgen import fewshot

        noise = (
            {"noise_multiplier": 1.0} if self.mechanism == "gaussian" else {"token_epsilon": 1.0}
        )
        config = fewshot.FewShotConfig(
            public_pool_size=1000, subsets=4, shots=1, mechanism=self.mechanism, **noise
        )
        return fewshot.plan_privacy(config, 10)

    def charged_relation(self):
        from synthgen.fewshot.plan import RELATION  # the relation the mechanism's analysis uses

        return RELATION


class TestFewShotPlanRnm(TestFewShotPlan):
    mechanism = "rnm"


class TestEvolutionPlan(ReleasePlanBattery):
    @property
    def plan_class(self):
        from synthgen.evolution.plan import EvolutionPlan

        return EvolutionPlan

    def make_plan(self):
        from synthgen import evolution

        config = evolution.EvolutionConfig(
            num_samples=4,
            iterations=2,
            noise_multiplier=2.0,
            public_size=100,
            labels=("cat", "dog"),
            initial_prompt="{label}: ",
            variation_prompt="{label} {text}",
            max_new_tokens=6,
            batch_size=4,
        )
        return evolution.plan_evolution(config)

    def charged_relation(self):
        from synthgen.privacy.nn_histogram import RELATION  # the NN histogram's analysis

        return RELATION


class TestFactPlan(ReleasePlanBattery):
    @property
    def plan_class(self):
        from synthgen.knowledge.facts import FactPlan

        return FactPlan

    def make_plan(self):
        from synthgen.knowledge.facts import FactConfig, plan_facts

        return plan_facts(FactConfig(epsilon=2.0, delta=1e-6), 500)

    def charged_relation(self):
        from synthgen.knowledge import facts

        return facts.RELATION

    def test_the_ledger_records_the_event_and_relation(self, plan, tmp_path):
        # the one plan whose charge is a function of its own: charge it and read it back
        from synthgen.knowledge.facts import charge_ref
        from synthgen.privacy.ledger import PrivacyLedger
        from synthgen.privacy.ledger_types import Scope
        from synthgen.privacy.receipts import ledger_payer, paid

        ledger = PrivacyLedger(tmp_path / "ledger.sqlite")
        ledger.open_scope(Scope("t", "records", 10.0, 1e-5, relation=plan.relation))
        pay = ledger_payer(ledger, ("t", "records"), stage="knowledge-release")
        for _ in range(2):  # the release's idempotency key: charged once
            paid(pay, plan, "fact release", ref=charge_ref(tmp_path, pay.scope, plan))
        (charge,) = ledger.charges("t", "records")
        assert charge.relation == plan.relation.name
        assert charge.event == event_to_json(plan.event)


class TestAnswerPlan(ReleasePlanBattery):
    mechanism, composition, score_share = "facts", "pure", 0.0

    @property
    def plan_class(self):
        from retriever.rag.plan import AnswerPlan

        return AnswerPlan

    def make_plan(self):
        from retriever.rag.plan import make_plan

        return make_plan(
            self.mechanism,
            3.0,
            delta=1e-6,
            max_tokens=4,
            composition=self.composition,
            score_share=self.score_share,
        )

    def charged_relation(self):
        from retriever.rag import answer

        return answer.RELATION

    def test_event_is_the_worst_case_the_ledger_checks(self, plan):
        assert plan.event == plan.worst_case_event()


class TestAnswerPlanIcl(TestAnswerPlan):
    mechanism, composition, score_share = "icl", "bounded-range", 0.1


# ---- the battery covers every plan ---------------------------------------------------------


def _batteries() -> list[type]:
    found, todo = [], list(ReleasePlanBattery.__subclasses__())
    while todo:
        cls = todo.pop()
        found.append(cls)
        todo += cls.__subclasses__()
    return found


def test_every_plan_class_has_a_battery():
    declared = set()
    for package in ("synthgen", "retriever", "dpsynth"):
        for path in (ROOT / package).rglob("*.py"):
            text = path.read_text(encoding="utf-8")
            if "Plan" not in text:
                continue
            declared |= {
                node.name
                for node in ast.walk(ast.parse(text))
                if isinstance(node, ast.ClassDef) and node.name.endswith("Plan")
            }
    covered = {cls().plan_class.__name__ for cls in _batteries()}
    assert declared - set(NOT_RELEASES) == covered
