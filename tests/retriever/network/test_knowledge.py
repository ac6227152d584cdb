"""`build_knowledge` and `retriever contributor build`: a contributor's DP release (tiny LM).

The release folder must hold no private text (canaries, doc_ids, sentences), the private
work folder must stay apart (mode 0700), the card must state what the ledger was charged,
and the ledger must refuse a second release of the same collection.
"""

from __future__ import annotations

import functools
import json
import stat
from pathlib import Path

import pytest

from retriever.network.folder import read_card, read_private_record
from retriever.network.knowledge import RELEASE_TENANT, build_knowledge, summary
from synthgen.knowledge import KnowledgeConfig, release
from synthgen.privacy import BudgetExceededError, PrivacyLedger
from tests.retriever.service.harness import cli

EPSILON, DELTA = 8.0, 1e-5  # keywords of 30 records pass PipelineDP's threshold
CONFIG = KnowledgeConfig(
    epsilon=EPSILON, delta=DELTA, voters=4, public_pool_size=8, max_clusters=8,
    keyword_share=0.4,
)  # fmt: skip
SEED = 1
SLOW_BUILD = pytest.mark.slow  # the shared build takes ~20 s: planning, two indexes

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


@pytest.fixture(scope="module", autouse=True)
def _plan_once():
    # plan_release is a deterministic function of its frozen, public config and takes
    # seconds; builds of one config in this process share its plan.
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(release, "plan_release", functools.cache(release.plan_release))
        yield


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    root = tmp_path_factory.mktemp("knowledge")
    rows = _private_rows()
    corpus = _write_corpus(root / "private" / "corpus.jsonl", rows)
    result = build_knowledge(
        corpus, root / "release", CONFIG, contributor="north", work=root / "work",
        lm="tiny", seed=SEED, progress=False,
    )  # fmt: skip
    return {"root": root, "rows": rows, "corpus": corpus, "result": result}


@SLOW_BUILD
def test_release_folder_holds_no_private_text(built):
    result, rows = built["result"], built["rows"]
    release = result.folder.path
    assert result.num_documents > 0 and result.num_topics > 0  # something was released
    files = _snapshot(release)
    assert {"card.json", "synthetic.jsonl", "metadata.json", "index/index.json"} <= set(files)
    assert all(name.split("/")[0] in {"card.json", "synthetic.jsonl", "metadata.json", "index"}
               for name in files)  # fmt: skip
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
    assert {row["topic"] for row in synthetic} <= set(
        json.loads((release / "metadata.json").read_text())["generation"]["keywords"]
    )


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
    assert guarantee["epsilon"] <= EPSILON and guarantee["delta"] == DELTA
    assert guarantee["seeded"] is True
    assert [s["stage"] for s in guarantee["stages"]] == [
        "keywords", "cluster-keywords", "generation"
    ]  # fmt: skip
    ledger = PrivacyLedger(result.work / "ledger.sqlite")
    charges = ledger.charges(RELEASE_TENANT, "corpus")
    assert [c.stage for c in charges] == ["knowledge-release"]  # one charge, all stages
    spent = ledger.spent(RELEASE_TENANT, "corpus")
    assert guarantee["epsilon"] == pytest.approx(spent.epsilon, rel=1e-4)
    assert card["releases"]["synthetic_documents"] == result.num_documents
    line = json.loads(summary(result))
    assert line["synthetic_records"] == result.num_documents
    assert line["clusters"] == result.num_topics
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
            build_knowledge(built["corpus"], out, CONFIG, contributor="north", work=work,
                            lm="tiny", seed=SEED + 1, progress=False)  # fmt: skip
    assert _snapshot(release) == before
    assert not (root / "second-release").exists()
    assert PrivacyLedger(work / "ledger.sqlite").charges(RELEASE_TENANT, "corpus") == charges


def test_work_folder_inside_the_release_is_refused(tmp_path):
    corpus = _write_corpus(tmp_path / "corpus.jsonl", _private_rows()[:5])
    out = tmp_path / "release"
    for work in (out / "private", out, out / "a" / "b"):
        with pytest.raises(ValueError, match="must not be inside the release"):
            build_knowledge(corpus, out, CONFIG, contributor="c", work=work, lm="tiny",
                            seed=0, progress=False)  # fmt: skip
    assert not out.exists()


def test_an_empty_corpus_is_refused(tmp_path):
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("")
    with pytest.raises(ValueError):
        build_knowledge(corpus, tmp_path / "out", CONFIG, contributor="c",
                        work=tmp_path / "work", lm="tiny", seed=0, progress=False)  # fmt: skip
    assert not (tmp_path / "out").exists()


def test_an_empty_release_has_no_documents_and_no_index(tmp_path):
    corpus = _write_corpus(tmp_path / "corpus.jsonl", _private_rows())
    config = KnowledgeConfig(epsilon=0.05, delta=DELTA, voters=4, public_pool_size=8)
    result = build_knowledge(corpus, tmp_path / "release", config, contributor="c",
                             work=tmp_path / "work", lm="tiny", seed=0, progress=False,
                             answer_index=False)  # fmt: skip
    release = result.folder.path
    assert (release / "synthetic.jsonl").read_text() == ""
    assert not (release / "index").exists()
    card = read_card(release)
    assert card["releases"]["synthetic_documents"] == 0
    assert (result.num_documents, result.num_topics) == (0, 0)
    assert card["guarantee"]["epsilon"] <= 0.05
    charges = PrivacyLedger(result.work / "ledger.sqlite").charges(RELEASE_TENANT, "corpus")
    assert [c.stage for c in charges] == ["knowledge-release"]  # paid before any noise
    assert read_private_record(result.work)["private_index"] is None


@pytest.mark.slow
def test_cli_build_prints_one_json_line(tmp_path):
    corpus = _write_corpus(tmp_path / "corpus.jsonl", _private_rows())
    out, work = tmp_path / "release", tmp_path / "work"
    result = cli("contributor", "build", "--mode", "clusters", "--private", corpus,
                 "--epsilon", EPSILON, "--out", out, "--work", work, "--lm", "tiny", "--seed", 1,
                 "--voters", 4, "--public-pool-size", 8, "--max-clusters", 8,
                 "--keyword-share", 0.4)  # fmt: skip
    lines = result.stdout.strip().splitlines()
    assert len(lines) == 1
    line = json.loads(lines[0])
    assert {"synthetic_records", "clusters", "epsilon", "delta"} <= set(line)
    assert line["synthetic_records"] > 0 and line["clusters"] > 0
    assert line["epsilon"] <= EPSILON and line["delta"] == 1e-5
    assert line["synthetic_records"] == len((out / "synthetic.jsonl").read_text().splitlines())
    assert read_card(out)["guarantee"]["epsilon"] == line["epsilon"]
    assert stat.S_IMODE(work.stat().st_mode) == 0o700
    assert "for tests only" in result.stderr  # the seed warning
    for canary in CANARIES:
        assert canary not in result.stdout + result.stderr
