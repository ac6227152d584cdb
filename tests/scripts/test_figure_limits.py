"""The results figures show every curve and line they draw (issue 51, item 15): the
privacy-utility plot's non-private generator line and the stream plot's collection curve."""

import importlib.util
import json
import sys
from pathlib import Path

from tests.dpsynth.pipeline import test_report as _report

ROOT = Path(__file__).parents[2]
saved_figures = _report.saved_figures  # the fixture that captures the figures as saved


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _inside(ax, floor: bool = False) -> bool:
    """Every line strictly inside the y-limits (on the floor too, where `floor`: a stream's
    accuracy of 0 is drawn on a y-axis that starts at 0)."""
    low, high = ax.get_ylim()
    ys = [y for line in ax.get_lines() for y in line.get_ydata()]
    return bool(ys) and all((low <= y if floor else low < y) and y < high for y in ys)


def test_privacy_utility_replot_shows_every_line_of_the_stored_json(tmp_path, saved_figures):
    cells = json.loads((ROOT / "docs" / "privacy_utility.json").read_text())
    pu = _load("privacy_utility_retrieval")
    pu.plot(cells, tmp_path / "privacy_utility.png")
    (ax,) = saved_figures[0].axes
    top = max(c["ndcg@10"] for c in cells)  # the non-private generator's line
    assert any(top in line.get_ydata() for line in ax.get_lines())
    assert _inside(ax)
    assert "370 held-out" in ax.get_ylabel()


def test_stream_plot_holds_a_curve_that_starts_at_one(tmp_path, saved_figures):
    mq = _load("multi_query_eval")
    config = {
        "questions": 4, "records": 10, "document_delta": 1e-6, "epsilon": 5.0,
        "document_epsilon": 10.0, "modes": ["collection", "individual"],
    }  # fmt: skip
    streams = {
        "collection": [{"correct": c} for c in (True, False, False, False)],
        "individual": [{"correct": c} for c in (False, True, False, True)],
    }
    single = {"uniform": 0.07, "stream_mix": 0.26}
    mq.plot(config, streams, single, tmp_path / "cumulative_accuracy.png")
    (ax,) = saved_figures[0].axes
    assert ax.get_ylim()[1] > 1.0
    assert _inside(ax, floor=True)
