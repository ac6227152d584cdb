"""One-run canary audits of released text (issue 52, item 3): few-shot and Private Evolution.

Planted leaks reach near the statistical cap without noise, small epsilons stay within the
claim, the cell files hold no canary material, the coins are fair and never fix a declared
size, and bad input fails early."""

import json
import math
import os
import sys
from pathlib import Path

import numpy as np
import pytest

from synthgen import evolution, fewshot
from synthgen.audit import evolution_release_audit, fewshot_release_audit, release_audit
from synthgen.audit.coins import streams
from synthgen.lm_backends import TinyLM

sys.path.insert(0, str(Path(__file__).parent))
from copy_lm import CopyLM  # noqa: E402, I001 (tests/synthgen/audit/copy_lm.py)

M = 200  # canaries per audited run


def _consonant_words(n, seed):
    # Vowel-free words: none can occur by chance in a cell file's keys or labels.
    rng = np.random.default_rng(seed)
    return ["".join(rng.choice(list("bcdfghjklmnpqrstvwxz"), 7)) for _ in range(n)]


ORDINARY_WORDS = "the a river stone old mill runs past near under green hill quiet road".split()
PUBLIC = [" ".join(_consonant_words(800, 1))]  # the secrets' public word list


def _ordinary(n, seed=0):
    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(ORDINARY_WORDS, 8)) for _ in range(n)]


def _fewshot(epsilon, *, seed=3, canaries=M, num_texts=1000, **kw):
    return fewshot_release_audit.run_fewshot_power_cell(
        CopyLM(), epsilon=epsilon, canaries=canaries, private_texts=_ordinary(20),
        public_texts=PUBLIC, num_texts=num_texts, shots=1, shot_tokens=64, max_new_tokens=32,
        seed=seed, **kw,
    )  # fmt: skip


def _evolution(epsilon, *, seed=5, canaries=M, **kw):
    kw.setdefault("num_samples", 2 * (canaries + 40))
    kw.setdefault("public_texts", PUBLIC + _ordinary(600, seed=1))
    return evolution_release_audit.run_evolution_power_cell(
        epsilon=epsilon, canaries=canaries, private_texts=_ordinary(40), seed=seed, **kw
    )


def _material(seed, template, public=PUBLIC, canaries=M):
    """The canaries a seeded cell drew (the public material stream of its seed)."""
    material, _, _ = streams(seed)
    words = release_audit.secret_vocabulary(public)
    return release_audit.make_release_canaries(canaries, words, material, template=template)


@pytest.fixture(scope="module")
def fewshot_noise_off():
    return _fewshot(math.inf)


@pytest.fixture(scope="module")
def evolution_noise_off():
    return _evolution(math.inf)


# ---- scores ------------------------------------------------------------------------------


def test_secret_word_score_prefers_longer_runs_then_more_words():
    secret = ("alpha", "bravo", "charlie")
    score = lambda text: release_audit.secret_word_score(secret, release_audit.words_of(text))  # noqa: E731
    assert score("nothing here") == 0.0
    assert score("x alpha bravo charlie y") == pytest.approx(3 + 3 / 4)
    assert score("bravo charlie alpha") > score("charlie x bravo x alpha") > score("alpha")
    assert score("alpha x charlie") > score("alpha")  # same run, more words
    scores = release_audit.secret_word_scores([secret, ("delta", "echo")], ["alpha bravo", "echo"])
    np.testing.assert_allclose(scores, [2 + 2 / 4, 1 + 1 / 3])


def test_max_cosine_scores_find_an_identical_release():
    texts = ["Velkora Tumbris is known for ash", "Dobi Ramek is known for oak", "plain words"]
    emb = release_audit.word_embedding(texts)
    scores = release_audit.max_cosine_scores(emb, emb[[0, 2]])
    assert scores[0] == pytest.approx(1.0) and scores[2] == pytest.approx(1.0)
    assert scores[1] < 0.9


def test_canaries_are_distinct_outliers_with_the_template():
    drawn = _material(0, evolution_release_audit.EVOLUTION_CANARY)
    assert len(drawn) == M and len(set(drawn.texts)) == M
    names = {t.split(" is known for ")[0] for t in drawn.texts}
    assert len(names) == M  # one invented subject per canary
    for text, secret in zip(drawn.texts, drawn.secrets, strict=True):
        assert text.endswith(" ".join(secret) + ".") and len(set(secret)) == 3


# ---- few-shot -------------------------------------------------------------------------------


def test_fewshot_planted_leak_reaches_near_the_cap(fewshot_noise_off):
    r = fewshot_noise_off
    s = r.primary
    assert r.claimed_epsilon == math.inf and not r.violation
    assert r.num_in + r.num_out == M and r.public_pool_size == 20 + M
    # The copy model releases the secret of a canary its one-shot prompt holds: most
    # included canaries are found whole, no excluded one is (its words are in no prompt).
    assert r.full_secret_out == 0 and r.full_secret_in >= 0.8 * r.num_in
    assert s.auroc > 0.9 and s.tpr_at_1pct_fpr > 0.8
    assert s.epsilon_one_run >= 0.85 * r.cap_one_run
    assert s.epsilon_one_run_fdp >= 0.85 * r.cap_fdp


def test_fewshot_small_epsilon_stays_within_its_claim():
    r = _fewshot(0.5, num_texts=100)
    assert 0 < r.claimed_epsilon <= 0.5 + 1e-9 and r.noise_multiplier > 1
    s = r.primary
    assert s.epsilon_one_run <= r.claimed_epsilon and s.epsilon_one_run_fdp <= r.claimed_epsilon
    assert not r.violation and r.full_secret_in == 0


def test_fewshot_declared_sizes_do_not_depend_on_the_coins(monkeypatch):
    seen = []

    def fake_generate(lm, rows, targets, template, config, *, rng, plan, on_token=None):
        seen.append((config, plan, len(rows)))
        return fewshot.FewShotResult([""] * len(targets), plan, 0)

    monkeypatch.setattr(fewshot_release_audit.fewshot, "generate", fake_generate)
    results = [_fewshot(2.0, seed=seed, num_texts=50) for seed in (1, 2)]
    (config_a, plan_a, rows_a), (config_b, plan_b, rows_b) = seen
    assert rows_a - results[0].num_in == rows_b - results[1].num_in == 20
    assert results[0].num_in != results[1].num_in  # the coins differ ...
    assert config_a == config_b and plan_a == plan_b  # ... the declared figures do not
    assert config_a.public_pool_size == 20 + M and results[0].claimed_epsilon == plan_a.epsilon


def test_fewshot_cells_resume_and_hold_no_canary_material(tmp_path, monkeypatch):
    work = tmp_path / "private"
    logs = []
    kw = dict(
        private_texts=_ordinary(20), public_texts=PUBLIC, num_texts=300, shots=1, shot_tokens=64
    )
    first = fewshot_release_audit.run_fewshot_power_cells(
        tmp_path / "out", CopyLM(), [math.inf], label="copy", canaries=M, seed=7,
        work_dir=work, log=logs.append, max_new_tokens=32, **kw,
    )  # fmt: skip
    (path,) = (tmp_path / "out").iterdir()
    assert path.name == f"fewshot_power_copy_m{M}_epsinf.json"
    text = path.read_text()
    drawn = _material(7, fewshot_release_audit.FEWSHOT_CANARY)
    assert first[0].full_secret_in > 0  # texts that hold secrets exist ...
    for canary, secret in zip(drawn.texts, drawn.secrets, strict=True):
        assert canary not in text and not any(w in text for w in secret)  # ... not here
    assert not {"coins", "scores", "texts", "released"} & set(json.loads(text))
    # The coins, scores and texts went to the private folder only, mode 0700.
    assert os.stat(work).st_mode & 0o777 == 0o700
    private = np.load(work / "fewshot_epsinf.npz")
    assert private["coins"].sum() == first[0].num_in
    # Read back, not re-run.
    monkeypatch.setattr(fewshot_release_audit, "run_fewshot_power_cell", lambda *a, **k: 1 / 0)
    kw["max_new_tokens"] = 32
    again = fewshot_release_audit.run_fewshot_power_cells(
        tmp_path / "out", CopyLM(), [math.inf], label="copy", canaries=M, log=logs.append, **kw
    )
    assert again == first and logs[-1].endswith("exists, skipped")
    assert json.loads(text)["violation"] is False
    # A file made with other settings is refused, not reused.
    with pytest.raises(ValueError, match="num_texts: file 300 != asked 301"):
        fewshot_release_audit.run_fewshot_power_cells(
            tmp_path / "out", CopyLM(), [math.inf], label="copy", canaries=M,
            **{**kw, "num_texts": 301},
        )  # fmt: skip
    with pytest.raises(ValueError, match="max_new_tokens: file 32 != asked 10"):  # a default
        fewshot_release_audit.run_fewshot_power_cells(
            tmp_path / "out", CopyLM(), [math.inf], label="copy", canaries=M,
            **{**kw, "max_new_tokens": 10},
        )  # fmt: skip


# ---- Private Evolution ------------------------------------------------------------------


def test_evolution_planted_leak_reaches_near_the_cap(evolution_noise_off):
    r = evolution_noise_off
    s = r.primary
    assert r.claimed_epsilon == math.inf and not r.violation
    assert r.public_size == 40 + M and r.population == r.num_samples == 2 * (M + 40)
    # Noise off, an included canary's bait holds its vote; the release draws 2x the votes.
    assert r.bait_out == 0 and r.bait_in >= 0.8 * r.num_in
    assert s.auroc > 0.9
    assert s.epsilon_one_run >= 0.85 * r.cap_one_run
    assert s.epsilon_one_run_fdp >= 0.85 * r.cap_fdp


def test_evolution_small_epsilon_stays_within_its_claim():
    r = _evolution(0.5)
    assert 0 < r.claimed_epsilon <= 0.5 + 1e-9 and r.noise_multiplier > 1
    s = r.primary
    assert s.epsilon_one_run <= r.claimed_epsilon and s.epsilon_one_run_fdp <= r.claimed_epsilon
    assert not r.violation


def test_evolution_with_variations_stays_separable_without_noise():
    # T = 2: the LM (the byte copy model, public prompts only) rewrites the drawn samples.
    # The kept baits carry the signal through; variations of them add little.
    sampler = evolution.NextTokenSampler(TinyLM(), max_new_tokens=16, batch_size=64)
    r = _evolution(math.inf, canaries=100, iterations=2, num_samples=None, sampler=sampler)
    assert r.iterations == 2 and r.samples_generated > 0
    assert r.primary.auroc > 0.7 and r.bait_in > r.bait_out


def test_evolution_declared_sizes_do_not_depend_on_the_coins(monkeypatch):
    seen = []

    def fake_evolve(sampler, embed, private, config, *, rng, initial, plan, progress):
        seen.append((config, plan, list(initial), len(private)))
        return evolution.EvolutionResult(list(initial[:5]), [""] * 5, plan, [1.0], 0, 0.0)

    monkeypatch.setattr(evolution_release_audit.evolution, "evolve", fake_evolve)
    results = [_evolution(2.0, seed=seed) for seed in (1, 2)]
    (config_a, plan_a, initial_a, n_a), (config_b, plan_b, initial_b, n_b) = seen
    assert n_a - results[0].num_in == n_b - results[1].num_in == 40
    assert results[0].num_in != results[1].num_in
    assert config_a == config_b and plan_a == plan_b and config_a.public_size == 40 + M
    assert len(initial_a) == len(initial_b) == config_a.population


def test_evolution_result_holds_no_canary_material(evolution_noise_off):
    text = json.dumps(evolution_noise_off.to_dict())
    drawn = _material(5, evolution_release_audit.EVOLUTION_CANARY)
    for canary, secret in zip(drawn.texts, drawn.secrets, strict=True):
        name = canary.split(" is known for ")[0]
        assert name not in text and not any(w in text for w in secret)
    back = evolution_release_audit.EvolutionPowerResult.from_dict(json.loads(text))
    assert back == evolution_noise_off


# ---- coins and errors ---------------------------------------------------------------------


def test_coins_are_fair():
    nums = [r.num_in for r in (_fewshot(math.inf, seed=s, num_texts=5) for s in range(4))]
    # Each num_in ~ Binomial(200, 1/2): within 4 standard deviations (sd ~ 7.1) of 100.
    assert all(abs(n - M / 2) < 4 * math.sqrt(M) / 2 for n in nums)
    coins = np.concatenate([streams(s)[1].random(1000) < 0.5 for s in range(20)])
    assert abs(coins.mean() - 0.5) < 0.02


@pytest.mark.parametrize(
    "kw, match",
    [
        (dict(canaries=1), "canaries"),
        (dict(epsilon=0.0), "epsilon"),
        (dict(epsilon=float("nan")), "epsilon"),
        (dict(significance=0.6), "significance"),
        (dict(num_texts=0), "num_texts"),
        (dict(delta=0.01), "delta"),
        (dict(template=fewshot.DOCUMENT_TEMPLATE), "template"),
        (dict(canary_template="no secret here"), "secret"),
    ],
)
def test_fewshot_refuses_bad_input(kw, match):
    args = dict(epsilon=math.inf, canaries=M, private_texts=_ordinary(20), public_texts=PUBLIC)
    with pytest.raises(ValueError, match=match):
        fewshot_release_audit.run_fewshot_power_cell(CopyLM(), **{**args, **kw})


@pytest.mark.parametrize(
    "kw, match",
    [
        (dict(iterations=2), "sampler"),
        (dict(canary_template="{secret} only"), "name"),
        (dict(num_samples=0), "num_samples"),
        (dict(epsilon=-1.0), "epsilon"),
        (dict(fillers=10_000), "public documents"),
    ],
)
def test_evolution_refuses_bad_input(kw, match):
    args = dict(epsilon=math.inf, canaries=M, private_texts=_ordinary(40), public_texts=PUBLIC)
    with pytest.raises(ValueError, match=match):
        evolution_release_audit.run_evolution_power_cell(**{**args, **kw})


def test_cell_labels_must_be_file_name_safe(tmp_path):
    with pytest.raises(ValueError, match="label"):
        release_audit.run_cells(tmp_path, "k", "a/b", [1.0], 2, None, object)


def test_evolution_run_without_its_noise_is_flagged_as_a_violation(monkeypatch):
    """A finite claim whose run draws no noise (a planted defect): the bound exceeds the
    claim and the cell reports a violation, so a broken mechanism cannot pass quietly."""
    from synthgen.evolution import generation

    real_histogram = generation.dp_nn_histogram

    def noiseless(counts, *, noise_multiplier, threshold, **kw):
        off = release_audit.NOISE_OFF  # below the plan's check: the noise draw itself
        scaled = threshold * off / noise_multiplier
        return real_histogram(counts, noise_multiplier=off, threshold=scaled, **kw)

    monkeypatch.setattr(generation, "dp_nn_histogram", noiseless)
    r = _evolution(0.5)
    assert 0 < r.claimed_epsilon <= 0.5 + 1e-9
    assert r.primary.epsilon_one_run > r.claimed_epsilon and r.violation
