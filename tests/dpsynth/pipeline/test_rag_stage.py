"""The main job's rag stage checks what its answers assume before it opens a scope: an
encoder whose provenance shows it independent of the collection, and δ below 1/n."""

import dataclasses
import json
import types
from pathlib import Path

import pytest

from dpsynth.pipeline.config import RagStageConfig
from dpsynth.pipeline.rag_stage import RAG_DATASET, answer_questions
from retriever import provenance
from synthgen.privacy import COLLECTION, PrivacyLedger, Scope

RELEASE = {"privacy": {"epsilon": 8.0, "delta": 1e-5, "unit": "one pair"}}


def _ctx(tmp_path, record, **rag):
    encoder = tmp_path / "encoder"
    encoder.mkdir()
    (encoder / "encoder.json").write_text('{"base": "random:bert"}')
    if record is not None:
        provenance.write_provenance(encoder, record)
    config = types.SimpleNamespace(
        rag=RagStageConfig(sample="medical-40", questions=1, **rag),
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
    book = PrivacyLedger(ctx.run.ledger)  # the collection's cap beside the run's tenant
    assert {(s.tenant, s.dataset) for s in book.scopes()} == {
        (COLLECTION, RAG_DATASET),
        ("pipeline", RAG_DATASET),
    }
    caps = ctx.config.rag.epsilon_cap, ctx.config.rag.delta_cap
    assert book.collection_scope(RAG_DATASET) == Scope(COLLECTION, RAG_DATASET, *caps)


# ---- individual (per-record) accounting ------------------------------------------------

INDIVIDUAL = {
    "accounting": "individual",
    "mechanism": "icl",
    "document_epsilon": 2.0,
    "document_delta": 1e-6,
    "epsilon": 1.0,
    "max_tokens": 3,
    "k": 4,
}


class _Towers:
    """`load_towers` replaced: every question lies along axis 0, the first half of the
    records along it too (relevant), the second half opposite (score clipped to 0)."""

    def encode(self, texts, **_):
        import numpy as np

        out = np.zeros((len(texts), 4), np.float32)
        out[:, 0] = 1.0
        if len(texts) > 1:  # the records
            out[len(texts) // 2 :, 0] = -1.0
        return out


@pytest.fixture
def individual_stage(tmp_path, monkeypatch):
    """The rag stage in individual accounting, on the byte-level test LM (no real
    encoder or LM loads), in a real run folder."""
    import retriever.evaluate
    from dpsynth.pipeline.context import RunFolder
    from synthgen import lm_backends

    monkeypatch.setattr(retriever.evaluate, "load_towers", lambda e: (_Towers(), _Towers()))
    monkeypatch.setattr(lm_backends.FlaxLM, "load", staticmethod(lambda name: lm_backends.TinyLM()))

    base = _ctx(tmp_path, RECORD)  # the encoder folder, with its provenance

    def ctx(questions=3, **rag):
        config = types.SimpleNamespace(
            rag=dataclasses.replace(base.config.rag, questions=questions, **{**INDIVIDUAL, **rag}),
            privacy=base.config.privacy,
            name="individual",
            report=types.SimpleNamespace(samples=0),
        )
        return types.SimpleNamespace(
            config=config, run=RunFolder(tmp_path), progress=False, log=lambda *a: None
        )

    return ctx


RECORD = provenance.synthetic(RELEASE, num_pairs=4)


def test_the_rag_stage_answers_under_per_record_filters(individual_stage):
    from synthgen.privacy.document_filters import SUMMARY_KEYS, DocumentFilters

    ctx = individual_stage()
    summary = answer_questions(ctx)
    assert summary["accounting"] == "individual" and summary["questions"] == 3
    assert summary["document_target"] == {
        "epsilon": 2.0,
        "delta": 1e-6,
        "relevance_threshold": 0.5,
        "answers_per_document": 2,
    }
    assert "document_summary" not in summary  # not DP: the operator reads the ledger
    documents = DocumentFilters(PrivacyLedger(ctx.run.ledger).store).summary(RAG_DATASET)
    assert set(documents) == set(SUMMARY_KEYS)
    # the relevant half paid for two answers and left the third; the other half never paid
    assert documents["documents"] == 40 and documents["exhausted"] == 20
    assert documents["max_epsilon"] <= 2.0
    assert documents["mean_epsilon"] == pytest.approx(documents["max_epsilon"] / 2)
    assert "collection_epsilon_spent" not in summary and summary["quota_epsilon_spent"] > 0
    book = PrivacyLedger(ctx.run.ledger)
    assert book.collection_scope(RAG_DATASET) is None
    filters = DocumentFilters(book.store)
    assert filters.verify(RAG_DATASET) == 0

    # resumed with every answer written: nothing is asked or charged again
    charges = book.charges("pipeline", RAG_DATASET)
    losses = filters.recompute(RAG_DATASET)
    answer_questions(individual_stage())
    assert filters.summary(RAG_DATASET) == documents
    assert book.charges("pipeline", RAG_DATASET) == charges
    assert filters.recompute(RAG_DATASET) == losses

    # the run folder keeps its accounting: a collection-accounting rerun is refused
    with pytest.raises(ValueError, match="holds per-document filters"):
        answer_questions(individual_stage(accounting="collection", document_epsilon=None,
                                          document_delta=None))  # fmt: skip
    # and so are other per-record settings
    with pytest.raises(ValueError, match="already has per-document filters"):
        answer_questions(individual_stage(document_epsilon=3.0))


def test_the_report_states_the_per_record_guarantee(individual_stage):
    from dpsynth.pipeline.report import write_report

    ctx = individual_stage()
    summary = answer_questions(ctx)
    ctx.run.write_record("rag", {"status": "done", "summary": summary})
    written = write_report(ctx)
    page = open(written["report"], encoding="utf-8").read()
    assert (
        "Each private record is (ε = 2, δ = 1e-06)-DP over all 3 answers, whichever tenant "
        "asked; records pay only for answers they took part in." in page
    )
    assert "20 are exhausted" not in page and "max_epsilon" not in page  # not DP
    assert "synthgen ledger documents" in page
    assert "the tenant's quota" in page and "relevance threshold τ = 0.5" in page
    metrics = json.loads((ctx.run.root / "report" / "metrics.json").read_text())
    [collection] = metrics["documents"]
    assert collection["dataset"] == RAG_DATASET and collection["answers"] == 3
    assert "summary" not in collection  # not DP: stays in the run's ledger


@pytest.mark.parametrize(
    ("rag", "message"),
    [
        ({"accounting": "per-tenant"}, "accounting must be collection or individual"),
        ({"accounting": "individual", "mechanism": "icl"}, "needs document_epsilon"),
        ({**INDIVIDUAL, "mechanism": "keywords"}, "icl only"),
        ({**INDIVIDUAL, "mechanism": "auto"}, "icl only"),
        ({**INDIVIDUAL, "document_delta": 1.0}, "document_delta must be in"),
        ({**INDIVIDUAL, "relevance_threshold": 1.5}, "relevance_threshold must be in"),
        ({"document_epsilon": 2.0}, "go with accounting='individual'"),
    ],
)
def test_the_rag_stage_config_validates_individual_accounting(rag, message):
    with pytest.raises(ValueError, match=message):
        RagStageConfig(**rag)


@pytest.mark.parametrize("mechanism", ["vote", "sparse-vote", "answer-vote", "magic"])
def test_the_rag_stage_config_refuses_a_retired_or_unknown_mechanism(mechanism):
    message = "mechanism must be one of" if mechanism == "magic" else "retired.*use facts"
    with pytest.raises(ValueError, match=message):
        RagStageConfig(mechanism=mechanism)


def test_the_rag_stage_reads_a_packaged_sample_or_refuses_an_unknown_one():
    from dpsynth.pipeline.rag_stage import read_collection

    collection = read_collection(RagStageConfig(sample="medical-40", questions=2))
    assert collection.name == RAG_DATASET and len(collection.texts) == 40
    assert collection.doc_ids[:2] == ["rec-00000", "rec-00001"]
    assert [answer for _, answer in collection.questions] == ["Besox fever", "Rovanora"]
    with pytest.raises(ValueError, match=r"rag.sample .*medical-40, medical-200, medical-2000"):
        RagStageConfig(sample="medical-100")


def test_release_mode_charges_once_and_answers_for_free(individual_stage):
    ctx = individual_stage(questions=4, accounting="collection", document_epsilon=None,
                           document_delta=None, mode="release", release_epsilon=10.0,
                           sample="medical-200")  # fmt: skip
    summary = answer_questions(ctx)
    assert summary["mode"] == "release" and summary["questions"] == 4
    assert all(a["epsilon"] == 0.0 and a["mechanism"] == "release" for a in summary["answers"])
    assert "typed" in summary["mechanism"] and summary["synthetic_records"] > 0
    book = PrivacyLedger(ctx.run.ledger)
    assert [c.stage for c in book.charges("release", RAG_DATASET)] == ["knowledge-release"]
    assert summary["release_epsilon"] == 10.0
    assert summary["collection_epsilon_spent"] == pytest.approx(summary["release_epsilon"], 1e-3)
    assert summary["abstained"] == sum(a["abstained"] for a in summary["answers"])
    released = (ctx.run.root / "rag" / "release.jsonl").read_text().splitlines()
    assert len(released) == summary["synthetic_records"]
    assert (ctx.run.private / "knowledge" / "facts_result.json").is_file()  # private stays
    assert not list((ctx.run.root / "rag").glob("facts_*"))  # private stays private
    # a rerun of the stage returns the first draw and charges nothing more
    again = answer_questions(ctx)
    assert again["synthetic_records"] == summary["synthetic_records"]
    assert len(book.charges("release", RAG_DATASET)) == 1


def test_release_mode_refuses_a_run_folder_of_the_retired_cluster_release(individual_stage):
    ctx = individual_stage(questions=2, accounting="collection", document_epsilon=None,
                           document_delta=None, mode="release", sample="medical-200")  # fmt: skip
    old = ctx.run.private / "knowledge"
    old.mkdir(parents=True)
    (old / "knowledge_charge.json").write_text('{"ref": "knowledge-0"}')
    with pytest.raises(ValueError, match="cluster release") as refused:
        answer_questions(ctx)
    assert "previous version" in str(refused.value) and "--out" in str(refused.value)
    assert PrivacyLedger(ctx.run.ledger).scopes() == []  # refused before its scope opened
    assert not (ctx.run.root / "rag").exists()


# ---- a user's own collection ---------------------------------------------------------


def _user_collection(tmp_path):
    records = tmp_path / "clinic-notes.jsonl"
    texts = [f"Patient {i} was seen for Vorlan fever and treated by Dr Mek." for i in range(30)]
    records.write_text("".join(json.dumps({"doc_id": f"n{i}", "text": t}) + "\n"
                               for i, t in enumerate(texts)))  # fmt: skip
    questions = tmp_path / "questions.jsonl"
    questions.write_text(
        json.dumps({"question": "Which disease was treated?", "answer": "Vorlan fever"}) + "\n"
        "Who treated the patients?\n"
    )
    return {"records": str(records), "questions_file": str(questions)}


def test_the_rag_stage_answers_over_a_users_own_records_and_questions(individual_stage):
    user = _user_collection(individual_stage().run.root)
    ctx = individual_stage(accounting="collection", document_epsilon=None, document_delta=None,
                           mechanism="icl", **user)  # fmt: skip
    summary = answer_questions(ctx)
    assert summary["dataset"] == "clinic-notes" and summary["records"] == 30
    assert [a["question"] for a in summary["answers"]] == [
        "Which disease was treated?",
        "Who treated the patients?",
    ]
    assert summary["answers"][1]["expected"] is None and summary["answers"][1]["correct"] is None
    assert isinstance(summary["answers"][0]["correct"], bool)
    book = PrivacyLedger(ctx.run.ledger)
    assert {s.dataset for s in book.scopes()} == {"clinic-notes"}  # not the packaged sample
    answers = {c.ref.split("/")[0] for c in book.charges("pipeline", "clinic-notes")}
    assert len(answers) == 2  # one charge (each stage a row) per answer


def test_a_users_questions_file_is_read_or_refused_with_its_line(tmp_path):
    from dpsynth.pipeline.rag_stage import read_questions

    path = tmp_path / "q.txt"
    path.write_text('What is X?\n\n{"question": "Where is Y?", "answer": "Z"}\n')
    assert read_questions(path) == [("What is X?", None), ("Where is Y?", "Z")]
    path.write_text('{"answer": "Z"}\n')
    with pytest.raises(ValueError, match=r"q.txt:1: .*question"):
        read_questions(path)
    with pytest.raises(ValueError, match="go together"):
        RagStageConfig(records=str(path))


def test_release_mode_releases_a_users_own_records_once(individual_stage):
    user = _user_collection(individual_stage().run.root)
    ctx = individual_stage(accounting="collection", document_epsilon=None, document_delta=None,
                           mode="release", **user)  # fmt: skip
    summary = answer_questions(ctx)
    assert summary["mode"] == "release" and summary["dataset"] == "clinic-notes"
    assert summary["records"] == 30 and summary["questions"] == 2
    book = PrivacyLedger(ctx.run.ledger)
    assert [(s.tenant, s.dataset) for s in book.scopes()] == [("release", "clinic-notes")]
    assert len(book.charges("release", "clinic-notes")) == 1


def test_questions_whose_answers_cannot_all_fit_the_cap_are_refused_before_any_charge(
    individual_stage,
):
    from dpsynth.pipeline.rag_stage import answers_that_fit

    user = _user_collection(individual_stage().run.root)
    settings = dict(accounting="collection", document_epsilon=None, document_delta=None,
                    mechanism="icl", epsilon=5.0, epsilon_cap=8.0, **user)  # fmt: skip
    assert answers_that_fit(individual_stage(**settings).config.rag) == 1
    ctx = individual_stage(questions=2, **settings)  # two answers at 5 in a cap of 8
    with pytest.raises(ValueError, match="2 answers at epsilon=5 do not fit"):
        answer_questions(ctx)
    book = PrivacyLedger(ctx.run.ledger)
    assert book.scopes() == [] and book.charges("pipeline", "clinic-notes") == []
    answer_questions(individual_stage(questions=1, **settings))  # one fits, and is answered
    assert len({c.ref.split("/")[0] for c in book.charges("pipeline", "clinic-notes")}) == 1


def test_a_users_collection_may_not_take_the_main_jobs_own_ledger_names(tmp_path):
    for name in ("train-pairs", "medical-records"):
        with pytest.raises(ValueError, match="main job's own"):
            RagStageConfig(records=str(tmp_path / f"{name}.jsonl"), questions_file="q.txt")
    assert RagStageConfig(records="a/medical-records.jsonl", questions_file="q", dataset="x")


def test_a_resumed_stage_refuses_answers_to_questions_edited_since(individual_stage):
    user = _user_collection(individual_stage().run.root)
    settings = dict(accounting="collection", document_epsilon=None, document_delta=None,
                    mechanism="icl", **user)  # fmt: skip
    ctx = individual_stage(**settings)
    answer_questions(ctx)
    Path(user["questions_file"]).write_text("An edited first question?\nWho treated them?\n")
    with pytest.raises(ValueError, match="answers other questions"):
        answer_questions(individual_stage(**settings))


def test_the_stage_admits_its_collection_as_retriever_answer_does(individual_stage, monkeypatch):
    """Collection accounting opens a collection cap at the run's caps and pins the answer
    event on it: a resumed run whose answers would be another event, or whose cap
    changed, is refused before anything is written or charged."""
    from dpsynth.pipeline.rag_stage import RESTORE_RAG

    user = _user_collection(individual_stage().run.root)
    settings = dict(accounting="collection", document_epsilon=None, document_delta=None,
                    mechanism="icl", **user)  # fmt: skip
    ctx = individual_stage(questions=1, **settings)
    answer_questions(ctx)
    book = PrivacyLedger(ctx.run.ledger)
    cap = book.collection_scope("clinic-notes")
    assert (cap.epsilon_cap, cap.delta_cap) == (
        ctx.config.rag.epsilon_cap,
        ctx.config.rag.delta_cap,
    )
    assert json.loads(book.event_shape(COLLECTION, "clinic-notes"))["epsilon"] == 1.0
    assert book.spent(COLLECTION, "clinic-notes") == book.spent("pipeline", "clinic-notes")
    charges = len(book.charges("pipeline", "clinic-notes"))
    from synthgen import lm_backends

    with monkeypatch.context() as m:  # refused before the LM loads
        m.setattr(lm_backends.FlaxLM, "load", staticmethod(lambda name: pytest.fail("loaded")))
        with pytest.raises(ValueError, match=r"epsilon 1\.0 recorded, 2\.0 here") as refused:
            answer_questions(individual_stage(questions=2, **{**settings, "epsilon": 2.0}))
    assert RESTORE_RAG in str(refused.value)
    with pytest.raises(ValueError, match="epsilon cap 20 .* config asks for 30"):
        answer_questions(individual_stage(questions=2, **{**settings, "epsilon_cap": 30.0}))
    assert len(book.charges("pipeline", "clinic-notes")) == charges
    answer_questions(individual_stage(questions=2, **settings))  # the same settings resume
    assert len({c.ref.split("/")[0] for c in book.charges("pipeline", "clinic-notes")}) == 2


def test_a_finished_stage_resumed_gives_no_answer_and_needs_no_room(individual_stage, monkeypatch):
    """Every answer written (the process died before the stage's record): a resume
    answers nothing, so it is not refused for want of room for one more answer, and it
    loads neither the encoder nor the LM to write its summary."""
    user = _user_collection(individual_stage().run.root)
    settings = dict(accounting="collection", document_epsilon=None, document_delta=None,
                    mechanism="icl", epsilon=5.0, epsilon_cap=8.0, **user)  # fmt: skip
    first = answer_questions(individual_stage(questions=1, **settings))
    import retriever.evaluate
    from synthgen import lm_backends

    unloadable = staticmethod(lambda *a: pytest.fail("a model was loaded"))
    monkeypatch.setattr(retriever.evaluate, "load_towers", unloadable)
    monkeypatch.setattr(lm_backends.FlaxLM, "load", unloadable)
    again = answer_questions(individual_stage(questions=1, **settings))  # a 2nd would not fit
    assert again["answers"] == first["answers"]
    book = PrivacyLedger(individual_stage().run.ledger)
    assert len({c.ref.split("/")[0] for c in book.charges("pipeline", "clinic-notes")}) == 1


def test_answers_of_a_version_that_pinned_no_event_are_compared_before_the_pin(
    individual_stage,
):
    """A run folder whose answers were charged with no collection cap and no pinned event
    (an earlier version): a resume at another event is refused, the same event goes on."""
    user = _user_collection(individual_stage().run.root)
    settings = dict(accounting="collection", document_epsilon=None, document_delta=None,
                    mechanism="icl", epsilon=1.0, **user)  # fmt: skip
    ctx = individual_stage(questions=1, **settings)
    answer_questions(ctx)
    book = PrivacyLedger(ctx.run.ledger)
    with book.store.write() as conn:  # as an earlier version left it: no cap, no pin
        conn.execute("DELETE FROM scopes WHERE tenant = ?", (COLLECTION,))
    with pytest.raises(ValueError, match="another event than this one, before answer events"):
        answer_questions(individual_stage(questions=2, **{**settings, "epsilon": 2.0}))
    assert book.collection_scope("clinic-notes") is None  # refused before anything opened
    answer_questions(individual_stage(questions=2, **settings))
    assert json.loads(book.event_shape(COLLECTION, "clinic-notes"))["epsilon"] == 1.0
    assert book.spent(COLLECTION, "clinic-notes") == book.spent("pipeline", "clinic-notes")


def test_the_run_tenant_may_not_be_the_collection_caps_name():
    from dpsynth.pipeline.config import PrivacyConfig

    with pytest.raises(ValueError, match="every tenant's cap"):
        PrivacyConfig(tenant=COLLECTION)


def test_per_record_settings_that_cannot_hold_one_answer_are_refused_before_any_write(
    individual_stage,
):
    ctx = individual_stage(document_epsilon=0.05)  # less than one answer's cost per record
    with pytest.raises(ValueError, match="not one answer would fit a document's target"):
        answer_questions(ctx)
    book = PrivacyLedger(ctx.run.ledger)
    with book.store.read() as conn:
        assert conn.execute("SELECT COUNT(*) FROM document_sets").fetchone()[0] == 0
    assert book.scopes() == []
