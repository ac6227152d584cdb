"""DP few-shot generation: accounting, the token mechanism, sensitivity, end to end (tiny LM)."""

import json
import math

import numpy as np
import pytest
from dp_accounting import dp_event
from scipy import stats

from synthgen import fewshot
from synthgen.fewshot import generation
from synthgen.fewshot.prompts import _Prompts
from synthgen.lm_backends import TinyLM
from synthgen.privacy import accounting
from synthgen.privacy.ledger import PrivacyLedger
from synthgen.privacy.ledger_types import Scope
from synthgen.privacy.receipts import ledger_payer


def _pay(ledger):
    """The payer of scope (t, d), as the commands build it."""
    return ledger_payer(ledger, ("t", "d"), stage="fewshot-generate")


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


def _plan(config, tokens=10):
    return fewshot.plan_privacy(config, tokens)


def _logprobs(private_probs, public_probs):
    with np.errstate(divide="ignore"):
        return np.log(np.vstack([public_probs, private_probs]))


@pytest.mark.parametrize("mechanism", ["gaussian", "rnm"])
def test_agreeing_subsets_release_their_token(mechanism):
    # All M subsets put their mass on token 7; at a large epsilon it is released w.p. > 0.99.
    m, v = 10, 64
    config = fewshot.FewShotConfig(
        public_pool_size=1000, subsets=m, shots=2, mechanism=mechanism, target_epsilon=50
    )
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
    config = fewshot.FewShotConfig(public_pool_size=1000, subsets=m, shots=1,
                                   noise_multiplier=sigma)  # fmt: skip
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
    config = fewshot.FewShotConfig(public_pool_size=1000, subsets=m, shots=1, mechanism="rnm",
                                   token_epsilon=2.0)  # fmt: skip
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
    config = fewshot.FewShotConfig(public_pool_size=1000, subsets=m, shots=1, target_epsilon=50,
                                   public_vocab=3)  # fmt: skip
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
    config = fewshot.FewShotConfig(public_pool_size=200, subsets=6, shots=3, noise_multiplier=1.0)
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
    config = fewshot.FewShotConfig(public_pool_size=40, subsets=m, shots=2, max_shots=2,
                                   noise_multiplier=1.0)  # fmt: skip
    rng = np.random.default_rng(5)
    rows = [{"text": "".join(rng.choice(list("abcdefgh"), 6))} for _ in range(41)]
    template = fewshot.PromptTemplate(header="", shot="{text}\n", stem="")
    prompts = _Prompts(TinyLM(), template, rows, 16)
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


def _config(**changes):
    values = dict(public_pool_size=40, subsets=5, shots=2, max_new_tokens=8, noise_multiplier=1.0)
    return fewshot.FewShotConfig(**{**values, **changes})


def test_bad_inputs_fail_before_any_compute():
    with pytest.raises(ValueError, match="positive"):
        fewshot.FewShotConfig(public_pool_size=100, target_epsilon=0)
    with pytest.raises(ValueError, match="exactly one"):
        fewshot.FewShotConfig(public_pool_size=100)
    with pytest.raises(TypeError):  # the declared pool size is required
        fewshot.FewShotConfig(target_epsilon=4)  # type: ignore[call-arg]
    with pytest.raises(ValueError, match="public_pool_size must be >= subsets"):
        fewshot.FewShotConfig(public_pool_size=49, subsets=10, shots=5, target_epsilon=4)
    config = fewshot.FewShotConfig(public_pool_size=50, subsets=10, shots=5, target_epsilon=4)
    with pytest.raises(ValueError, match="lack field"):
        fewshot.plan_for([{"body": "a"}] * 100, [{"label": "x"}], fewshot.DOCUMENT_TEMPLATE,
                         config)  # fmt: skip


def test_a_pool_smaller_than_declared_is_refused_without_its_size(tmp_path):
    # Pool y has 40 examples, x has 60. Declaring 41 refuses y, by name, and says nothing of 40.
    config = _config(public_pool_size=41)
    targets = [{"label": "x"}, {"label": "y"}]
    with pytest.raises(ValueError) as refused:
        fewshot.plan_for(ROWS, targets, fewshot.DOCUMENT_TEMPLATE, config, pool_field="label")
    message = str(refused.value)
    assert "label='y'" in message and "smaller than the declared public pool size" in message
    assert not any(str(n) in message for n in (40, 60, 100, 1, 0))
    # generate() refuses the same way with a plan made elsewhere, before any charge.
    ledger = PrivacyLedger(tmp_path / "ledger.sqlite")
    ledger.open_scope(Scope("t", "d", 100.0, 0.01))
    plan = fewshot.plan_privacy(config, 8, 2)
    with pytest.raises(ValueError, match="smaller than the declared"):
        fewshot.generate(TinyLM(), ROWS, targets, fewshot.DOCUMENT_TEMPLATE, config,
                         pool_field="label", rng=np.random.default_rng(0), pay=_pay(ledger),
                         plan=plan)  # fmt: skip
    assert ledger.charges("t", "d") == []
    # A label of the public list with no private example at all is refused the same way.
    with pytest.raises(ValueError, match="label='z' is smaller than the declared"):
        fewshot.plan_for(ROWS, [{"label": "z"}], fewshot.DOCUMENT_TEMPLATE, _config(),
                         pool_field="label")  # fmt: skip


def test_a_plan_made_for_other_privacy_settings_is_refused_before_the_charge(tmp_path):
    """The release states its config next to the plan's figures: a plan for another
    epsilon, noise or delta than the config's is refused, nothing charged."""
    ledger = PrivacyLedger(tmp_path / "ledger.sqlite")
    ledger.open_scope(Scope("t", "d", 1000.0, 0.01))
    target = _config(noise_multiplier=None, target_epsilon=1.0)  # never calibrated here
    cases = (  # (the run's config, the config its plan was made for)
        (target, _config(noise_multiplier=0.3)),  # a larger epsilon than the target
        (_config(noise_multiplier=1.0), _config(noise_multiplier=0.5)),
        (_config(noise_multiplier=1.0), _config(noise_multiplier=1.0, delta=1e-4)),
    )
    for config, other in cases:
        plan = fewshot.plan_for(ROWS, [{"label": "x"}], fewshot.DOCUMENT_TEMPLATE, other)
        with pytest.raises(ValueError, match="plan does not cover this run"):
            fewshot.generate(TinyLM(), ROWS, [{"label": "x"}], fewshot.DOCUMENT_TEMPLATE,
                             config, rng=np.random.default_rng(0), pay=_pay(ledger),
                             plan=plan)  # fmt: skip
    assert ledger.charges("t", "d") == []


def test_the_plan_depends_on_declared_figures_only():
    # Two private datasets with different pool sizes (both >= declared): the same plan, the
    # rate M * shots / declared for every pool, and no real size anywhere in it.
    config = _config(public_pool_size=30, max_new_tokens=10)
    targets = [{"label": "x"}] * 3 + [{"label": "y"}]
    bigger = ROWS + [{"text": "abcdefg", "label": "y"}] * 17
    plans = [fewshot.plan_for(rows, targets, fewshot.DOCUMENT_TEMPLATE, config,
                              pool_field="label") for rows in (ROWS, bigger)]  # fmt: skip
    assert plans[0] == plans[1]
    plan = plans[0].to_dict()
    assert plan["sampling_rate"] == pytest.approx(10 / 30)
    assert plan["tokens"] == 30  # the pool with the most examples to generate
    assert plan["public_pool_size"] == 30 and plan["pools"] == 2
    assert not {"num_private", "smallest_pool"} & set(plan)
    assert not any(str(n) in json.dumps(plan) for n in (40, 57, 60, 100, 117))


def test_default_delta_is_well_below_one_over_n_and_one_over_n_is_refused():
    config = _config(public_pool_size=50)
    plan = fewshot.plan_privacy(config, 8, 2)
    assert plan.delta == pytest.approx(1 / (10 * 100))  # N = declared pool size x pools
    for delta in (1 / 100, 2 / 100):
        with pytest.raises(ValueError, match="delta must be in"):
            fewshot.plan_privacy(_config(public_pool_size=50, delta=delta), 8, 2)
    assert fewshot.plan_privacy(_config(public_pool_size=50, delta=0.9 / 100), 8, 2).delta == (
        pytest.approx(0.009)
    )


class CountingLM(TinyLM):
    """Tiny LM that never stops and counts the shots of every private prompt it scores."""

    def __init__(self):
        super().__init__()
        self.shots: list[int] = []

    @property
    def eos_ids(self):
        return ()

    def score(self, prompts, **kwargs):
        if len(prompts) > 1:  # the M private prompts; the public one is scored alone
            self.shots += [self.decode(p).count("Paragraph: ") for p in prompts]
        return super().score(prompts, **kwargs)


def test_each_example_is_included_with_the_declared_rate_and_prompts_stay_capped():
    # A real pool 4x the declared size: the inclusion probability is still q = M*n/declared
    # (not M*n/real), so a prompt holds Binomial(200, q/M) examples cut at max_shots.
    # Fixed seed; 400 tokens x 5 prompts, the mean has std ~0.06.
    declared, m, n, cap = 50, 5, 2, 12
    rows = [{"text": "abcdefg", "label": "x"}] * (4 * declared)
    config = _config(public_pool_size=declared, subsets=m, shots=n, max_shots=cap,
                     max_new_tokens=400, stop_at_newline=False)  # fmt: skip
    template = fewshot.PromptTemplate(header="H\n", shot="Paragraph: {text}\n", stem="")
    lm = CountingLM()
    fewshot.generate(lm, rows, [{"label": "x"}], template, config, pool_field="label",
                     rng=np.random.default_rng(7))  # fmt: skip
    k = np.arange(len(rows) + 1)
    expected = np.sum(np.minimum(k, cap) * stats.binom.pmf(k, len(rows), n / declared))  # ~7.9
    assert abs(np.mean(lm.shots) - expected) < 0.3
    assert max(lm.shots) == cap  # the cap binds, and holds
    assert len(lm.shots) == 400 * m


class BatchCoupledLM(TinyLM):
    """Tiny LM with batched numerics: every row's log-probs move (by ~1e-6, unevenly over
    the vocabulary) with the total length of the batch it is scored in, as padding and
    batched matmuls do in a real model."""

    def score(self, prompts, **kwargs):
        out = super().score(prompts, **kwargs).astype(np.float64)
        total = sum(len(p) for p in prompts)
        out += 1e-6 * (total % 97) * (np.arange(out.shape[1]) % 3)
        return out.astype(np.float32)


@pytest.mark.parametrize("resample", ["token", "example"])
def test_public_scores_are_bit_identical_whatever_the_private_prompts(resample, monkeypatch):
    # The public row (and so the RVP candidates) must not depend on the private rows, even
    # through batched numerics: it is scored in a call whose inputs are all public.
    seen = []
    real_release = fewshot.release_token

    def spy(logprobs, config, plan, rng):
        public = logprobs[0].copy()
        seen.append((public, fewshot.public_candidates(fewshot.distributions(public[None])[0],
                                                       config)))  # fmt: skip
        return real_release(logprobs, config, plan, rng)

    # patched where `generate` looks it up: the loop lives in synthgen.fewshot.generation
    monkeypatch.setattr(generation, "release_token", spy)
    config = _config(max_new_tokens=1, public_vocab=5, resample=resample)
    targets = [{"label": "x"}, {"label": "y"}, {"label": "x"}]
    template = fewshot.PromptTemplate(header="{label}\n", shot="{text}\n", stem="")
    other = [{"text": r["text"][::-1] * 2, "label": r["label"]} for r in ROWS]
    runs = []
    for rows in (ROWS, other):
        seen.clear()
        fewshot.generate(BatchCoupledLM(), rows, targets, template, config, pool_field="label",
                         rng=np.random.default_rng(0))  # fmt: skip
        runs.append(list(seen))
    assert len(runs[0]) == len(runs[1]) == 3
    for (pub_a, cand_a), (pub_b, cand_b) in zip(*runs, strict=True):
        assert pub_a.tobytes() == pub_b.tobytes()
        np.testing.assert_array_equal(cand_a, cand_b)


class ShapeLM(CountingLM):
    """Records the length every private call is padded to (a compiled program's shape)."""

    def __init__(self):
        super().__init__()
        self.lengths: list[int] = []

    def score(self, prompts, *, length=None):
        if len(prompts) > 1:
            self.lengths.append(max([length or 0, *map(len, prompts)]))
        return super().score(prompts, length=length)


@pytest.mark.parametrize("resample", ["token", "example"])
def test_private_calls_are_padded_to_the_public_worst_case(resample):
    """Rule 9: the private prompts' shape is fixed by public settings, not by which
    examples were drawn, nor how long they are (a neighbour with one long example)."""
    config = _config(resample=resample, max_new_tokens=4, stop_at_newline=False)
    template = fewshot.PromptTemplate(header="H\n", shot="Paragraph: {text}\n", stem="")
    runs = []
    for rows in (ROWS, ROWS + [{"text": "z" * 90, "label": "x"}]):
        lm = ShapeLM()
        fewshot.generate(lm, rows, [{"label": "x"}], template, config, pool_field="label",
                         rng=np.random.default_rng(3))  # fmt: skip
        runs.append(lm.lengths)
    prompts = _Prompts(ShapeLM(), template, ROWS, config.shot_tokens)
    worst = prompts.worst_length([prompts.frame({"label": "x"})], config.shots_cap)
    # one private call per token (token: a scoring; example: the session's start, appends)
    assert runs[0] == runs[1] == [worst + g for g in range(config.max_new_tokens)]


def test_rows_that_are_not_distributions_are_normalised():
    # A backend returning a row that sums to 1.8 (or holds NaN) would break the sqrt(2)/M
    # sensitivity; every row is normalised first.
    v = 6
    good = np.full(v, 1 / v)
    bad = np.full(v, 1.8 / v)
    nan = np.full(v, np.nan)
    with np.errstate(divide="ignore"):
        logprobs = np.log(np.vstack([good, good, bad])).astype(np.float32)
    logprobs = np.vstack([logprobs, nan[None]])
    mean = fewshot.private_mean(logprobs)
    assert mean.sum() == pytest.approx(1.0)
    np.testing.assert_allclose(fewshot.distributions(logprobs).sum(1), 1.0)
    # Neighbours differing in one bogus row stay within sqrt(2)/M of each other.
    m = logprobs.shape[0] - 1
    other = logprobs.copy()
    other[2] = np.log(np.eye(v)[0] * 1.8 + 1e-30)
    diff = fewshot.private_mean(other) - mean
    assert np.linalg.norm(diff) <= math.sqrt(2) / m + 1e-12


@pytest.mark.parametrize("resample", ["token", "example"])
def test_end_to_end_with_the_tiny_lm_is_charged_and_on_topic(resample, tmp_path):
    ledger = PrivacyLedger(tmp_path / "ledger.sqlite")
    ledger.open_scope(Scope("t", "d", 100.0, 1 / 800))  # the plan's delta: 1/(10 x 40 x 2)
    # sigma = 1 with M = 20: noise std 0.07 on the mean probability (small sigmas make the
    # PLD of the charge slow).
    config = fewshot.FewShotConfig(
        public_pool_size=40, subsets=20, shots=1, max_new_tokens=8, noise_multiplier=1.0,
        resample=resample, stop_at_newline=True,
    )  # fmt: skip
    targets = fewshot.round_robin_targets(["x", "y"], 4)
    # A header and stem whose letters do not compete with the examples' bigrams.
    template = fewshot.PromptTemplate(header="{label}\n", shot="{text}\n", stem="")
    result = fewshot.generate(
        TinyLM(), ROWS, targets, template, config, pool_field="label",
        rng=np.random.default_rng(0), pay=_pay(ledger),
    )  # fmt: skip
    assert len(result.texts) == 4
    charges = ledger.charges("t", "d")
    assert len(charges) == 1 and charges[0].epsilon == pytest.approx(result.plan.epsilon)
    assert charges[0].relation == "ADD_OR_REMOVE_ONE"
    # The tiny LM copies bigrams of its prompt: each label's text comes back.
    for target, text in zip(targets, result.texts, strict=True):
        assert text == ("abcdefg" if target["label"] == "x" else "nopqrst")
    meta = fewshot.write_output(str(tmp_path / "out"), {"label": [t["label"] for t in targets],
                                "text": result.texts}, result, config, model="tiny",
                                template=fewshot.DOCUMENT_TEMPLATE, seeded=True)  # fmt: skip
    assert meta["privacy"]["epsilon"] == result.plan.epsilon
    assert (tmp_path / "out" / "synthetic.jsonl").read_text().count("\n") == 4
    # Released metadata: declared figures only, the seed is flagged, no timings.
    assert (
        meta["randomness"]["seeded"] is True
        and "not for publication" in (meta["randomness"]["note"])
    )
    text = (tmp_path / "out" / "metadata.json").read_text()
    assert "second" not in text and "smallest_pool" not in text and "num_private" not in text
    assert not hasattr(result, "seconds")


def test_over_budget_run_is_refused_and_releases_nothing(tmp_path):
    ledger = PrivacyLedger(tmp_path / "ledger.sqlite")
    ledger.open_scope(Scope("t", "d", 0.5, 0.01))
    config = _config()

    class SpyLM(TinyLM):
        calls = 0

        def score(self, prompts, **kwargs):
            SpyLM.calls += 1
            return super().score(prompts, **kwargs)

    lm = SpyLM()
    from synthgen.privacy.errors import BudgetExceededError

    with pytest.raises(BudgetExceededError):
        fewshot.generate(lm, ROWS, [{"label": "x"}], fewshot.DOCUMENT_TEMPLATE, config,
                         pool_field="label", rng=np.random.default_rng(0),
                         pay=_pay(ledger))  # fmt: skip
    assert ledger.charges("t", "d") == [] and SpyLM.calls == 0


def test_a_run_that_may_overflow_the_context_is_refused_before_the_charge(tmp_path):
    class ShortLM(TinyLM):
        max_context = 24

    ledger = PrivacyLedger(tmp_path / "ledger.sqlite")
    ledger.open_scope(Scope("t", "d", 100.0, 0.01))
    with pytest.raises(ValueError, match="context"):
        fewshot.generate(ShortLM(), ROWS, [{"label": "x"}], fewshot.DOCUMENT_TEMPLATE,
                         _config(), pool_field="label", rng=np.random.default_rng(0),
                         pay=_pay(ledger))  # fmt: skip
    assert ledger.charges("t", "d") == []


def test_amplified_pure_epsilon_does_not_overflow():
    assert accounting.amplified_pure_epsilon(2000.0, 0.01) == pytest.approx(2000 + math.log(0.01))
