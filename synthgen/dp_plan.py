"""The plan of a DP training run, fixed before it starts: `DPConfig` (what the run does),
`plan_privacy` (delta, steps and sigma or epsilon for a dataset size) and `PrivacyPlan` (the
guarantee the accountant states). Below `synthgen.dp_train` and `synthgen.work_folder`.

Privacy:
  The accountant reads the sampling (Poisson: add/remove-one; fixed-size shuffling:
  replace-one), the batch size, the steps and sigma from the same `DPConfig` that drives
  the sampler, so the stated guarantee is that of the run the code does.
"""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Literal

from synthgen import run_seed
from synthgen.privacy import accounting

PER_EXAMPLE_NORMS = ("ghost", "vmap")


@dataclasses.dataclass(frozen=True)
class DPConfig:
    """Hyper-parameters of a DP-Adafactor run.

    Exactly one of `noise_multiplier` and `target_epsilon` is set; `noise_multiplier=0` is
    an explicitly NON-private reference run (no noise, epsilon = infinity, refused by the
    ledger). `delta=None` means 1/(2n) (Carranza et al.). `seed=None` (production) draws the
    128-bit run seed from OS entropy; fixed seeds (in [0, 2**128)) are for tests.
    `per_example_norms`: "ghost" (`synthgen.ghost_clipping`, where the caller gives a tapped
    loss) or "vmap" (materialised per-example gradients); both release the same sum.
    """

    batch_size: int = 1024
    epochs: float = 30.0
    clip_norm: float = 0.1
    learning_rate: float = 1e-3
    noise_multiplier: float | None = None
    target_epsilon: float | None = 8.0
    delta: float | None = None
    sampling: accounting.Sampling = "poisson"
    accountant: accounting.AccountantKind = "pld"
    physical_batch: int = 16
    microbatch: int = 4
    checkpoint_every: int = 50
    seed: int | None = None
    per_example_norms: Literal["ghost", "vmap"] = "ghost"

    def __post_init__(self) -> None:
        if (self.noise_multiplier is None) == (self.target_epsilon is None):
            raise ValueError("set exactly one of noise_multiplier and target_epsilon")
        if self.target_epsilon is not None and not self.target_epsilon > 0:
            raise ValueError(f"target_epsilon must be > 0, got {self.target_epsilon=}")
        if self.noise_multiplier is not None and not self.noise_multiplier >= 0:
            raise ValueError(f"noise_multiplier must be >= 0, got {self.noise_multiplier=}")
        for name in ("batch_size", "physical_batch", "microbatch", "checkpoint_every"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.physical_batch % self.microbatch:
            raise ValueError(
                f"physical_batch must be a multiple of microbatch, got "
                f"{self.physical_batch=}, {self.microbatch=}"
            )
        if not (self.clip_norm > 0 and self.learning_rate > 0 and self.epochs > 0):
            raise ValueError("clip_norm, learning_rate and epochs must be positive")
        if self.sampling not in accounting.SAMPLINGS:
            raise ValueError(f"sampling must be one of {accounting.SAMPLINGS}")
        if self.accountant not in accounting.ACCOUNTANTS:
            raise ValueError(f"accountant must be one of {accounting.ACCOUNTANTS}")
        if self.seed is not None:
            run_seed.check_seed(self.seed)
        if self.per_example_norms not in PER_EXAMPLE_NORMS:
            raise ValueError(f"per_example_norms must be one of {PER_EXAMPLE_NORMS}")


@dataclasses.dataclass(frozen=True)
class PrivacyPlan:
    """The guarantee of a run, fixed before it starts: what the accountant assumes.

    A `synthgen.privacy.release_plan.ReleasePlan`: `event` composed under `relation` with
    `accountant` at `delta` gives `epsilon` (infinity for the non-private reference run,
    which has no event).
    """

    num_examples: int
    batch_size: int
    steps: int
    noise_multiplier: float
    clip_norm: float
    delta: float
    epsilon: float
    sampling: str
    accountant: str

    @property
    def sampling_rate(self) -> float:
        return self.batch_size / self.num_examples

    def _accountant_kwargs(self, steps: int) -> dict:
        """The accountant's keywords of this run's first `steps` steps (all but sigma, delta)."""
        return dict(
            num_examples=self.num_examples,
            batch_size=self.batch_size,
            steps=steps,
            sampling=self.sampling,
            accountant=self.accountant,
        )

    @property
    def event(self):
        return accounting.dpsgd_event(
            noise_multiplier=self.noise_multiplier, **self._accountant_kwargs(self.steps)
        )

    @property
    def relation(self) -> accounting.NeighboringRelation:
        """The neighbouring relation of `event`: add/remove-one (Poisson) or replace-one
        (shuffle); its ``name`` is what the ledger records."""
        return accounting.neighboring_relation(self.sampling)

    @property
    def private(self) -> bool:
        """False for the explicitly non-private reference run (noise_multiplier = 0)."""
        return self.noise_multiplier > 0

    def epsilon_after(self, steps: int) -> float:
        """Epsilon spent after the first `steps` steps (for progress reporting)."""
        if steps == 0:
            return 0.0
        if not self.private:
            return math.inf
        return accounting.dpsgd_epsilon(
            noise_multiplier=self.noise_multiplier,
            delta=self.delta,
            **self._accountant_kwargs(steps),
        )

    def to_dict(self) -> dict:
        out = dataclasses.asdict(self)
        out.update(
            private=self.private,
            sampling_rate=self.sampling_rate,
            neighboring_relation=self.relation.name,
            dp_event=json.loads(accounting.event_to_json(self.event)) if self.private else None,
        )
        return out


def plan_privacy(config: DPConfig, num_examples: int) -> PrivacyPlan:
    """Resolves delta, steps and sigma (or epsilon) for a dataset of `num_examples`.

    Raises:
      ValueError: empty dataset, batch larger than the data, delta >= 1/n.
    """
    if num_examples < 1:
        raise ValueError("the training set is empty")
    if config.batch_size > num_examples:
        raise ValueError(f"batch_size={config.batch_size} exceeds the {num_examples} examples")
    delta = config.delta if config.delta is not None else 1.0 / (2 * num_examples)
    if not 0 < delta < 1.0 / num_examples:
        raise ValueError(f"delta must be in (0, 1/n) = (0, {1 / num_examples:.3g}), got {delta=}")
    steps = accounting.steps_for_epochs(num_examples, config.batch_size, config.epochs)
    shape = dict(
        num_examples=num_examples,
        batch_size=config.batch_size,
        steps=steps,
        sampling=config.sampling,
        accountant=config.accountant,
    )
    sigma = config.noise_multiplier
    if sigma is None:
        sigma = accounting.calibrate_noise_multiplier(
            target_epsilon=config.target_epsilon, delta=delta, **shape
        )
    if sigma == 0:
        eps = math.inf  # the explicitly non-private reference run
    else:
        eps = accounting.dpsgd_epsilon(noise_multiplier=sigma, delta=delta, **shape)
    return PrivacyPlan(
        num_examples,
        config.batch_size,
        steps,
        float(sigma),
        config.clip_norm,
        delta,
        eps,
        config.sampling,
        config.accountant,
    )
