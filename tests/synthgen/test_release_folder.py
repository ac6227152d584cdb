"""The released generator folder holds weights, configs, tokenizer and privacy metadata only:
no noise key, no sampler state, no checkpoint, no loss or timing of the private training."""

import json
import shutil
import sys
from pathlib import Path

import pytest

from dpsynth.config_files import querygen_preset
from synthgen import corpora, querygen
from synthgen.paths import default_work_dir
from synthgen.privacy.ledger import PrivacyLedger
from synthgen.privacy.ledger_types import Scope
from synthgen.work_folder import run_payer

sys.path.insert(0, str(Path(__file__).parent))
from release_audit import assert_clean_release, files_containing, needles, record_randomness  # noqa: E402, I001

N = 96
SEED = 0xC0FFEE + 2**70  # a fixed test seed with bits above 64


def _keys(value) -> set[str]:
    if isinstance(value, dict):
        return set(value) | set().union(*(_keys(v) for v in value.values()))
    if isinstance(value, list):
        return set().union(set(), *(_keys(v) for v in value))
    return set()


def test_default_work_dir_is_beside_the_ledger_and_stable(tmp_path):
    release = tmp_path / "releases" / "gen"
    work = default_work_dir(release, tmp_path / "private" / "ledger.sqlite")
    assert work.parent == (tmp_path / "private" / "work").resolve()
    assert work.name.startswith("gen-") and release.resolve() not in work.parents
    assert default_work_dir(release, tmp_path / "private" / "ledger.sqlite") == work
    assert default_work_dir(tmp_path / "other" / "gen", tmp_path / "private" / "l.sqlite") != work


@pytest.mark.slow
def test_a_finished_run_releases_no_secret_and_generates_from_the_release_alone(
    tmp_path, monkeypatch
):
    wiki = corpora.load_wiki_summaries(limit=N + 3)
    train, held_out = wiki.select(range(N)), wiki.select(range(N, N + 3))
    config = querygen_preset("tiny_t5").replace(dp_seed=SEED, dp_epochs=1, dp_batch_size=16)
    ledger = PrivacyLedger(tmp_path / "private" / "ledger.sqlite")
    ledger.open_scope(Scope("t", "wiki", 8.0, 1 / (2 * N)))
    release, work = tmp_path / "gen", tmp_path / "private" / "work" / "gen"
    seen = record_randomness(monkeypatch)
    pay = run_payer(ledger, ("t", "wiki"), out_dir=release, work_dir=work)
    kwargs = dict(pay=pay, progress=False)

    first = querygen.train_generator(config, train, release, stop_after=2, **kwargs)
    assert first.steps_run == 2 < first.plan.steps
    # Interrupted: the work folder keeps the resume state (and does hold the secrets, so
    # the search below can find them), the release is not written yet.
    assert (work / "checkpoints").is_dir() and (work / "charge.json").is_file()
    assert files_containing(work, needles(seen))
    assert not (release / querygen.GENERATOR_FILE).exists()

    result = querygen.train_generator(config, train, release, **kwargs)
    assert result.resumed_from == 2 and result.steps_run == result.plan.steps
    assert not work.exists()  # deleted once the release is written
    assert len(ledger.charges("t", "wiki")) == 1
    assert_clean_release(release, seen)
    assert files_containing(release, [str(SEED).encode(), hex(SEED).encode()]) == []
    record = json.loads((release / querygen.GENERATOR_FILE).read_text())
    keys = _keys(record)
    assert not keys & {"seconds", "train_seconds", "created_at", "losses", "nonfinite"}
    assert not any("loss" in k for k in keys)
    assert record["privacy"]["epsilon"] == pytest.approx(result.plan.epsilon)

    shipped = tmp_path / "shipped" / "generator"  # the release folder, alone
    shutil.copytree(release, shipped)
    shutil.rmtree(release)
    queries = querygen.generate_queries(shipped, held_out, tmp_path / "q", seed=0, progress=False)
    assert len(queries) == len(held_out) * config.queries_per_doc


@pytest.mark.slow
def test_keep_work_keeps_the_work_folder_outside_the_release(tmp_path):
    wiki = corpora.load_wiki_summaries(limit=N)
    config = querygen_preset("tiny_t5").replace(
        dp_seed=1, dp_epochs=0.2, dp_batch_size=16, dp_target_epsilon=None, dp_noise_multiplier=1
    )
    ledger = PrivacyLedger(tmp_path / "ledger.sqlite")
    ledger.open_scope(Scope("t", "wiki", 100.0, 1 / (2 * N)))
    result = querygen.train_generator(
        config, wiki, tmp_path / "gen", keep_work=True, progress=False,
        pay=run_payer(ledger, ("t", "wiki"), out_dir=tmp_path / "gen"),
    )  # fmt: skip
    work = default_work_dir(tmp_path / "gen", ledger.path)
    assert result.steps_run == result.plan.steps
    assert (work / "charge.json").is_file() and (work / "checkpoints").is_dir()
    assert work.stat().st_mode & 0o077 == 0  # owner only
    assert not (tmp_path / "gen" / "checkpoints").exists()


@pytest.mark.slow
def test_the_released_vocabulary_is_the_public_one_whatever_the_pairs(tmp_path):
    """A random-init base ships its vocabulary: it must not depend on which documents the
    private pairs name (a vocabulary trained on them published a piece of a document
    named by 32 of 96 pairs, telling the pairs apart with certainty)."""
    from synthgen.models.sentencepiece_tokenizer import train_sentencepiece
    from synthgen.paths import cache_dir

    wiki = corpora.load_wiki_summaries(limit=N)
    secret = "Zanzibar Quokka Xylophonist, a private record of the Quokka Xylophonist guild."
    pairs = wiki.map(lambda row, i: {"document": secret} if i % 3 == 0 else {}, with_indices=True)
    config = querygen_preset("tiny_t5").replace(
        dp_seed=1, dp_epochs=0.2, dp_batch_size=16, dp_target_epsilon=None, dp_noise_multiplier=1
    )
    release = tmp_path / "gen"
    querygen.train_generator(config, pairs, release, work_dir=tmp_path / "work", progress=False)
    public = train_sentencepiece(
        querygen.public_vocabulary_texts(),
        config.vocab_size,
        tmp_path / "public",
        cache=cache_dir() / querygen.VOCABULARY_CACHE,
    )
    shipped = (release / "tokenizer" / "spiece.vocab").read_text()
    assert shipped == (tmp_path / "public" / "spiece.vocab").read_text()
    assert public.encode(secret) == querygen.load_generator(release)[0].tokenizer.encode(secret)
    assert "Quokka" not in shipped and "Xylophon" not in shipped


def test_a_work_folder_inside_the_release_is_refused_before_anything_is_written(tmp_path):
    wiki = corpora.load_wiki_summaries(limit=N)
    config = querygen_preset("tiny_t5").replace(
        dp_batch_size=16, dp_target_epsilon=None, dp_noise_multiplier=1
    )
    for release, work in (
        (tmp_path / "gen", tmp_path / "gen" / "work"),
        (tmp_path / "w" / "gen", tmp_path / "w"),
    ):
        with pytest.raises(ValueError, match="must not overlap"):
            querygen.train_generator(config, wiki, release, work_dir=work, progress=False)
        assert not release.exists() and not work.exists()
