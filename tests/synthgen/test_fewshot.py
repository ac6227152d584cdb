"""DP few-shot generation: accounting, the token mechanism, sensitivity, end to end (tiny LM)."""

import math

import numpy as np
import pytest
from dp_accounting import dp_event
from scipy import stats

from synthgen import fewshot
from synthgen.lm_backends import TinyLM
from synthgen.privacy import accounting
from synthgen.privacy.ledger import PrivacyLedger, Scope

# ---- accounting -------------------------------------------------------------------------


def test_tang_agnews_check():
    # Tang et al. 2024 (ICLR), AGNews setting: N=30000, 20 private examples per token,
    # 100 tokens, delta=1/N, sigma=0.51 gives eps ~= 0.965 with their PRV accountant.
    eps = accounting.fewshot_epsilon(
        1 / 30000, sampling_rate=20 / 30000, tokens=100, noise_multiplier=0.51
    )
    assert eps == pytest.approx(0.965, abs=2e-3)


def test_fewshot_event_is_dpsgd_event_for_fresh_draws():
    # A fresh Poisson draw per token is exactly DP-SGD's Poisson-sampled Gaussian.
    ours = accounting.fewshot_event(sampling_rate=0.01, tokens=50, noise_multiplier=0.8)
    theirs = accounting.dpsgd_event(
        noise_multiplier=0.8, num_examples=1000, batch_size=10, steps=50
    )
    assert accounting.event_to_json(ours) == accounting.event_to_json(theirs)


def test_one_draw_per_example_composes_tokens_inside_the_draw():
    event = accounting.fewshot_event(
        sampling_rate=0.1, tokens=40, noise_multiplier=2.0, tokens_per_draw=20
    )
    # 2 draws, each a Gaussian of multiplier 2/sqrt(20) (composition of 20 Gaussians).
    assert isinstance(event, dp_event.SelfComposedDpEvent) and event.count == 2
    assert event.event.event.noise_multiplier == pytest.approx(2.0 / math.sqrt(20))
    fresh = accounting.fewshot_epsilon(1e-5, sampling_rate=0.1, tokens=40, noise_multiplier=2.0)
    shared = accounting.fewshot_epsilon(1e-5, sampling_rate=0.1, tokens=40, noise_multiplier=2.0,
                                        tokens_per_draw=20)  # fmt: skip
    assert shared > fresh  # sharing a draw loses amplification


def test_rnm_amplification_matches_the_formula():
    # Balle et al. 2018: a Poisson(q) subsample of an eps-DP mechanism is log(1+q(e^eps-1))-DP.
    q, eps0 = 0.05, 1.5
    assert accounting.amplified_pure_epsilon(eps0, q) == pytest.approx(
        math.log(1 + q * (math.exp(eps0) - 1))
    )
    eps = accounting.fewshot_epsilon(
        1e-6, sampling_rate=q, tokens=1, mechanism="rnm", token_epsilon=eps0
    )
    assert eps == pytest.approx(math.log(1 + q * (math.exp(eps0) - 1)), rel=1e-3)


@pytest.mark.parametrize("mechanism", ["gaussian", "rnm"])
def test_calibration_meets_the_target_on_the_safe_side(mechanism):
    shape = dict(sampling_rate=0.02, tokens=200, mechanism=mechanism)
    value = accounting.calibrate_fewshot(target_epsilon=3.0, delta=1e-5, **shape)
    name = "noise_multiplier" if mechanism == "gaussian" else "token_epsilon"
    eps = accounting.fewshot_epsilon(1e-5, **shape, **{name: value})
    assert 3.0 * 0.99 < eps <= 3.0


# ---- the token mechanism ------------------------------------------------------------------


def _plan(config, pool=1000, tokens=10):
    return fewshot.plan_privacy(config, [pool], tokens, pool)


def _logprobs(private_probs, public_probs):
    with np.errstate(divide="ignore"):
        return np.log(np.vstack([public_probs, private_probs]))


@pytest.mark.parametrize("mechanism", ["gaussian", "rnm"])
def test_agreeing_subsets_release_their_token(mechanism):
    # All M subsets put their mass on token 7; at a large epsilon it is released w.p. > 0.99.
    m, v = 10, 64
    config = fewshot.FewShotConfig(subsets=m, shots=2, mechanism=mechanism, target_epsilon=50)
    plan = _plan(config)
    private = np.full((m, v), 1e-6)
    private[:, 7] = 1.0
    private /= private.sum(1, keepdims=True)
    logprobs = _logprobs(private, np.full(v, 1 / v))
    rng = np.random.default_rng(0)
    picks = [fewshot.release_token(logprobs, config, plan, rng) for _ in range(2000)]
    assert np.mean(np.asarray(picks) == 7) > 0.99


@pytest.mark.parametrize("scale", [1.0, 2 / 3, 3 / 2])
def test_gaussian_noise_has_the_declared_scale(scale):
    # Two candidates whose mean probabilities differ by d: release_token picks the larger
    # with P = Phi(d / (sqrt(2) * std)), std = sigma * sqrt(2) / M. The observed frequency
    # matches the declared sigma and rejects 2/3 and 3/2 of it.
    m, sigma, d = 8, 1.3, 0.2
    config = fewshot.FewShotConfig(subsets=m, shots=1, noise_multiplier=sigma)
    plan = _plan(config)
    private = np.tile([0.5 + d / 2, 0.5 - d / 2], (m, 1))
    logprobs = _logprobs(private, np.array([0.5, 0.5]))
    rng = np.random.default_rng(1)
    n = 4000
    hits = sum(fewshot.release_token(logprobs, config, plan, rng) == 0 for _ in range(n))
    p = stats.norm.cdf(d * m / (2 * sigma * scale))
    pvalue = stats.binomtest(hits, n, p).pvalue
    assert pvalue > 0.01 if scale == 1.0 else pvalue < 1e-4


def test_rnm_selection_frequencies_follow_the_exponential_mechanism():
    m, v = 5, 3
    config = fewshot.FewShotConfig(subsets=m, shots=1, mechanism="rnm", token_epsilon=2.0)
    plan = _plan(config)
    private = np.array([[0.6, 0.3, 0.1]] * m)
    logprobs = _logprobs(private, np.full(v, 1 / v))
    rng = np.random.default_rng(2)
    picks = np.bincount([fewshot.release_token(logprobs, config, plan, rng) for _ in range(6000)],
                        minlength=v)  # fmt: skip
    weights = np.exp(2.0 * private[0] / (2 * (1 / m)))
    expected = weights / weights.sum() * 6000
    assert stats.chisquare(picks, expected).pvalue > 0.01


def test_candidates_come_from_the_public_row_only():
    # RVP: private mass on a token outside the public top-K is never released.
    m, v = 4, 50
    config = fewshot.FewShotConfig(subsets=m, shots=1, target_epsilon=50, public_vocab=3)
    plan = _plan(config)
    public = np.full(v, 1e-4)
    public[[1, 2, 3]] = 1.0
    private = np.full((m, v), 1e-6)
    private[:, 40] = 1.0
    rng = np.random.default_rng(3)
    picks = {fewshot.release_token(_logprobs(private, public / public.sum()), config, plan, rng)
             for _ in range(300)}  # fmt: skip
    assert picks <= {1, 2, 3}


# ---- sensitivity: neighbouring datasets ---------------------------------------------------


def test_adding_one_example_changes_at_most_one_prompt():
    config = fewshot.FewShotConfig(subsets=6, shots=3, noise_multiplier=1.0)
    pool = np.arange(200)
    for seed in range(50):
        # The same randomness for D and D + {x}: x is the last element, drawn last.
        a = fewshot.draw_subsets(pool, config, 0.09, np.random.default_rng(seed))
        b = fewshot.draw_subsets(np.append(pool, 200), config, 0.09, np.random.default_rng(seed))
        changed = [i for i in range(6) if sorted(a[i]) != sorted(b[i])]
        assert len(changed) <= 1, (seed, changed)


def test_neighbouring_pools_move_the_released_statistic_within_the_sensitivity():
    # D and D + {x} with shared randomness (x's draws come last), prompts rendered and scored
    # by the tiny LM, the mean that release_token uses: ||.||_2 <= sqrt(2)/M and
    # ||.||_inf <= 1/M. A high rate fills the prompts past max_shots, so x can displace
    # another example of its prompt.
    m = 5
    config = fewshot.FewShotConfig(subsets=m, shots=2, max_shots=2, noise_multiplier=1.0)
    rng = np.random.default_rng(5)
    rows = [{"text": "".join(rng.choice(list("abcdefgh"), 6))} for _ in range(41)]
    template = fewshot.PromptTemplate(header="", shot="{text}\n", stem="")
    prompts = fewshot._Prompts(TinyLM(), template, rows, 16)
    frame = prompts.frame({})
    lm, worst2, worstinf, displaced = TinyLM(), 0.0, 0.0, 0
    for seed in range(40):
        means = []
        subsets_of = []
        for pool in (np.arange(40), np.arange(41)):
            subsets = fewshot.draw_subsets(pool, config, 0.5, np.random.default_rng(seed))
            subsets_of.append(subsets)
            rows_ids = [prompts.prompt(frame, [])] + [prompts.prompt(frame, s) for s in subsets]
            means.append(fewshot.private_mean(lm.score(rows_ids)))
        changed = [j for j in range(m) if subsets_of[0][j] != subsets_of[1][j]]
        assert len(changed) <= 1
        displaced += any(40 in subsets_of[1][j] and len(subsets_of[0][j]) == 2 for j in changed)
        diff = means[1] - means[0]
        worst2 = max(worst2, np.linalg.norm(diff))
        worstinf = max(worstinf, np.abs(diff).max())
    assert displaced > 0  # the cap case was exercised
    assert 0 < worst2 <= math.sqrt(2) / m and worstinf <= 1 / m


# ---- validation and end to end ------------------------------------------------------------

# Every bigram of these texts has one continuation, so the tiny LM copies them exactly.
ROWS = [{"text": "abcdefg", "label": "x"}] * 60 + [{"text": "nopqrst", "label": "y"}] * 40


def test_bad_inputs_fail_before_any_compute():
    with pytest.raises(ValueError, match="positive"):
        fewshot.FewShotConfig(target_epsilon=0)
    with pytest.raises(ValueError, match="exactly one"):
        fewshot.FewShotConfig()
    config = fewshot.FewShotConfig(subsets=10, shots=5, target_epsilon=4)
    targets = [{"label": "x"}, {"label": "y"}]
    with pytest.raises(ValueError, match="fewer than subsets"):
        fewshot.plan_for(ROWS, targets, fewshot.DOCUMENT_TEMPLATE, config, pool_field="label")
    with pytest.raises(ValueError, match="lack field"):
        fewshot.plan_for([{"body": "a"}] * 100, targets, fewshot.DOCUMENT_TEMPLATE, config)


def test_plan_charges_the_worst_pool():
    config = fewshot.FewShotConfig(subsets=4, shots=2, max_new_tokens=10, noise_multiplier=1.0)
    targets = [{"label": "x"}] * 3 + [{"label": "y"}]
    plan = fewshot.plan_for(ROWS, targets, fewshot.DOCUMENT_TEMPLATE, config, pool_field="label")
    assert plan.sampling_rate == pytest.approx(8 / 40)  # the smaller pool
    assert plan.tokens == 30  # the pool with the most examples
    assert plan.delta == pytest.approx(1 / 100)


@pytest.mark.parametrize("resample", ["token", "example"])
def test_end_to_end_with_the_tiny_lm_is_charged_and_on_topic(resample, tmp_path):
    ledger = PrivacyLedger(tmp_path / "ledger.sqlite")
    ledger.open_scope(Scope("t", "d", 100.0, 0.01))
    # sigma = 1 with M = 20: noise std 0.07 on the mean probability (small sigmas make the
    # PLD of the charge slow).
    config = fewshot.FewShotConfig(
        subsets=20, shots=1, max_new_tokens=8, noise_multiplier=1.0, resample=resample,
        stop_at_newline=True,
    )  # fmt: skip
    targets = fewshot.round_robin_targets([r["label"] for r in ROWS], 4)
    # A header and stem whose letters do not compete with the examples' bigrams.
    template = fewshot.PromptTemplate(header="{label}\n", shot="{text}\n", stem="")
    result = fewshot.generate(
        TinyLM(), ROWS, targets, template, config, pool_field="label",
        rng=np.random.default_rng(0), ledger=ledger, ledger_scope=("t", "d"),
    )  # fmt: skip
    assert len(result.texts) == 4
    charges = ledger.charges("t", "d")
    assert len(charges) == 1 and charges[0].epsilon == pytest.approx(result.plan.epsilon)
    # The tiny LM copies bigrams of its prompt: each label's text comes back.
    for target, text in zip(targets, result.texts, strict=True):
        assert text == ("abcdefg" if target["label"] == "x" else "nopqrst")
    meta = fewshot.write_output(str(tmp_path / "out"), {"label": [t["label"] for t in targets],
                                "text": result.texts}, result, config, model="tiny",
                                template=fewshot.DOCUMENT_TEMPLATE)  # fmt: skip
    assert meta["privacy"]["epsilon"] == result.plan.epsilon
    assert (tmp_path / "out" / "synthetic.jsonl").read_text().count("\n") == 4


def test_over_budget_run_is_refused_and_releases_nothing(tmp_path):
    ledger = PrivacyLedger(tmp_path / "ledger.sqlite")
    ledger.open_scope(Scope("t", "d", 0.5, 0.01))
    config = fewshot.FewShotConfig(subsets=5, shots=2, max_new_tokens=8, noise_multiplier=1.0)

    class SpyLM(TinyLM):
        calls = 0

        def score(self, prompts):
            SpyLM.calls += 1
            return super().score(prompts)

    lm = SpyLM()
    from synthgen.privacy.errors import BudgetExceededError

    with pytest.raises(BudgetExceededError):
        fewshot.generate(lm, ROWS, [{"label": "x"}], fewshot.DOCUMENT_TEMPLATE, config,
                         pool_field="label", rng=np.random.default_rng(0), ledger=ledger,
                         ledger_scope=("t", "d"))  # fmt: skip
    assert ledger.charges("t", "d") == [] and SpyLM.calls == 0


def test_a_run_that_may_overflow_the_context_is_refused_before_the_charge(tmp_path):
    class ShortLM(TinyLM):
        max_context = 24

    ledger = PrivacyLedger(tmp_path / "ledger.sqlite")
    ledger.open_scope(Scope("t", "d", 100.0, 0.01))
    config = fewshot.FewShotConfig(subsets=5, shots=2, max_new_tokens=8, noise_multiplier=1.0)
    with pytest.raises(ValueError, match="context"):
        fewshot.generate(ShortLM(), ROWS, [{"label": "x"}], fewshot.DOCUMENT_TEMPLATE, config,
                         pool_field="label", rng=np.random.default_rng(0), ledger=ledger,
                         ledger_scope=("t", "d"))  # fmt: skip
    assert ledger.charges("t", "d") == []


def test_amplified_pure_epsilon_does_not_overflow():
    assert accounting.amplified_pure_epsilon(2000.0, 0.01) == pytest.approx(2000 + math.log(0.01))
