"""End to end canary audit of a tiny query generator: without noise it memorises canaries
repeated 10 times (high exposure, greedy extraction), at epsilon = 0.5 it does not. With the
noise switched off the DP run would memorise like the non-private one and this test fails."""

import json
import math

import numpy as np
import pytest

from dpsynth.config_files import querygen_preset
from synthgen import corpora
from synthgen.audit import auditor, canaries, querygen_audit, report

REFERENCES = 30
MAX_EXPOSURE = math.log2(REFERENCES)


@pytest.fixture(scope="module")
def audited(tmp_path_factory):
    root = tmp_path_factory.mktemp("audit")
    pairs = corpora.load_wiki_summaries(limit=150)
    config = querygen_preset("tiny_llama").replace(
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


@pytest.mark.slow
def test_a_non_private_model_claimed_private_is_flagged(audited):
    """The same scores, as if the non-private run had claimed epsilon = 0.05: flagged."""
    audit, root, *_ = audited
    drawn, record = canaries.load_record(root / "work")
    scores = dict(np.load(root / "work" / querygen_audit.SCORES / "inf.npz"))
    base = np.asarray(record["base_log_perplexity"])
    rows, _ = querygen_audit.membership_figures(drawn, scores, base, 0.05, 1e-5, 0.05)
    single = next(r for r in rows if r["repetitions"] == 1)
    assert single["violation"] and single["epsilon_one_run"] > 0.05
    assert "PRIVACY VIOLATION" in single["violation_message"]


@pytest.mark.slow
def test_the_claim_does_not_depend_on_which_canaries_went_in(audited):
    """Every run is planned for all canary copies (fixed Poisson rate), not the drawn ones."""
    audit, root, config, pairs, args = audited
    drawn, _ = canaries.load_record(root / "work")
    planned = len(pairs) + sum(c.repetitions for c in drawn)
    for tag in ("inf", "0.5"):
        generator = json.loads(
            (root / "work" / querygen_audit.MODELS / tag / "generator.json").read_text()
        )
        assert generator["privacy"]["num_examples"] == planned


def test_work_folder_inside_the_report_is_refused(tmp_path):
    spec = canaries.CanarySpec(kinds=("secret",), repetitions=(1,), per_cell=2)
    with pytest.raises(ValueError, match="overlap"):
        querygen_audit.run_querygen_audit(
            querygen_preset("tiny_llama"),
            corpora.load_wiki_summaries(limit=40),
            tmp_path / "report",
            epsilons=(1.0,),
            spec=spec,
            work_dir=tmp_path / "report" / "work",
            progress=False,
        )


def test_a_plan_given_for_other_runs_is_refused_before_any_charge(tmp_path):
    """The caller's charged plan must be these runs': one per (finite) epsilon, each for
    every canary copy; the payer is never called."""
    import types

    spec = canaries.CanarySpec(kinds=("secret",), repetitions=(1,), per_cell=2)
    pairs = corpora.load_wiki_summaries(limit=40)
    size = querygen_audit.planned_size(spec, len(pairs))
    run = types.SimpleNamespace(num_examples=size)
    cases = {  # (epsilons, the plan's runs, what is refused)
        "epsilons": ((1.0, 2.0), (run,), "charged plan of 1 runs"),
        "inf": ((math.inf,), (run,), "charged plan"),
        "examples": ((1.0,), (types.SimpleNamespace(num_examples=size - 1),), "examples"),
    }
    for epsilons, runs, message in cases.values():
        with pytest.raises(ValueError, match=message):
            querygen_audit.run_querygen_audit(
                querygen_preset("tiny_llama"), pairs, tmp_path / "report", epsilons=epsilons,
                spec=spec, work_dir=tmp_path / "work", progress=False,
                pay=lambda *a, **k: pytest.fail("charged"),
                plan=querygen_audit.AuditRunsPlan(runs, 1.0, 1e-6),
            )  # fmt: skip


def _audit_cli(tmp_path, pairs, *extra):
    """`synthgen audit run` of one tiny cell (secret canaries, one repetition) on `pairs`,
    its work folder the default one: beside the ledger."""
    import cli_process

    return cli_process.command(
        "synthgen", "audit", "run", "--out", tmp_path / "report", "--pairs", pairs,
        "--ledger", tmp_path / "ledger.db", "--kinds", "secret", "--repetitions", "1",
        "--per-cell", "4", "--references", "3",
        "--split", "all", "--epochs", "1", "--batch-size", "16", "--target-len", "32",
        "--seed", "3", *extra,
    )  # fmt: skip


@pytest.mark.slow
def test_an_audit_of_private_pairs_is_charged_once_and_refuses_inf(tmp_path):
    """A JSONL pairs file is private: the audit is one release of it, charged before it
    trains (the runs' events composed) and not again on a resume; an inf run, which is not
    private, is refused before the ledger is touched."""
    from synthgen.audit.querygen_audit import audit_runs_plan, planned_size
    from synthgen.privacy import PrivacyLedger

    pairs = tmp_path / "pairs.jsonl"
    corpora.load_wiki_summaries(limit=40).to_json(pairs, lines=True)
    refused = _audit_cli(tmp_path, pairs, "--epsilon", "inf,8")
    assert refused.returncode == 2, refused.stderr
    assert "inf run on private pairs is not private" in refused.stderr
    assert not (tmp_path / "ledger.db").exists()
    overlapping = _audit_cli(tmp_path, pairs, "--epsilon", "8", "--work-dir", tmp_path / "report")
    assert overlapping.returncode != 0 and "must not overlap" in overlapping.stderr
    assert not (tmp_path / "ledger.db").exists()  # refused before the pairs were admitted

    trained = []
    for _ in range(2):  # the second run resumes: nothing trained, nothing charged again
        ran = _audit_cli(tmp_path, pairs, "--epsilon", "8")
        assert ran.returncode == 0, ran.stderr
        (work,) = (tmp_path / "work").iterdir()  # beside --ledger, named after the report
        (model,) = (work / "models").iterdir()
        trained.append(max(f.stat().st_mtime_ns for f in model.iterdir()))
    assert trained[0] == trained[1]
    (charge,) = PrivacyLedger(tmp_path / "ledger.db").charges("audit", "pairs")
    assert charge.stage == "querygen-audit"
    config = querygen_preset("tiny_llama").replace(dp_epochs=1.0, dp_batch_size=16, target_len=32)
    spec = canaries.CanarySpec(kinds=("secret",), repetitions=(1,), per_cell=4, references=3)
    plan = audit_runs_plan(config, [8.0], planned_size(spec, 40), seed=3)
    assert charge.epsilon == pytest.approx(plan.epsilon)
    stated = json.loads((tmp_path / "report" / "audit.json").read_text())["charged"]
    assert stated["epsilon"] == pytest.approx(plan.epsilon) and stated["delta"] == plan.delta
    table = (tmp_path / "report" / "audit.md").read_text()
    assert f"every run below composed, ε = {plan.epsilon:.3g} at δ = {plan.delta:.3g}" in table
