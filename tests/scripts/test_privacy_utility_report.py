"""The privacy-utility script's report (the test half's table, the paired differences, the
schedule check, the last line) and the man-pages holdout parser."""

import importlib.util
import math
import re
import sys
from argparse import Namespace
from pathlib import Path

from tests.retriever.study_cells import example_cells, make_cell

SCRIPTS = Path(__file__).parents[2] / "scripts"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


pu = _load("privacy_utility_retrieval")
holdout = _load("man_pages_holdout")


def test_report_prints_the_test_half_and_the_last_line(tmp_path, capsys):
    args = Namespace(headline="auto", full_corpus_out=None, holdout_ndcg=0.75)
    pu.report(example_cells(), tmp_path, args)
    lines = capsys.readouterr().out.strip().splitlines()
    assert (
        lines[-1] == "share_of_real_gain_eps1=0.5000 full_corpus_share_eps1=nan holdout_ndcg=0.7500"
    )
    row = next(line for line in lines if line.startswith("| synthetic-1 |"))
    assert "| 0.6000 | 0.9500 [0.9500, 0.9500]" in row  # validation, then test
    assert (tmp_path / "privacy_utility.png").is_file()
    assert "per_query" not in (tmp_path / "results.json").read_text()
    # the lever cell against the plain cell of its epsilon: validation, then test
    paired = next(line for line in lines if line.startswith("| synthetic-1+filter | synthetic-1 |"))
    assert paired.endswith("| +0.2000 [+0.2000, +0.2000] | -0.2500 [-0.2500, -0.2500] |")


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


def test_schedule_check_compares_with_the_real_cell_of_the_same_schedule(tmp_path, capsys):
    cells = [*example_cells(), make_cell("real-e2", 1.0, 1.0, math.inf)]
    cells.append(make_cell("synthetic-1-e2", 0.7, 0.8))
    pu.report(cells, tmp_path, Namespace(headline="auto", full_corpus_out=None, holdout_ndcg=None))
    out = capsys.readouterr().out
    assert "schedule check: synthetic-1-e2, share of real-e2's gain 0.600" in out
