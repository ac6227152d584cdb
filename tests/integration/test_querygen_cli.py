"""`synthgen train-generator` / `generate-queries` as a user runs them: JSONL in, JSON out."""

import json

import cli_process
import pytest

from dpsynth.cli.synthgen.common import SEED_WARNING
from dpsynth.config_files import querygen_preset
from synthgen import corpora, querygen


def _synthgen(*args, cwd=None):
    return cli_process.command("synthgen", *args, cwd=cwd)


@pytest.fixture(scope="module")
def pairs_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("pairs") / "pairs.jsonl"
    corpora.load_wiki_summaries(limit=120).to_json(path, lines=True)
    return path


def test_bad_input_is_one_line_before_compute(pairs_file, tmp_path):
    common = ("train-generator", "--pairs", pairs_file, "--ledger", tmp_path / "l.sqlite")
    result = _synthgen(*common, "--out", tmp_path / "a", "--epsilon", "0")
    assert result.returncode == 1 and result.stderr.count("\n") == 1
    assert "target_epsilon must be > 0" in result.stderr
    result = _synthgen(*common, "--out", tmp_path / "b", "--delta", "0.1")
    assert result.returncode == 1 and "delta must be in" in result.stderr
    result = _synthgen(*common, "--out", tmp_path / "c", "--query-field", "nope")
    assert result.returncode == 1 and "lacks field" in result.stderr
    assert "Traceback" not in result.stderr
    result = _synthgen(*common, "--out", tmp_path / "d", "--work-dir", tmp_path / "d" / "w")
    assert result.returncode == 2 and "must not overlap" in result.stderr
    assert not any((tmp_path / d).exists() for d in "abcd")
    assert not (tmp_path / "work").exists()  # no work folder either
    assert not (tmp_path / "l.sqlite").exists()  # nor a ledger: refused before admission


def test_train_generator_documents_its_secret_work_folder():
    result = _synthgen("train-generator", "--help")
    assert result.returncode == 0
    assert "--work-dir" in result.stdout and "--keep-work" in result.stdout
    assert "SECRET" in result.stdout


@pytest.mark.slow
def test_a_seeded_generator_is_warned_and_marked_in_its_release(pairs_file, tmp_path):
    """--seed replays the DP-SGD noise: the run warns, and the generator release and every
    query set drawn from it say so (as the few-shot, PE and contributor releases do)."""
    result = _synthgen(
        "train-generator", "--pairs", pairs_file, "--limit", "48", "--config", "tiny_t5",
        "--noise-multiplier", "2", "--epochs", "0.2", "--batch-size", "8",
        "--out", tmp_path / "gen", "--ledger", tmp_path / "l.sqlite", "--seed", "5",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert SEED_WARNING in result.stderr
    assert json.loads(result.stdout.strip().splitlines()[-1])["seeded"] is True
    record = json.loads((tmp_path / "gen" / querygen.GENERATOR_FILE).read_text())
    assert record["randomness"] == {"seeded": True, "note": querygen.SEEDED_NOTE}
    assert record["generator_config"]["dp"]["seed"] is None  # the seed itself stays out

    result = _synthgen(
        "generate-queries", "--generator", tmp_path / "gen", "--documents", pairs_file,
        "--limit", "2", "--k", "1", "--out", tmp_path / "q",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    metadata = json.loads((tmp_path / "q" / "metadata.json").read_text())
    assert metadata["randomness"]["seeded"] is True


def test_an_unseeded_generator_release_says_os_entropy():
    config = querygen_preset("tiny_t5")
    assert config.dp.seed is None
    assert querygen._randomness(config) == {"seeded": False, "note": "OS entropy"}
    assert querygen._randomness(config.replace(dp_seed=0))["seeded"] is True


@pytest.mark.slow
def test_train_then_generate_through_the_cli(pairs_file, tmp_path):
    ledger = tmp_path / "ledger.sqlite"
    result = _synthgen(
        "train-generator", "--pairs", pairs_file, "--config", "tiny_t5", "--epsilon", "4",
        "--epochs", "1", "--batch-size", "16", "--out", tmp_path / "gen", "--ledger", ledger,
        "--tenant", "acme", "--dataset", "wiki", "--seed", "0",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert summary["epsilon"] <= 4 and summary["delta"] == 1 / 240
    # Statistics of the private training (loss, timing) are not printed: they are not DP.
    assert not any("loss" in k or "seconds" in k for k in summary), summary
    # The release holds the generator only; the secret work folder (beside the ledger) is
    # gone once the release is written.
    assert not (tmp_path / "gen" / "checkpoints").exists() and "work_dir" not in summary
    assert not any((tmp_path / "work").glob("*"))
    shown = json.loads(_synthgen("ledger", "show", "--db", ledger, "--json").stdout)
    assert shown[0]["tenant"] == "acme" and shown[0]["charges"] == 1
    assert shown[0]["epsilon_spent"] == pytest.approx(summary["epsilon"], rel=1e-6)

    result = _synthgen(
        "generate-queries", "--generator", tmp_path / "gen", "--documents", pairs_file,
        "--limit", "3", "--k", "2", "--out", tmp_path / "q", "--seed", "0",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout.strip().splitlines()[-1])
    assert out["num_queries"] == 6 and out["epsilon"] == summary["epsilon"]
    rows = [json.loads(line) for line in (tmp_path / "q" / "queries.jsonl").open()]
    assert [r["doc_id"] for r in rows] == ["wiki-00000"] * 2 + ["wiki-00001"] * 2 + [
        "wiki-00002"
    ] * 2
    # A second run in the same scope would exceed its cap (opened at the first run's
    # epsilon): refused, one line, nothing recorded.
    result = _synthgen(
        "train-generator", "--pairs", pairs_file, "--config", "tiny_t5", "--epsilon", "4",
        "--epochs", "1", "--batch-size", "16", "--out", tmp_path / "gen2", "--ledger", ledger,
        "--tenant", "acme", "--dataset", "wiki", "--seed", "1",
    )  # fmt: skip
    assert result.returncode == 1 and "charge refused" in result.stderr
    assert not (tmp_path / "gen2").exists()  # refused before any work
    shown = json.loads(_synthgen("ledger", "show", "--db", ledger, "--json").stdout)
    assert shown[0]["charges"] == 1
