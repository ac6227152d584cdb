"""The main job's charging stages name the run's ledger, warn when they created it, and warn
about a weak guarantee in their stage log (privacy review, issue 68, findings 12 and 15).
The private folders the data stage writes are owner-only (finding 14)."""

import json
import stat
import types

import pytest

from dpsynth.pipeline import GenerateConfig, PipelineConfig, PrivacyConfig, RunFolder
from dpsynth.pipeline import stages as stages_module
from dpsynth.pipeline.config import RagStageConfig
from dpsynth.pipeline.context import StageContext
from dpsynth.pipeline.rag_stage import answer_questions
from retriever import provenance
from synthgen.dp_train import DPConfig
from synthgen.querygen import GeneratorConfig

RELEASE = {"privacy": {"epsilon": 8.0, "delta": 1e-5, "unit": "one pair"}}


class _Stop(Exception):
    pass


def _stop(*args, **kwargs):
    raise _Stop("stopped before compute")


def _pairs(run: RunFolder, n: int = 40) -> None:
    path = run.private / "data" / "train_pairs.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = [{"doc_id": str(i), "document": f"document {i}", "query": f"q {i}"} for i in range(n)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def _querygen_context(tmp_path, **privacy) -> StageContext:
    generator = GeneratorConfig(
        family="llama", base="random:tiny", dp=DPConfig(batch_size=8, target_epsilon=4.0)
    )
    config = PipelineConfig(
        generate=GenerateConfig(querygen=generator), privacy=PrivacyConfig(**privacy)
    )
    run = RunFolder(tmp_path / "run")
    _pairs(run)
    return StageContext(config, run, progress=False)


def test_the_generate_stage_names_the_runs_ledger_and_warns_about_delta(
    tmp_path, monkeypatch, capsys
):
    from synthgen import querygen

    monkeypatch.setattr(querygen, "train_generator", _stop)
    ctx = _querygen_context(tmp_path, delta=1e-3)  # n = 40: 1e-3 <= 1/(10 n)
    stages_module.generate_precheck(ctx)  # opens (creates) the run's ledger
    err = capsys.readouterr().err.splitlines()
    [created] = [line for line in err if "warning:" in line]
    assert created.startswith(f"[generate] warning: created a new ledger at {ctx.run.ledger}")
    assert "train-pairs starts with a full budget here" in created
    with pytest.raises(_Stop):
        stages_module.generate_stage(ctx)
    err = capsys.readouterr().err.splitlines()
    location = f"[generate] ledger: collection train-pairs is charged in {ctx.run.ledger}"
    assert location in err and not [line for line in err if "warning:" in line]

    ctx = _querygen_context(tmp_path / "default")  # delta: the pipeline's default 1/(2n)
    with pytest.raises(_Stop):
        stages_module.generate_stage(ctx)
    err = capsys.readouterr().err
    assert "[generate] warning: delta=0.0125 is near 1/n (n=40)" in err
    assert "warning: epsilon=" not in err


def _rag_context(tmp_path, logged, **rag):
    encoder = tmp_path / "encoder"
    encoder.mkdir()
    (encoder / "encoder.json").write_text('{"base": "random:bert"}')
    provenance.write_provenance(encoder, provenance.synthetic(RELEASE, num_pairs=4))
    config = types.SimpleNamespace(
        rag=RagStageConfig(sample="medical-40", questions=1, **rag),
        privacy=types.SimpleNamespace(tenant="pipeline"),
    )
    run = types.SimpleNamespace(root=tmp_path, ledger=tmp_path / "ledger.sqlite")
    log = lambda stage, message: logged.append(f"[{stage}] {message}")  # noqa: E731
    return types.SimpleNamespace(config=config, run=run, progress=False, log=log)


@pytest.mark.parametrize(
    ("rag", "weak"),
    [
        ({"epsilon_cap": 10.0}, []),
        ({}, ["[rag] warning: epsilon=20 (scope cap) is above 10"]),  # the default cap
        (
            {"epsilon": 12.0, "epsilon_cap": 30.0, "delta": 5e-3, "delta_cap": 1e-2},
            [
                "[rag] warning: epsilon=12 (per answer) is above 10",
                "[rag] warning: delta=0.005 (per answer) is near 1/n (n=40)",
                "[rag] warning: epsilon=30 (scope cap) is above 10",
                "[rag] warning: delta=0.01 (scope cap) is near 1/n (n=40)",
            ],
        ),
    ],
)
def test_the_rag_stage_names_the_runs_ledger_and_warns_about_weak_settings(
    tmp_path, monkeypatch, rag, weak
):
    import retriever.evaluate

    monkeypatch.setattr(retriever.evaluate, "load_towers", _stop)
    logged = []
    ctx = _rag_context(tmp_path, logged, **rag)
    with pytest.raises(_Stop):
        answer_questions(ctx)
    assert logged[0] == f"[rag] ledger: collection medical-records is charged in {ctx.run.ledger}"
    assert logged[1].startswith("[rag] warning: created a new ledger at")
    warnings = [line for line in logged[2:] if "warning:" in line]
    assert [w[: len(expected)] for w, expected in zip(warnings, weak)] == weak
    assert len(warnings) == len(weak)


def test_the_data_stages_private_folders_are_owner_only(tmp_path, monkeypatch):
    import datasets

    from synthgen import corpora

    rows = datasets.Dataset.from_list(
        [
            {"doc_id": str(i), "document": f"d {i}", "query": f"q {i}", "title": "t"}
            for i in range(10)
        ]
    )
    monkeypatch.setattr(corpora, "load_wiki_summaries", lambda source, limit: rows)
    config = _querygen_context(tmp_path / "other").config
    stages_module.data_stage(StageContext(config, RunFolder(tmp_path), progress=False))
    for folder in (tmp_path / "private", tmp_path / "private" / "data"):
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700, folder
