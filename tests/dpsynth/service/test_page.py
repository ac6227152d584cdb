"""The page at `/` driven in headless Chromium: key, question, answer, budget card, the
Ask button enabled exactly while the ledger admits another answer, and abstentions."""

import re

import httpx
import pytest

from retriever.rag.answer_types import ABSTENTION_TEXT
from synthgen.privacy import PrivacyLedger, format_remaining
from tests.dpsynth.service.harness import Server, add_tenants, bearer, questions

CAP = 2.5  # three answers at the service's epsilon 1.0 (PLD: 2.49), not four
COLLECTION_CAP = 5.0
WAIT_MS = 60_000  # every wait in the browser is bounded by this
REMAINING = re.compile(r"remaining ε (\S+) of (\S+) \(δ cap \S+, (\d+) charges\)")


@pytest.fixture
def served(world, tmp_path):
    ledger = str(tmp_path / "ledger.sqlite")
    keys = add_tenants(ledger, {"alice": CAP}, collection=COLLECTION_CAP)
    server = Server(world, ledger, tmp_path / "server.log").start()
    yield server, keys["alice"], PrivacyLedger(ledger)
    server.stop()


def _ledger_remaining(book: PrivacyLedger) -> str:
    """alice's remaining epsilon as every front end writes it (`format_remaining`)."""
    return format_remaining(CAP, book.spent("alice", "corpus").epsilon)


def _remaining_text(page) -> str:
    return REMAINING.fullmatch(page.locator("#remaining").inner_text().strip())[1]


def _remaining(page) -> tuple[float, float, int]:
    text = page.locator("#remaining").inner_text()
    match = REMAINING.fullmatch(text.strip())
    assert match, f"unexpected budget text: {text!r}"
    return float(match[1]), float(match[2]), int(match[3])


BUDGET_SHOWN = "document.getElementById('remaining').textContent.startsWith('remaining')"


def _ask(page, question: str) -> None:
    """Asks and waits until the answer (or error) and the refreshed budget are on the page."""
    page.fill("#question", question)
    page.click("#ask")  # sets body[data-busy] at once, clears it after the budget refresh
    page.wait_for_function("!document.body.dataset.busy", timeout=WAIT_MS)


def test_page_answers_and_shows_the_budget(chromium, served, world):
    server, key, book = served
    page = chromium.new_page()
    page.set_default_timeout(WAIT_MS)
    errors: list[str] = []
    page.on("console", lambda msg: errors.append(msg.text) if msg.type == "error" else None)
    page.on("pageerror", lambda exc: errors.append(f"pageerror: {exc}"))
    try:
        page.goto(server.url + "/", timeout=WAIT_MS)
        assert page.title() == "dpsynth · private answers"
        # before a key is checked: Ask disabled, no placeholder costs (issue 51)
        assert page.locator("#ask").is_disabled()
        assert page.locator("#terms").inner_text().startswith("enter your tenant key")
        assert "…" not in page.locator("body").inner_text()
        page.fill("#key", "dpk_wrong")
        page.dispatch_event("#key", "change")
        page.wait_for_function(
            "document.getElementById('remaining').textContent !== '–'", timeout=WAIT_MS
        )
        assert page.locator("#ask").is_disabled()  # a refused key enables nothing
        errors.clear()  # the browser logs the refused key's 401s as console errors

        page.fill("#key", key)
        page.dispatch_event("#key", "change")
        page.wait_for_function(BUDGET_SHOWN, timeout=WAIT_MS)
        remaining, cap, charges = _remaining(page)
        assert (remaining, cap, charges) == (CAP, CAP, 0)
        assert page.locator("#tenant").inner_text() == "of alice on corpus"
        assert page.locator("#log tbody tr").count() == 0

        # the terms come from /health, which states them to a valid key only
        assert page.locator("#epsilon").inner_text() == "1.00"
        assert page.locator("#mechanism").inner_text() == "icl"
        assert page.locator("#max-question-tokens").inner_text() == "128"
        _ask(page, questions(world)[0])
        assert page.locator("#error").inner_text() == ""
        assert page.locator("#answer").inner_text().strip()  # gibberish from the test LM
        cost = page.locator("#cost").inner_text()
        assert cost.startswith("cost ε ") and "retrieval" in cost and "tokens" in cost
        spent = float(cost.split()[2].rstrip(","))
        assert 0 < spent <= 1.0 + 1e-9

        after, cap, charges = _remaining(page)
        assert _remaining_text(page) == _ledger_remaining(book)  # the same string
        assert CAP - spent - 0.01 <= after < CAP  # the ledger's composition is never worse
        assert charges == len(book.charges("alice", "corpus")) == 2
        assert page.locator("#log tbody tr").count() == 2
        assert float(page.locator("#spent-bar").get_attribute("value") or 0) > 0
        assert not page.locator("#ask").is_disabled()

        assert _answers_left(page) == _api_answers_left(server, key) == 2

        # the second answer leaves less than one answer's epsilon (2.5 - 1.94), yet the
        # ledger admits a third (composition: 2.49 <= 2.5): Ask stays enabled, as /budget says
        _ask(page, questions(world)[1])
        second, cap, charges = _remaining(page)
        assert second < 1.0 and charges == 4
        assert _answers_left(page) == _api_answers_left(server, key) == 1
        assert not page.locator("#ask").is_disabled()
        assert page.locator("#error").inner_text() == ""
        _ask(page, questions(world)[2])
        assert page.locator("#cost").inner_text().startswith("cost ε ")  # admitted and shown
        final, cap, charges = _remaining(page)
        assert _remaining_text(page) == _ledger_remaining(book)
        assert final == float(_ledger_remaining(book))
        assert charges == 6 and page.locator("#log tbody tr").count() == 6
        # now none fits: the page disables Ask, and the API indeed refuses the next answer
        assert _api_answers_left(server, key) == 0
        assert page.locator("#answers-left").inner_text().startswith("0 more answers fit")
        assert page.locator("#ask").is_disabled()
        assert page.locator("#error").inner_text().startswith("budget exhausted")
        refused = httpx.post(
            server.url + "/answer",
            json={"question": questions(world)[3]},
            headers=bearer(key),
            timeout=60,
        )
        assert refused.status_code == 402
        assert errors == []
    finally:
        page.close()


def _answers_left(page) -> int:
    text = page.locator("#answers-left").inner_text()
    match = re.fullmatch(r"(\d+) more answers? fits? in this budget", text.strip())
    assert match, f"unexpected answers-left text: {text!r}"
    return int(match[1])


def _api_answers_left(server, key: str) -> int:
    budget = httpx.get(server.url + "/budget", headers=bearer(key), timeout=30)
    assert budget.status_code == 200
    return budget.json()["answers_left"]


def test_page_shows_an_abstention_as_such(chromium, world, tmp_path):
    """keywords at epsilon 1 needs ~53 agreeing voters of at most 4: nothing is released,
    so the answer abstains, and the page says so."""
    ledger = str(tmp_path / "ledger.sqlite")
    key = add_tenants(ledger, {"alice": 10.0}, collection=20.0)["alice"]
    server = Server(
        world, ledger, tmp_path / "server.log", "--mechanism", "keywords", "--answer-epsilon", "1.0"
    ).start()
    page = chromium.new_page()
    page.set_default_timeout(WAIT_MS)
    try:
        page.goto(server.url + "/", timeout=WAIT_MS)
        page.fill("#key", key)
        page.dispatch_event("#key", "change")
        page.wait_for_function(BUDGET_SHOWN, timeout=WAIT_MS)
        assert page.locator("#mechanism").inner_text() == "keywords"
        _ask(page, questions(world)[0])
        assert page.locator("#error").inner_text() == ""
        assert page.locator("#answer").inner_text() == ABSTENTION_TEXT
        assert "abstained" in (page.locator("#answer").get_attribute("class") or "")
        assert page.locator("#abstention").inner_text().startswith("abstained:")
        assert "charged" in page.locator("#abstention").inner_text()
        assert _remaining(page)[2] == 2  # an abstention is charged like any answer
        assert not page.locator("#ask").is_disabled()
    finally:
        page.close()
        server.stop()
