"""The dual encoder's training settings (`RetrieverConfig`), without jax: the main job's config
names them and loads without the numeric libraries. Training is `retriever.train`."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class RetrieverConfig:
    """Hyper-parameters of dual-encoder training (non-private and the DP baseline's shapes).

    Attributes:
      batch_size: pairs per step (in-batch negatives: batch_size - 1 per query).
      epochs: passes over the pairs. Steps have a fixed batch, so the n mod batch_size
        pairs that fill no batch are left out of each epoch (others each epoch: the order
        is reshuffled); `RetrieverResult.pairs_left_out_per_epoch` says how many.
      learning_rate: AdamW learning rate (linear warm-up over the first 10% of steps).
      weight_decay: AdamW weight decay.
      temperature: softmax temperature tau (logit scale 1 / tau).
      learn_temperature: learn log(1 / tau), initialised at the given temperature.
      max_query_len, max_doc_len: token budgets (static shapes).
      separate_towers: separate query and document encoders (both from the same base).
      checkpoint_every: steps between checkpoints.
      seed: data order (a public choice: this trainer sees no private data).
    """

    batch_size: int = 32
    epochs: float = 1.0
    learning_rate: float = 5e-5
    weight_decay: float = 0.01
    temperature: float = 0.05
    learn_temperature: bool = False
    max_query_len: int = 32
    max_doc_len: int = 128
    separate_towers: bool = False
    checkpoint_every: int = 100
    seed: int = 0

    def __post_init__(self) -> None:
        if self.batch_size < 2:
            raise ValueError(f"in-batch softmax needs batch_size >= 2, got {self.batch_size=}")
        if not (self.epochs > 0 and self.learning_rate > 0 and self.temperature > 0):
            raise ValueError(
                f"epochs, learning_rate and temperature must be > 0, got {self.epochs=}, "
                f"{self.learning_rate=}, {self.temperature=}"
            )
        if self.max_query_len < 4 or self.max_doc_len < 4 or self.checkpoint_every < 1:
            raise ValueError(f"bad sizes: {self.max_query_len=}, {self.max_doc_len=}")
