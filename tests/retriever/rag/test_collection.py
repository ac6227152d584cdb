"""What answering from a private collection assumes: an encoder independent of it, δ below
1/n, one answer event per collection; checked by `load_dprag` before anything loads."""

import json

import numpy as np
import pytest

from retriever import provenance
from retriever.index import ExactSearcher
from retriever.index_folder import save_index_folder
from retriever.rag import RagConfig, make_plan
from retriever.rag.collection import (
    ENCODER_FLAG,
    answer_event_shape,
    check_answer_event,
    check_delta,
    check_encoder,
    open_answer_scopes,
    pin_answer_event,
)
from retriever.rag.loading import load_dprag
from synthgen.lm_backends import TinyLM
from synthgen.privacy import COLLECTION, PrivacyLedger, Scope, accounting

N = 20  # documents: delta must be below 1/20 = 0.05
DP_RELEASE = {
    "model": {"family": "llama", "base": "random:tiny"},
    "privacy": {
        "epsilon": 4.0,
        "delta": 1e-5,
        "unit": "one (document, query) pair",
        "neighboring_relation": "ADD_OR_REMOVE_ONE",
    },
}


def _encoder(tmp_path, name, record=None, files=("encoder.json",)):
    """An encoder folder with `record` as provenance.json (None: none) and `files`."""
    folder = tmp_path / name
    folder.mkdir()
    for file in files:
        (folder / file).write_text(json.dumps({"base": "random:bert"}))
    if record is not None:
        provenance.write_provenance(folder, record)
    return str(folder)


ENCODERS = {
    # name: (provenance record or None, files, independent by provenance)
    "pretrained-folder": (provenance.pretrained("all-minilm-l6-v2"), (), True),
    "dp-synthetic": (provenance.synthetic(DP_RELEASE, num_pairs=8), (), True),
    "dp-sgd": (provenance.dp_sgd({**DP_RELEASE["privacy"], "num_examples": 8}), (), True),
    "real": (provenance.real_data(num_pairs=8), (), False),
    "non-private-synthetic": (
        provenance.synthetic({"privacy": {"private": False, "epsilon": None}}),
        (),
        False,
    ),
    "continued-from-real": (
        provenance.continued_from(
            provenance.real_data(), provenance.synthetic(DP_RELEASE, num_pairs=8)
        ),
        (),
        False,
    ),
    "trained-without-provenance": (None, ("encoder.json",), False),
    "hugging-face-folder": (None, ("config.json",), False),
}


@pytest.mark.parametrize("name", sorted(ENCODERS))
def test_provenance_decides_which_encoder_may_score_a_collection(tmp_path, name):
    record, files, independent = ENCODERS[name]
    encoder = _encoder(tmp_path, name, record, files)
    if independent:
        assert check_encoder(encoder) is None
        assert provenance.collection_independence(encoder)
        return
    assert provenance.collection_independence(encoder) is None
    with pytest.raises(ValueError) as refused:
        check_encoder(encoder)
    message = str(refused.value)
    assert ENCODER_FLAG in message and "\n" not in message
    line = check_encoder(encoder, asserted=True)
    assert ENCODER_FLAG in line and name in line and str(tmp_path) not in line  # no path


@pytest.mark.parametrize("name", ["all-minilm-l6-v2", "random:bert"])
def test_assets_and_random_initialisations_are_public(name):
    assert check_encoder(name) is None


def test_dp_trained_encoders_state_that_the_guarantees_compose(tmp_path):
    encoder = _encoder(tmp_path, "e", ENCODERS["dp-synthetic"][0])
    assert "composes" in provenance.collection_independence(encoder)


class _Encoder:
    def __init__(self, dim=8):
        self.dim = dim

    def encode(self, texts, **_):
        return np.ones((len(texts), self.dim), np.float32) / np.sqrt(self.dim)


@pytest.fixture
def towers(monkeypatch):
    """`load_towers` replaced: records its calls (nothing loads a real encoder)."""
    import retriever.evaluate

    calls = []

    def fake(encoder):
        calls.append(encoder)
        return _Encoder(), _Encoder()

    monkeypatch.setattr(retriever.evaluate, "load_towers", fake)
    return calls


def _collection(tmp_path, encoder):
    rng = np.random.default_rng(0)
    emb = rng.normal(size=(N, 8)).astype(np.float32)
    emb /= np.linalg.norm(emb, axis=1, keepdims=True)
    ids = [f"d{i}" for i in range(N)]
    corpus = tmp_path / "records.jsonl"
    corpus.write_text("".join(json.dumps({"doc_id": d, "text": f"{d} blue"}) + "\n" for d in ids))
    index = tmp_path / "index"
    save_index_folder(index, ExactSearcher(emb), encoder=encoder, doc_ids=ids)
    return index, corpus


def _ledger(tmp_path, collection_delta=1e-5, tenant_delta=1e-5):
    ledger = PrivacyLedger(tmp_path / "ledger.sqlite")
    ledger.open_scope(Scope(COLLECTION, "records", 10.0, collection_delta))
    ledger.open_scope(Scope("alice", "records", 5.0, tenant_delta))
    return ledger


def test_load_dprag_refuses_an_encoder_without_provenance_before_loading(tmp_path, towers):
    index, corpus = _collection(tmp_path, _encoder(tmp_path, "enc", None))
    ledger = _ledger(tmp_path)
    with pytest.raises(ValueError, match=ENCODER_FLAG):
        load_dprag(index, corpus, lm=TinyLM(), ledger=ledger, dataset="records")
    assert towers == [] and ledger.scope_notes(COLLECTION, "records") == []


def test_the_operators_assertion_is_recorded_on_the_collection_cap(tmp_path, towers):
    index, corpus = _collection(tmp_path, _encoder(tmp_path, "enc", None))
    ledger = _ledger(tmp_path)
    for _ in range(2):
        rag = load_dprag(
            index,
            corpus,
            lm=TinyLM(),
            ledger=ledger,
            dataset="records",
            encoder_independent_of_collection=True,
        )
    [note] = ledger.scope_notes(COLLECTION, "records")  # recorded once
    assert ENCODER_FLAG in note and "enc" in note and str(tmp_path) not in note
    assert rag.dataset == "records" and towers
    # without a collection cap there is nowhere to record it: refused before loading
    other = PrivacyLedger(tmp_path / "other.sqlite")
    with pytest.raises(ValueError, match="collection cap"):
        load_dprag(
            index,
            corpus,
            lm=TinyLM(),
            ledger=other,
            dataset="records",
            encoder_independent_of_collection=True,
        )
    assert other.scopes() == []


def test_a_pretrained_encoder_needs_no_assertion(tmp_path, towers):
    index, corpus = _collection(tmp_path, "all-minilm-l6-v2")
    ledger = _ledger(tmp_path)
    load_dprag(index, corpus, lm=TinyLM(), ledger=ledger, dataset="records")
    assert ledger.scope_notes(COLLECTION, "records") == []


@pytest.mark.parametrize(
    ("delta", "collection_delta", "tenant_delta", "named"),
    [
        (0.1, 1e-5, 1e-5, "per-answer delta"),
        (1 / N, 1e-5, 1e-5, "per-answer delta"),
        (1e-6, 0.05, 1e-5, "collection cap of records"),
        (1e-6, 1e-5, 0.2, "scope (alice, records)"),
    ],
)
def test_load_dprag_refuses_delta_at_or_above_one_over_n(
    tmp_path, towers, delta, collection_delta, tenant_delta, named
):
    index, corpus = _collection(tmp_path, "all-minilm-l6-v2")
    ledger = _ledger(tmp_path, collection_delta, tenant_delta)
    with pytest.raises(ValueError) as refused:
        load_dprag(
            index, corpus, lm=TinyLM(), ledger=ledger, dataset="records",
            config=RagConfig(delta=delta),
        )  # fmt: skip
    message = str(refused.value)
    assert named in message and f"n={N}" in message and "\n" not in message
    assert towers == []


def test_check_delta_names_the_bound_and_n():
    check_delta(0.049, N, "x")
    with pytest.raises(ValueError, match=r"x: delta must be in \(0, 1/n\) = \(0, 0.05\) for n=20"):
        check_delta(0.05, N, "x")


def test_answer_scopes_need_a_collection_cap_and_small_deltas(tmp_path):
    ledger = PrivacyLedger(tmp_path / "ledger.sqlite")
    alice = Scope("alice", "records", 5.0, 1e-5)
    with pytest.raises(ValueError, match="no collection cap"):
        open_answer_scopes(ledger, alice, documents=N)
    cap = Scope(COLLECTION, "records", 10.0, 1e-5)
    with pytest.raises(ValueError, match=r"scope \(bob, records\).*n=20"):
        open_answer_scopes(ledger, Scope("bob", "records", 5.0, 0.5), documents=N, collection=cap)
    with pytest.raises(ValueError, match="collection cap of records"):
        open_answer_scopes(
            ledger, alice, documents=N, collection=Scope(COLLECTION, "records", 10.0, 0.05)
        )
    assert ledger.scopes() == []  # refusals write nothing
    open_answer_scopes(ledger, alice, documents=N, collection=cap)
    assert {(s.tenant, s.delta_cap) for s in ledger.scopes()} == {("*", 1e-5), ("alice", 1e-5)}
    # the stored caps govern: a later call needs no collection options
    open_answer_scopes(ledger, Scope("carol", "records", 5.0, 1e-5), documents=N)
    assert len(ledger.scopes()) == 3


def _plan(epsilon=1.0, mechanism="icl", max_tokens=4):
    return make_plan(mechanism, epsilon, delta=1e-6, max_tokens=max_tokens)


def test_the_answer_event_shape_is_canonical_public_parameters():
    shape = json.loads(answer_event_shape(_plan()))
    assert shape["mechanism"] == "icl" and shape["epsilon"] == 1.0 and shape["delta"] == 1e-6
    assert shape["max_tokens"] == 4 and shape["relation"] == "ADD_OR_REMOVE_ONE"
    assert answer_event_shape(_plan()) == answer_event_shape(_plan())
    assert answer_event_shape(_plan(2.0)) != answer_event_shape(_plan())
    assert answer_event_shape(_plan(mechanism="keywords")) != answer_event_shape(_plan())


# The exact shapes collections pinned before vote, sparse-vote and answer-vote were retired
# (commit 03575c5): a ledger pinned then must accept the same answers now, byte for byte.
PINNED_SHAPES = {
    ("icl", 5.0, 0.0, "pure"): (
        '{"composition":"pure","delta":1e-06,"epsilon":5.0,"format":1,"kind":"rag-answer",'
        '"max_releases":12,"max_tokens":12,"mechanism":"icl","relation":"ADD_OR_REMOVE_ONE",'
        '"retrieval_share":0.1,"score_share":0.0}'
    ),
    ("icl", 3.0, 0.1, "bounded-range"): (
        '{"composition":"bounded-range","delta":1e-06,"epsilon":3.0,"format":1,'
        '"kind":"rag-answer","max_releases":12,"max_tokens":12,"mechanism":"icl",'
        '"relation":"ADD_OR_REMOVE_ONE","retrieval_share":0.1,"score_share":0.1}'
    ),
    ("keywords", 5.0, 0.0, "pure"): (
        '{"composition":null,"delta":1e-06,"epsilon":5.0,"format":1,"kind":"rag-answer",'
        '"max_releases":1,"max_tokens":12,"mechanism":"keywords","relation":"ADD_OR_REMOVE_ONE",'
        '"retrieval_share":0.1,"score_share":0.0}'
    ),
    ("facts", 5.0, 0.0, "pure"): (
        '{"composition":null,"delta":1e-06,"epsilon":5.0,"format":1,"kind":"rag-answer",'
        '"max_releases":1,"max_tokens":12,"mechanism":"facts","relation":"ADD_OR_REMOVE_ONE",'
        '"retrieval_share":0.1,"score_share":0.0}'
    ),
}


@pytest.mark.parametrize("key", sorted(PINNED_SHAPES))
def test_the_pinned_event_shape_is_byte_identical(key):
    mechanism, epsilon, score_share, composition = key
    plan = make_plan(
        mechanism,
        epsilon,
        delta=1e-6,
        max_tokens=12,
        score_share=score_share,
        composition=composition,
    )
    assert answer_event_shape(plan) == PINNED_SHAPES[key]


def test_one_answer_event_per_collection(tmp_path):
    ledger = _ledger(tmp_path)
    check_answer_event(ledger, "records", _plan())  # nothing pinned yet
    pin_answer_event(ledger, "records", _plan())
    pin_answer_event(ledger, "records", _plan())  # the same event again
    for other in (_plan(2.0), _plan(mechanism="keywords"), _plan(max_tokens=8)):
        for check in (check_answer_event, pin_answer_event):
            with pytest.raises(ValueError, match="already answers with another event") as err:
                check(ledger, "records", other)
            assert "\n" not in str(err.value) and "recorded" in str(err.value)
    with pytest.raises(ValueError, match="epsilon 1.0 recorded, 2.0 here"):
        pin_answer_event(ledger, "records", _plan(2.0))
    assert ledger.event_shape(COLLECTION, "records") == answer_event_shape(_plan())
    # max_releases follows from the mechanism and max_tokens: never named on its own
    with pytest.raises(ValueError, match="max_tokens 4 recorded, 8 here") as err:
        pin_answer_event(ledger, "records", _plan(max_tokens=8))
    assert "max_releases" not in str(err.value)


def test_answers_charged_before_any_pin_are_compared_with_the_first_pin(tmp_path):
    """A ledger of a version that pinned no event: its answers must be the event pinned
    now; other stages (not answers) are left out."""
    ledger = _ledger(tmp_path)
    charged = _plan()
    items = [(f"rag-{s}", e, "rag answer (icl)") for s, e in charged.stage_events()]
    ledger.charge_all("alice", "records", items, relation="ADD_OR_REMOVE_ONE", delta=1e-6)
    release = accounting.pure_epsilon_event(0.5)  # a release of the same name: not an answer
    ledger.charge("alice", "records", stage="knowledge-release", event=release,
                  relation="ADD_OR_REMOVE_ONE")  # fmt: skip
    for check in (check_answer_event, pin_answer_event):
        with pytest.raises(ValueError, match="another event than this one, before answer"):
            check(ledger, "records", _plan(2.0))
    assert ledger.event_shape(COLLECTION, "records") is None  # nothing pinned
    check_answer_event(ledger, "records", charged)
    pin_answer_event(ledger, "records", charged)
    assert ledger.event_shape(COLLECTION, "records") == answer_event_shape(charged)


# the shape a collection pinned to vote recorded before it was retired (commit 03575c5)
VOTE_SHAPE = (
    '{"composition":null,"delta":1e-06,"epsilon":5.0,"format":1,"kind":"rag-answer",'
    '"max_releases":12,"max_tokens":12,"mechanism":"vote","relation":"ADD_OR_REMOVE_ONE",'
    '"retrieval_share":0.1,"score_share":0.0}'
)


@pytest.mark.parametrize("retired", ["vote", "sparse-vote", "answer-vote"])
def test_a_collection_pinned_to_a_retired_mechanism_says_so(tmp_path, retired):
    ledger = _ledger(tmp_path)
    ledger.pin_event_shape(COLLECTION, "records", VOTE_SHAPE.replace('"vote"', f'"{retired}"'))
    for check in (check_answer_event, pin_answer_event):
        with pytest.raises(ValueError, match=f"pinned to {retired}, which was retired") as err:
            check(ledger, "records", make_plan("facts", 5.0, delta=1e-6, max_tokens=12))
        message = str(err.value)
        assert "--mechanism" not in message and "\n" not in message
        assert "--guarantees-add-up" in message and "still compose" in message


def _options_of(command) -> set[str]:
    return {opt for param in command.params for opt in getattr(param, "opts", [])}


@pytest.mark.parametrize(
    "requested",
    [
        {"epsilon": 2.0},
        {"mechanism": "keywords", "composition": None, "max_releases": 1},
        {"delta": 1e-7, "max_tokens": 4, "score_share": 0.2},
        {"max_tokens": 12, "max_releases": 12},
        {"composition": "pure"},
    ],
)
def test_every_option_a_refusal_suggests_is_one_a_command_accepts(requested):
    import re

    import typer.main

    from dpsynth.cli.retriever import app
    from retriever.rag.collection import _shape_refusal

    root = typer.main.get_command(app)
    accepted = _options_of(root.commands["answer"]) | _options_of(root.commands["serve"])
    tenant_add = root.commands["tenant"].commands["add"]
    recorded = {
        "mechanism": "icl", "epsilon": 1.0, "delta": 1e-6, "max_tokens": 8,
        "max_releases": 8, "retrieval_share": 0.1, "score_share": 0.1, "composition": "pld",
    }  # fmt: skip
    message = str(_shape_refusal("d", json.dumps(recorded), json.dumps({**recorded, **requested})))
    assert "None" not in message
    quoted = re.findall(r"`(retriever [^`]+)`", message)
    suggested = set(re.findall(r"--[a-z][a-z-]+", re.sub(r"`[^`]+`", "", message)))
    assert suggested <= accepted | {"--dataset"}, suggested - accepted
    for command in quoted:  # a quoted command parses as written
        words = command.split()[3:]
        if words[:1] == ["NAME"]:
            tenant_add.make_context("add", words, resilient_parsing=True)


def test_served_filters_refuse_other_records_under_their_ids_before_binding(tmp_path, towers):
    """`load_dprag` (the server's path) in individual accounting: a record edited under
    its id is refused by the pinned filters before the ledger binds the edited record."""
    import sqlite3

    index, corpus = _collection(tmp_path, "all-minilm-l6-v2")
    ledger = PrivacyLedger(tmp_path / "l.sqlite")
    config = RagConfig(max_tokens=3, accounting="individual")
    options = dict(lm=TinyLM(), ledger=ledger, dataset="records", config=config,
                   document_target=(4.0, 1e-6), answer_epsilon=1.0)  # fmt: skip
    load_dprag(index, corpus, **options)

    def bindings():
        with sqlite3.connect(tmp_path / "l.sqlite") as conn:
            return [conn.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0]
                    for table in ("document_sets", "document_records")]  # fmt: skip

    before = bindings()
    lines = corpus.read_text().splitlines()
    row = json.loads(lines[-1])
    lines[-1] = json.dumps({**row, "text": "an edited record"})
    corpus.write_text("\n".join(lines) + "\n")
    with pytest.raises(ValueError, match="ids name other records"):
        load_dprag(index, corpus, **options)
    assert bindings() == before
