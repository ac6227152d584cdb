"""The main job end to end at tiny size: interrupted mid-generation, resumed by the CLI,
re-run as a no-op, a changed section recomputing only its downstream stages, the generate
and index stages run in 3 shards and joined (the unsharded run's bytes), and the report
checked in headless Chromium."""

import dataclasses
import json
import shutil
from pathlib import Path

import cli_process
import pytest

from dpsynth.config_files import default_configs_dir
from dpsynth.pipeline import (
    STAGES,
    RunFolder,
    StageNotReadyError,
    load_pipeline_config,
    run_pipeline,
    run_stage,
    stage_status,
)
from dpsynth.pipeline import report as report_page
from dpsynth.pipeline.runner import run_shard
from synthgen import querygen
from synthgen.privacy import PrivacyLedger
from synthgen.shards import Shard
from tests.synthgen.release_audit import assert_clean_release, record_randomness

pytestmark = pytest.mark.slow
CONFIG = default_configs_dir() / "tiny.py"  # the packaged example (`--config tiny`)


def _cli(*args):
    return cli_process.command("synthgen", "pipeline", *args, timeout=900)


def _started(run: Path) -> dict:
    return {s: json.loads((run / "stages" / f"{s}.json").read_text())["started"] for s in STAGES}


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    """The tiny pipeline, interrupted after 2 DP steps of the generator, then resumed by
    `synthgen pipeline` in a new process."""
    run = tmp_path_factory.mktemp("pipeline") / "run"
    config = load_pipeline_config(CONFIG)
    original = querygen.train_generator
    with pytest.MonkeyPatch.context() as patch:
        seen = record_randomness(patch)

        def interrupted(*args, **kwargs):
            original(*args, **{**kwargs, "stop_after": 2})
            raise KeyboardInterrupt  # as if the user pressed Ctrl-C mid-training

        patch.setattr(querygen, "train_generator", interrupted)
        with pytest.raises(KeyboardInterrupt):
            run_pipeline(config, run, progress=False)
    state = stage_status(config, RunFolder(run))
    charges = PrivacyLedger(run / "ledger.sqlite").charges("pipeline", "train-pairs")
    with pytest.MonkeyPatch.context() as patch:  # training done, sampling queries interrupted

        def sampling_interrupted(*args, **kwargs):
            raise KeyboardInterrupt

        patch.setattr(querygen, "generate_queries", sampling_interrupted)
        with pytest.raises(KeyboardInterrupt):
            run_pipeline(config, run, progress=False)
    assert (run / "private" / "work" / "generate").is_dir()  # the charge's record is kept
    # The generator is trained and its queries not yet sampled: the state the shards start
    # from (`synthgen pipeline generate --train-only`), kept for the sharded run's test.
    trained = run.parent / "trained"
    shutil.copytree(run, trained, symlinks=True)
    resumed = _cli("--config", CONFIG, "--out", run, "--no-progress")
    return run, config, state, charges, resumed, seen, trained


def test_interrupted_generation_resumes_without_a_second_charge(tiny_run):
    run, config, state, charges, resumed, _, _ = tiny_run
    assert state["data"] == "done" and state["generate"] == "interrupted"
    assert [c.stage for c in charges] == ["dp-train"]  # charged before the first step
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resuming an interrupted run" in resumed.stderr
    report = (run / "report" / "report.html").resolve()
    assert resumed.stdout.strip().splitlines()[-1] == f"report: {report}"
    assert PrivacyLedger(run / "ledger.sqlite").charges("pipeline", "train-pairs") == charges
    generate = RunFolder(run).summary("generate")
    # the last resume found training finished (the second interruption came while sampling)
    assert generate["resumed_from_step"] == generate["steps_run"] == generate["steps"]
    assert set(stage_status(config, RunFolder(run)).values()) == {"done"}


def test_report_numbers_come_from_the_run(tiny_run):
    run = tiny_run[0]
    metrics = json.loads((run / "report" / "metrics.json").read_text())
    folder = RunFolder(run)
    assert metrics["evaluation"] == folder.summary("evaluate")
    assert [r["encoder"] for r in metrics["evaluation"]["rows"]] == [
        "zero-shot",
        "DP synthetic",
        "real (upper bound)",
    ]
    assert all(0 <= r["ndcg"] <= 1 and 0 <= r["recall"] <= 1 for r in metrics["evaluation"]["rows"])
    ledger = PrivacyLedger(run / "ledger.sqlite")
    by_scope = {s["dataset"]: s for s in metrics["privacy"]}
    assert set(by_scope) == {"train-pairs", "medical-records"}
    for name, scope in by_scope.items():
        spend = ledger.spent("pipeline", name)
        assert scope["epsilon"] == pytest.approx(spend.epsilon)
        assert len(scope["charges"]) == spend.num_charges
    generate = folder.summary("generate")
    assert by_scope["train-pairs"]["epsilon"] == pytest.approx(generate["epsilon"], rel=1e-6)
    rag = folder.summary("rag")
    assert len(by_scope["medical-records"]["charges"]) == 2 * rag["questions"]
    assert [s["stage"] for s in metrics["stages"]] == [s for s in STAGES if s != "report"]
    assert all(s["seconds"] > 0 and s["peak_memory_bytes"] > 0 for s in metrics["stages"])
    for png in ("retrieval.png", "stages.png", "privacy.png"):
        assert (run / "report" / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    page = (run / "report" / "report.html").read_text()
    assert page.index("Privacy statement") < page.index("Retrieval quality")
    assert f"ε = {report_page._up(generate['epsilon'])}," in page  # rounded up, never below


def test_released_folders_hold_no_secret_randomness(tiny_run):
    run, seen = tiny_run[0], tiny_run[5]
    for folder in ("generator", "synthetic", "encoder", "index", "rag", "data", "report"):
        assert_clean_release(run / folder, seen)
    assert not (run / "private" / "work" / "generate").exists()  # deleted after the stage
    assert not (run / "private" / "work" / "generate-sampling").exists()
    assert not (run / "encoder" / "checkpoints").exists()


def test_stage_records_and_index_hold_no_real_query(tiny_run):
    run = tiny_run[0]
    private = run / "private" / "data"
    queries = [
        json.loads(line)["query"]
        for name in ("train_pairs.jsonl", "test_queries.jsonl")
        for line in (private / name).read_text().splitlines()
    ]
    queries = [q.encode() for q in queries if len(q) >= 20]
    assert len(queries) > 50
    for folder in ("stages", "index", "encoder", "generator"):
        for path in (run / folder).rglob("*"):
            if path.is_file():
                data = path.read_bytes()
                assert not [q for q in queries if q in data], path
    for folder in ("private", "stages", "report"):
        assert (run / folder).stat().st_mode & 0o077 == 0, folder


def test_rerun_is_a_no_op_and_a_changed_section_recomputes_its_downstream(tiny_run, tmp_path):
    run = tiny_run[0]
    before = _started(run)
    again = _cli("--config", CONFIG, "--out", run, "--no-progress")
    assert again.returncode == 0, again.stderr[-2000:]
    assert _started(run) == before
    changed = tmp_path / "tiny_exact.py"
    changed.write_text(
        CONFIG.read_text().replace('IndexConfig(kind="scann")', 'IndexConfig(kind="exact")')
    )
    status = _cli("status", "--config", changed, "--out", run)
    assert status.returncode == 0
    assert "index     stale" in status.stdout and "evaluate  done" in status.stdout
    single = _cli("index", "--config", changed, "--out", run, "--no-progress")
    assert single.returncode == 0, single.stderr[-2000:]
    after = _cli("--config", changed, "--out", run, "--no-progress")
    assert after.returncode == 0, after.stderr[-2000:]
    now = _started(run)
    assert [s for s in STAGES if now[s] != before[s]] == ["index", "report"]
    assert RunFolder(run).summary("index")["kind"] == "exact"
    assert dataclasses.is_dataclass(load_pipeline_config(changed))


def test_cli_errors_are_one_line(tmp_path):
    missing = _cli("--config", tmp_path / "nope.py", "--out", tmp_path / "run")
    assert missing.returncode == 1 and missing.stderr.startswith("error:")
    assert len(missing.stderr.strip().splitlines()) == 1
    early = _cli("train", "--config", CONFIG, "--out", tmp_path / "run")
    assert early.returncode == 1 and "run `synthgen pipeline generate`" in early.stderr


def test_report_in_headless_chromium(tiny_run, chromium, tmp_path):
    run = tiny_run[0]
    page = chromium.new_page(viewport={"width": 1100, "height": 900})
    errors = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto((run / "report" / "report.html").resolve().as_uri())
    headings = page.locator("h2").all_inner_texts()
    assert headings[0] == "Privacy statement"
    assert "Retrieval quality" in headings and "DP-RAG answers" in headings
    widths = page.eval_on_selector_all("img", "imgs => imgs.map(i => i.naturalWidth)")
    assert len(widths) == 3 and all(w > 0 for w in widths)
    shot = tmp_path / "report.png"
    page.screenshot(path=str(shot), full_page=True)
    assert shot.stat().st_size > 10_000
    assert errors == []
    page.close()


def _files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def test_generate_in_three_shards_joins_to_the_unsharded_queries(tiny_run, tmp_path):
    run, config, trained = tiny_run[0], tiny_run[1], tiny_run[6]
    sharded = tmp_path / "run"
    shutil.copytree(trained, sharded, symlinks=True)
    folder = RunFolder(sharded)
    ledger = PrivacyLedger(sharded / "ledger.sqlite")
    charges = ledger.charges("pipeline", "train-pairs")
    # --train-only on a trained generator resumes to the end and leaves the stage open.
    record = run_stage("generate", config, folder, progress=False, train_only=True)
    assert record["status"] == "running" and stage_status(config, folder)["generate"] != "done"
    done = _cli("generate", "--config", CONFIG, "--out", sharded, "--shard", "2/3", "--no-progress")
    assert done.returncode == 0, done.stderr[-2000:]
    assert "generate shard 2/3: done" in done.stdout
    run_shard("generate", config, folder, Shard(0, 3), progress=False)
    status = _cli("status", "--config", CONFIG, "--out", sharded)
    assert "generate  interrupted (generator trained; 2 of 3 shards finished)" in status.stdout
    with pytest.raises(ValueError, match=r"shard\(s\) 1/3 are missing"):
        run_stage("generate", config, folder, progress=False)
    run_shard("generate", config, folder, Shard(1, 3), progress=False)
    seed_file = sharded / "private" / "work" / "generate-sampling" / "seed.json"
    seed = seed_file.read_text()
    seed_file.write_text(json.dumps({"seed": "12345"}))  # not the seed the shards drew from
    with pytest.raises(ValueError, match="another generator or seed"):
        run_stage("generate", config, folder, progress=False)
    seed_file.write_text(seed)
    record = run_stage("generate", config, folder, progress=False)
    assert record["status"] == "done" and record["summary"]["shards"] == 3
    joined, whole = _files(sharded / "synthetic"), _files(run / "synthetic")
    assert joined["queries.jsonl"] == whole["queries.jsonl"]
    assert joined["queries.parquet"] == whole["queries.parquet"]
    assert ledger.charges("pipeline", "train-pairs") == charges  # shards spend nothing
    assert not (sharded / "shards" / "generate").exists()
    assert not (sharded / "private" / "work" / "generate-sampling").exists()
    assert not (sharded / "private" / "work" / "generate").exists()
    assert_clean_release(sharded / "synthetic", tiny_run[5])
    drawn = json.loads(seed)["seed"].encode()  # the sampling seed is in no released file
    assert not [
        f for f in ("synthetic", "generator") for b in _files(sharded / f).values() if drawn in b
    ]
    with pytest.raises(ValueError, match="done under this config"):
        run_shard("generate", config, folder, Shard(0, 3), progress=False)


def test_index_in_three_shards_joins_to_the_unsharded_index(tiny_run, tmp_path):
    run, config = tiny_run[0], tiny_run[1]
    folders = {}
    for name in ("whole", "sharded"):  # the index stage not run yet in either copy
        shutil.copytree(run, tmp_path / name, symlinks=True)
        for path in (tmp_path / name / "stages" / "index.json", tmp_path / name / "index"):
            path.unlink() if path.is_file() else shutil.rmtree(path)
        folders[name] = RunFolder(tmp_path / name)
    run_stage("index", config, folders["whole"], progress=False)
    for i in (2, 0, 1):
        run_shard("index", config, folders["sharded"], Shard(i, 3), progress=False)
    first = next((tmp_path / "sharded" / "shards" / "index").glob("*/0-of-3")) / "shard.json"
    record = json.loads(first.read_text())
    first.write_text(json.dumps({**record, "encoder_weights_sha256": "0" * 64}))
    with pytest.raises(ValueError, match="another build"):  # the shards disagree
        run_stage("index", config, folders["sharded"], progress=False)
    for shard in first.parent.parent.iterdir():  # all three from another encoder's weights
        meta = json.loads((shard / "shard.json").read_text())
        (shard / "shard.json").write_text(json.dumps({**meta, "encoder_weights_sha256": "0" * 64}))
    with pytest.raises(ValueError, match="another corpus, encoder or token limit"):
        run_stage("index", config, folders["sharded"], progress=False)
    for shard in first.parent.parent.iterdir():
        meta = json.loads((shard / "shard.json").read_text())
        real = record["encoder_weights_sha256"]
        (shard / "shard.json").write_text(json.dumps({**meta, "encoder_weights_sha256": real}))
    record = run_stage("index", config, folders["sharded"], progress=False)
    assert record["summary"]["shards"] == 3
    joined, whole = _files(tmp_path / "sharded" / "index"), _files(tmp_path / "whole" / "index")
    assert sorted(joined) == sorted(whole)
    for name in whole:
        if name == "index.json":  # names the run's own encoder folder
            a, b = json.loads(joined[name]), json.loads(whole[name])
            assert a.pop("encoder").startswith(str(tmp_path / "sharded"))
            assert b.pop("encoder").startswith(str(tmp_path / "whole"))
            assert a == b
        else:
            assert joined[name] == whole[name], name
    summary = {k: v for k, v in record["summary"].items() if "second" not in k}
    expected = RunFolder(tmp_path / "whole").summary("index")
    assert summary == {"shards": 3, **{k: v for k, v in expected.items() if "second" not in k}}
    assert not (tmp_path / "sharded" / "shards" / "index").exists()


def test_shards_refuse_an_untrained_generator_and_other_stages(tiny_run, tmp_path):
    run, config = tiny_run[0], tiny_run[1]
    copy = tmp_path / "run"
    shutil.copytree(run, copy, symlinks=True)
    (copy / "stages" / "generate.json").unlink()
    with pytest.raises(StageNotReadyError, match="--train-only"):
        run_shard("generate", config, RunFolder(copy), Shard(0, 2), progress=False)
    with pytest.raises(ValueError, match="only the generate and index stages"):
        run_shard("train", config, RunFolder(copy), Shard(0, 2), progress=False)
    bad = _cli("index", "--config", CONFIG, "--out", copy, "--shard", "3/3")
    assert bad.returncode == 2 and "--shard" in bad.stderr
    with pytest.raises(ValueError, match="--train-only is an option of the generate stage"):
        run_stage("index", config, RunFolder(copy), train_only=True)
