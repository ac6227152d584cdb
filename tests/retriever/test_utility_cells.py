"""The privacy-utility study's figures: the headline is chosen on the validation queries, the
share and the paired differences are measured on each half as stated, cells are named and
ordered by their levers."""

import math

import pytest

from retriever import utility_cells as uc
from tests.retriever.study_cells import example_cells, make_cell


def test_auto_headline_is_the_best_validation_cell_at_that_epsilon():
    assert uc.headline_cell(example_cells(), "auto") == "synthetic-1+filter"
    assert uc.headline_cell(example_cells(), "none") == "synthetic-1"
    assert uc.headline_cell(example_cells(), "all") == "synthetic-1+all"
    assert uc.headline_cell(example_cells()[:2], "auto") is None


def test_share_is_measured_on_the_test_queries_only():
    name, share, (lo, hi) = uc.headline_share(example_cells(), "auto")
    assert name == "synthetic-1+filter"
    assert share == pytest.approx((0.7 - 0.5) / (0.9 - 0.5))
    assert lo == pytest.approx(share) and hi == pytest.approx(share)  # constant per query
    assert uc.headline_share(example_cells(), "all") is None  # the named cell is missing


def test_schedule_checks_are_never_the_headline_and_use_their_own_real_cell():
    cells = [*example_cells(), make_cell("real-e2", 1.0, 1.0, math.inf)]
    cells.append(make_cell("synthetic-1-e2", 0.99, 0.8))  # best on validation, but a check
    assert uc.headline_cell(cells, "auto") == "synthetic-1+filter"
    assert uc.gain_share(cells, "synthetic-1-e2", real="real-e2")[1] == pytest.approx(0.6)


def test_share_refuses_cells_scored_on_other_queries():
    cells = example_cells()
    cells[1]["per_query"]["ndcg@10"] = cells[1]["per_query"]["ndcg@10"][:-1]
    with pytest.raises(ValueError, match="different query sets"):
        uc.gain_share(cells, "synthetic-1")


def test_paired_difference_is_per_half_and_its_interval_pairs_the_queries():
    diff = uc.paired_difference(example_cells(), "synthetic-1+filter", "synthetic-1")
    assert diff["validation"][0] == pytest.approx(0.8 - 0.6)
    assert diff["test"][0] == pytest.approx(0.7 - 0.95)
    # per-query differences are constant within a half: a paired interval has no width
    assert diff["test"][1] == pytest.approx((0.7 - 0.95, 0.7 - 0.95))
    assert uc.paired_difference(example_cells(), "synthetic-1+all", "synthetic-1") is None


def test_cell_names_say_which_levers():
    assert uc.cell_name("synthetic-1", ()) == "synthetic-1"
    assert uc.cell_name("synthetic-1", ("filter",)) == "synthetic-1+filter"
    assert uc.cell_name("synthetic-1", ("filter", "negatives")) == "synthetic-1+filter+negatives"
    assert uc.cell_name("synthetic-1", uc.LEVERS) == "synthetic-1+all"


def test_levers_of_tells_levers_and_schedule_checks_apart():
    assert uc.levers_of("1") == ""
    assert uc.levers_of("1+negatives") == "+negatives"
    assert uc.levers_of("3+filter+negatives") == "+filter+negatives"
    assert uc.levers_of("1-e2") is None


def test_lever_combinations_sort_plain_first_then_by_count_and_all_last():
    names = ["synthetic-1+all", "synthetic-1+negatives", "synthetic-1", "synthetic-1+filter"]
    names += ["synthetic-1+filter+negatives", "synthetic-1+multi"]
    assert sorted(names, key=uc.lever_rank) == [
        "synthetic-1",
        "synthetic-1+filter",
        "synthetic-1+multi",
        "synthetic-1+negatives",
        "synthetic-1+filter+negatives",
        "synthetic-1+all",
    ]
    assert uc.lever_rank("+filter") == uc.lever_rank("synthetic-3+filter")
    with pytest.raises(ValueError, match="unknown levers"):
        uc.lever_rank("synthetic-1+filtre")
