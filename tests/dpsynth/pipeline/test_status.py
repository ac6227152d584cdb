"""`synthgen pipeline status` names the config's assets that are not cached yet."""

from typer.testing import CliRunner

from dpsynth.cli.synthgen import app
from dpsynth.pipeline import load_pipeline_config
from dpsynth.pipeline.config import config_assets
from synthgen import assets

TINY = "tiny"  # the packaged example


def test_config_assets_lists_the_registered_names_a_config_holds():
    names = config_assets(load_pipeline_config(TINY))
    assert names and set(names) <= set(assets.REGISTRY)
    assert "wiki-summaries-en" in names  # the corpus the tiny run reads


def test_config_assets_skip_what_the_run_does_not_read_and_add_the_vocabulary_corpus():
    """The generator kind not run and a disabled DP-RAG stage name no asset; a random-init
    query generator reads the public vocabulary corpus whatever its pairs."""
    import dataclasses

    from synthgen.querygen_config import VOCABULARY_CORPUS

    config = load_pipeline_config(TINY)  # querygen, its unused few-shot LM: SmolLM2
    assert config.generate.fewshot_model in assets.REGISTRY
    assert config_assets(config) == [VOCABULARY_CORPUS]
    disabled = dataclasses.replace(config.rag, lm="smollm2-135m-instruct", enabled=False)
    assert config_assets(dataclasses.replace(config, rag=disabled)) == [VOCABULARY_CORPUS]
    enabled = dataclasses.replace(disabled, enabled=True)
    named = config_assets(dataclasses.replace(config, rag=enabled))
    assert named == ["smollm2-135m-instruct", VOCABULARY_CORPUS]
    own_pairs = dataclasses.replace(
        config.data, source=None, pairs="pairs.jsonl", documents="documents.jsonl"
    )
    assert config_assets(dataclasses.replace(config, data=own_pairs)) == [VOCABULARY_CORPUS]


def test_status_warns_about_assets_not_cached(tmp_path, monkeypatch):
    runner = CliRunner()
    args = ["pipeline", "status", "--config", str(TINY), "--out", str(tmp_path / "run")]
    monkeypatch.setattr(assets, "is_cached", lambda name: name != "wiki-summaries-en")
    warned = runner.invoke(app, args)
    assert warned.exit_code == 0, warned.output
    assert "not cached yet: wiki-summaries-en" in warned.stderr
    monkeypatch.setattr(assets, "is_cached", lambda name: True)
    quiet = runner.invoke(app, args)
    assert quiet.exit_code == 0 and "not cached" not in quiet.stderr
