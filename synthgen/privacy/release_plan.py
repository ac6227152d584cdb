"""`ReleasePlan`: what every DP plan of the project states, fixed before it releases anything.

A plan is the guarantee of one release (a DP-SGD run, a few-shot generation, a Private
Evolution run, a fact release, one DP-RAG answer), built from public figures only: the
event charged before any noise, its relation, the stated (epsilon, delta) (``event``
composed under ``relation`` at ``delta`` gives at most ``epsilon``) and ``to_dict()``,
JSON metadata naming ``epsilon``, ``delta`` and ``neighboring_relation`` (the relation's
``.name``), equal to the attributes. Plans are frozen dataclasses: a plan that changed
after its charge would state a guarantee the ledger never saw. DP-SGD's non-private
reference run (noise multiplier 0) has no event, so it is no release plan (`isinstance`
on it raises the event's ValueError). Every plan class passes one test battery,
``tests/synthgen/privacy/test_release_plans.py``.

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
