"""End to end canary audit of a tiny query generator: without noise it memorises canaries
repeated 10 times (high exposure, greedy extraction), at epsilon = 0.5 it does not. With the
noise switched off the DP run would memorise like the non-private one and this test fails."""

import json
import math

import numpy as np
import pytest

from configs import querygen as presets
from synthgen import corpora
from synthgen.audit import auditor, canaries, querygen_audit, report

REFERENCES = 30
MAX_EXPOSURE = math.log2(REFERENCES)


@pytest.fixture(scope="module")
def audited(tmp_path_factory):
    root = tmp_path_factory.mktemp("audit")
    pairs = corpora.load_wiki_summaries(limit=150)
    config = presets.get("tiny_llama").replace(
        target_len=32, dp_epochs=20, dp_batch_size=32, dp_learning_rate=1e-2
    )
    spec = canaries.CanarySpec(
        kinds=("secret", "random_document"),
        repetitions=(1, 10),
        per_cell={1: 8, 10: 4},
        references=REFERENCES,
    )
    args = dict(
        epsilons=(math.inf, 0.5),
        spec=spec,
        work_dir=root / "work",
        seed=7,
        progress=False,
    )
    audit = querygen_audit.run_querygen_audit(config, pairs, root / "report", **args)
    return audit, root, config, pairs, args


def _cells(run, repetitions, included=True):
    return [
        c for c in run["cells"] if c["repetitions"] == repetitions and c["included"] == included
    ]


@pytest.mark.slow
def test_non_private_memorises_and_dp_does_not(audited):
    audit, *_ = audited
    non_private, dp = audit["runs"]
    assert math.isinf(non_private["epsilon"]) and dp["epsilon"] == pytest.approx(0.5, rel=1e-3)
    memorised = _cells(non_private, 10)
    assert memorised, "no canary repeated 10 times was inserted"
    assert np.mean([c["median_exposure"] for c in memorised]) >= MAX_EXPOSURE - 0.5
    assert np.mean([c["extracted"] for c in memorised]) >= 0.5
    assert min(c["median_extrapolated_exposure"] for c in memorised) > 10
    private = _cells(dp, 10)
    assert np.mean([c["median_exposure"] for c in private]) <= MAX_EXPOSURE - 2
    assert all(c["extracted"] == 0 for c in private)
    # canaries that were not inserted are not exposed by either model
    for run in audit["runs"]:
        assert all(c["extracted"] == 0 for c in run["cells"] if not c["included"])
    # membership: the non-private model separates inserted from held-out canaries
    single = next(m for m in non_private["membership"] if m["repetitions"] == 1)
    assert single["auroc"] >= 0.9
    dp_single = next(m for m in dp["membership"] if m["repetitions"] == 1)
    assert dp_single["claimed_epsilon"] == pytest.approx(dp["epsilon"])
    assert not dp_single["violation"]
    assert dp_single["epsilon_one_run"] <= dp["epsilon"]


@pytest.mark.slow
def test_report_holds_aggregates_only_and_the_record_stays_private(audited):
    audit, root, *_ = audited
    out = root / "report"
    for name in (report.AUDIT_FILE, report.TABLE_FILE, report.EXPOSURE_PLOT, report.ROC_PLOT):
        assert (out / name).is_file()
    text = (out / report.AUDIT_FILE).read_text() + (out / report.TABLE_FILE).read_text()
    json.loads((out / report.AUDIT_FILE).read_text())  # strict JSON (inf as a string)
    drawn, record = canaries.load_record(root / "work")
    assert len(drawn) == 2 * 8 + 2 * 4 and "references" in record
    for c in drawn:
        assert c.secret not in text and c.key not in text
    assert not list(out.glob("**/*.msgpack")) and not list(out.glob("**/canaries*"))


@pytest.mark.slow
def test_a_second_call_resumes_without_training(audited):
    audit, root, config, pairs, args = audited
    models = root / "work" / querygen_audit.MODELS
    stamps = {p: p.stat().st_mtime_ns for p in models.glob("*/params.msgpack")}
    again = querygen_audit.run_querygen_audit(config, pairs, root / "again", **args)
    assert {p: p.stat().st_mtime_ns for p in models.glob("*/params.msgpack")} == stamps
    assert report.strict_json(again) == report.strict_json(audit)


def test_a_violation_is_flagged_loudly(tmp_path, capsys):
    inside, outside = np.arange(200.0) + 1000, np.arange(200.0)
    result = auditor.audit(inside, outside, claimed_epsilon=0.1, delta=1e-5)
    assert result.violation
    row = {"repetitions": 1, **result.to_dict()}
    row["violation_message"] = auditor.violation_message(result)
    audit = {
        "generator": "test",
        "significance": 0.05,
        "runs": [{"epsilon": 0.1, "cells": [], "membership": [row], "roc": {}}],
    }
    report.write_report(audit, tmp_path)
    assert "PRIVACY VIOLATION" in capsys.readouterr().err
    assert "**VIOLATION**" in (tmp_path / report.TABLE_FILE).read_text()
