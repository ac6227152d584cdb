"""Shard folders of the pipeline's stages: finished/unfinished detection, removal, the stage
lock between a stage's run and its shards, and the refusals made before anything is cleaned
(the end-to-end 3-shard runs are in tests/integration/test_pipeline.py)."""

import dataclasses

import pytest

from dpsynth.config_files import default_configs_dir
from dpsynth.pipeline import RunFolder, load_pipeline_config, run_stage
from dpsynth.pipeline.context import StageBusyError, stage_lock
from dpsynth.pipeline.runner import run_shard
from dpsynth.pipeline.stage_shards import (
    finished_shards,
    remove_shards,
    shard_folder,
    shard_progress,
    shards_root,
)
from synthgen.fewshot.config import FewShotConfig
from synthgen.shards import Shard


def _make(run_root, stage, fp, *names):
    for name in names:
        (shards_root(run_root, stage, fp) / name).mkdir(parents=True)


def test_finished_shards_in_order_and_none_without_shards(tmp_path):
    assert finished_shards(tmp_path, "index", "fp") == []
    _make(tmp_path, "index", "fp", "2-of-3", "0-of-3", "1-of-3")
    assert [p.name for p in finished_shards(tmp_path, "index", "fp")] == [
        "0-of-3",
        "1-of-3",
        "2-of-3",
    ]
    assert shard_progress(tmp_path, "index", "fp") == "3 of 3 shards finished"
    assert shard_folder(tmp_path, "index", "fp", Shard(1, 3)).name == "1-of-3"


@pytest.mark.parametrize(
    ("names", "message"),
    [
        (("0-of-3", "1-of-3"), r"2/3 are missing"),
        (("0-of-2", "1-of-3"), r"different N"),
        (("0-of-2", "1-of-2.partial"), r"1-of-2.partial are not finished"),
        (("0-of-2.partial",), r"not finished"),
    ],
)
def test_an_incomplete_set_is_refused_with_the_way_out(tmp_path, names, message):
    _make(tmp_path, "generate", "fp", *names)
    with pytest.raises(ValueError, match=message) as info:
        finished_shards(tmp_path, "generate", "fp")
    assert "--shard I/N" in str(info.value) and "unsharded" in str(info.value)


def test_remove_shards_keeps_only_the_named_config(tmp_path):
    _make(tmp_path, "index", "old", "0-of-2")
    _make(tmp_path, "index", "new", "0-of-2")
    remove_shards(tmp_path, "index", keep="new")
    assert [p.name for p in (tmp_path / "shards" / "index").iterdir()] == ["new"]
    remove_shards(tmp_path, "index")
    assert not (tmp_path / "shards" / "index").exists()


def _tiny(**generate):
    config = load_pipeline_config(default_configs_dir() / "tiny.py")
    return dataclasses.replace(config, generate=dataclasses.replace(config.generate, **generate))


def test_a_stage_and_its_shards_never_run_side_by_side(tmp_path):
    run = RunFolder(tmp_path / "run")
    run.root.mkdir()
    config = _tiny()
    with stage_lock(run, "index", exclusive=False):  # a shard is running
        with pytest.raises(StageBusyError, match="or one of its shards"):
            with stage_lock(run, "index", exclusive=True):
                pass
        with stage_lock(run, "index", exclusive=False):  # shards run beside each other
            pass
    with stage_lock(run, "generate", exclusive=True):  # the stage itself is running
        with pytest.raises(StageBusyError, match="another process is running stage 'generate'"):
            run_shard("generate", config, run, Shard(0, 2), progress=False)


def test_few_shot_refuses_train_only_and_shards_before_touching_the_run(tmp_path):
    run = RunFolder(tmp_path / "run")
    (run.root / "generator").mkdir(parents=True)
    (run.root / "stages").mkdir()
    few = FewShotConfig(public_pool_size=40, subsets=2, shots=2, target_epsilon=8.0)
    config = _tiny(kind="fewshot", fewshot=few)
    with pytest.raises(ValueError, match="few-shot generator"):
        run_stage("generate", config, run, train_only=True)
    with pytest.raises(ValueError, match="few-shot generator"):
        run_shard("generate", config, run, Shard(0, 2))
    assert (run.root / "generator").is_dir() and not list((run.root / "stages").iterdir())
