"""The hyper-parameters of a DP few-shot generation run (`FewShotConfig`).

Privacy:
  Everything here is public: the declared `public_pool_size` fixes the rate q = M * shots /
  public_pool_size the accountant assumes; real pool sizes never enter the config.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Literal

from synthgen.privacy import accounting

Mechanism = Literal["gaussian", "rnm"]
Resample = Literal["token", "example"]


@dataclasses.dataclass(frozen=True)
class FewShotConfig:
    """Hyper-parameters of a DP few-shot generation run.

    Attributes:
      public_pool_size: declared public figure N_pool (required): the accounting assumes
        q = M * shots / N_pool for every pool; a real pool smaller than this is refused.
      subsets: M, prompts per token.
      shots: expected private examples per prompt in a pool of exactly N_pool examples.
      max_shots: most examples a prompt keeps (default 2 * shots).
      shot_tokens: every text field (of a private example or a target) is cut to this
        many tokens in a prompt.
      max_new_tokens: token limit of a synthetic example.
      mechanism: "gaussian" or "rnm".
      target_epsilon: calibrate the noise to this epsilon (or give the noise directly).
      noise_multiplier: sigma of ``gaussian``.
      token_epsilon: per-token epsilon of ``rnm``.
      delta: must be below 1 / N, N = public_pool_size x pools; default 1 / (10 N).
      public_vocab: K of RVP; None = the whole vocabulary.
      public_prior: lambda of the public soft prior (0 = none).
      resample: "token" (fresh draw per token) or "example" (one draw, KV cache).
      stop_at_newline: a token containing a newline ends the example (single paragraphs).
      allow_small_pools: run pools smaller than `public_pool_size` instead of refusing them
        (the guarantee is unchanged: each example joins with probability exactly q; small
        pools fill fewer shots). For pools of DP-released keys, where refusing would itself
        read a pool's size.
      extra_candidates: public token ids added to the RVP candidates (e.g. the tokens of
        DP-released keywords): private data may enter them only through a DP release.
    """

    public_pool_size: int = dataclasses.field(kw_only=True)
    subsets: int = 10
    shots: int = 4
    max_shots: int | None = None
    shot_tokens: int = 96
    max_new_tokens: int = 64
    mechanism: Mechanism = "gaussian"
    target_epsilon: float | None = None
    noise_multiplier: float | None = None
    token_epsilon: float | None = None
    delta: float | None = None
    public_vocab: int | None = None
    public_prior: float = 0.0
    resample: Resample = "token"
    stop_at_newline: bool = True
    allow_small_pools: bool = False
    extra_candidates: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        for name in ("subsets", "shots", "shot_tokens", "max_new_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {name}={getattr(self, name)}")
        need = self.subsets * self.shots
        if self.public_pool_size < need:
            raise ValueError(
                f"public_pool_size must be >= subsets * shots = {need} (rate <= 1), "
                f"got {self.public_pool_size=}"
            )
        if self.max_shots is not None and self.max_shots < self.shots:
            raise ValueError(f"max_shots must be >= shots, got {self.max_shots=}")
        if self.mechanism not in accounting.FEWSHOT_MECHANISMS:
            raise ValueError(f"mechanism must be gaussian or rnm, got {self.mechanism=}")
        if self.resample not in accounting.FEWSHOT_RESAMPLING:
            raise ValueError(f"resample must be token or example, got {self.resample=}")
        noise = self.noise_multiplier if self.mechanism == "gaussian" else self.token_epsilon
        if (self.target_epsilon is None) == (noise is None):
            param = "noise_multiplier" if self.mechanism == "gaussian" else "token_epsilon"
            raise ValueError(f"give exactly one of target_epsilon and {param}")
        for name in ("target_epsilon", "noise_multiplier", "token_epsilon"):
            value = getattr(self, name)
            if value is not None and not (math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be a finite positive number, got {name}={value}")
        if self.delta is not None and not 0 < self.delta < 1:
            raise ValueError(f"delta must be in (0, 1), got {self.delta=}")
        if self.public_vocab is not None and self.public_vocab < 1:
            raise ValueError(f"public_vocab must be >= 1, got {self.public_vocab=}")
        if any(not isinstance(t, int) or t < 0 for t in self.extra_candidates):
            raise ValueError("extra_candidates must be token ids (ints >= 0)")
        if self.public_prior < 0:
            raise ValueError(f"public_prior must be >= 0, got {self.public_prior=}")

    @property
    def min_pool_size(self) -> int:
        """Pools below this size are refused (0: none is, see `allow_small_pools`)."""
        return 0 if self.allow_small_pools else self.public_pool_size

    @property
    def shots_cap(self) -> int:
        return self.max_shots or 2 * self.shots

    @property
    def tokens_per_draw(self) -> int:
        """Tokens that share one Poisson draw: 1 (resample "token") or max_new_tokens."""
        return 1 if self.resample == "token" else self.max_new_tokens

    @property
    def sampling_rate(self) -> float:
        """q = M * shots / public_pool_size: each example's inclusion probability."""
        return self.subsets * self.shots / self.public_pool_size
