"""`retriever privacy rag` and `retriever answer` as a user runs them."""

import json
import math
import subprocess
import sys

import pytest

from synthgen.privacy import PrivacyLedger


def _run(*args):
    return subprocess.run([sys.executable, "-m", *map(str, args)], capture_output=True, text=True)


def test_privacy_rag_calculator():
    out = {}
    for composition in ("pure", "bounded-range"):
        result = _run(
            "retriever.cli", "privacy", "rag", "--tokens", "32", "--delta", "1e-6",
            "--target-epsilon", "5", "--composition", composition, "--json",
        )  # fmt: skip
        assert result.returncode == 0, result.stderr
        out[composition] = json.loads(result.stdout)
        assert {"token_epsilon", "epsilon", "delta"} <= set(out[composition])
        assert 4.99 <= out[composition]["epsilon"] <= 5.0
    # 32 pure tokens at delta 1e-6: PLD bisection (Grislain 2024); bounded range is tighter
    assert out["pure"]["token_epsilon"] == pytest.approx(0.1936, abs=5e-4)
    assert out["bounded-range"]["token_epsilon"] > out["pure"]["token_epsilon"]


def test_privacy_rag_prints_the_vote_release_threshold():
    """An operator sees, from public parameters, when vote cannot release anything."""
    thresholds = {}
    for eps in ("1", "10"):
        result = _run(
            "retriever.cli", "privacy", "rag", "--tokens", "5", "--delta", "1e-6",
            "--target-epsilon", eps, "--mechanism", "vote", "--voters", "64", "--json",
        )  # fmt: skip
        assert result.returncode == 0, result.stderr
        plan = json.loads(result.stdout)
        assert plan["mechanism"] == "vote" and plan["voters"] == 64
        assert plan["epsilon"] <= float(eps)
        # the noise-free LimitedDomain threshold of the plan's per-vote parameters
        e, d = (
            plan["token_epsilon"] / 2,
            plan["token_delta"] / (1 + math.exp(plan["token_epsilon"] / 2)),
        )
        assert plan["limited_domain_threshold"] == pytest.approx(1 + math.log(1 / d) / e)
        thresholds[eps] = plan
    assert thresholds["10"]["release_possible"] and not thresholds["1"]["release_possible"]
    sparse = _run(
        "retriever.cli", "privacy", "rag", "--tokens", "5", "--delta", "1e-6",
        "--target-epsilon", "10", "--mechanism", "sparse-vote", "--voters", "64", "--json",
    )  # fmt: skip
    assert sparse.returncode == 0, sparse.stderr
    assert json.loads(sparse.stdout)["gate_threshold"] == 32


@pytest.mark.slow
def test_answer_charges_then_refuses(tmp_path):
    data, index, ledger = tmp_path / "world", tmp_path / "index", tmp_path / "ledger.sqlite"
    made = _run(
        "retriever.rag.medical", "--out", data, "--num-records", "40", "--num-diseases", "5"
    )
    assert made.returncode == 0, made.stderr
    corpus = data / "corpus.jsonl"
    built = _run("retriever.cli", "index", "build", "--corpus", corpus, "--out", index,
                 "--kind", "exact")  # fmt: skip
    assert built.returncode == 0, built.stderr
    question = json.loads((data / "questions.jsonl").read_text().splitlines()[0])["question"]
    common = ["--index", index, "--private-corpus", corpus, "--question", question,
              "--ledger", ledger, "--tenant", "alice", "--tenant-epsilon", "3",
              "--k", "4", "--max-tokens", "3", "--min-score", "0.2"]  # fmt: skip
    first = _run("retriever.cli", "answer", *common, "--epsilon", "2", "--json")
    assert first.returncode == 0, first.stderr
    answer = json.loads(first.stdout.strip().splitlines()[-1])
    assert {"text", "charges", "epsilon", "remaining_epsilon"} <= set(answer)
    assert [c["stage"] for c in answer["charges"]] == ["retrieval", "tokens"]
    assert answer["epsilon"] <= 2.0 and answer["remaining_epsilon"] < 1.1
    book = PrivacyLedger(ledger)
    before = book.charges("alice", "corpus")
    assert [c.stage for c in before] == ["rag-retrieval", "rag-tokens"]

    second = _run("retriever.cli", "answer", *common, "--epsilon", "2")
    assert second.returncode == 1
    assert second.stderr.startswith("error:") and len(second.stderr.strip().splitlines()) == 1
    assert question not in second.stderr  # nothing private in the error
    assert book.charges("alice", "corpus") == before
