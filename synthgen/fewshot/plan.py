"""The privacy plan of a run: delta, the noise and the guarantee, fixed before it starts.

`plan_for` validates a run's inputs and plans it (`plan_privacy`: a `FewShotPlan`, its
dp-accounting event, epsilon and delta); `_check_plan` refuses a plan that would
under-charge a run.

Privacy:
  Unit: one private example; add/remove-one (`RELATION`). The plan reads only declared
  public figures (q = M * shots / public_pool_size, the targets' pools, max_new_tokens;
  delta < 1 / N, N = public_pool_size x pools); the private rows only refuse a pool
  smaller than declared. `accounting.fewshot_event` composes the tokens (PLD).
"""

from __future__ import annotations

import collections
import dataclasses
import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from synthgen.fewshot.config import FewShotConfig
from synthgen.fewshot.prompts import PromptTemplate
from synthgen.fewshot.sampling import _pools
from synthgen.privacy import accounting

RELATION = "ADD_OR_REMOVE_ONE"
DELTA_SAFETY = 10  # default delta = 1 / (DELTA_SAFETY * N)


def resolve_delta(delta: float | None, num_private: int) -> float:
    """delta, or its default 1 / (10 N); refuses delta >= 1 / N.

    A mechanism that publishes each record with probability delta is (0, delta)-DP, so
    delta >= 1 / N allows publishing a record outright; 1 / (10 N) leaves a margin.

    Args:
      delta: the requested delta, or None for the default.
      num_private: N, a declared public figure (never a count of the private rows).

    Raises:
      ValueError: N < 1 or delta outside (0, 1 / N).
    """
    if num_private < 1:
        raise ValueError(f"num_private must be >= 1, got {num_private=}")
    if delta is None:
        return 1.0 / (DELTA_SAFETY * num_private)
    accounting.check_delta(delta, num_private)
    return float(delta)


@dataclasses.dataclass(frozen=True)
class FewShotPlan:
    """The guarantee of a run, fixed before it starts from declared public figures only."""

    public_pool_size: int
    pools: int
    sampling_rate: float
    tokens: int
    tokens_per_draw: int
    mechanism: str
    noise_multiplier: float | None
    token_epsilon: float | None
    subsets: int
    delta: float
    epsilon: float
    pools_per_example: int = 1

    @property
    def relation(self) -> accounting.NeighboringRelation:
        """The neighbouring relation of `event` (`RELATION`, the one the ledger is charged
        under by `synthgen.fewshot.generation`)."""
        return accounting.NeighboringRelation[RELATION]

    @property
    def event(self):
        return accounting.fewshot_event(
            sampling_rate=self.sampling_rate,
            tokens=self.tokens * self.pools_per_example,
            mechanism=self.mechanism,
            noise_multiplier=self.noise_multiplier,
            token_epsilon=self.token_epsilon,
            tokens_per_draw=self.tokens_per_draw,
        )

    def to_dict(self) -> dict:
        out = dataclasses.asdict(self)
        out.update(
            unit="one private example",
            neighboring_relation=RELATION,
            accountant="pld",
            sampling=(
                "poisson per pool (label): each example joins with probability "
                "q = subsets * shots / public_pool_size (declared, public); real pool "
                "sizes are neither used nor published"
            ),
            noise_std=None
            if self.noise_multiplier is None
            else self.noise_multiplier * math.sqrt(2) / self.subsets,
            mechanism_description=(
                "Gaussian noise sigma*sqrt(2)/M on the mean of M next-token distributions, "
                "argmax (Tang et al. 2024)"
                if self.mechanism == "gaussian"
                else "exponential mechanism (report-noisy-max, Gumbel) on the mean of M "
                "next-token distributions, sensitivity 1/M (Tang et al. 2024)"
            ),
            dp_event=json.loads(accounting.event_to_json(self.event)),
        )
        return out


def plan_privacy(
    config: FewShotConfig, tokens_per_pool: int, pools: int = 1, pools_per_example: int = 1
) -> FewShotPlan:
    """Resolves delta and the noise of a run from declared public figures only.

    Args:
      config: the run's hyper-parameters (its `public_pool_size` sets the rate).
      tokens_per_pool: most tokens released for one pool (examples x max_new_tokens).
      pools: pools that have synthetic examples to generate (public: from the targets).
      pools_per_example: most pools one private example sits in (overlapping pools, e.g.
        one per keyword of a document): its tokens are charged that many times.

    Raises:
      ValueError: delta >= 1 / N with N = public_pool_size x pools.

    Privacy:
      Reads no private data: q, delta and the noise follow from public figures, so the
      plan may be published whole.
    """
    if pools < 1 or tokens_per_pool < 1 or pools_per_example < 1:
        raise ValueError(
            f"pools, tokens_per_pool, pools_per_example must be >= 1, got {pools=} "
            f"{tokens_per_pool=} {pools_per_example=}"
        )
    delta = resolve_delta(config.delta, config.public_pool_size * pools)
    rate, per_draw = config.sampling_rate, config.tokens_per_draw
    shape = dict(
        sampling_rate=rate,
        tokens=tokens_per_pool * pools_per_example,
        mechanism=config.mechanism,
        tokens_per_draw=per_draw,
    )
    noise_name = "noise_multiplier" if config.mechanism == "gaussian" else "token_epsilon"
    noise = getattr(config, noise_name)
    if noise is None:
        noise = accounting.calibrate_fewshot(
            target_epsilon=config.target_epsilon, delta=delta, **shape
        )
    eps = accounting.fewshot_epsilon(delta, **shape, **{noise_name: noise})
    return FewShotPlan(
        public_pool_size=config.public_pool_size,
        pools=pools,
        sampling_rate=rate,
        tokens=tokens_per_pool,
        tokens_per_draw=per_draw,
        mechanism=config.mechanism,
        noise_multiplier=noise if config.mechanism == "gaussian" else None,
        token_epsilon=noise if config.mechanism == "rnm" else None,
        subsets=config.subsets,
        delta=delta,
        epsilon=eps,
        pools_per_example=pools_per_example,
    )


def plan_for(
    private_rows: Sequence[Mapping[str, Any]],
    targets: Sequence[Mapping[str, Any]],
    template: PromptTemplate,
    config: FewShotConfig,
    *,
    pool_field: str | None = None,
    pools_per_example: int = 1,
) -> FewShotPlan:
    """Validates the inputs and fixes the run's guarantee (before any model is loaded).

    `pools_per_example`: most pools one private example's rows sit in (overlapping pools
    repeat its row once per `pool_field` value); every token is charged that many times.
    The private rows are read only to refuse a pool smaller than declared.

    Raises:
      ValueError: no targets, a field the template reads is missing, a pool smaller than
        the declared public pool size (named by its label, size never shown), or a bad
        delta.
    """
    if not targets:
        raise ValueError("nothing to generate: no targets")
    shot_fields, target_fields = template.fields()
    if private_rows:
        missing = shot_fields - set(private_rows[0])
        if pool_field is not None and pool_field not in private_rows[0]:
            missing |= {pool_field}
        if missing:
            raise ValueError(
                f"private rows lack field(s) {sorted(missing)}; have {sorted(private_rows[0])}"
            )
    missing = target_fields - set(targets[0])
    if missing:
        raise ValueError(f"targets lack field(s) {sorted(missing)}")
    pools = _pools(private_rows, targets, pool_field, config.min_pool_size)
    count, tokens = _pool_budget(pools, config)
    return plan_privacy(config, tokens, count, pools_per_example)


def _pool_budget(pools: Sequence[np.ndarray], config: FewShotConfig) -> tuple[int, int]:
    """(distinct pools, most tokens one pool releases); pools are told apart by identity."""
    counts = collections.Counter(map(id, pools))
    return len(counts), max(counts.values()) * config.max_new_tokens


def _check_plan(plan: FewShotPlan, config: FewShotConfig, pools: Sequence[np.ndarray]) -> None:
    """Refuses a plan that does not cover this run (it would under-charge), or that claims
    a guarantee other than the config's (the metadata states the config next to the plan's
    figures; a noise-off plan, an audit's, claims none)."""
    count, tokens = _pool_budget(pools, config)
    gaussian = config.mechanism == "gaussian"
    noise = plan.noise_multiplier if gaussian else plan.token_epsilon
    given = config.noise_multiplier if gaussian else config.token_epsilon
    other = (
        (given is not None and noise != given)
        or (config.target_epsilon is not None and plan.epsilon > config.target_epsilon)
        or plan.delta != resolve_delta(config.delta, config.public_pool_size * plan.pools)
    )
    if (
        (other and math.isfinite(plan.epsilon))
        or plan.subsets != config.subsets
        or plan.mechanism != config.mechanism
        or plan.tokens_per_draw != config.tokens_per_draw
        or plan.public_pool_size != config.public_pool_size
        or plan.sampling_rate != config.sampling_rate
        or plan.pools < count
        or tokens > plan.tokens
    ):
        raise ValueError("the privacy plan does not cover this run; make it with plan_for")
