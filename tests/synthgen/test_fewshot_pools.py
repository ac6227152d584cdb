"""Few-shot pools (`synthgen.fewshot`): small pools when allowed, extra RVP candidates, an
example in several pools (the plan charges each of its pools), one array per empty pool."""

import numpy as np
import pytest

from synthgen import fewshot
from synthgen.fewshot import mechanism, sampling
from synthgen.fewshot.plan import plan_for, plan_privacy
from synthgen.lm_backends import TinyLM
from synthgen.privacy import accounting

TEMPLATE = fewshot.PromptTemplate(
    header='Here are records that mention "{label}".\n\n', shot="Record: {text}\n\n", stem="Record:"
)


def _fewshot(**changes):
    values = dict(public_pool_size=8, subsets=4, shots=1, max_new_tokens=6, noise_multiplier=3.0)
    return fewshot.FewShotConfig(**{**values, **changes})


def test_min_pool_size_and_extra_candidates_validation():
    assert _fewshot().min_pool_size == 8
    assert _fewshot(allow_small_pools=True).min_pool_size == 0
    assert _fewshot(extra_candidates=(3, 0, 7)).extra_candidates == (3, 0, 7)
    for bad in [(-1,), (1.5,), ("a",)]:
        with pytest.raises(ValueError, match="extra_candidates"):
            _fewshot(extra_candidates=bad)


def test_pools_per_example_multiplies_the_charged_tokens():
    config = _fewshot()
    plan = plan_privacy(config, 12, 3, pools_per_example=3)
    assert plan.tokens == 12 and plan.pools_per_example == 3
    same = accounting.fewshot_event(
        sampling_rate=config.sampling_rate, tokens=36, noise_multiplier=3.0
    )
    assert accounting.event_to_json(plan.event) == accounting.event_to_json(same)
    assert plan.epsilon == pytest.approx(
        accounting.fewshot_epsilon(
            plan.delta, sampling_rate=config.sampling_rate, tokens=36, noise_multiplier=3.0
        )
    )
    assert plan.epsilon > plan_privacy(config, 12, 3).epsilon
    assert plan.to_dict()["pools_per_example"] == 3
    with pytest.raises(ValueError, match="pools_per_example"):
        plan_privacy(config, 12, 3, pools_per_example=0)


def test_every_empty_pool_has_its_own_array():
    rows = [{"text": "abc", "label": "x"}] * 3
    targets = [{"label": "y"}, {"label": "z"}, {"label": "y"}, {"label": "x"}]
    pools = sampling._pools(rows, targets, "label", 0)
    assert [p.size for p in pools] == [0, 0, 0, 3]
    assert pools[0] is pools[2]  # one pool per label
    assert pools[0] is not pools[1]  # two empty pools are two pools
    assert len({id(p) for p in pools}) == 3
    plan = plan_for(
        rows, targets, fewshot.PromptTemplate("{label}\n", "{text}\n", "T:"),
        _fewshot(allow_small_pools=True), pool_field="label",
    )  # fmt: skip
    assert plan.pools == 3 and plan.tokens == 2 * 6  # label y: two targets
    with pytest.raises(ValueError, match="label='y'"):
        sampling._pools(rows, targets, "label", 1)


def test_public_candidates_add_the_extra_candidates():
    public = np.linspace(1.0, 0.1, 20)
    public /= public.sum()
    top = set(mechanism.public_candidates(public, _fewshot(public_vocab=3)).tolist())
    assert top == {0, 1, 2}
    extra = mechanism.public_candidates(
        public, _fewshot(public_vocab=3, extra_candidates=(15, 1, 19, 20, 400))
    )
    assert sorted(extra.tolist()) == [0, 1, 2, 15, 19]  # ids beyond the vocabulary dropped
    everything = mechanism.public_candidates(public, _fewshot(extra_candidates=(5,)))
    assert everything.tolist() == list(range(20))


def test_small_pools_run_when_allowed():
    rows = [{"text": "quinaxitis brings shivers", "label": "quinaxitis"}] * 2  # < 8 declared
    targets = [{"label": "quinaxitis"}, {"label": "absent"}]
    with pytest.raises(ValueError, match="smaller than the declared"):
        fewshot.generate(TinyLM(), rows, targets, TEMPLATE, _fewshot(),
                         pool_field="label", rng=np.random.default_rng(0))  # fmt: skip
    result = fewshot.generate(
        TinyLM(), rows, targets, TEMPLATE, _fewshot(allow_small_pools=True),
        pool_field="label", rng=np.random.default_rng(0),
    )  # fmt: skip
    assert len(result.texts) == 2 and result.plan.pools == 2
    # the declared size, not the real one, sets the rate and the guarantee
    assert result.plan.sampling_rate == pytest.approx(4 * 1 / 8)
