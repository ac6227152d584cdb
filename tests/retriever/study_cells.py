"""Cells of a privacy-utility study with known figures on each half of the held-out queries,
shared by the tests of `retriever.utility_cells` and of the script's report."""

import math

from retriever.metrics import validation_split

N = 40
VAL, TEST = validation_split(N)


def make_cell(name: str, val: float, test: float, epsilon=1.0) -> dict:
    """A cell whose per-query NDCG is `val` on the validation queries and `test` on the rest."""
    ndcg = [val if i in VAL else test for i in range(N)]
    per_query = {"ndcg@10": ndcg, "recall@10": ndcg, "mrr@10": ndcg}
    return {"cell": name, "epsilon": epsilon, "ndcg@10": sum(ndcg) / N, "per_query": per_query}


def example_cells() -> list[dict]:
    return [
        make_cell("zero-shot", 0.5, 0.5, epsilon=None),
        make_cell("real", 0.9, 0.9, epsilon=math.inf),
        # best on the test queries and on all of them, worst on validation: not the headline
        make_cell("synthetic-1", 0.6, 0.95),
        make_cell("synthetic-1+filter", 0.8, 0.7),
        make_cell("synthetic-3", 0.95, 0.95, epsilon=3.0),
    ]
