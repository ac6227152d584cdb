"""How to pick the next token (`SamplingConfig`): the settings alone, without jax, so that
a config that names them (the query generator's, the main job's) loads without the numeric
libraries. The sampling itself is `synthgen.models.sampling`."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class SamplingConfig:
    """How to pick the next token. `temperature == 0` means greedy.

    Attributes:
      temperature: softmax temperature; 0 selects the argmax.
      top_k: keep only the k most likely tokens (0 = no cut).
      top_p: keep the smallest set of tokens whose mass reaches p (1.0 = no cut).
    """

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature=}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0, got {self.top_k=}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p=}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0
