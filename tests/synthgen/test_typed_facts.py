"""Typed facts of one record (`synthgen.knowledge.typed_facts`): metadata dropped, values
whole and typed, each bound to the subject it is said of, at most K per record."""

import pytest

from synthgen.knowledge.typed_facts import (
    fact_key,
    parse_typed_text,
    record_fact_keys,
    record_facts,
    split_fact,
    statements,
    value_kind,
)

TICKET = """Ticket #48213
Subject: VPN drops
Priority: P3
Category: Network
Opened: 2026-06-05 09:14

Hi team,
The printer is jamming again. Team Heron owns the payments gateway, and the maintenance
window for the payments gateway is Sundays 02:00-04:00 UTC.
Thanks,
Dana"""


def test_headers_greetings_timestamps_and_signatures_are_not_statements():
    said = " ".join(s for s, _ in statements(TICKET))
    for gone in ("48213", "Subject", "Priority", "P3", "Network", "2026", "09:14", "Dana",
                 "Hi team", "Thanks"):  # fmt: skip
        assert gone not in said, gone
    chat = "[09:42] sam: the mail relay answers on 10.4.2.17\nnote 2026-06-05 from priya: ok"
    assert [s for s, _ in statements(chat)] == ["the mail relay answers on 10.4.2.17", "ok"]


def test_values_are_whole_and_typed():
    cases = {
        "10.40.2.17": "ip", "Sundays 02:00-04:00 UTC": "window", "v4.12.3": "version",
        "45 days": "duration", "12 people": "count", "190 cm": "measure", "$249": "price",
        "room 4.12": "room", "Team Heron": "team", "1987": "year", "Velmora Dynamics": "org",
        "Venfen Uplands": "place", "Dara Quill": "person", "Poswick": "place",
        "lantern": "item", "\\\\fs01\\raw7": "share", "build01.corp": "host",
    }  # fmt: skip
    for value, kind in cases.items():
        assert value_kind(value) == ("money" if kind == "price" else kind), value


def test_each_value_is_bound_to_its_subject():
    facts = {(f.subject, f.value, f.kind) for f in record_facts(TICKET, 10)}
    assert ("the payments gateway", "Team Heron", "team") in facts
    assert ("the payments gateway", "Sundays 02:00-04:00 UTC", "window") in facts
    assert not any("2026" in v or "Ticket" in s for s, v, _ in facts)
    # the subject comes first where a clause has one before the value
    kitchen = record_facts("The third-floor kitchen is in room 1.25, next to the lifts.", 5)
    assert (kitchen[0].subject, kitchen[0].value) == ("the third-floor kitchen", "room 1.25")
    # names: the value said after its subject comes first
    (first,) = record_facts("Dara Quill works at Velmora Dynamics.", 1)
    assert (first.subject, first.value) == ("Dara Quill", "Velmora Dynamics")


def test_a_checklist_line_is_a_fact_of_its_heading():
    text = "Handover notes for the incident bridge (2026-05-17 09:01):\n- code word: walnut\n"
    (fact,) = record_facts(text, 5)
    assert (fact.subject, fact.value, fact.kind) == ("the incident bridge", "walnut", "item")
    assert "code" in fact.words and "word" in fact.words


def test_each_item_of_a_list_states_a_fact_with_the_name_after_it():
    said = (
        "Erika Holm (87) reported dalorish cramps, vitrilish rash and ratrorish itch and "
        "was diagnosed with Gruquind palsy; Binorafen was prescribed."
    )
    facts = [(f.subject, f.value) for f in record_facts(said, 3)]
    assert facts == [(s, "Gruquind palsy") for s in
                     ("dalorish cramps", "vitrilish rash", "ratrorish itch")]  # fmt: skip
    # the name after the list may open the next statement
    note = (
        "Patient Ines Moreau, 67, presented with tadrunic numbness and gugolal spots. "
        "Diagnosis: Sefonemia. Treated with Brozane."
    )
    assert [(f.subject, f.value) for f in record_facts(note, 2)] == [
        ("tadrunic numbness", "Sefonemia"), ("gugolal spots", "Sefonemia")]  # fmt: skip
    # typed values still come first; a list with nothing after it states no list fact
    assert (
        record_facts("The relay runs v2.1.0. Dara met Brenol, Quist and Vand.", 1)[0].value
        == "v2.1.0"
    )
    alone = record_facts("We met Brenolt, Quistan and Vandor.", 8)
    assert not any(f.value == "Vandor" and f.subject == "Brenolt" for f in alone)


def test_a_list_read_across_statements_keeps_the_record_to_k_facts():
    """The over-K canary without its filler: the list's facts name the next statement's
    first name, and the record still gives at most K keys (its shared pair past them)."""
    for k in (1, 2, 4):
        own = ", ".join(f"Vor{c}an" for c in "bdfg"[:k]) + " and Quistel"
        text = f"Brenolt met {own}. Dalvera grew up in Poswick."
        keys = record_fact_keys(text, k)
        assert len(keys) == k
        assert fact_key("Dalvera", "Poswick") not in keys
        assert fact_key("Dalvera", "Poswick") in record_fact_keys(text, 10**6)


def test_a_link_between_two_names_pools_whatever_the_phrasing_and_a_day_is_no_name():
    phrasings = (
        "Dara Quill works at Velmora Dynamics.",
        "Velmora Dynamics employs Dara Quill as an engineer.",
        "At Velmora Dynamics, Dara Quill leads a small team.",
    )
    assert {tuple(record_fact_keys(text, 1)) for text in phrasings} == {
        (fact_key("Dara Quill", "Velmora Dynamics"),)
    }
    filler = "Local volunteers cleaned the park on Saturday morning. "
    assert record_fact_keys(filler + phrasings[0], 1) == [
        fact_key("Dara Quill", "Velmora Dynamics")
    ]
    assert record_fact_keys(filler, 1) == []


def test_a_record_contributes_each_fact_once_and_at_most_k():
    text = "Team Heron owns the payments gateway. " * 3 + "The mail relay runs v2.1.0."
    keys = record_fact_keys(text, 5)
    assert keys == [fact_key("the payments gateway", "Team Heron"),
                    fact_key("The mail relay", "v2.1.0")]  # fmt: skip
    assert record_fact_keys(text, 1) == keys[:1]
    assert split_fact(keys[1]) == ("mail relay", "v2.1.0")


@pytest.mark.parametrize("value", ["a; b", "x (y)", "k: v"])
def test_a_value_that_would_not_read_back_is_never_a_key(value):
    heading = "Handover notes for the incident bridge:\n"
    assert record_fact_keys(heading + "- code word: walnut", 3) != []  # the filter's only cause
    assert record_fact_keys(heading + f"- code word: {value}", 3) == []


def test_a_typed_record_reads_back():
    text = "incident bridge: version v7.27.2 (37); time window Tuesdays 03:00-09:00 UTC (34)."
    record = parse_typed_text(text)
    assert record["topic"] == "incident bridge"
    assert [(f["value"], f["kind"], f["count"]) for f in record["facts"]] == [
        ("v7.27.2", "version", 37.0),
        ("Tuesdays 03:00-09:00 UTC", "window", 34.0),
    ]
    assert parse_typed_text("Dara Quill: Velmora Dynamics; Poswick.") is None


def test_the_rule_reads_a_public_number_of_characters():
    from synthgen.knowledge.typed_facts import MAX_RECORD_CHARS

    padding = "word " * (MAX_RECORD_CHARS // 5)
    assert record_facts(padding + "The mail relay runs v2.1.0.", 3) == []  # past the cap
    assert (
        fact_key("The Zorvak Quimble", "the Pelthrix Dynamo") == "Zorvak Quimble | Pelthrix Dynamo"
    )
