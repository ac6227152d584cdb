"""Cells of a privacy-utility study: their names, figures on the test queries, the headline.

A cell is one trained (or zero-shot) retriever scored on the held-out real queries, a dict
with ``"cell"`` (its name), ``"epsilon"`` and ``"per_query"`` (``{metric: one value per
query}``, in `retriever.metrics.group_queries` order). Names:

* ``zero-shot``, ``real`` (real train queries, no DP), ``direct-dp-<epsilon>``;
* ``synthetic-<epsilon>`` (a DP query generator's release), with the levers that cost no
  privacy appended (``synthetic-1+filter+negatives``; ``+all`` for every lever, `cell_name`);
* ``real-e<E>`` / ``synthetic-<epsilon>-e<E>``: the same with the retriever trained E epochs
  (a schedule check).

The held-out queries are halved once by a fixed public permutation
(`retriever.metrics.validation_split`): the headline cell is chosen by its validation NDCG@10
and every reported figure is the test half's, so the figure is not the maximum of noisy test
figures. The queries are private data too; these figures are for the operator's report.
"""

from __future__ import annotations

import math

from retriever.metrics import bootstrap_interval, validation_split

METRICS = ("ndcg@10", "recall@10", "mrr@10")
LEVERS = ("filter", "multi", "negatives")


def cell_name(name: str, levers: tuple[str, ...]) -> str:
    """``synthetic-1``, ``synthetic-1+filter``, ``synthetic-1+filter+negatives``, and
    ``synthetic-1+all`` for every lever in `LEVERS`."""
    if set(levers) == set(LEVERS):
        return f"{name}+all"
    return "+".join((name, *levers))


def levers_of(rest: str) -> str | None:
    """The lever suffix of a synthetic cell's name after ``synthetic-``: ``"+filter"`` of
    ``"1+filter"``, ``""`` of ``"1"``; None for a schedule check (``"1-e2"``)."""
    epsilon, _, levers = rest.partition("+")
    return None if "-e" in epsilon else (f"+{levers}" if levers else "")


def lever_rank(name: str) -> tuple[int, list[int]]:
    """A sort key for lever combinations, from a cell name or a lever suffix: none, one lever
    (in `LEVERS` order), two, ..., ``+all`` last."""
    levers = name.split("+")[1:]
    levers = list(LEVERS) if levers == ["all"] else levers
    return len(levers), [LEVERS.index(lever) for lever in levers if lever in LEVERS]


def split_figures(cell: dict) -> dict:
    """The cell's validation NDCG@10 and its test-half metrics with percentile-bootstrap 95%
    intervals over the test queries."""
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
    """The cell a report's last line is about: named in advance (a lever combination such as
    ``filter``, ``all``, or ``none`` for the plain cell), or (``auto``) the synthetic cell at
    `epsilon`, plain or with levers, with the best validation NDCG@10; None when there is no
    such cell. Schedule checks are never candidates."""
    prefix = f"synthetic-{epsilon:g}"
    if headline != "auto":
        return prefix + ("" if headline == "none" else f"+{headline}")
    candidates = [c for c in cells if c["cell"] == prefix or c["cell"].startswith(prefix + "+")]
    if not candidates:
        return None
    return max(candidates, key=lambda c: split_figures(c)["validation_ndcg@10"])["cell"]


def headline_share(
    cells: list[dict], headline: str = "auto", epsilon: float = 1.0
) -> tuple[str, float, tuple[float, float]] | None:
    """`gain_share` of the `headline_cell`; None when a cell is missing."""
    name = headline_cell(cells, headline, epsilon)
    return None if name is None else gain_share(cells, name)


def gain_share(
    cells: list[dict], name: str, real: str = "real"
) -> tuple[str, float, tuple[float, float]] | None:
    """(name, the cell's share of the `real` cell's gain over zero-shot on the test queries,
    ``(NDCG - zero-shot) / (real - zero-shot)``, its paired-bootstrap 95% interval), or None
    when one of the three cells is missing.

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


def _mean(values, positions=None) -> float:
    picked = values if positions is None else [values[i] for i in positions]
    return sum(picked) / len(picked)
