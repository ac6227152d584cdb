"""The main job from a user-shaped pairs file: `synthgen pipeline init --pairs` then the run.

A support log whose fields are renamed ("clicked", "q") names documents by id in a
collection with its own id field ("id", "body"); the tiny preset keeps it CI-sized.
"""

import json

import cli_process
import pytest

from dpsynth.pipeline import load_pipeline_config

pytestmark = pytest.mark.slow

TOPICS = "printer vpn password badge laptop wifi email calendar payroll parking".split()


def _words(rng, n):
    """Invented words: enough distinct text for the tiny preset's own tokenizer (512 pieces)."""
    syllables = [a + b + c for a in "bcdfgklmnprstvz" for b in "aeiou" for c in "lnrsx"]
    return " ".join(
        "".join(rng.choice(syllables) for _ in range(rng.randint(1, 3))) for _ in range(n)
    )


def _files(folder, documents=40, per=3):
    import random

    rng = random.Random(0)
    docs = folder / "kb.jsonl"
    docs.write_text(
        "".join(
            json.dumps({"id": f"kb-{i}", "body": f"How to fix the {TOPICS[i % 10]} issue {i}: "
                        f"{_words(rng, 150)}."}) + "\n"
            for i in range(documents + 5)  # five documents nobody clicked: indexed too
        )
    )  # fmt: skip
    log = folder / "clicks.jsonl"
    log.write_text(
        "".join(
            json.dumps({"clicked": f"kb-{i}", "q": f"{TOPICS[i % 10]} {_words(rng, 4)}"}) + "\n"
            for i in range(documents)
            for _ in range(per)
        )
    )
    return log, docs


def _rag_files(folder):
    """A private helpdesk collection (doc_id, text) and public questions about it."""
    tickets = folder / "tickets.jsonl"
    tickets.write_text("".join(
        json.dumps({"doc_id": f"t{i}", "text": f"Ticket {i}: the {TOPICS[i % 10]} on floor "
                    f"{i % 4} was fixed by Omar Vell."}) + "\n"
        for i in range(40)
    ))  # fmt: skip
    questions = folder / "questions.jsonl"
    questions.write_text(
        json.dumps({"question": "Who fixed the printer?", "answer": "Omar Vell"}) + "\n"
        "Which floor had the vpn issue?\n"
    )
    return tickets, questions


def _cli(*args, cwd):
    return cli_process.command("synthgen", *args, cwd=cwd, timeout=1800)


def test_init_writes_a_config_for_the_pairs_and_the_main_job_runs_it(tmp_path):
    log, docs = _files(tmp_path)
    made = _cli(
        "pipeline", "init", "--pairs", log, "--documents", docs, "--query-field", "q",
        "--doc-id-field", "clicked", "--id-field", "id", "--text-field", "body",
        "--preset", "tiny", "--to", tmp_path / "support.py", cwd=tmp_path,
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    assert "120 pairs naming 40 documents" in made.stdout and "45 documents indexed" in made.stdout
    alone = _cli("pipeline", "init", "--pairs", log, "--query-field", "q",
                 "--doc-id-field", "clicked", "--to", tmp_path / "x.py", cwd=tmp_path)  # fmt: skip
    assert alone.returncode == 2 and "--documents FILE" in alone.stderr
    config = load_pipeline_config(str(tmp_path / "support.py"))
    assert config.data.pairs == str(log.resolve()) and config.data.source is None
    assert not config.rag.enabled  # no collection of yours: no DP-RAG stage over a sample
    tickets, questions = _rag_files(tmp_path)
    made = _cli(
        "pipeline", "init", "--pairs", log, "--documents", docs, "--query-field", "q",
        "--doc-id-field", "clicked", "--id-field", "id", "--text-field", "body",
        "--rag-records", tickets, "--rag-questions", questions,
        "--preset", "tiny", "--to", tmp_path / "support_rag.py", cwd=tmp_path,
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    rag = load_pipeline_config(str(tmp_path / "support_rag.py")).rag
    assert rag.enabled and rag.records == str(tickets.resolve()) and rag.questions == 2
    run = _cli("pipeline", "--config", tmp_path / "support_rag.py", "--out", tmp_path / "run",
               "--no-progress", cwd=tmp_path)  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    root = tmp_path / "run"
    data = json.loads((root / "stages" / "data.json").read_text())["summary"]
    assert data["documents"] == 45 and data["train_pairs"] + data["test_queries"] == 120
    # the generator wrote queries for public documents, clicked or not, never by the pairs
    targets = {json.loads(line)["doc_id"] for line in (root / "data" / "targets.jsonl").open()}
    assert len(targets) == 36 and targets & {f"kb-{i}" for i in range(40, 45)}
    written = {json.loads(line)["doc_id"] for line in (root / "synthetic" / "queries.jsonl").open()}
    assert written <= targets
    report = (root / "report" / "report.html").read_text()
    assert "NDCG@10" in report and "synthetic" in report and "ε" in report
    # the DP-RAG stage answered your questions over your collection, charged to its scope
    answered = json.loads((root / "stages" / "rag.json").read_text())["summary"]
    assert answered["dataset"] == "tickets" and answered["records"] == 40
    assert [a["question"] for a in answered["answers"]][1] == "Which floor had the vpn issue?"
    assert "DP-RAG answers" in report and "tickets" in report
    assert "real queries and" not in report  # no real query is shown
    for line in (root / "private" / "data" / "train_pairs.jsonl").read_text().splitlines()[:3]:
        assert json.loads(line)["query"] not in report  # no private query in the report


def test_bad_pairs_files_are_refused_by_init_naming_the_line(tmp_path):
    log, docs = _files(tmp_path)
    lines = log.read_text().splitlines()
    lines[6] = json.dumps({"clicked": "kb-999", "q": "lost"})
    log.write_text("\n".join(lines) + "\n")
    made = _cli("pipeline", "init", "--pairs", log, "--documents", docs, "--query-field", "q",
                "--doc-id-field", "clicked", "--id-field", "id", "--text-field", "body",
                "--preset", "tiny", cwd=tmp_path)  # fmt: skip
    assert made.returncode == 2
    assert f"{log}:7: document id not in" in made.stderr and "lost" not in made.stderr
    assert not (tmp_path / "clicks.py").exists()
