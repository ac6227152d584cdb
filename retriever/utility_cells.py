"""Cells of a privacy-utility study: their names, figures on the test queries, the headline.

A cell is one trained (or zero-shot) retriever scored on the held-out real queries: a dict
with ``"cell"``, ``"epsilon"`` and ``"per_query"`` (``{metric: one value per query}``, in
`retriever.metrics.group_queries` order). Names: ``zero-shot``, ``real``,
``direct-dp-<epsilon>``, ``synthetic-<epsilon>`` with the free levers appended
(``synthetic-1+filter+negatives``, ``+all``: `cell_name`), and ``-e<E>`` for E epochs.

The held-out queries are halved once by a fixed public permutation
(`retriever.metrics.validation_split`): the headline cell is chosen by its validation NDCG@10
and every reported figure is the test half's, so it is not the maximum of noisy test
figures. The queries are private data too; these figures are for the operator's report.
"""

from __future__ import annotations

import math

from retriever.metrics import bootstrap_interval, validation_split

METRICS = ("ndcg@10", "recall@10", "mrr@10")
LEVERS = ("filter", "multi", "negatives")


def cell_name(name: str, levers: tuple[str, ...]) -> str:
    """The name of a synthetic cell with levers.

    Args:
      name: the plain cell, e.g. ``synthetic-1``.
      levers: lever names from `LEVERS`, in the order to write them.

    Returns:
      ``synthetic-1``, ``synthetic-1+filter``, ``synthetic-1+filter+negatives``, or
      ``synthetic-1+all`` when `levers` holds every lever in `LEVERS`.
    """
    if set(levers) == set(LEVERS):
        return f"{name}+all"
    return "+".join((name, *levers))


def levers_of(rest: str) -> str | None:
    """The lever suffix of a synthetic cell's name.

    Args:
      rest: the name after ``synthetic-`` (``"1+filter"``).

    Returns:
      ``"+filter"`` of ``"1+filter"``, ``""`` of ``"1"``; None for a schedule check
      (``"1-e2"``).
    """
    epsilon, _, levers = rest.partition("+")
    return None if "-e" in epsilon else (f"+{levers}" if levers else "")


def lever_rank(name: str) -> tuple[int, list[int]]:
    """A sort key that orders lever combinations: none, one lever, two, ..., ``+all`` last.

    Args:
      name: a cell name (``synthetic-3+filter``) or a lever suffix (``+filter``).

    Returns:
      (how many levers, their positions in `LEVERS`).

    Raises:
      ValueError: a lever not in `LEVERS`.
    """
    levers = name.split("+")[1:]
    levers = list(LEVERS) if levers == ["all"] else levers
    unknown = [lever for lever in levers if lever not in LEVERS]
    if unknown:
        raise ValueError(f"unknown levers {unknown} in {name!r}: expected some of {LEVERS}")
    return len(levers), [LEVERS.index(lever) for lever in levers]


def split_figures(cell: dict) -> dict:
    """A cell's figures on the two halves of the held-out queries.

    Args:
      cell: a cell with ``per_query`` values.

    Returns:
      ``validation_ndcg@10``, ``validation_queries``, ``test_queries``, and for each metric
      ``test_<metric>`` with its percentile-bootstrap 95% interval ``test_<metric>_ci95``.
    """
    per_query = cell["per_query"]
    val, test = validation_split(len(per_query["ndcg@10"]))
    out: dict = {
        "validation_ndcg@10": _mean(per_query["ndcg@10"], val),
        "validation_queries": len(val),
        "test_queries": len(test),
    }
    for k in METRICS:
        values = [per_query[k][i] for i in test]
        out[f"test_{k}"] = _mean(values)
        out[f"test_{k}_ci95"] = bootstrap_interval(lambda m: m, values)
    return out


def headline_cell(cells: list[dict], headline: str = "auto", epsilon: float = 1.0) -> str | None:
    """The cell a report's last line is about.

    Args:
      cells: the finished cells.
      headline: ``auto`` for the synthetic cell at `epsilon`, plain or with levers, with the
        best validation NDCG@10 (schedule checks are never candidates); or a lever
        combination named in advance (``filter``, ``filter+negatives``, ``all``; ``none`` for
        the plain cell).
      epsilon: the synthetic cells' epsilon.

    Returns:
      The cell's name; None under ``auto`` when there is no synthetic cell at `epsilon`.
    """
    prefix = f"synthetic-{epsilon:g}"
    if headline != "auto":
        return prefix + ("" if headline == "none" else f"+{headline}")
    candidates = [c for c in cells if c["cell"] == prefix or c["cell"].startswith(prefix + "+")]
    if not candidates:
        return None

    def validation_ndcg(cell: dict) -> float:
        values = cell["per_query"]["ndcg@10"]
        return _mean(values, validation_split(len(values))[0])

    return max(candidates, key=validation_ndcg)["cell"]


def headline_share(
    cells: list[dict], headline: str = "auto", epsilon: float = 1.0
) -> tuple[str, float, tuple[float, float]] | None:
    """`gain_share` of the `headline_cell`; None when a cell is missing."""
    name = headline_cell(cells, headline, epsilon)
    return None if name is None else gain_share(cells, name)


def gain_share(
    cells: list[dict], name: str, real: str = "real"
) -> tuple[str, float, tuple[float, float]] | None:
    """A cell's share of the real queries' gain over zero-shot, on the test queries.

    Args:
      cells: the finished cells, ``zero-shot`` among them.
      name: the cell to measure.
      real: the upper-bound cell (``real``, or ``real-e2`` for a schedule check).

    Returns:
      (name, ``(NDCG - zero-shot) / (real - zero-shot)`` on the test queries, its
      paired-bootstrap 95% interval), or None when one of the three cells is missing.

    Raises:
      ValueError: the cells were scored on different query sets.
    """
    by = {c["cell"]: c for c in cells}
    if not {"zero-shot", real, name} <= set(by):
        return None
    zero, base, cell = (by[n]["per_query"]["ndcg@10"] for n in ("zero-shot", real, name))
    if not len(zero) == len(base) == len(cell):
        raise ValueError("the cells were scored on different query sets")
    _, test = validation_split(len(cell))
    zero, base, cell = ([values[i] for i in test] for values in (zero, base, cell))

    def share(z, r, b):
        return (b - z) / (r - z) if r != z else math.nan

    value = share(_mean(zero), _mean(base), _mean(cell))
    return name, value, bootstrap_interval(share, zero, base, cell)


def paired_difference(cells: list[dict], name: str, against: str) -> dict | None:
    """How much a cell's NDCG@10 differs from another's, on the same queries.

    Args:
      cells: the finished cells.
      name: the cell to compare (``synthetic-3+multi``).
      against: the cell it is compared with (``synthetic-3``).

    Returns:
      ``{"validation": (difference, (lo, hi)), "test": (difference, (lo, hi))}``: mean NDCG@10
      of `name` minus that of `against` on each half, with a paired-bootstrap 95% interval
      (each replicate resamples the queries once for both cells); None when a cell is missing.

    Raises:
      ValueError: the cells were scored on different query sets.
    """
    by = {c["cell"]: c for c in cells}
    if not {name, against} <= set(by):
        return None
    cell, base = (by[n]["per_query"]["ndcg@10"] for n in (name, against))
    if len(cell) != len(base):
        raise ValueError("the cells were scored on different query sets")
    out = {}
    for half, positions in zip(("validation", "test"), validation_split(len(cell))):
        b, c = [base[i] for i in positions], [cell[i] for i in positions]
        out[half] = _mean(c) - _mean(b), bootstrap_interval(lambda x, y: y - x, b, c)
    return out


def _mean(values, positions=None) -> float:
    picked = values if positions is None else [values[i] for i in positions]
    return sum(picked) / len(picked)
