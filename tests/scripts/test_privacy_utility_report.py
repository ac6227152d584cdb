"""The privacy-utility study (`retriever.utility_cells`) and its script's report: the headline
is chosen on the validation queries and the share is measured on the test queries; the
man-pages holdout parser."""

import importlib.util
import math
import re
import sys
from argparse import Namespace
from pathlib import Path

import pytest

from retriever import utility_cells as uc
from retriever.metrics import validation_split

SCRIPTS = Path(__file__).parents[2] / "scripts"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


pu = _load("privacy_utility_retrieval")
holdout = _load("man_pages_holdout")

N = 40
VAL, TEST = validation_split(N)


def _cell(name: str, val: float, test: float, epsilon=1.0) -> dict:
    """A cell whose per-query NDCG is `val` on the validation queries and `test` on the rest."""
    ndcg = [val if i in VAL else test for i in range(N)]
    per_query = {"ndcg@10": ndcg, "recall@10": ndcg, "mrr@10": ndcg}
    return {"cell": name, "epsilon": epsilon, "ndcg@10": sum(ndcg) / N, "per_query": per_query}


def _cells() -> list[dict]:
    return [
        _cell("zero-shot", 0.5, 0.5, epsilon=None),
        _cell("real", 0.9, 0.9, epsilon=math.inf),
        # best on the test queries and on all of them, worst on validation: not the headline
        _cell("synthetic-1", 0.6, 0.95),
        _cell("synthetic-1+filter", 0.8, 0.7),
        _cell("synthetic-3", 0.95, 0.95, epsilon=3.0),
    ]


def test_auto_headline_is_the_best_validation_cell_at_that_epsilon():
    assert uc.headline_cell(_cells(), "auto") == "synthetic-1+filter"
    assert uc.headline_cell(_cells(), "none") == "synthetic-1"
    assert uc.headline_cell(_cells(), "all") == "synthetic-1+all"
    assert uc.headline_cell(_cells()[:2], "auto") is None


def test_share_is_measured_on_the_test_queries_only():
    name, share, (lo, hi) = uc.headline_share(_cells(), "auto")
    assert name == "synthetic-1+filter"
    assert share == pytest.approx((0.7 - 0.5) / (0.9 - 0.5))
    assert lo == pytest.approx(share) and hi == pytest.approx(share)  # constant per query
    assert uc.headline_share(_cells(), "all") is None  # the named cell is missing


def test_report_prints_the_test_half_and_the_last_line(tmp_path, capsys):
    args = Namespace(headline="auto", full_corpus_out=None, holdout_ndcg=0.75)
    pu.report(_cells(), tmp_path, args)
    lines = capsys.readouterr().out.strip().splitlines()
    assert (
        lines[-1] == "share_of_real_gain_eps1=0.5000 full_corpus_share_eps1=nan holdout_ndcg=0.7500"
    )
    row = next(line for line in lines if line.startswith("| synthetic-1 |"))
    assert "| 0.6000 | 0.9500 [0.9500, 0.9500]" in row  # validation, then test
    assert (tmp_path / "privacy_utility.png").is_file()
    assert "per_query" not in (tmp_path / "results.json").read_text()


RENDERED = """LS(1)                 User Commands                LS(1)

NAME
       ls, dir - list directory
       contents

SYNOPSIS
       ls [OPTION]... [FILE]...

DESCRIPTION
       List  information  about  the FILEs.

       -a, --all
              do not ignore entries starting with .

SEE ALSO
       dircolors(1)
"""


def test_man_page_parser_takes_name_summary_and_description():
    name, summary, description = holdout.parse_page(RENDERED)
    assert (name, summary) == ("ls", "list directory contents")
    assert description.startswith("List information about the FILEs. -a, --all do not")
    assert "dircolors" not in description
    assert re.fullmatch(r"\S+( \S+)*", description)
    assert holdout.parse_page(RENDERED.replace(" - ", " ")) is None
    assert holdout.parse_page(RENDERED.split("DESCRIPTION")[0]) is None


def test_cell_names_say_which_levers():
    assert uc.cell_name("synthetic-1", ()) == "synthetic-1"
    assert uc.cell_name("synthetic-1", ("filter",)) == "synthetic-1+filter"
    assert uc.cell_name("synthetic-1", ("filter", "negatives")) == "synthetic-1+filter+negatives"
    assert uc.cell_name("synthetic-1", uc.LEVERS) == "synthetic-1+all"


def test_schedule_check_compares_with_the_real_cell_of_the_same_schedule(tmp_path, capsys):
    cells = [*_cells(), _cell("real-e2", 1.0, 1.0, math.inf), _cell("synthetic-1-e2", 0.7, 0.8)]
    assert uc.headline_cell(cells, "auto") == "synthetic-1+filter"  # not a schedule trial
    assert uc.gain_share(cells, "synthetic-1-e2", real="real-e2")[1] == pytest.approx(0.6)
    pu.report(cells, tmp_path, Namespace(headline="auto", full_corpus_out=None, holdout_ndcg=None))
    out = capsys.readouterr().out
    assert "schedule check: synthetic-1-e2, share of real-e2's gain 0.600" in out


def test_plot_curves_tell_levers_and_schedule_checks_apart():
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
