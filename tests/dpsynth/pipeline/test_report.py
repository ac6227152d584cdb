"""The report's retrieval figure names its metrics and zooms to the values (issue 51, 15)."""

import matplotlib
import matplotlib.figure
import pytest

from dpsynth.pipeline import report


@pytest.fixture
def saved_figures(monkeypatch):
    """The figures `report._plots` draws, captured as they are saved."""
    figures = []
    original = matplotlib.figure.Figure.savefig

    def savefig(self, *args, **kwargs):
        figures.append(self)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", savefig)
    return figures


def _metrics(rows):
    return {"evaluation": {"k": 10, "rows": rows}, "stages": [], "privacy": []}


def test_retrieval_plot_labels_the_metric_and_zooms_to_the_values(saved_figures):
    rows = [
        {"encoder": "zero-shot", "ndcg": 0.781, "recall": 0.901},
        {"encoder": "dp-synthetic", "ndcg": 0.808, "recall": 0.906},
        {"encoder": "real", "ndcg": 0.847, "recall": 0.944},
    ]
    plots = report._plots(_metrics(rows))
    assert plots["retrieval.png"].startswith(b"\x89PNG")
    (ax,) = saved_figures[0].axes
    assert "NDCG@10" in ax.get_ylabel() and "Recall@10" in ax.get_ylabel()
    low, high = ax.get_ylim()
    assert 0.5 < low < 0.781 and 0.944 < high
    # 0.781 against 0.847 is a visible share of the axis, not 7% of a 0-1 scale
    assert (0.847 - 0.781) / (high - low) > 0.2
    labels = {text.get_text() for text in ax.texts}
    assert {"0.781", "0.847", "0.944"} <= labels


def test_retrieval_plot_keeps_zero_when_the_values_span_the_scale(saved_figures):
    rows = [
        {"encoder": "a", "ndcg": 0.05, "recall": 0.12},
        {"encoder": "b", "ndcg": 0.99, "recall": 1.0},
    ]
    report._plots(_metrics(rows))
    low, high = saved_figures[0].axes[0].get_ylim()
    assert low == 0.0 and 1.0 < high <= 1.15


def test_the_statement_names_the_collection_cap_and_lists_each_charge_once():
    charge = {"stage": "rag-tokens", "epsilon": 2.7, "delta": 1e-6, "description": "rag answer",
              "time": "2026-12-01T05:35:02"}  # fmt: skip
    scope = {"dataset": "notes", "privacy_unit": "one note", "relation": "ADD_OR_REMOVE_ONE",
             "accountant": "pld", "epsilon_cap": 10.0, "delta_cap": 1e-4, "epsilon": 2.7,
             "delta": 1e-4, "charges": [charge]}  # fmt: skip
    metrics = {
        "name": "t", "created": "now", "stages": [],
        "privacy": [{**scope, "tenant": "*"}, {**scope, "tenant": "pipeline"}],
        "rag": {"dataset": "notes"}, "generate": {"epsilon": 8.0, "delta": 1e-5},
    }  # fmt: skip
    page = report._html(metrics, {}, [])
    assert "<b>notes</b> (the collection cap: every tenant's answers together)" in page
    assert "<b>notes</b> (tenant pipeline)" in page and "(tenant *)" not in page
    assert page.count("2026-12-01T05:35:02") == 1  # the cap's rows are the tenants' rows
    assert "charged to the tenant's notes scope above and counted by its collection cap" in page


def test_a_stated_epsilon_or_delta_is_never_shown_below_itself():
    assert report._up(7.962115) == "7.9622" and report._num(7.962115) == "7.9621"
    assert report._up(0.0010499) == "0.0011" and report._num(0.0010499) == "0.001"
    assert report._up(1 / 192) == "0.0053" and report._up(1.23456e-6) == "1.235e-06"
    assert report._up(2.0) == "2" and report._up(0.0) == "0" and report._up(None) == "-"
    assert report._up(float("inf")) == "inf"
