"""The fact release: the public key-phrase rule, the plan's arithmetic, the DP selection."""

from __future__ import annotations

import json

import pytest

from synthgen.knowledge.facts import FactConfig, fact_records, plan_facts, release_facts
from synthgen.knowledge.phrases import (
    pair_key,
    question_phrases,
    record_pairs,
    record_phrases,
    sentence_phrases,
)
from synthgen.knowledge.typed_facts import fact_key
from synthgen.privacy import PrivacyLedger, Scope
from synthgen.privacy.partition_selection import keep_probability
from synthgen.privacy.receipts import ledger_payer


def test_key_phrases_are_names_numbers_and_rare_words():
    assert sentence_phrases("Dara Quillon works at Velmora Dynamics.") == [
        "Dara Quillon",
        "Velmora Dynamics",
    ]
    assert sentence_phrases("In 1970, Norol Murzer was born.") == ["1970", "Norol Murzer"]
    assert sentence_phrases("The Vuke B8 costs $1,299.50 in Poby's shops.") == [
        "Vuke B8",
        "$1,299.50",
        "Poby",
    ]
    # common words, even capitalised at a sentence's start, carry no fact
    assert sentence_phrases("The weather was mild for most of the season.") == []
    assert sentence_phrases("Maria Lopez grew up in Tarnwick.") == ["Maria Lopez", "Tarnwick"]
    assert sentence_phrases("An adult Trirgol trenne measures 190 cm.") == [
        "Trirgol trenne",
        "190 cm",
    ]
    assert sentence_phrases("It weighs 5 kg in Poby.") == ["5 kg", "Poby"]


def test_pairs_nearest_first_sentence_before_record_at_most_k():
    text = "Ada Vorn met Bel Quist and Cai Zorn. Dov Rell is elsewhere."
    assert record_phrases(text) == [["Ada Vorn", "Bel Quist", "Cai Zorn"], ["Dov Rell"]]
    assert record_pairs(text, 10) == [
        pair_key("Ada Vorn", "Bel Quist"),
        pair_key("Bel Quist", "Cai Zorn"),
        pair_key("Ada Vorn", "Cai Zorn"),
        pair_key("Ada Vorn", "Dov Rell"),
        pair_key("Bel Quist", "Dov Rell"),
        pair_key("Cai Zorn", "Dov Rell"),
    ]
    assert record_pairs(text, 1) == [pair_key("Ada Vorn", "Bel Quist")]
    assert pair_key("b", "a") == pair_key("a", "b")


def test_question_phrases_are_whole_words_longest_first():
    known = ["Dara Quill", "Quill", "Velmora Dynamics", "Poby"]
    assert question_phrases("Which company does Dara Quill work for?", known) == ["Dara Quill"]
    assert question_phrases("Where is Pobyton?", known) == []


def test_the_plan_is_public_arithmetic_and_refuses_what_cannot_carry():
    plan = plan_facts(FactConfig(epsilon=10.0, delta=1e-6), 500)
    assert plan.problems() == []
    assert plan.singleton_probability <= 1e-6
    assert plan.singleton_probability == keep_probability(1, 10.0, 1e-6, 1)
    needed = plan.records_needed(0.5)
    assert plan.keep_probability(needed) >= 0.5 > plan.keep_probability(needed - 1)
    assert plan_facts(FactConfig(epsilon=3.0), 500).records_needed() > needed
    assert plan_facts(FactConfig(epsilon=10.0, max_pairs=4), 500).records_needed() > needed
    assert "1/n" in plan_facts(FactConfig(epsilon=10.0, delta=1e-2), 500).problems()[0]
    thin = plan_facts(FactConfig(epsilon=0.1), 40).problems()
    assert thin and "carry nothing" in thin[0]
    table = plan.table()
    assert [r["released"] for r in table] == sorted(r["released"] for r in table)


def _collection(canary: str) -> list[str]:
    texts = [f"Dara Quillon works at Velmora Dynamics. Note {i}." for i in range(30)]
    texts += [f"Bo Kestrin grew up in Tarnwick. Entry {i}." for i in range(30)]
    texts += [f"The weather was mild on day {i}." for i in range(40)]
    return texts + [canary]


def test_release_carries_shared_facts_and_never_a_single_records(tmp_path):
    canary = "Zorvik Plenthe was born in Qaxfordshire."
    release = release_facts(_collection(canary), FactConfig(epsilon=10.0))
    assert set(release.pairs) == {  # typed: the subject first, the value it is said of
        fact_key("Dara Quillon", "Velmora Dynamics"),
        fact_key("Bo Kestrin", "Tarnwick"),
    }
    assert all(abs(count - 30) < 15 for count in release.pairs.values())
    texts = " ".join(r["text"] for r in release.records)
    assert "Zorvik" not in texts and "Qaxfordshire" not in texts
    assert {r["topic"] for r in release.records} == {"Dara Quillon", "Bo Kestrin"}
    by_topic = {r["topic"]: r for r in release.records}
    assert by_topic["Dara Quillon"]["facts"][0]["kind"] == "org"
    assert by_topic["Bo Kestrin"]["text"].startswith("Bo Kestrin: place Tarnwick (")


def test_the_phrase_release_is_kept_as_an_extractor():
    canary = "Zorvik Plenthe was born in Qaxfordshire."
    config = FactConfig(epsilon=10.0, extractor="phrases")
    release = release_facts(_collection(canary), config)
    assert set(release.pairs) == {
        pair_key("Dara Quillon", "Velmora Dynamics"),
        pair_key("Bo Kestrin", "Tarnwick"),
    }
    assert {r["topic"] for r in release.records} == {
        "Dara Quillon", "Velmora Dynamics", "Bo Kestrin", "Tarnwick",
    }  # fmt: skip
    with pytest.raises(ValueError, match="extractor"):
        FactConfig(epsilon=10.0, extractor="spacy")


def test_fact_records_list_partners_by_noisy_count():
    pairs = {pair_key("A", "B"): 9.0, pair_key("A", "C"): 20.0, pair_key("D", "E"): 5.0}
    records = {r["topic"]: r for r in fact_records(pairs, max_partners=8)}
    assert records["A"]["text"] == "A: C; B."
    assert records["B"]["partners"] == ["A"]
    assert fact_records(pairs, max_partners=1)[0]["partners"] == ["C"]


def _pay(ledger):
    return ledger_payer(ledger, ("release", "c"), stage="knowledge-release")


def test_refused_before_any_charge_and_charged_once_on_rerun(tmp_path):
    ledger = PrivacyLedger(str(tmp_path / "ledger.sqlite"))
    ledger.ensure_scope(Scope("release", "c", 10.0, 1e-6))
    with pytest.raises(ValueError, match="carry nothing"):
        release_facts(["Ada Vorn met Bel Quist."] * 20, FactConfig(epsilon=0.2),
                      work=tmp_path, pay=_pay(ledger))  # fmt: skip
    assert ledger.charges("release", "c") == []
    texts = _collection("x")
    draws = [  # a rerun after a crash: the same idempotency key, one charge, the same draw
        release_facts(
            texts,
            FactConfig(epsilon=10.0),
            work=tmp_path,
            pay=_pay(ledger),
        ).pairs  # fmt: skip
        for _ in range(3)
    ]
    assert draws[0] == draws[1] == draws[2]  # no fresh noise to average for free
    with pytest.raises(ValueError, match="another plan"):
        release_facts(texts, FactConfig(epsilon=5.0), work=tmp_path)
    with pytest.raises(ValueError, match="another plan"):  # paid: refused before its charge
        release_facts(texts, FactConfig(epsilon=5.0), work=tmp_path, pay=_pay(ledger))
    ledger.ensure_scope(Scope("release", "d", 10.0, 1e-6))
    other = ledger_payer(ledger, ("release", "d"), stage="knowledge-release")
    with pytest.raises(ValueError, match="another scope"):  # the folder's key is c's
        release_facts(texts, FactConfig(epsilon=10.0), work=tmp_path, pay=other)
    assert ledger.charges("release", "d") == []
    unpaid = tmp_path / "unpaid"  # a draw made without a charge is never a paid release
    release_facts(texts, FactConfig(epsilon=10.0), work=unpaid)
    with pytest.raises(ValueError, match="without a charge"):
        release_facts(texts, FactConfig(epsilon=10.0), work=unpaid, pay=_pay(ledger))
    charges = ledger.charges("release", "c")
    assert len(charges) == 1 and charges[0].stage == "knowledge-release"
    assert json.loads((tmp_path / "facts_charge.json").read_text())["ref"].startswith("facts-")


def test_a_draw_lost_before_it_was_stored_is_never_drawn_again_on_its_charge(tmp_path, monkeypatch):
    from synthgen.knowledge import facts

    ledger = PrivacyLedger(str(tmp_path / "ledger.sqlite"))
    ledger.ensure_scope(Scope("release", "c", 10.0, 1e-6))
    texts, draws = _collection("x"), []
    real_select, real_write = facts._select, facts.write_private

    def crash_on_the_result(path, text):
        if path.name == facts.RESULT_FILE:
            raise OSError("disk full")
        real_write(path, text)

    with monkeypatch.context() as patch:
        patch.setattr(facts, "_select", lambda *a: draws.append(1) or real_select(*a))
        patch.setattr(facts, "write_private", crash_on_the_result)
        with pytest.raises(OSError, match="disk full"):  # charged and drawn, never stored
            release_facts(texts, FactConfig(epsilon=10.0), work=tmp_path, pay=_pay(ledger))
        patch.setattr(facts, "write_private", real_write)
        with pytest.raises(ValueError, match="draw was lost"):
            release_facts(texts, FactConfig(epsilon=10.0), work=tmp_path, pay=_pay(ledger))
    assert len(draws) == 1 and len(ledger.charges("release", "c")) == 1


def test_a_lost_unpaid_draw_refuses_a_paid_run_before_its_charge(tmp_path, monkeypatch):
    """An uncharged attempt that drew and crashed leaves its marker: a paid run on that
    folder is refused before it charges anything (a refusal changes nothing)."""
    from synthgen.knowledge import facts

    ledger = PrivacyLedger(str(tmp_path / "ledger.sqlite"))
    ledger.ensure_scope(Scope("release", "c", 10.0, 1e-6))
    texts, real_write = _collection("x"), facts.write_private

    def crash_on_the_result(path, text):
        if path.name == facts.RESULT_FILE:
            raise OSError("disk full")
        real_write(path, text)

    with monkeypatch.context() as patch:
        patch.setattr(facts, "write_private", crash_on_the_result)
        with pytest.raises(OSError, match="disk full"):  # drawn without a charge, never stored
            release_facts(texts, FactConfig(epsilon=10.0), work=tmp_path)
    with pytest.raises(ValueError, match="draw was lost"):
        release_facts(texts, FactConfig(epsilon=10.0), work=tmp_path, pay=_pay(ledger))
    assert ledger.charges("release", "c") == []


def test_two_concurrent_releases_on_one_work_folder_charge_once_and_draw_once(
    tmp_path, monkeypatch, caplog
):
    """Run B starts while run A is inside its draw (a hook, not a timing): with the folder's
    lock B waits, then returns A's draw; without it B would draw a second time."""
    import logging
    import threading

    from synthgen.knowledge import facts

    ledger = PrivacyLedger(str(tmp_path / "ledger.sqlite"))
    ledger.ensure_scope(Scope("release", "c", 10.0, 1e-6))
    texts, work = _collection("x"), tmp_path
    real, draws, results = facts.release_key_counts, [], {}
    b_waits_or_ends = threading.Event()

    class Waiting(logging.Handler):  # the lock's one log line: B is blocked on it
        def emit(self, record):
            b_waits_or_ends.set()

    def run(name):
        try:
            results[name] = facts.release_facts(
                texts, FactConfig(epsilon=10.0), work=work, pay=_pay(ledger)
            ).pairs  # fmt: skip
        finally:
            b_waits_or_ends.set()

    second = threading.Thread(target=run, args=("b",))

    def drawing(*args, **kwargs):
        draws.append(threading.current_thread().name)
        if len(draws) == 1:  # A is drawing: start B, go on once B waits (or has finished)
            second.start()
            assert b_waits_or_ends.wait(timeout=120), "run B neither waited nor finished"
        return real(*args, **kwargs)

    monkeypatch.setattr(facts, "release_key_counts", drawing)
    waiting = Waiting()
    logging.getLogger("synthgen.knowledge.work_lock").addHandler(waiting)
    caplog.set_level(logging.INFO, logger="synthgen.knowledge.work_lock")
    try:
        run("a")
        second.join(timeout=120)
    finally:
        logging.getLogger("synthgen.knowledge.work_lock").removeHandler(waiting)
    assert not second.is_alive() and set(results) == {"a", "b"}
    assert len(draws) == 1 and results["a"] == results["b"]  # one draw, returned twice
    assert len(ledger.charges("release", "c")) == 1


def test_an_epsilon_that_releases_single_records_is_refused():
    plan = plan_facts(FactConfig(epsilon=1000.0), 10_000)
    assert any("one record states" in p for p in plan.problems())
    assert plan_facts(FactConfig(epsilon=10.0), 10_000).problems() == []
