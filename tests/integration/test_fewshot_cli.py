"""`synthgen generate-docs`, `generate-queries-fewshot`, `privacy fewshot` as a user runs them."""

import json

import cli_process
import pytest


def _synthgen(*args):
    return cli_process.command("synthgen", *args)


@pytest.fixture(scope="module")
def private_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("private") / "private.jsonl"
    rows = (
        [{"body": "abab abab", "topic": "x"}] * 60
        + [{"body": "cdcd cdcd", "topic": "y"}] * 60
        + [{"body": "efef efef", "topic": "secret-topic"}] * 3  # not in the public list
    )
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_privacy_fewshot_default_delta_is_a_tenth_of_one_over_n():
    # Tang et al. 2024, AGNews shape: N=30000, 20 examples per token, 100 tokens, sigma=0.51.
    # (Their delta = 1/N is refused here; tests/synthgen/test_fewshot.py checks their
    # epsilon ~= 0.965 at 1/N on the accountant itself.)
    from synthgen.privacy import accounting

    result = _synthgen("privacy", "fewshot", "--num-private", 30000, "--sample-size", 20,
                       "--tokens", 100, "--noise-multiplier", 0.51, "--json")  # fmt: skip
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    assert out["delta"] == pytest.approx(1 / 300000)
    assert out["epsilon"] == pytest.approx(
        accounting.fewshot_epsilon(1 / 300000, sampling_rate=20 / 30000, tokens=100,
                                   noise_multiplier=0.51), rel=1e-9)  # fmt: skip
    assert out["sampling_rate"] == pytest.approx(20 / 30000) and out["tokens"] == 100
    assert out["noise_multiplier"] == 0.51
    for delta in (1 / 30000, 1e-4):
        refused = _synthgen("privacy", "fewshot", "--num-private", 30000, "--sample-size", 20,
                            "--tokens", 100, "--noise-multiplier", 0.51,
                            "--delta", delta)  # fmt: skip
        assert refused.returncode == 1 and "delta must be in (0, 1/n)" in refused.stderr


def test_bad_input_is_one_line_before_compute(private_file, tmp_path):
    common = ("generate-docs", "--private", private_file, "--text-field", "body",
              "--label-field", "topic", "--labels", "x,y", "--num-examples", 2,
              "--public-pool-size", 50, "--model", "tiny",
              "--ledger", tmp_path / "l.sqlite")  # fmt: skip
    cases = [
        (("--epsilon", 0, "--out", tmp_path / "a"), "target_epsilon must be"),
        (("--epsilon", 4, "--subsets", 20, "--shots", 4, "--out", tmp_path / "b"),
         "public_pool_size must be >= subsets * shots"),
        (("--epsilon", 4, "--out", tmp_path / "c", "--mechanism", "laplace"), "mechanism"),
        (("--epsilon", 4, "--out", tmp_path / "e", "--labels", "x,z"),
         "label='z' is smaller than the declared public pool size"),
        # A real pool (60 rows) smaller than declared: refused, its size never shown.
        (("--epsilon", 4, "--out", tmp_path / "f", "--public-pool-size", 61),
         "label='x' is smaller than the declared public pool size"),
        (("--epsilon", 4, "--out", tmp_path / "g", "--delta", 1 / 100),
         "delta must be in (0, 1/n)"),
    ]  # fmt: skip
    for extra, message in cases:
        result = _synthgen(*common, *extra)
        usage = "--mechanism" in extra  # a value outside the option's choices: exit 2
        assert result.returncode == (2 if usage else 1), result.stderr
        assert result.stderr.count("\n") == 1, result.stderr
        assert message in result.stderr and "Traceback" not in result.stderr
        assert not any(n in result.stderr for n in ("60", "123", "secret"))
    result = _synthgen("generate-docs", "--private", private_file, "--text-field", "nope",
                       "--num-examples", 2, "--epsilon", 4, "--public-pool-size", 50,
                       "--out", tmp_path / "d")  # fmt: skip
    assert result.returncode == 1 and "lacks field" in result.stderr
    assert not any((tmp_path / d).exists() for d in "abcdefg")


def test_a_label_field_needs_a_public_label_list(private_file, tmp_path):
    result = _synthgen("generate-docs", "--private", private_file, "--text-field", "body",
                       "--label-field", "topic", "--num-examples", 2, "--epsilon", 4,
                       "--public-pool-size", 50, "--model", "tiny", "--out", tmp_path / "o",
                       "--ledger", tmp_path / "l.sqlite")  # fmt: skip
    assert result.returncode != 0 and "--labels" in result.stderr
    assert "secret" not in result.stderr and not (tmp_path / "o").exists()
    assert not (tmp_path / "l.sqlite").exists()


def test_generate_docs_end_to_end_with_the_tiny_lm(private_file, tmp_path):
    ledger = tmp_path / "ledger.sqlite"
    run = ("generate-docs", "--private", private_file, "--text-field", "body", "--label-field",
           "topic", "--labels", "x,y", "--public-pool-size", 50, "--num-examples", 4,
           "--epsilon", 8, "--subsets", 5, "--shots", 2, "--max-new-tokens", 8,
           "--model", "tiny", "--ledger", ledger, "--tenant", "acme",
           "--dataset", "private")  # fmt: skip
    result = _synthgen(*run, "--out", tmp_path / "docs", "--seed", 0)
    assert result.returncode == 0, result.stderr
    assert "warning: --seed" in result.stderr and "not for publication" in result.stderr
    bar = [s for s in result.stderr.replace("\r", "\n").splitlines() if "generate:" in s]
    assert bar and bar[-1].startswith("generate: 32/32 tokens")  # counts and epsilon only:
    assert not [s for s in bar if "/s" in s or "s/" in s or "00:" in s]  # no rate, no time
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert summary["num_examples"] == 4 and summary["epsilon"] <= 8
    assert summary["seeded"] is True and not any("second" in k for k in summary)
    rows = [json.loads(line) for line in (tmp_path / "docs" / "synthetic.jsonl").open()]
    assert [r["label"] for r in rows] == ["x", "y", "x", "y"]
    text = (tmp_path / "docs" / "metadata.json").read_text()
    meta = json.loads(text)
    assert meta["privacy"]["epsilon"] == pytest.approx(summary["epsilon"])
    assert meta["privacy"]["neighboring_relation"] == "ADD_OR_REMOVE_ONE"
    # Declared figures only: q = M * shots / declared, delta = 1/(10 x declared x pools).
    assert meta["privacy"]["sampling_rate"] == pytest.approx(10 / 50)
    assert meta["privacy"]["delta"] == pytest.approx(1 / (10 * 50 * 2))
    assert meta["privacy"]["public_pool_size"] == 50
    assert meta["randomness"]["seeded"] is True
    assert meta["privacy"]["rows_covered"] == "all rows of the private data"
    for private_figure in ("num_private", "smallest_pool", "second", "60", "123", "secret"):
        assert private_figure not in text
    shown = json.loads(_synthgen("ledger", "show", "--db", ledger, "--json").stdout)
    assert shown[0]["tenant"] == "acme" and shown[0]["charges"] == 1
    assert shown[0]["epsilon_spent"] == pytest.approx(summary["epsilon"], rel=1e-6)
    # The scope's cap is this run's epsilon: a second run is refused before any compute.
    again = _synthgen(*run, "--out", tmp_path / "again")
    assert again.returncode == 1 and "charge refused" in again.stderr
    assert not (tmp_path / "again").exists()
    # The same rows under another name: refused (the ledger knows the records), unless the
    # guarantees are meant to add up; then `ledger show` totals both names.
    renamed = [*run[: run.index("--dataset") + 1], "private-2"]
    refused = _synthgen(*renamed, "--out", tmp_path / "renamed")
    assert refused.returncode == 1 and "--guarantees-add-up" in refused.stderr
    assert "--dataset private" in refused.stderr and not (tmp_path / "renamed").exists()
    added = _synthgen(*renamed, "--out", tmp_path / "renamed", "--guarantees-add-up")
    assert added.returncode == 0, added.stderr
    shown = json.loads(_synthgen("ledger", "show", "--db", ledger, "--json").stdout)
    (group,) = [row for row in shown if "same_documents" in row]
    assert group["same_documents"] == ["private", "private-2"]
    assert group["epsilon_spent"] > summary["epsilon"]


def test_an_unseeded_limited_run_states_which_rows_are_covered(private_file, tmp_path):
    result = _synthgen(
        "generate-docs", "--private", private_file, "--text-field", "body", "--label-field",
        "topic", "--labels", "x", "--public-pool-size", 40, "--limit", 50, "--num-examples", 1,
        "--epsilon", 8, "--subsets", 4, "--shots", 2, "--max-new-tokens", 4, "--model", "tiny",
        "--out", tmp_path / "docs", "--ledger", tmp_path / "l.sqlite",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    # no seed warning; the one warning says this command created the ledger (issue 68)
    [warning] = [line for line in result.stderr.splitlines() if "warning" in line]
    assert warning.startswith("warning: created a new ledger at")
    meta = json.loads((tmp_path / "docs" / "metadata.json").read_text())
    assert meta["randomness"]["seeded"] is False
    covered = meta["privacy"]["rows_covered"]
    assert "--limit 50" in covered and "the guarantee covers the selected rows only" in covered


def test_generate_queries_fewshot_with_the_tiny_lm(tmp_path):
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text("".join(json.dumps({"document": f"doc {i}", "query": "abab"}) + "\n"
                             for i in range(50)))  # fmt: skip
    docs = tmp_path / "docs.jsonl"
    docs.write_text("".join(json.dumps({"doc_id": f"d{i}", "document": f"public {i}"}) + "\n"
                            for i in range(3)))  # fmt: skip
    common = ("generate-queries-fewshot", "--private", pairs, "--documents", docs, "--epsilon", 8,
              "--subsets", 4, "--shots", 2, "--max-new-tokens", 6, "--model", "tiny",
              "--ledger", tmp_path / "l.sqlite", "--seed", 0)  # fmt: skip
    small = _synthgen(*common, "--public-pool-size", 51, "--out", tmp_path / "n")
    assert small.returncode == 1 and "private dataset is smaller than the declared" in small.stderr
    assert "50" not in small.stderr and not (tmp_path / "n").exists()
    result = _synthgen(*common, "--public-pool-size", 40, "--out", tmp_path / "q")
    assert result.returncode == 0, result.stderr
    rows = [json.loads(line) for line in (tmp_path / "q" / "synthetic.jsonl").open()]
    assert [r["doc_id"] for r in rows] == ["d0", "d1", "d2"]
    assert all(set(r) == {"doc_id", "document", "query"} for r in rows)
    meta = json.loads((tmp_path / "q" / "metadata.json").read_text())
    assert meta["privacy"]["sampling_rate"] == pytest.approx(8 / 40)
    assert meta["privacy"]["delta"] == pytest.approx(1 / 400)
