"""The main job's rag stage checks what its answers assume before it opens a scope: an
encoder whose provenance shows it independent of the collection, and δ below 1/n."""

import types

import pytest

from retriever import provenance
from synthgen.pipeline.config import RagStageConfig
from synthgen.pipeline.rag_stage import RAG_DATASET, answer_questions
from synthgen.privacy import PrivacyLedger

RELEASE = {"privacy": {"epsilon": 8.0, "delta": 1e-5, "unit": "one pair"}}


def _ctx(tmp_path, record, **rag):
    encoder = tmp_path / "encoder"
    encoder.mkdir()
    (encoder / "encoder.json").write_text('{"base": "random:bert"}')
    if record is not None:
        provenance.write_provenance(encoder, record)
    config = types.SimpleNamespace(
        rag=RagStageConfig(num_records=40, num_diseases=5, questions=1, **rag),
        privacy=types.SimpleNamespace(tenant="pipeline"),
    )
    run = types.SimpleNamespace(root=tmp_path, ledger=tmp_path / "ledger.sqlite")
    return types.SimpleNamespace(config=config, run=run, progress=False, log=lambda *a: None)


@pytest.mark.parametrize(
    ("record", "rag", "message"),
    [
        (None, {}, "--encoder-independent-of-collection"),
        (provenance.real_data(num_pairs=4), {}, "no privacy guarantee"),
        (provenance.synthetic(RELEASE), {"delta_cap": 0.03}, "rag.delta_cap: delta must be"),
        (provenance.synthetic(RELEASE), {"delta": 0.025, "delta_cap": 0.1}, "rag.delta: delta"),
    ],
)
def test_the_rag_stage_refuses_before_opening_its_scope(tmp_path, record, rag, message):
    ctx = _ctx(tmp_path, record, **rag)
    with pytest.raises(ValueError, match=message):
        answer_questions(ctx)
    assert PrivacyLedger(ctx.run.ledger).scopes() == []


def test_the_pipelines_encoder_provenance_passes(tmp_path, monkeypatch):
    import retriever.evaluate

    ctx = _ctx(tmp_path, provenance.synthetic(RELEASE, num_pairs=4))

    def loaded(encoder):  # the checks passed: the stage goes on to load the encoder
        raise RuntimeError("loading")

    monkeypatch.setattr(retriever.evaluate, "load_towers", loaded)
    with pytest.raises(RuntimeError, match="loading"):
        answer_questions(ctx)
    assert [s.dataset for s in PrivacyLedger(ctx.run.ledger).scopes()] == [RAG_DATASET]
