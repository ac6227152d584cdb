"""Canary audit of DP few-shot generation with a tiny copying LM: the non-private aggregate
exposes and releases a repeated canary, a small epsilon does not, and the record is secret-free."""

import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from synthgen import fewshot
from synthgen.audit import canaries, fewshot_audit, report

sys.path.insert(0, str(Path(__file__).parent))
from copy_lm import CopyLM  # noqa: E402, I001 (tests/synthgen/audit/copy_lm.py)

WORDS = "the a river stone old mill runs past near under green hill quiet road".split()
TEMPLATE = fewshot.PromptTemplate(header="", shot="{text}\n", stem="")


def _filler(n=40, seed=0):
    rng = np.random.default_rng(seed)
    return [{"text": " ".join(rng.choice(WORDS, 5))} for _ in range(n)]


def _config():
    # q = 8 * 2 / 40 = 0.4: a canary repeated 20 times sits in about 2/3 of the 8 prompts.
    return fewshot.FewShotConfig(
        public_pool_size=40, subsets=8, shots=2, max_shots=8, shot_tokens=64,
        max_new_tokens=40, noise_multiplier=1.0,
    )  # fmt: skip


def _key_words(seed=0):
    # Distinct random words, so no two canary keys share a word the copy model could mix.
    rng = np.random.default_rng(seed)
    return [" ".join("".join(rng.choice(list("bcdfghjklmnpqrstvwxz"), 6)) for _ in range(30))]


def test_copy_lm_copies_a_key_seen_in_its_prompt():
    lm = CopyLM()
    prompt = lm.encode("river stone mill 0123456789\nold road\nriver stone mill 01234")
    assert int(np.argmax(lm.score([prompt])[0])) == ord("5")


@pytest.mark.parametrize("gap", [0.0, 0.7, 3.0])
def test_gaussian_win_probability_matches_monte_carlo(gap):
    scores = np.array([0.5, 0.5 + gap * 0.3, 0.1, 0.1, 0.1, 0.2])
    std = 0.3
    rng = np.random.default_rng(0)
    n = 200_000
    wins = np.argmax(scores + rng.normal(0, std, (n, scores.size)), axis=1)
    hits = int(np.sum(wins == 0))
    p = math.exp(fewshot_audit.gaussian_win_logprob(scores, 0, std))
    assert stats.binomtest(hits, n, p).pvalue > 0.01
    # Deep tails stay finite and ordered (far below float64's exp range in the product).
    far = np.array([0.0, 40.0, 40.0])
    assert -math.inf < fewshot_audit.gaussian_win_logprob(far, 0, 0.5) < -1000


def test_release_logprob_matches_release_token_frequencies():
    lm = CopyLM()
    config = _config()
    plan = fewshot.plan_privacy(config, 10)
    rows = [lm.encode("ab\nac\nab\na")] * config.subsets
    logprobs = np.vstack([lm.score([lm.encode("a")]), lm.score(rows)])
    rng = np.random.default_rng(1)
    n = 4000
    picks = [fewshot.release_token(logprobs, config, plan, rng) for _ in range(n)]
    p = math.exp(fewshot_audit.release_logprob(logprobs, ord("b"), config, plan))
    assert stats.binomtest(sum(t == ord("b") for t in picks), n, p).pvalue > 0.01


def test_audit_exposes_a_repeated_canary_without_noise_but_not_at_small_epsilon(tmp_path):
    spec = canaries.CanarySpec(kinds=("secret",), repetitions=(20,), per_cell=8, references=15)
    work = tmp_path / "private"
    audit = fewshot_audit.run_fewshot_audit(
        CopyLM(), _filler(), _config(), template=TEMPLATE, targets=[{}] * 6, work_dir=work,
        epsilons=(math.inf, 0.05), spec=spec, lead="", draws=4, seed=3,
        public_documents=_key_words(),
    )  # fmt: skip
    drawn, _ = canaries.load_record(work)
    assert {c.included for c in drawn} == {True, False}  # seed 3 splits the canaries

    off, small = audit["runs"]
    assert off["epsilon"] == math.inf and 0 < small["epsilon"] <= 0.05
    cells = {(r["epsilon"], c["included"]): c for r in audit["runs"] for c in r["cells"]}
    top = math.log2(spec.references)
    noise_off_in, noisy_in = cells[math.inf, True], cells[small["epsilon"], True]
    # Noise off: an inserted canary (20 copies, in most prompts) is the argmax at nearly
    # every digit: the release makes its secret hundreds of bits likelier than references,
    # and releases it verbatim.
    assert noise_off_in["median_exposure"] == pytest.approx(top)
    assert noise_off_in["median_ratio_bits"] > 100
    assert noise_off_in["extracted"] > 0 and noise_off_in["median_prefix_digits"] >= 5
    assert cells[math.inf, False]["extracted"] == 0
    # Small epsilon (sigma ~ 150): the release is nearly indifferent to the secret. Group
    # privacy allows about r * eps = 1 nat (1.4 bits) for 20 copies; the rank still tops the
    # collapsed references, so the ratio, not the rank, is the figure to read.
    assert noisy_in["median_ratio_bits"] < 1.44
    assert noisy_in["extracted"] == 0 and noisy_in["median_prefix_digits"] <= 2
    # Membership: a perfect attack without noise; no violation of the claim at small epsilon.
    assert off["membership"][0]["auroc"] == 1.0
    assert math.isfinite(small["membership"][0]["claimed_epsilon"])
    assert not small["membership"][0]["violation"]

    # The record is aggregate only; the secrets, keys and texts stay in the work folder.
    text = json.dumps(report.strict_json(audit))
    for canary in drawn:
        assert canary.secret not in text and canary.key not in text
        assert canary.secret[:6] not in text
    assert "|" in report.markdown(audit)
    released = json.loads((work / fewshot_audit.TEXTS / "inf.json").read_text())
    assert any(c.secret in t for c in drawn for t in released)
