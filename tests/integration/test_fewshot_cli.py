"""`synthgen generate-docs`, `generate-queries-fewshot`, `privacy fewshot` as a user runs them."""

import json
import subprocess
import sys

import pytest


def _synthgen(*args):
    return subprocess.run(
        [sys.executable, "-m", "synthgen.cli", *map(str, args)], capture_output=True, text=True
    )


@pytest.fixture(scope="module")
def private_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("private") / "private.jsonl"
    rows = [{"body": "abab abab", "topic": "x"}] * 60 + [{"body": "cdcd cdcd", "topic": "y"}] * 60
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_privacy_fewshot_tang_check():
    # Tang et al. 2024, AGNews: N=30000, 20 examples per token, 100 tokens, sigma=0.51,
    # delta=1/N (default) -> epsilon ~= 0.965.
    result = _synthgen("privacy", "fewshot", "--num-private", 30000, "--sample-size", 20,
                       "--tokens", 100, "--noise-multiplier", 0.51, "--json")  # fmt: skip
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    assert out["epsilon"] == pytest.approx(0.965, abs=2e-3)
    assert out["delta"] == pytest.approx(1 / 30000)
    assert out["sampling_rate"] == pytest.approx(20 / 30000) and out["tokens"] == 100
    assert out["noise_multiplier"] == 0.51


def test_bad_input_is_one_line_before_compute(private_file, tmp_path):
    common = ("generate-docs", "--private", private_file, "--text-field", "body",
              "--label-field", "topic", "--labels", "x,y", "--num-examples", 2,
              "--model", "tiny", "--ledger", tmp_path / "l.sqlite")  # fmt: skip
    cases = [
        (("--epsilon", 0, "--out", tmp_path / "a"), "target_epsilon must be"),
        (("--epsilon", 4, "--subsets", 20, "--shots", 4, "--out", tmp_path / "b"), "fewer than"),
        (("--epsilon", 4, "--out", tmp_path / "c", "--mechanism", "laplace"), "mechanism"),
        (("--epsilon", 4, "--out", tmp_path / "e", "--labels", "x,z"), "no private examples"),
    ]
    for extra, message in cases:
        result = _synthgen(*common, *extra)
        assert result.returncode == 1 and result.stderr.count("\n") == 1, result.stderr
        assert message in result.stderr and "Traceback" not in result.stderr
    result = _synthgen("generate-docs", "--private", private_file, "--text-field", "nope",
                       "--num-examples", 2, "--epsilon", 4, "--out", tmp_path / "d")  # fmt: skip
    assert result.returncode == 1 and "lacks field" in result.stderr
    assert not any((tmp_path / d).exists() for d in "abcde")


def test_generate_docs_end_to_end_with_the_tiny_lm(private_file, tmp_path):
    ledger = tmp_path / "ledger.sqlite"
    result = _synthgen(
        "generate-docs", "--private", private_file, "--text-field", "body", "--label-field",
        "topic", "--num-examples", 4, "--epsilon", 8, "--subsets", 5, "--shots", 2,
        "--max-new-tokens", 8, "--model", "tiny", "--out", tmp_path / "docs", "--ledger", ledger,
        "--tenant", "acme", "--dataset", "private", "--seed", 0,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert summary["num_examples"] == 4 and summary["epsilon"] <= 8
    rows = [json.loads(line) for line in (tmp_path / "docs" / "synthetic.jsonl").open()]
    assert [r["label"] for r in rows] == ["x", "y", "x", "y"]
    meta = json.loads((tmp_path / "docs" / "metadata.json").read_text())
    assert meta["privacy"]["epsilon"] == pytest.approx(summary["epsilon"])
    assert meta["privacy"]["neighboring_relation"] == "ADD_OR_REMOVE_ONE"
    assert meta["privacy"]["sampling_rate"] == pytest.approx(10 / 60)
    shown = json.loads(_synthgen("ledger", "show", "--db", ledger, "--json").stdout)
    assert shown[0]["tenant"] == "acme" and shown[0]["charges"] == 1
    assert shown[0]["epsilon_spent"] == pytest.approx(summary["epsilon"], rel=1e-6)
    # The scope's cap is this run's epsilon: a second run is refused before any compute.
    again = _synthgen(
        "generate-docs", "--private", private_file, "--text-field", "body", "--label-field",
        "topic", "--num-examples", 4, "--epsilon", 8, "--subsets", 5, "--shots", 2,
        "--max-new-tokens", 8, "--model", "tiny", "--out", tmp_path / "again", "--ledger", ledger,
        "--tenant", "acme", "--dataset", "private",
    )  # fmt: skip
    assert again.returncode == 1 and "charge refused" in again.stderr
    assert not (tmp_path / "again").exists()


def test_generate_queries_fewshot_with_the_tiny_lm(tmp_path):
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text("".join(json.dumps({"document": f"doc {i}", "query": "abab"}) + "\n"
                             for i in range(50)))  # fmt: skip
    docs = tmp_path / "docs.jsonl"
    docs.write_text("".join(json.dumps({"doc_id": f"d{i}", "document": f"public {i}"}) + "\n"
                            for i in range(3)))  # fmt: skip
    result = _synthgen(
        "generate-queries-fewshot", "--private", pairs, "--documents", docs, "--epsilon", 8,
        "--subsets", 4, "--shots", 2, "--max-new-tokens", 6, "--model", "tiny",
        "--out", tmp_path / "q", "--ledger", tmp_path / "l.sqlite", "--seed", 0,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    rows = [json.loads(line) for line in (tmp_path / "q" / "synthetic.jsonl").open()]
    assert [r["doc_id"] for r in rows] == ["d0", "d1", "d2"]
    assert all(set(r) == {"doc_id", "document", "query"} for r in rows)
