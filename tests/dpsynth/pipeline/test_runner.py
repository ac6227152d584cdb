"""Stage bookkeeping of the main job: skip, resume, invalidate exactly downstream."""

import dataclasses
import json
import stat

import pytest

from dpsynth.pipeline import (
    STAGES,
    GenerateConfig,
    IndexConfig,
    PipelineConfig,
    RunFolder,
    StageNotReadyError,
    fingerprints,
    load_pipeline_config,
    run_pipeline,
    run_stage,
    stage_status,
)
from dpsynth.pipeline import runner as runner_module
from dpsynth.pipeline import stages as stages_module
from synthgen.dp_train import DPConfig
from synthgen.querygen import GeneratorConfig


def _config(**changes) -> PipelineConfig:
    generator = GeneratorConfig(family="llama", base="random:tiny", dp=DPConfig(batch_size=8))
    base = PipelineConfig(generate=GenerateConfig(querygen=generator))
    return dataclasses.replace(base, **changes)


@pytest.fixture
def calls(monkeypatch):
    """Replaces every stage function with one that records its call (no compute)."""
    seen = []

    def fake(name):
        def stage(ctx):
            seen.append(name)
            if ctx.config.name == f"fail-{name}":
                raise KeyboardInterrupt
            return {"stage": name}

        return stage

    monkeypatch.setattr(runner_module, "STAGE_FUNCTIONS", {s: fake(s) for s in STAGES})
    return seen


def test_runs_all_then_skips(tmp_path, calls):
    config = _config()
    run_pipeline(config, tmp_path)
    assert calls == list(STAGES)
    assert set(stage_status(config, RunFolder(tmp_path)).values()) == {"done"}
    record = RunFolder(tmp_path).record("generate")
    assert record["seconds"] >= 0 and record["peak_memory_bytes"] > 0
    calls.clear()
    run_pipeline(config, tmp_path)
    assert calls == []


def test_changed_section_invalidates_exactly_downstream(tmp_path, calls):
    run_pipeline(_config(), tmp_path)
    calls.clear()
    run_pipeline(_config(index=IndexConfig(kind="exact")), tmp_path)
    assert calls == ["index", "report"]
    calls.clear()
    changed = _config(
        index=IndexConfig(kind="exact"), data=dataclasses.replace(_config().data, num_documents=500)
    )
    assert stage_status(changed, RunFolder(tmp_path)) == {s: "stale" for s in STAGES}
    run_pipeline(changed, tmp_path)
    assert calls == list(STAGES)


def test_fingerprints_chain():
    a, b = fingerprints(_config()), fingerprints(_config(index=IndexConfig(kind="exact")))
    assert [s for s in STAGES if a[s] != b[s]] == ["index", "report"]
    c = fingerprints(_config(seed=1))
    assert [s for s in STAGES if a[s] == c[s]] == []  # the seed reaches data, so everything


def test_fields_added_later_enter_the_fingerprint_only_off_their_default():
    from dpsynth.pipeline.context import jsonable

    base = _config()
    assert "accounting" not in jsonable(base.rag)  # old run folders keep their fingerprints
    same = _config(rag=dataclasses.replace(base.rag, relevance_threshold=0.5))
    assert fingerprints(same) == fingerprints(base)
    moved = _config(rag=dataclasses.replace(base.rag, relevance_threshold=0.6))
    assert [s for s in STAGES if fingerprints(moved)[s] != fingerprints(base)[s]] == [
        "rag",
        "report",
    ]


def test_the_rag_sample_is_fingerprinted_as_the_world_fields_it_replaced():
    from dpsynth.pipeline.config import RagStageConfig
    from dpsynth.pipeline.context import jsonable

    base = _config()  # rag.sample at its default, medical-200
    hashed = jsonable(base.rag)
    assert "sample" not in hashed  # as before the field: run folders keep their fingerprints
    assert {k: hashed[k] for k in ("num_records", "num_diseases", "world_seed")} == {
        "num_records": 200,
        "num_diseases": 10,
        "world_seed": 0,
    }
    tiny = _config(rag=RagStageConfig(sample="medical-40"))
    assert jsonable(tiny.rag)["num_records"] == 40 and jsonable(tiny.rag)["num_diseases"] == 5
    assert [s for s in STAGES if fingerprints(tiny)[s] != fingerprints(base)[s]] == [
        "rag",
        "report",
    ]


def test_from_recomputes_that_stage_and_later(tmp_path, calls):
    run_pipeline(_config(), tmp_path)
    calls.clear()
    run_pipeline(_config(), tmp_path, start="evaluate")
    assert calls == ["evaluate", "index", "rag", "report"]


def test_single_stage_needs_its_upstream(tmp_path, calls):
    config, run = _config(), RunFolder(tmp_path)
    with pytest.raises(StageNotReadyError, match="'data'"):
        run_stage("generate", config, run)
    run_stage("data", config, run)
    run_stage("generate", config, run)
    assert calls == ["data", "generate"]
    run_stage("data", config, run, force=True)  # recomputed: generate must run again
    assert stage_status(config, run)["generate"] == "stale"
    with pytest.raises(ValueError, match="unknown stage"):
        run_stage("nope", config, run)


def test_interrupted_stage_is_resumed_not_cleaned(tmp_path, calls):
    run = RunFolder(tmp_path)
    with pytest.raises(KeyboardInterrupt):
        run_pipeline(_config(name="fail-train"), tmp_path)
    broken = _config(name="fail-train")
    assert stage_status(broken, run)["train"] == "interrupted"
    (tmp_path / "encoder").mkdir()
    (tmp_path / "encoder" / "checkpoint").write_text("partial")
    calls.clear()
    run_pipeline(_config(name="fail-train-ok"), tmp_path)  # name only reaches the report
    assert calls == ["train", "evaluate", "index", "rag", "report"]
    assert (tmp_path / "encoder" / "checkpoint").read_text() == "partial"  # resumed in place


def test_stale_stage_outputs_are_removed(tmp_path, calls):
    run_pipeline(_config(), tmp_path)
    (tmp_path / "index").mkdir(exist_ok=True)
    (tmp_path / "index" / "old").write_text("x")
    run_pipeline(_config(index=IndexConfig(kind="exact")), tmp_path)
    assert not (tmp_path / "index" / "old").exists()


def test_private_folder_is_owner_only(tmp_path, calls):
    run_pipeline(_config(), tmp_path)
    mode = stat.S_IMODE((tmp_path / "private").stat().st_mode)
    assert mode == 0o700
    records = [json.loads(p.read_text()) for p in (tmp_path / "stages").glob("*.json")]
    assert {r["stage"] for r in records} == set(STAGES)


def test_config_files_load(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # packaged examples load by name from any folder
    for name in ("tiny", "demo", "gpu"):
        config = load_pipeline_config(name)
        assert isinstance(config, PipelineConfig) and config.name == name
    bad = tmp_path / "bad.py"
    bad.write_text("x = 1\n")
    with pytest.raises(ValueError, match="get_config"):
        load_pipeline_config(bad)
    with pytest.raises(FileNotFoundError):
        load_pipeline_config(tmp_path / "missing.py")


def test_config_validation():
    with pytest.raises(ValueError, match="needs its config"):
        GenerateConfig(kind="fewshot")
    with pytest.raises(ValueError, match="generate"):
        PipelineConfig()


def test_refuses_a_folder_that_is_not_a_run(tmp_path, calls):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "mine.txt").write_text("keep me")
    with pytest.raises(ValueError, match="holds no pipeline run"):
        run_pipeline(_config(), tmp_path)
    with pytest.raises(ValueError, match="holds no pipeline run"):
        run_stage("data", _config(), RunFolder(tmp_path))
    assert (tmp_path / "data" / "mine.txt").read_text() == "keep me" and calls == []


def test_run_scope_refuses_other_caps(tmp_path):
    from dpsynth.pipeline.context import check_run_scope, open_run_scope
    from synthgen.privacy.ledger import PrivacyLedger
    from synthgen.privacy.ledger_types import COLLECTION, Scope

    ledger = PrivacyLedger(tmp_path / "ledger.sqlite")
    open_run_scope(ledger, Scope("t", "d", 10.0, 1e-5))
    open_run_scope(ledger, Scope("t", "d", 10.0, 1e-5))  # the same scope again is fine
    with pytest.raises(ValueError, match="cap 10 .* asks for 3"):
        open_run_scope(ledger, Scope("t", "d", 3.0, 1e-5))
    with pytest.raises(ValueError, match="charges d to tenant 't'.*names tenant 'u'"):
        open_run_scope(ledger, Scope("u", "d", 10.0, 1e-5))
    assert [(s.tenant, s.dataset) for s in ledger.scopes()] == [("t", "d")]  # nothing opened
    open_run_scope(ledger, Scope("t", "e", 10.0, 1e-5))  # another dataset is its own scope
    # a collection cap sits beside the run's tenant, and is held to its caps as well
    open_run_scope(ledger, Scope(COLLECTION, "d", 10.0, 1e-5))
    open_run_scope(ledger, Scope("t", "d", 10.0, 1e-5))
    with pytest.raises(ValueError, match=r"\(\*, d\) with epsilon cap 10 .* asks for 12"):
        check_run_scope(ledger, Scope(COLLECTION, "d", 12.0, 1e-5))


def test_cli_rejects_group_options_before_a_stage(tmp_path):
    from dpsynth.cli.synthgen import app, run

    code = run(app, ["pipeline", "--config", "tiny", "status"])
    assert code == 2


def test_fewshot_generate_precheck_refuses_a_run_over_the_cap(tmp_path):
    from dpsynth.pipeline import PrivacyConfig
    from dpsynth.pipeline.context import StageContext
    from synthgen.fewshot import FewShotConfig
    from synthgen.privacy import BudgetExceededError, PrivacyLedger

    def context(cap):
        fewshot = FewShotConfig(public_pool_size=40, subsets=2, shots=2, target_epsilon=8.0)
        config = _config(
            generate=GenerateConfig(kind="fewshot", fewshot=fewshot, synthetic_documents=4),
            privacy=PrivacyConfig(epsilon_cap=cap),
        )
        return StageContext(config, RunFolder(tmp_path / f"run-{cap}"), progress=False)

    rows = [{"doc_id": str(i), "document": f"document {i}", "query": f"q {i}"} for i in range(40)]
    for cap in (5.0, 10.0):
        ctx = context(cap)
        pairs = ctx.run.private / "data" / "train_pairs.jsonl"
        pairs.parent.mkdir(parents=True)
        pairs.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(BudgetExceededError):
        stages_module.generate_precheck(context(5.0))
    stages_module.generate_precheck(context(10.0))  # fits: nothing is charged by a check
    assert (
        PrivacyLedger(tmp_path / "run-10.0" / "ledger.sqlite").charges("pipeline", "train-pairs")
        == []
    )


def test_an_edited_input_file_makes_its_stage_and_what_reads_it_stale(tmp_path, calls):
    pairs, run = tmp_path / "pairs.jsonl", tmp_path / "run"
    pairs.write_text('{"query": "q", "document": "d"}\n')
    data = dataclasses.replace(_config().data, source=None, pairs=str(pairs), documents="d.jsonl")
    config = _config(data=data)  # documents.jsonl is missing: not hashed, not read here
    run_pipeline(config, run)
    calls.clear()
    run_pipeline(config, run)
    assert calls == []
    pairs.write_text('{"query": "q2", "document": "d"}\n')  # the same path, other pairs
    assert stage_status(config, RunFolder(run)) == {s: "stale" for s in STAGES}
    run_pipeline(config, run)
    assert calls == list(STAGES)
    calls.clear()
    pairs.unlink()  # an input removed after its run: nothing to compare, nothing re-run
    assert stage_status(config, RunFolder(run)) == {s: "done" for s in STAGES}
    run_pipeline(config, run)
    assert calls == []


def test_secret_work_left_behind_a_done_stage_goes_at_the_next_run(tmp_path, calls):
    run_pipeline(_config(), tmp_path)
    left = tmp_path / "private" / "work" / "generate"  # a run stopped after its done record
    left.mkdir(parents=True)
    (left / "noise_key").write_text("secret")
    run_pipeline(_config(), tmp_path)
    assert not left.exists()
