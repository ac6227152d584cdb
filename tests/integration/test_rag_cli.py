"""`retriever privacy rag` and `retriever answer` as a user runs them."""

import json
import sys
import types

import cli_process
import numpy as np
import pytest

from synthgen.privacy import PrivacyLedger


def _run(*args):
    return cli_process.run([sys.executable, "-m", *map(str, args)], capture_output=True, text=True)


def test_privacy_rag_calculator():
    out = {}
    for composition in ("pure", "bounded-range"):
        result = _run(
            "dpsynth.cli.retriever", "privacy", "rag", "--tokens", "32", "--delta", "1e-6",
            "--target-epsilon", "5", "--composition", composition, "--json",
        )  # fmt: skip
        assert result.returncode == 0, result.stderr
        out[composition] = json.loads(result.stdout)
        assert {"token_epsilon", "epsilon", "delta"} <= set(out[composition])
        assert 4.99 <= out[composition]["epsilon"] <= 5.0
    # 32 pure tokens at delta 1e-6: PLD bisection (Grislain 2024); bounded range is tighter
    assert out["pure"]["token_epsilon"] == pytest.approx(0.1936, abs=5e-4)
    assert out["bounded-range"]["token_epsilon"] > out["pure"]["token_epsilon"]


def test_privacy_rag_prints_the_keyword_release_threshold():
    """An operator sees, from public parameters, when keywords cannot release anything."""
    from retriever.rag.keyword_vote import keyword_threshold

    thresholds = {}
    for eps in ("1", "10"):
        result = _run(
            "dpsynth.cli.retriever", "privacy", "rag", "--tokens", "5", "--delta", "1e-6",
            "--target-epsilon", eps, "--mechanism", "keywords", "--voters", "16", "--json",
        )  # fmt: skip
        assert result.returncode == 0, result.stderr
        plan = json.loads(result.stdout)
        assert plan["mechanism"] == "keywords" and plan["voters"] == 16
        assert plan["epsilon"] <= float(eps) and plan["max_releases"] == 1
        # the partition selection's threshold at the plan's one release
        expected = keyword_threshold(plan["token_epsilon"], plan["token_delta"], 1)
        assert plan["keyword_threshold"] == pytest.approx(expected)
        thresholds[eps] = plan
    assert thresholds["10"]["release_possible"] and not thresholds["1"]["release_possible"]
    retired = _run(
        "dpsynth.cli.retriever", "privacy", "rag", "--tokens", "5", "--delta", "1e-6",
        "--target-epsilon", "10", "--mechanism", "sparse-vote", "--json",
    )  # fmt: skip
    assert retired.returncode == 2
    assert "the sparse-vote mechanism was retired" in retired.stderr
    assert "Traceback" not in retired.stderr


@pytest.mark.slow
def test_answer_charges_then_refuses(tmp_path):
    data, index, ledger = tmp_path / "world", tmp_path / "index", tmp_path / "ledger.sqlite"
    made = _run("dpsynth.evaluation.medical_world", "--out", data,
                "--num-records", "40", "--num-diseases", "5")  # fmt: skip
    assert made.returncode == 0, made.stderr
    corpus = data / "corpus.jsonl"
    built = _run("dpsynth.cli.retriever", "index", "build", "--corpus", corpus, "--out", index,
                 "--kind", "exact")  # fmt: skip
    assert built.returncode == 0, built.stderr
    question = json.loads((data / "questions.jsonl").read_text().splitlines()[0])["question"]
    common = ["--index", index, "--private-corpus", corpus, "--question", question,
              "--ledger", ledger, "--tenant", "alice", "--tenant-epsilon", "3",
              "--dataset", "corpus", "--collection-epsilon", "10", "--collection-delta", "1e-5",
              "--k", "4", "--max-tokens", "3", "--min-score", "0.2"]  # fmt: skip
    first = _run("dpsynth.cli.retriever", "answer", *common, "--epsilon", "2", "--json")
    assert first.returncode == 0, first.stderr
    answer = json.loads(first.stdout.strip().splitlines()[-1])
    assert {"text", "charges", "epsilon", "remaining_epsilon"} <= set(answer)
    assert [c["stage"] for c in answer["charges"]] == ["retrieval", "tokens"]
    assert answer["epsilon"] <= 2.0 and answer["remaining_epsilon"] < 1.1
    book = PrivacyLedger(ledger)
    before = book.charges("alice", "corpus")
    assert [c.stage for c in before] == ["rag-retrieval", "rag-tokens"]

    second = _run("dpsynth.cli.retriever", "answer", *common, "--epsilon", "2")
    assert second.returncode == 1
    assert second.stderr.startswith("error:") and len(second.stderr.strip().splitlines()) == 1
    assert question not in second.stderr  # nothing private in the error
    assert book.charges("alice", "corpus") == before

    # every answer charged to the collection is the event the first one pinned
    assert json.loads(book.event_shape("*", "corpus"))["epsilon"] == 2.0
    other = _run("dpsynth.cli.retriever", "answer", *common, "--tenant", "bob", "--epsilon", "1")
    assert other.returncode == 1 and "already answers with another event" in other.stderr
    assert book.charges("*", "corpus") == before
    assert [s.tenant for s in book.scopes()] == ["*", "alice"]  # bob was never opened
    assert "--guarantees-add-up" in other.stderr  # the way to other settings says the cost

    # the same documents under a new name: refused, as the ledger knows the documents
    renamed = [*common[: common.index("--dataset") + 1], "corpus-2",
               *common[common.index("--dataset") + 2 :]]  # fmt: skip
    refused = _run("dpsynth.cli.retriever", "answer", *renamed, "--epsilon", "1")
    assert refused.returncode == 1, refused.stderr
    assert "--dataset corpus" in refused.stderr and "add" in refused.stderr
    assert [s.dataset for s in book.scopes()] == ["corpus", "corpus"]  # nothing opened
    added = _run(
        "dpsynth.cli.retriever", "answer", *renamed, "--epsilon", "1", "--guarantees-add-up"
    )
    assert added.returncode == 0, added.stderr
    (group,) = book.document_groups()
    assert group.datasets == ("corpus", "corpus-2") and group.documents == 40
    assert group.epsilon > book.spent("*", "corpus").epsilon
    shown = _run("dpsynth.cli.synthgen", "ledger", "show", "--db", ledger)
    assert shown.returncode == 0, shown.stderr
    assert "2 names share documents (corpus, corpus-2; up to 40 documents each)" in shown.stdout
    listed = _run("dpsynth.cli.retriever", "tenant", "list", "--ledger", ledger)
    assert "(corpus, corpus-2; up to 40 documents each): their guarantees add up" in listed.stdout


N = 20  # documents of the collection below: delta must be below 1/20


@pytest.fixture
def collection(tmp_path):
    """An exact index over N documents (random embeddings) and its corpus; the encoder is
    the MiniLM asset (public), never loaded: every refusal below comes first."""
    import numpy as np

    from retriever.index import ExactSearcher
    from retriever.index_folder import save_index_folder

    ids = [f"d{i}" for i in range(N)]
    corpus = tmp_path / "records.jsonl"
    corpus.write_text("".join(json.dumps({"doc_id": d, "text": f"{d} blue"}) + "\n" for d in ids))
    emb = np.eye(N, 32, dtype=np.float32)

    def index(encoder="all-minilm-l6-v2"):
        folder = tmp_path / f"index-{len(list(tmp_path.iterdir()))}"
        save_index_folder(folder, ExactSearcher(emb), encoder=encoder, doc_ids=ids)
        return folder

    return index, corpus


def _answer(index, corpus, ledger, *extra):
    return _run(
        "dpsynth.cli.retriever", "answer", "--index", index, "--private-corpus", corpus,
        "--question", "which record says blue?", "--epsilon", "1", "--ledger", ledger,
        "--tenant", "alice", "--tenant-epsilon", "10", "--lm", "no-such-lm", *extra,
    )  # fmt: skip


def test_answer_needs_a_dataset(collection, tmp_path):
    index, corpus = collection
    result = _answer(index(), corpus, tmp_path / "ledger.sqlite")
    assert result.returncode == 2 and "--dataset" in result.stderr


CAPS = ("--dataset", "records", "--collection-epsilon", "10", "--collection-delta", "1e-5")


BOUND = f"delta must be in (0, 1/n) = (0, 0.05) for n={N} documents"


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (("--dataset", "records"), "records has no collection cap"),
        ((*CAPS, "--delta", "0.1"), f"--delta (per answer): {BOUND}, got 0.1"),
        ((*CAPS, "--delta", "0.05"), f"--delta (per answer): {BOUND}, got 0.05"),
        ((*CAPS, "--tenant-delta", "0.1"), f"the scope (alice, records): {BOUND}, got 0.1"),
        ((*CAPS[:-1], "0.2"), f"the collection cap of records: {BOUND}, got 0.2"),
    ],
)
def test_answer_refuses_before_opening_or_charging_anything(collection, tmp_path, extra, message):
    index, corpus = collection
    ledger = tmp_path / "ledger.sqlite"
    result = _answer(index(), corpus, ledger, *extra)
    assert result.returncode == 1, result.stderr
    assert result.stderr.startswith("error:") and len(result.stderr.strip().splitlines()) == 1
    assert message in result.stderr
    book = PrivacyLedger(ledger)
    assert book.scopes() == []


def test_answer_refuses_an_encoder_without_provenance(collection, tmp_path):
    index, corpus = collection
    encoder = tmp_path / "my-encoder"
    encoder.mkdir()
    (encoder / "encoder.json").write_text(json.dumps({"base": "random:bert"}))  # no provenance
    ledger = tmp_path / "ledger.sqlite"
    result = _answer(index(str(encoder)), corpus, ledger, *CAPS)
    assert result.returncode == 1
    assert "--encoder-independent-of-collection" in result.stderr
    assert "a folder without provenance.json" in result.stderr
    assert PrivacyLedger(ledger).scopes() == []
    # asserted by the operator: it passes that check, is recorded on the collection cap,
    # and the command goes on (to the LM, which does not exist here)
    asserted = _answer(index(str(encoder)), corpus, ledger, *CAPS,
                       "--encoder-independent-of-collection")  # fmt: skip
    assert "encoder-independent" not in asserted.stderr
    [note] = PrivacyLedger(ledger).scope_notes("*", "records")
    assert "my-encoder" in note and "asserted by the operator" in note


def test_answer_refuses_another_event_than_the_collections(collection, tmp_path):
    from retriever.rag import make_plan
    from retriever.rag.collection import pin_answer_event
    from synthgen.privacy import Scope

    index, corpus = collection
    ledger = tmp_path / "ledger.sqlite"
    book = PrivacyLedger(ledger)
    book.open_scope(Scope("*", "records", 10.0, 1e-5))
    pin_answer_event(book, "records", make_plan("icl", 2.0, delta=1e-6, max_tokens=12))
    result = _answer(index(), corpus, ledger, "--dataset", "records", "--mechanism", "icl")
    assert result.returncode == 1
    assert "already answers with another event (epsilon 2.0 recorded, 1.0 here)" in result.stderr
    # the way forward: the settings to use, or a new collection name (issue 51)
    assert "use the recorded settings (--answer-epsilon (serve) / --epsilon (answer) 2.0)" in (
        result.stderr
    )
    assert "--dataset NEW --guarantees-add-up" in result.stderr and "adds up" in result.stderr
    assert [s.tenant for s in book.scopes()] == ["*"] and book.charges("*", "records") == []


# ---- individual (per-document) accounting ---------------------------------------------

NEAR = 6  # documents 0-5 are close to every question below; the others far from it


class _Towers:
    """The question tower of `load_towers`, replaced: every question lies along axis 0."""

    def encode(self, texts, **_):
        import numpy as np

        out = np.zeros((len(texts), 8), np.float32)
        out[:, 0] = 1.0
        return out


@pytest.fixture
def individual(tmp_path, monkeypatch):
    """An exact index over N documents (NEAR of them relevant to any question, the others
    below every threshold), its corpus, a ledger, and the in-process command line with
    `load_towers` replaced (no real encoder loads; its calls are counted)."""
    import numpy as np

    import retriever.evaluate
    from dpsynth.cli.retriever import app
    from retriever.index import ExactSearcher
    from retriever.index_folder import save_index_folder
    from synthgen.command_line import run

    rng = np.random.default_rng(0)
    emb = rng.normal(size=(N, 8)).astype(np.float32)
    emb[:, 0] = -2.0  # far: negative cosine with every question, clipped to 0
    emb[:NEAR] = 0.05 * rng.normal(size=(NEAR, 8))
    emb[:NEAR, 0] = 1.0  # near: cosine about 0.99
    emb /= np.linalg.norm(emb, axis=1, keepdims=True)
    ids = [f"d{i}" for i in range(N)]
    corpus = tmp_path / "records.jsonl"
    corpus.write_text(
        "".join(json.dumps({"doc_id": d, "text": f"{d} the answer is blue"}) + "\n" for d in ids)
    )
    index = tmp_path / "index"
    save_index_folder(index, ExactSearcher(emb), encoder="all-minilm-l6-v2", doc_ids=ids)
    loads = []
    monkeypatch.setattr(
        retriever.evaluate, "load_towers", lambda e: loads.append(e) or (_Towers(), _Towers())
    )
    ledger = tmp_path / "ledger.sqlite"

    def cli(*extra, tenant="alice", epsilon="1", document=("2", "1e-6")):
        docs = (
            ["--document-epsilon", document[0], "--document-delta", document[1]] if document else []
        )
        argv = [
            "answer", "--index", index, "--private-corpus", corpus, "--question",
            "which record says blue?", "--epsilon", epsilon, "--ledger", ledger,
            "--tenant", tenant, "--tenant-epsilon", "10", "--dataset", "records", "--lm",
            "tiny", "--k", "4",
            "--max-tokens", "3", "--accounting", "individual",
            *docs, *extra,
        ]  # fmt: skip
        return run(app, list(map(str, argv)))

    return types.SimpleNamespace(cli=cli, ledger=ledger, loads=loads, ids=ids)


def _filters(ledger):
    from synthgen.privacy.document_filters import DocumentFilters

    book = PrivacyLedger(ledger)
    return book, DocumentFilters(book.store)


def test_answer_in_individual_accounting_charges_the_relevant_documents(individual, capsys):

    assert individual.cli("--json") == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["accounting"] == "individual"
    # no --relevance-threshold: the dense retrieval's calibrated tau
    assert out["document_guarantee"] == {"epsilon": 2.0, "delta": 1e-6, "relevance_threshold": 0.6}
    assert "document_summary" not in out  # not DP: the operator reads it from the ledger
    assert [c["stage"] for c in out["charges"]] == ["tokens"]  # tau is public: no threshold
    book, filters = _filters(individual.ledger)
    record = filters.get("records")
    assert record.budget.epsilon == 2.0 and record.answers_per_document == 2
    losses = filters.losses("records", individual.ids)
    assert list(losses[:NEAR]) == [record.answer_rho] * NEAR and not losses[NEAR:].any()
    assert book.collection_scope("records") is None  # no collection cap, no pinned event
    assert book.event_shape("alice", "records") is None
    assert book.spent("alice", "records").epsilon > 0  # the tenant's quota pays too

    # another tenant's answer exhausts the relevant documents: every tenant counts
    assert individual.cli(tenant="bob") == 0
    text = capsys.readouterr().out
    assert "per document: each record of records is (epsilon=2, delta=1e-06)-DP" in text
    assert "exhausted" not in text  # the filters' summary is not DP: not in the output
    assert filters.summary("records")["exhausted"] == NEAR
    assert "remaining quota epsilon=" in text and "for tenant bob" in text
    assert filters.verify("records") == 0
    # exhausted documents leave the prompts: a third answer charges no document
    assert individual.cli(tenant="bob") == 0
    capsys.readouterr()
    np_losses = filters.losses("records", individual.ids)
    assert list(np_losses[:NEAR]) == [2 * record.answer_rho] * NEAR

    # the filters never change: an answer at another epsilon is refused before any load
    loads = len(individual.loads)
    assert individual.cli(epsilon="0.5") == 1
    assert "already has per-document filters" in capsys.readouterr().err
    # a collection-accounting answer on an individual collection is refused
    assert individual.cli("--accounting", "collection", document=None) == 1
    assert "is in individual accounting" in capsys.readouterr().err
    assert len(individual.loads) == loads


@pytest.mark.parametrize(
    ("extra", "document", "code", "message"),
    [
        (("--mechanism", "keywords"), ("2", "1e-6"), 2, "icl only, got --mechanism keywords"),
        ((), None, 2, "needs --document-epsilon and --document-delta"),
        (("--document-delta", "1e-6"), None, 2, "needs --document-epsilon and"),
        (
            ("--collection-epsilon", "10", "--collection-delta", "1e-5"),
            ("2", "1e-6"),
            2,
            "takes no collection cap",
        ),
        ((), ("2", "0.05"), 1, "the per-document delta: delta must be in (0, 1/n)"),
        (("--tenant-delta", "0.1"), ("2", "1e-6"), 1, "the scope (alice, records)"),
        ((), ("0.5", "1e-6"), 1, "not one answer would fit"),
    ],
)
def test_answer_in_individual_accounting_refuses_before_writing_anything(
    individual, capsys, extra, document, code, message
):
    assert individual.cli(*extra, document=document) == code
    err = capsys.readouterr().err
    assert err.startswith("error:") and len(err.strip().splitlines()) == 1
    assert message in err
    book, filters = _filters(individual.ledger)
    assert book.scopes() == [] and filters.datasets() == [] and individual.loads == []


def test_answer_in_individual_accounting_refuses_a_collection_with_a_cap(individual, capsys):
    from synthgen.privacy import Scope

    book, filters = _filters(individual.ledger)
    book.open_scope(Scope("*", "records", 10.0, 1e-5))
    assert individual.cli() == 1
    assert "records has a collection cap" in capsys.readouterr().err
    assert [s.tenant for s in book.scopes()] == ["*"] and filters.datasets() == []
    assert individual.loads == []


def test_an_unregistered_tenant_is_refused_unless_opened_explicitly(collection, tmp_path):
    """A mistyped --tenant must not open a hidden budget (issue 51): refused (exit 2, no
    ledger created) unless --tenant-epsilon asks for a new scope."""
    index, corpus = collection
    ledger = tmp_path / "ledger.sqlite"
    result = _run(
        "dpsynth.cli.retriever", "answer", "--index", index(), "--private-corpus", corpus,
        "--question", "which record says blue?", "--epsilon", "1", "--ledger", ledger,
        "--tenant", "mallory", "--dataset", "records", "--lm", "no-such-lm",
    )  # fmt: skip
    assert result.returncode == 2, result.stderr
    assert "tenant mallory has no budget on records" in result.stderr
    assert "retriever tenant add mallory" in result.stderr and "--tenant-epsilon" in result.stderr
    assert not ledger.exists()


def test_tenant_list_shows_every_scope_that_spends_on_the_collection(tmp_path):
    """A scope opened by `retriever answer --tenant-epsilon` holds no key but is listed, so
    the tenants' rows and the collection's row can be added up."""
    from synthgen.privacy import Scope, accounting

    ledger = tmp_path / "ledger.sqlite"
    added = _run(
        "dpsynth.cli.retriever", "tenant", "add", "alice", "--epsilon", "5", "--delta", "1e-6",
        "--ledger", ledger, "--dataset", "records", "--collection-epsilon", "20",
        "--collection-delta", "1e-6",
    )  # fmt: skip
    assert added.returncode == 0, added.stderr
    book = PrivacyLedger(ledger)
    book.ensure_scope(Scope("mallory", "records", 10.0, 1e-6))
    book.charge(
        "mallory", "records", stage="rag-tokens", event=accounting.pure_epsilon_event(0.5),
        relation="ADD_OR_REMOVE_ONE",
    )  # fmt: skip
    listed = _run("dpsynth.cli.retriever", "tenant", "list", "--ledger", ledger, "--json")
    rows = {r["tenant"]: r for r in map(json.loads, listed.stdout.splitlines())}
    assert rows["mallory"]["status"] == "no key"
    assert rows["mallory"]["spent_epsilon"] == pytest.approx(0.5, abs=1e-3)
    assert rows["alice"]["status"] == "active"


def test_answer_by_term_overlap_scores_rare_words_and_auto_takes_facts(collection, tmp_path):
    """--retrieval overlap: the index only lists the documents, scores are the share of the
    question's words a document holds, and auto resolves to facts (a question no kind rule
    reads is answered by keywords at the same event)."""
    from retriever.rag.loading import load_dprag
    from synthgen.lm_backends import TinyLM

    index, corpus = collection
    folder = index()
    rag = load_dprag(folder, corpus, lm=TinyLM(), retrieval="overlap")
    scores = rag._scores("which record says d7?")
    assert int(np.argmax(scores)) == 7 and scores[7] > scores[3]
    with pytest.raises(ValueError, match="retrieval"):
        load_dprag(folder, corpus, lm=TinyLM(), retrieval="bm25")
    # no encoder scores: an index whose encoder is unknown (refused for dense) is fine
    custom = index(encoder=str(tmp_path / "no-such-encoder"))
    assert load_dprag(custom, corpus, lm=TinyLM(), retrieval="overlap")._scores("d7")[7] > 0
    with pytest.raises((ValueError, FileNotFoundError)):
        load_dprag(custom, corpus, lm=TinyLM())
    result = _run(
        "dpsynth.cli.retriever", "answer", "--index", folder, "--private-corpus", corpus,
        "--question", "which record says blue?", "--epsilon", "5", "--ledger",
        tmp_path / "ledger.sqlite", "--tenant", "alice", "--tenant-epsilon", "10",
        "--lm", "tiny", "--retrieval", "overlap", "--json", *CAPS,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    answer = json.loads(result.stdout.strip().splitlines()[-1])
    assert answer["mechanism"] == "facts"
    bad = _answer(folder, corpus, tmp_path / "other.sqlite", *CAPS, "--retrieval", "bm25")
    assert bad.returncode == 2 and "--retrieval" in bad.stderr
