"""The one admission path (`synthgen.privacy.admission.admit`): bind, open, check, tell."""

import dataclasses

import pytest
from dp_accounting import NeighboringRelation

from synthgen.privacy import BudgetExceededError, PrivacyLedger, accounting
from synthgen.privacy.admission import admit
from synthgen.privacy.ledger_documents import SharedDocumentsError
from synthgen.privacy.release_plan import ReleasePlan

TEXTS = [f"record {i} of a private collection" for i in range(30)]


@dataclasses.dataclass(frozen=True)
class _Plan:
    epsilon: float
    delta: float
    relation: NeighboringRelation = NeighboringRelation.REPLACE_ONE

    @property
    def event(self):
        return accounting.epsilon_delta_event(self.epsilon, self.delta)

    def to_dict(self) -> dict:
        return {"epsilon": self.epsilon, "delta": self.delta, "relation": self.relation.name}


def _admit(ledger, plan, lines, **kwargs):
    return admit(ledger, "t", "notes", TEXTS, plan, stage="s", public_count=len(TEXTS),
                 tell=lines.extend, **kwargs)  # fmt: skip


def test_admit_opens_the_scope_from_the_plan_and_tells_the_ledger(tmp_path):
    ledger, lines = PrivacyLedger(tmp_path / "l.sqlite"), []
    plan = _Plan(2.0, 0.01)
    assert isinstance(plan, ReleasePlan)
    assert _admit(ledger, plan, lines, budget=5.0) == ("t", "notes")
    scope = ledger.get_scope("t", "notes")
    assert (scope.epsilon_cap, scope.delta_cap, scope.relation) == (5.0, 0.01, "REPLACE_ONE")
    assert ledger.charges("t", "notes") == []  # a dry run: nothing is charged
    assert any("collection notes is charged in" in line for line in lines)
    assert any("delta=0.01 is near 1/n (n=30)" in line for line in lines)
    # without a budget the cap is the plan's own epsilon
    _admit(PrivacyLedger(tmp_path / "m.sqlite"), plan, [])
    assert PrivacyLedger(tmp_path / "m.sqlite").get_scope("t", "notes").epsilon_cap == 2.0


def test_admit_refuses_what_does_not_fit_unless_the_run_checks_itself(tmp_path):
    ledger = PrivacyLedger(tmp_path / "l.sqlite")
    with pytest.raises(BudgetExceededError):
        _admit(ledger, _Plan(2.0, 1e-6), [], budget=1.0)
    # the scope now exists (cap 1): its cap governs, whatever the plan's epsilon
    with pytest.raises(BudgetExceededError):
        _admit(ledger, _Plan(2.0, 1e-6), [])
    _admit(ledger, _Plan(2.0, 1e-6), [], check=False)  # a resumable run checks itself
    assert ledger.charges("t", "notes") == []


def test_admit_binds_the_records_so_another_name_is_refused(tmp_path):
    ledger = PrivacyLedger(tmp_path / "l.sqlite")
    plan = _Plan(1.0, 1e-6)
    _admit(ledger, plan, [])
    ledger.charge("t", "notes", stage="s", event=plan.event, relation=plan.relation)
    again = dict(stage="s", public_count=30, tell=lambda lines: None)
    with pytest.raises(SharedDocumentsError):
        admit(ledger, "t", "renamed", TEXTS, plan, **again)
    admit(ledger, "t", "renamed", TEXTS, plan, guarantees_add_up=True, **again)


def test_a_zero_epsilon_plan_gets_a_positive_cap_and_delta_can_be_the_callers(tmp_path):
    ledger, lines = PrivacyLedger(tmp_path / "l.sqlite"), []
    _admit(ledger, _Plan(0.0, 1e-6), lines, delta=0.02, check=False)  # a very noisy run
    scope = ledger.get_scope("t", "notes")
    assert (scope.epsilon_cap, scope.delta_cap) == (1e-6, 0.02)
    assert any("delta=0.02 is near 1/n" in line for line in lines)
