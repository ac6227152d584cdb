"""What defines a query-generator run (`GeneratorConfig`; presets: `dpsynth/configs/querygen.py`).

The settings alone, without jax: a config that names them (the main job's) loads without the
numeric libraries. Training and generating are `synthgen.querygen`.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

from synthgen.dp_plan import DPConfig
from synthgen.models.sampling_config import SamplingConfig

Family = Literal["t5", "llama"]
COMPUTE_DTYPES = ("float32", "bfloat16")
VOCABULARY_CORPUS = "wiki-summaries-en"
VOCABULARY_DOCUMENTS = 1000
"""A random-init base's vocabulary is trained on the first `VOCABULARY_DOCUMENTS` lead
paragraphs of the public corpus `VOCABULARY_CORPUS`, whatever the run trains on."""


@dataclasses.dataclass(frozen=True)
class GeneratorConfig:
    """Everything that defines a query-generator run (presets: `dpsynth/configs/querygen.py`).

    Attributes:
      family: "t5" or "llama".
      base: asset name or local path of the pretrained model, or "random:<preset>" for a
        randomly initialised model of that preset (tests), whose SentencePiece vocabulary
        of `vocab_size` pieces is trained on a fixed public corpus
        (`synthgen.querygen.public_vocabulary_texts`), never on the run's pairs.
      lora_rank: 0 for full fine-tuning, else the LoRA rank.
      input_len, target_len: token budgets of document prompt and query.
      dp: DP-Adafactor hyper-parameters.
      top_p, temperature, queries_per_doc, max_new_tokens, generation_batch: sampling.
      dtype: compute dtype of the model's matmuls ("float32" or "bfloat16": accelerators);
        parameters, optimizer state, the clipped sum and the noise stay float32.
      remat: recompute each block in the backward pass (less activation memory, about a
        third more compute): what lets t5-base at the paper's batch fit one GPU.
    """

    family: Family
    base: str
    dp: DPConfig
    lora_rank: int = 0
    lora_alpha: float = 16.0
    input_len: int = 384
    target_len: int = 128
    vocab_size: int = 512
    top_p: float = 0.8
    temperature: float = 1.0
    queries_per_doc: int = 1
    max_new_tokens: int = 32
    generation_batch: int = 16
    dtype: str = "float32"
    remat: bool = False

    def __post_init__(self) -> None:
        if self.family not in ("t5", "llama"):
            raise ValueError(f"family must be 't5' or 'llama', got {self.family=}")
        if self.lora_rank < 0 or self.input_len < 8 or self.target_len < 2:
            raise ValueError(f"bad sizes: {self.lora_rank=}, {self.input_len=}, {self.target_len=}")
        if self.queries_per_doc < 1 or self.max_new_tokens < 1 or self.generation_batch < 1:
            raise ValueError("queries_per_doc, max_new_tokens, generation_batch must be >= 1")
        SamplingConfig(temperature=self.temperature, top_p=self.top_p)  # validates
        if self.dtype not in COMPUTE_DTYPES:
            raise ValueError(f"dtype must be one of {COMPUTE_DTYPES}, got {self.dtype=}")

    def replace(self, **changes) -> GeneratorConfig:
        dp_changes = {k[3:]: changes.pop(k) for k in list(changes) if k.startswith("dp_")}
        if dp_changes:
            changes["dp"] = dataclasses.replace(self.dp, **dp_changes)
        return dataclasses.replace(self, **changes)
