"""Encoder provenance: the statement for each kind of training data, the release metadata it
reads (with its ledger scope), and the training runs that write it with no resume state."""

import dataclasses
import json

import numpy as np
import pytest

from retriever import evaluate as ev
from retriever import provenance as prov
from retriever.encoders import load_encoder, random_encoder, save_encoder
from retriever.train import RetrieverConfig, train_retriever
from synthgen import dp_train, fewshot, querygen
from synthgen.corpora import file_sha256
from synthgen.privacy.events import event_to_json
from synthgen.privacy.receipts import Receipt

POST_PROCESSING = "post-processing of an (ε, δ)-DP release"


def _querygen_metadata(num_queries=12, *, private=True, scope=("acme", "support-pairs")):
    """The metadata.json `querygen.generate_queries` writes (its privacy block from the
    generator's own `_privacy_block`)."""
    dp = dp_train.DPConfig(
        batch_size=4, epochs=1.0, noise_multiplier=1.0 if private else 0.0, target_epsilon=None
    )
    privacy = querygen._privacy_block(dp_train.plan_privacy(dp, 40), scope)
    return json.loads(
        json.dumps(
            {
                "privacy": privacy,
                "model": {"family": "t5", "base": "random:tiny", "lora_rank": 0},
                "num_documents": num_queries,
                "num_queries": num_queries,
            },
            default=str,
        )
    )


def test_synthetic_training_is_post_processing_of_the_release_with_its_scope():
    meta = _querygen_metadata()
    record = prov.synthetic(meta, num_pairs=10)
    assert record["statement"].startswith(POST_PROCESSING)
    guarantee = record["guarantee"]
    assert guarantee["kind"] == "post-processing"
    assert guarantee["epsilon"] == pytest.approx(meta["privacy"]["epsilon"])
    assert guarantee["delta"] == pytest.approx(1 / 80)  # default delta 1/(2n), n = 40
    assert guarantee["privacy_unit"].startswith("one (document, query) pair")
    assert guarantee["neighboring_relation"] == meta["privacy"]["neighboring_relation"]
    assert guarantee["ledger_scope"] == {"tenant": "acme", "dataset": "support-pairs"}
    trained_on = record["trained_on"]
    dataset = trained_on["dataset"]
    assert trained_on["kind"] == "dp-synthetic" and trained_on["num_pairs"] == 10
    assert dataset["generator"] == "DP fine-tuned query generator random:tiny (t5)"
    assert dataset["ledger_scope"] == guarantee["ledger_scope"] and dataset["num_rows"] == 12
    assert f"ε = {guarantee['epsilon']:.4g}" in record["statement"]


def test_a_non_private_generator_run_gives_no_guarantee():
    record = prov.synthetic(_querygen_metadata(private=False))
    assert record["guarantee"]["kind"] == "none" and record["guarantee"]["epsilon"] is None
    assert "NON-private" in record["statement"] and "no privacy guarantee" in record["statement"]
    assert POST_PROCESSING not in record["statement"]
    with pytest.raises(ValueError, match="no 'privacy' block"):
        prov.synthetic({"num_queries": 3})


def test_fewshot_output_records_its_ledger_scope(tmp_path):
    config = fewshot.FewShotConfig(
        public_pool_size=40, subsets=5, shots=2, max_new_tokens=8, noise_multiplier=1.0
    )
    plan = fewshot.plan_privacy(config, 8)
    receipt = Receipt("t", "d", "fewshot-generate", event_to_json(plan.event), 1)
    result = fewshot.FewShotResult(texts=["a b", "c d"], plan=plan, tokens_released=4)
    charged = dataclasses.replace(result, receipt=receipt)
    columns = {"doc_id": ["1", "2"], "document": ["x", "y"], "query": result.texts}
    meta = fewshot.write_output(
        str(tmp_path), columns, charged, config, model="tiny", template=fewshot.QUERY_TEMPLATE,
        name="queries",
    )  # fmt: skip
    assert meta["privacy"]["ledger_scope"] == {"tenant": "t", "dataset": "d"}
    record = prov.for_pairs_file(tmp_path / "queries.jsonl")
    assert record["statement"].startswith(POST_PROCESSING)
    assert record["guarantee"]["ledger_scope"] == {"tenant": "t", "dataset": "d"}
    assert record["guarantee"]["privacy_unit"] == "one private example"
    assert record["trained_on"]["dataset"]["generator"].startswith("DP few-shot generation")
    assert "fixed seed" not in record["statement"]
    unscoped = fewshot.write_output(
        str(tmp_path / "u"), columns, result, config, model="tiny",
        template=fewshot.QUERY_TEMPLATE, seeded=True,
    )  # fmt: skip
    assert unscoped["privacy"]["ledger_scope"] is None
    record = prov.synthetic(unscoped)
    assert record["guarantee"]["ledger_scope"] is None
    assert record["statement"].endswith("for tests only, not for publication)")


def test_dp_sgd_and_real_data_statements():
    dp = dp_train.DPConfig(batch_size=4, epochs=1.0, noise_multiplier=1.0, target_epsilon=None)
    privacy = dp_train.plan_privacy(dp, 40).to_dict()
    privacy.update(unit="one (query, document) pair", mechanism="DP-Adafactor")
    record = prov.dp_sgd(
        {**json.loads(json.dumps(privacy, default=str)), "ledger_scope": ("t", "q")}
    )
    assert record["guarantee"]["kind"] == "dp-sgd" and record["trained_on"]["num_pairs"] == 40
    assert record["statement"].endswith("DP-SGD on the private pairs")
    assert "one (query, document) pair" in record["statement"]
    assert record["guarantee"]["ledger_scope"] == {"tenant": "t", "dataset": "q"}
    assert prov.real_data(num_pairs=3)["statement"] == "trained on real data: no privacy guarantee"
    assert prov.real_data()["guarantee"]["kind"] == "none"


def _write_pairs(folder, n):
    folder.mkdir(parents=True, exist_ok=True)
    rows = [{"doc_id": str(i), "document": f"doc {i}", "query": f"q {i}"} for i in range(n)]
    (folder / "queries.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return folder / "queries.jsonl"


def _describing(pairs):
    """Release metadata that names `pairs` by its SHA-256, as the generators write it."""
    return {**_querygen_metadata(12), "files": {pairs.name: file_sha256(pairs)}}


def test_a_pairs_file_is_synthetic_only_when_its_metadata_describes_it(tmp_path):
    pairs = _write_pairs(tmp_path / "synthetic", 12)
    assert prov.for_pairs_file(pairs)["trained_on"]["kind"] == "real"  # no metadata.json
    (tmp_path / "synthetic" / "metadata.json").write_text(json.dumps(_querygen_metadata(12)))
    assert prov.for_pairs_file(pairs)["statement"] == prov.REAL_STATEMENT  # no file digest
    (tmp_path / "synthetic" / "metadata.json").write_text(json.dumps(_describing(pairs)))
    record = prov.for_pairs_file(pairs, num_pairs=8)
    assert record["statement"].startswith(POST_PROCESSING)
    assert record["trained_on"]["num_pairs"] == 8
    # A file with other rows than the release's, even as many of them, is real data.
    edited = _write_pairs(tmp_path / "synthetic-edited", 12)
    edited.write_text(edited.read_text().replace('"q 3"', '"a real query"'))
    (edited.parent / "metadata.json").write_text(json.dumps(_describing(pairs)))
    assert prov.for_pairs_file(edited)["statement"] == prov.REAL_STATEMENT
    with pytest.raises(ValueError, match="does not describe"):
        prov.for_pairs_file(edited, metadata=edited.parent / "metadata.json")
    with pytest.raises(FileNotFoundError, match="no such metadata"):
        prov.for_pairs_file(pairs, metadata=tmp_path / "missing.json")
    # Given explicitly, a release's metadata stored elsewhere counts.
    moved = _write_pairs(tmp_path / "copy", 12)
    record = prov.for_pairs_file(moved, metadata=tmp_path / "synthetic" / "metadata.json")
    assert record["guarantee"]["kind"] == "post-processing"


def test_provenance_of_untrained_and_unrecorded_encoders(tmp_path):
    assert prov.encoder_provenance("all-minilm-l6-v2")["trained_on"]["kind"] == "pretrained"
    assert "no privacy statement" in prov.encoder_provenance("random:bert")["statement"]
    encoder = random_encoder("bert")
    save_encoder(encoder, encoder.params, tmp_path / "old")  # written before provenance
    record = prov.encoder_provenance(tmp_path / "old")
    assert record["statement"] == prov.UNKNOWN_STATEMENT and record["base_model"] == "random:bert"
    # A path that is gone (a moved run folder) is not taken for an untouched base model.
    assert prov.encoder_provenance(tmp_path / "moved")["statement"] == prov.UNKNOWN_STATEMENT


def test_training_that_continues_from_a_trained_encoder_states_no_guarantee(tmp_path):
    encoder = random_encoder("bert", seed=0)
    config = RetrieverConfig(batch_size=4, epochs=1, max_query_len=16, max_doc_len=16)
    queries, documents = [q for q, _ in PAIRS], [d for _, d in PAIRS]
    real = tmp_path / "real"  # trained on real pairs: no guarantee
    train_retriever(encoder, queries, documents, config, out_dir=real, work_dir=tmp_path / "w1",
                    progress=False)  # fmt: skip
    start = load_encoder(real)
    assert start.origin == real.resolve()
    synthetic = prov.synthetic(_querygen_metadata(8), num_pairs=8)
    out = tmp_path / "continued"
    train_retriever(start, queries, documents, config, out_dir=out, provenance=synthetic,
                    work_dir=tmp_path / "w2", progress=False)  # fmt: skip
    stored = json.loads((out / "provenance.json").read_text())
    assert stored["guarantee"]["kind"] == "none" and POST_PROCESSING not in stored["statement"]
    assert stored["statement"].startswith("no privacy guarantee: training continued")
    assert stored["started_from"]["statement"] == prov.REAL_STATEMENT
    # From a base model the synthetic statement stands.
    base = load_encoder("random:bert")
    assert base.origin is None
    assert prov.continued_from(prov.encoder_provenance("random:bert"), synthetic) == synthetic


PAIRS = [
    (f"what is the {w} of {v}", f"the {w} of {v} is a document about {w} and {v}")
    for w, v in zip(
        ("city", "music", "film", "war", "game", "team", "school", "state"),
        ("data", "model", "text", "search", "query", "year", "world", "people"),
    )
]


def test_training_writes_provenance_to_every_tower_and_keeps_no_resume_state(tmp_path):
    encoder = random_encoder("bert", seed=0)
    queries, documents = [q for q, _ in PAIRS], [d for _, d in PAIRS]
    config = RetrieverConfig(
        batch_size=4, epochs=2, max_query_len=16, max_doc_len=16, separate_towers=True,
        checkpoint_every=1,
    )  # fmt: skip
    record = prov.synthetic(_querygen_metadata(8), num_pairs=8)
    out, work = tmp_path / "encoder", tmp_path / "work"
    kwargs = dict(out_dir=out, provenance=record, work_dir=work, progress=False)
    part = train_retriever(encoder, queries, documents, config, stop_after=2, **kwargs)
    assert part.steps_run == 2 and not out.exists()
    assert (work / "checkpoints").is_dir()  # an interrupted run resumes from its work folder
    with pytest.raises(ValueError, match="different run"):  # other pairs: no silent resume
        train_retriever(encoder, queries[::-1], documents[::-1], config, **kwargs)
    full = train_retriever(encoder, queries, documents, config, **kwargs)
    assert full.steps_run == 4 and not work.exists()
    for folder in (out, out / "doc_tower"):
        assert sorted(p.name for p in folder.iterdir() if p.is_file()) == [
            "encoder.json", "params.msgpack", "provenance.json"
        ]  # fmt: skip
        stored = json.loads((folder / "provenance.json").read_text())
        assert stored == {**record, "base_model": "random:bert"}
    assert not any(p.name == "checkpoints" for p in out.rglob("*"))
    # evaluate names the folder it evaluated, its base and its statement
    rows = [{"query": q, "doc_id": str(i)} for i, q in enumerate(queries)]
    report = ev.evaluate(
        str(out), [str(i) for i in range(8)], documents, rows, max_query_len=16,
        max_doc_len=16, progress=False,
    )  # fmt: skip
    assert report["encoder"] == str(out.resolve()) and report["base"] == "random:bert"
    assert report["statement"] == record["statement"]
    np.testing.assert_allclose(
        ev.load_towers(str(out))[0].encode(queries[:2], max_len=16),
        encoder.encode(queries[:2], params=full.params["query"], max_len=16),
        atol=1e-5,
    )


def test_real_pairs_default_to_no_guarantee(tmp_path):
    encoder = random_encoder("bert", seed=0)
    config = RetrieverConfig(batch_size=4, epochs=1, max_query_len=16, max_doc_len=16)
    train_retriever(
        encoder, [q for q, _ in PAIRS], [d for _, d in PAIRS], config, out_dir=tmp_path / "m",
        work_dir=tmp_path / "w", progress=False,
    )  # fmt: skip
    stored = json.loads((tmp_path / "m" / "provenance.json").read_text())
    assert stored["statement"] == prov.REAL_STATEMENT
    assert stored["trained_on"] == {
        "kind": "real", "description": "real (query, document) pairs", "num_pairs": 8,
        "dataset": None,
    }  # fmt: skip


def test_the_pipeline_s_earlier_provenance_file_is_read_as_synthetic(tmp_path):
    privacy = _querygen_metadata()["privacy"]
    earlier = {
        "trained_on": "DP synthetic queries (run folder synthetic/)",
        "guarantee": "post-processing of an (epsilon, delta)-DP release",
        "privacy": privacy,
    }
    (tmp_path / "provenance.json").write_text(json.dumps(earlier))
    record = prov.encoder_provenance(tmp_path)
    assert record["statement"].startswith(POST_PROCESSING)
    assert record["guarantee"]["epsilon"] == pytest.approx(privacy["epsilon"])
    assert record["trained_on"]["description"] == earlier["trained_on"]
