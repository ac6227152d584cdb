"""`ReleasePlan`: what every DP plan of the project states, fixed before it releases anything.

A plan is the guarantee of one release (a DP-SGD run, a few-shot generation, a Private
Evolution run, a fact release, one DP-RAG answer), built from public figures only. Each plan
class has its own parameters, but every one of them promises the same four things:

* ``event``: the dp-accounting `DpEvent` the ledger is charged (or checked against) for the
  release, before any noise is drawn;
* ``relation``: the `NeighboringRelation` under which ``event`` is analysed, exactly the
  relation the charge passes to the ledger;
* ``epsilon`` and ``delta``: the stated guarantee. ``event`` composed under ``relation`` at
  ``delta`` (with the plan's accountant; PLD unless it names another) gives at most
  ``epsilon``;
* ``to_dict()``: the plan as JSON-serialisable metadata (released with the artefact), which
  names ``epsilon``, ``delta`` and ``neighboring_relation`` (the relation's ``.name``,
  e.g. ``"ADD_OR_REMOVE_ONE"``), equal to the attributes.

Plans are frozen dataclasses: a plan that changed after its charge would state a guarantee
the ledger never saw. DP-SGD's explicitly non-private reference run (noise multiplier 0,
epsilon infinity) has no event, so it is no release plan: the ledger refuses it, and
`isinstance` on it raises the event's ValueError (Python 3.11 evaluates the properties).

``tests/synthgen/privacy/test_release_plans.py`` holds one battery that every plan class
passes (dp-accounting's pattern: one abstract test class per interface, one subclass per
implementation).

Privacy:
  The protocol states no mechanism of its own; each plan's module states its privacy unit,
  mechanism and references. The relation is part of the guarantee: an add/remove-one
  statement converts soundly to replace-one (`events.convert_relation`), not the converse.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from dp_accounting import NeighboringRelation, dp_event


@runtime_checkable
class ReleasePlan(Protocol):
    """The guarantee of one DP release: its charged event, relation and (epsilon, delta).

    Attributes:
      epsilon: the stated epsilon; ``event`` composed under ``relation`` at ``delta`` is at
        most this.
      delta: the stated delta.
      relation: the neighbouring relation the guarantee is stated under, the one the
        ledger is told when ``event`` is charged.
      event: the `DpEvent` charged to the ledger for the release.
    """

    @property
    def epsilon(self) -> float: ...

    @property
    def delta(self) -> float: ...

    @property
    def relation(self) -> NeighboringRelation: ...

    @property
    def event(self) -> dp_event.DpEvent: ...

    def to_dict(self) -> dict:
        """JSON-serialisable metadata naming epsilon, delta and neighboring_relation."""
        ...
