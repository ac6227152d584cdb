"""`build_knowledge` and `retriever contributor build`: a contributor's DP fact release.

The release folder must hold no private text (canaries, doc_ids, sentences), the private
work folder must stay apart (mode 0700), the card must state what the ledger was charged,
the ledger must refuse a second release of the same collection, and a work folder left by
an unfinished cluster release (retired) must be refused, never resumed as a fact release.
"""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest

from retriever.network.folder import read_card, read_private_record
from retriever.network.knowledge import (
    CLUSTER_RELEASE_FILES,
    KNOWLEDGE_WORK,
    RELEASE_TENANT,
    build_knowledge,
    summary,
)
from synthgen.knowledge import FactConfig
from synthgen.privacy import BudgetExceededError, PrivacyLedger
from tests.dpsynth.service.harness import cli

EPSILON, DELTA = 8.0, 1e-5  # a pair of phrases 30 records state passes the threshold
# the records below state (disease, symptom) pairs of key phrases; typed facts read none
CONFIG = FactConfig(epsilon=EPSILON, delta=DELTA, extractor="phrases")
SLOW_BUILD = pytest.mark.slow  # the shared build takes ~20 s: two indexes

# Three invented diseases, 30 records each, and three canary records (unique strings).
DISEASES = {
    "quinaxitis": ("shivers", "blisters", "Dabaxozane"),
    "bruvelosis": ("wheezing", "cramps", "Plunexozane"),
    "tremadoria": ("itching", "swelling", "Fusonivir"),
}
CANARIES = (
    "canary-7f3a9c2e4b1d8a60",
    "canary-0d9e8b7a6c5f4e31",
    "canary-a1b2c3d4e5f60718",
)


def _private_rows() -> list[dict[str, str]]:
    rows = []
    for name, (a, b, drug) in DISEASES.items():
        for i in range(30):
            rows.append(
                {
                    "doc_id": f"private-rec-{len(rows):04d}",
                    "text": f"Record {i}: the {name} case came in with {a} and {b}. "
                    f"It was treated with {drug} for {i + 3} days at the north clinic.",
                }
            )
    for canary in CANARIES:
        rows.append(
            {
                "doc_id": f"private-rec-{len(rows):04d}",
                "text": f"Chart note {canary} belongs to a quinaxitis case with shivers.",
            }
        )
    return rows


def _write_corpus(path: Path, rows: list[dict[str, str]]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def _sentences(text: str) -> list[str]:
    return [s.strip() for s in text.replace(":", ".").split(".") if len(s.strip()) > 40]


def _snapshot(folder: Path) -> dict[str, tuple[bytes, int]]:
    """Every file under `folder` (recursively) with its bytes and modification time."""
    return {
        str(p.relative_to(folder)): (p.read_bytes(), p.stat().st_mtime_ns)
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    root = tmp_path_factory.mktemp("knowledge")
    rows = _private_rows()
    corpus = _write_corpus(root / "private" / "corpus.jsonl", rows)
    result = build_knowledge(
        corpus, root / "release", CONFIG, contributor="north", work=root / "work"
    )
    return {"root": root, "rows": rows, "corpus": corpus, "result": result}


@SLOW_BUILD
def test_release_folder_holds_no_private_text(built):
    result, rows = built["result"], built["rows"]
    release = result.folder.path
    assert result.num_documents > 0 and result.num_pairs > 0  # something was released
    files = _snapshot(release)
    shipped = {"card.json", "synthetic.jsonl", "metadata.json", "facts.json", "index"}
    assert shipped - {"index"} | {"index/index.json"} <= set(files)
    assert all(name.split("/")[0] in shipped for name in files)
    secrets = [*CANARIES, *(row["doc_id"] for row in rows)]
    secrets += [s for row in rows for s in _sentences(row["text"])]
    assert len(secrets) > len(rows) * 2  # every record has a long sentence to look for
    for name, (content, _) in files.items():
        for secret in secrets:
            assert secret.encode() not in content, f"{name} holds private text"
    synthetic = [
        json.loads(line) for line in (release / "synthetic.jsonl").read_text().splitlines()
    ]
    assert len(synthetic) == result.num_documents
    pairs = json.loads((release / "facts.json").read_text())["pairs"]
    assert {row["topic"] for row in synthetic} <= {p for pair in pairs for p in pair.split(" | ")}


@SLOW_BUILD
def test_work_folder_is_private_and_apart(built):
    result, release = built["result"], built["result"].folder.path
    work = result.work
    assert work.is_dir() and stat.S_IMODE(work.stat().st_mode) == 0o700
    assert release not in work.parents and work != release
    assert work not in release.parents
    assert (work / "ledger.sqlite").is_file() and (work / "private.json").is_file()
    record = read_private_record(work)
    assert record["dataset"] == "corpus" and record["release"] == str(release)
    assert Path(record["private_index"]).is_dir()
    assert work in Path(record["private_index"]).parents
    assert not any(p.name in {"ledger.sqlite", "private.json"} for p in release.rglob("*"))


@SLOW_BUILD
def test_card_states_the_ledger_spend(built):
    result = built["result"]
    card = read_card(result.folder.path)
    assert card == result.card
    guarantee = card["guarantee"]
    assert guarantee["epsilon"] == EPSILON and guarantee["delta"] == DELTA
    assert guarantee["seeded"] is False
    assert [s["stage"] for s in guarantee["stages"]] == ["fact-pairs"]
    ledger = PrivacyLedger(result.work / "ledger.sqlite")
    charges = ledger.charges(RELEASE_TENANT, "corpus")
    assert [c.stage for c in charges] == ["knowledge-release"]  # one charge, all stages
    spent = ledger.spent(RELEASE_TENANT, "corpus")
    assert guarantee["epsilon"] == pytest.approx(spent.epsilon, rel=1e-4)
    assert card["releases"]["synthetic_documents"] == result.num_documents
    line = json.loads(summary(result))
    assert line["synthetic_records"] == result.num_documents
    assert line["pairs"] == result.num_pairs and "clusters" not in line
    assert line["epsilon"] == guarantee["epsilon"]


@SLOW_BUILD
def test_building_again_is_refused_and_changes_nothing(built):
    result, root = built["result"], built["root"]
    release, work = result.folder.path, result.work
    before, charges = (
        _snapshot(release),
        PrivacyLedger(work / "ledger.sqlite").charges(RELEASE_TENANT, "corpus"),
    )
    for out in (release, root / "second-release"):
        with pytest.raises(BudgetExceededError):
            build_knowledge(built["corpus"], out, CONFIG, contributor="north", work=work)
    assert _snapshot(release) == before
    assert not (root / "second-release").exists()
    assert PrivacyLedger(work / "ledger.sqlite").charges(RELEASE_TENANT, "corpus") == charges


def test_work_folder_inside_the_release_is_refused(tmp_path):
    corpus = _write_corpus(tmp_path / "corpus.jsonl", _private_rows()[:5])
    out = tmp_path / "release"
    for work in (out / "private", out, out / "a" / "b"):
        with pytest.raises(ValueError, match="must not overlap"):
            build_knowledge(corpus, out, CONFIG, contributor="c", work=work)
    assert not out.exists()


def test_an_empty_corpus_is_refused(tmp_path):
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("")
    with pytest.raises(ValueError):
        build_knowledge(corpus, tmp_path / "out", CONFIG, contributor="c", work=tmp_path / "work")
    assert not (tmp_path / "out").exists()


def test_an_empty_release_has_no_documents_and_no_index(tmp_path):
    # as many records as the shared corpus, each stating its own pair: none is released
    rows = [{"doc_id": f"r{i}", "text": f"Zorblat{i} met Quenzy{i}."} for i in range(93)]
    corpus = _write_corpus(tmp_path / "corpus.jsonl", rows)
    result = build_knowledge(corpus, tmp_path / "release", CONFIG, contributor="c",
                             work=tmp_path / "work", answer_index=False)  # fmt: skip
    release = result.folder.path
    assert (release / "synthetic.jsonl").read_text() == ""
    assert not (release / "index").exists()
    card = read_card(release)
    assert card["releases"]["synthetic_documents"] == 0
    assert (result.num_documents, result.num_pairs) == (0, 0)
    assert json.loads(summary(result))["empty"] is True
    charges = PrivacyLedger(result.work / "ledger.sqlite").charges(RELEASE_TENANT, "corpus")
    assert [c.stage for c in charges] == ["knowledge-release"]  # paid before any noise
    assert read_private_record(result.work)["private_index"] is None


@pytest.mark.parametrize("left", CLUSTER_RELEASE_FILES)
def test_an_unfinished_cluster_release_is_refused_before_anything(tmp_path, left):
    """A work folder charged for a cluster release (retired) that never finished: refused
    with what to do, nothing charged or written, never resumed as a fact release."""
    corpus = _write_corpus(tmp_path / "corpus.jsonl", _private_rows())
    work = tmp_path / "work"
    (work / KNOWLEDGE_WORK).mkdir(parents=True)
    (work / KNOWLEDGE_WORK / left).write_text('{"ref": "knowledge-0"}')
    with pytest.raises(ValueError, match="unfinished cluster release") as refused:
        build_knowledge(corpus, tmp_path / "release", CONFIG, contributor="c", work=work)
    assert "previous version" in str(refused.value) and "delete" in str(refused.value)
    assert not (tmp_path / "release").exists() and not (work / "ledger.sqlite").exists()
    if left != CLUSTER_RELEASE_FILES[0]:
        return  # the command line's one-line error: once
    result = cli("contributor", "build", "--private", corpus, "--epsilon", EPSILON,
                 "--out", tmp_path / "release", "--work", work, check=False)  # fmt: skip
    assert result.returncode != 0 and "unfinished cluster release" in result.stderr
    assert "Traceback" not in result.stderr and not (tmp_path / "release").exists()


def test_a_finished_cluster_release_is_left_to_the_ledger(tmp_path):
    """A finished cluster release's work folder (private.json written) is not the legacy
    refusal's: its ledger refuses a second release of the collection."""
    corpus = _write_corpus(tmp_path / "corpus.jsonl", _private_rows())
    work = tmp_path / "work"
    (work / KNOWLEDGE_WORK).mkdir(parents=True)
    (work / KNOWLEDGE_WORK / CLUSTER_RELEASE_FILES[0]).write_text('{"ref": "knowledge-0"}')
    (work / "private.json").write_text("{}")
    first = build_knowledge(corpus, tmp_path / "first", CONFIG, contributor="c",
                            work=tmp_path / "other", ledger=str(work / "ledger.sqlite"),
                            answer_index=False)  # fmt: skip
    assert first.num_pairs > 0
    with pytest.raises(BudgetExceededError, match="already released"):
        build_knowledge(corpus, tmp_path / "release", CONFIG, contributor="c", work=work,
                        ledger=str(work / "ledger.sqlite"))  # fmt: skip


def test_a_cluster_config_is_refused():
    with pytest.raises(TypeError, match="FactConfig"):
        build_knowledge("corpus.jsonl", "out", object(), contributor="c")


@pytest.mark.slow
def test_cli_build_prints_one_json_line(tmp_path):
    corpus = _write_corpus(tmp_path / "corpus.jsonl", _private_rows())
    out, work = tmp_path / "release", tmp_path / "work"
    result = cli("contributor", "build", "--private", corpus, "--epsilon", EPSILON,
                 "--delta", DELTA, "--extractor", "phrases", "--out", out,
                 "--work", work)  # fmt: skip
    lines = result.stdout.strip().splitlines()
    assert len(lines) == 1
    line = json.loads(lines[0])
    assert {"synthetic_records", "pairs", "epsilon", "delta"} <= set(line)
    assert line["synthetic_records"] > 0 and line["pairs"] > 0
    assert line["epsilon"] == EPSILON and line["delta"] == DELTA
    assert line["synthetic_records"] == len((out / "synthetic.jsonl").read_text().splitlines())
    assert read_card(out)["guarantee"]["epsilon"] == line["epsilon"]
    assert json.loads((out / "facts.json").read_text())["extractor"] == "phrases"
    assert stat.S_IMODE(work.stat().st_mode) == 0o700
    for canary in CANARIES:
        assert canary not in result.stdout + result.stderr
    retired = cli("contributor", "build", "--mode", "clusters", "--private", corpus,
                  "--epsilon", EPSILON, "--out", tmp_path / "c", check=False)  # fmt: skip
    assert retired.returncode == 2 and "--mode" in retired.stderr


def test_a_release_that_could_carry_nothing_changes_nothing_and_a_retry_runs(tmp_path):
    """Refused before the ledger is opened: no scope with the refused plan's cap is left
    behind to refuse the corrected retry (a second review's finding)."""
    corpus = _write_corpus(tmp_path / "corpus.jsonl", _private_rows())
    ledger, work = tmp_path / "ledger.sqlite", tmp_path / "work"
    tiny = FactConfig(epsilon=0.01, delta=DELTA, extractor="phrases")
    with pytest.raises(ValueError, match="records"):
        build_knowledge(corpus, tmp_path / "release", tiny, contributor="c", work=work,
                        ledger=str(ledger), answer_index=False)  # fmt: skip
    assert not ledger.exists() and not work.exists() and not (tmp_path / "release").exists()
    result = build_knowledge(corpus, tmp_path / "release", CONFIG, contributor="c", work=work,
                             ledger=str(ledger), answer_index=False)  # fmt: skip
    assert result.num_pairs > 0
    assert [s.epsilon_cap for s in PrivacyLedger(ledger).scopes()] == [EPSILON]
