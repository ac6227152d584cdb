"""Validation shared by the model configs (`T5Config`, `LlamaConfig`, `BertConfig`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

DTYPES = ("float32", "bfloat16", "float16")


def check_config(
    config: Any,
    positive_ints: Sequence[str],
    positive: Sequence[str] = (),
    lora_targets: Sequence[str] | None = None,
) -> None:
    """ValueError naming the first field of a model config that is out of range.

    Args:
      config: the frozen dataclass being constructed.
      positive_ints: fields that must be positive ints.
      positive: fields that must be > 0.
      lora_targets: the projections LoRA may target: then `lora_rank` must be >= 0,
        `lora_targets` among these (it is made a tuple) and `dtype` one of `DTYPES`.
    """
    for name in positive_ints:
        value = getattr(config, name)
        if not isinstance(value, int) or value <= 0:
            raise ValueError(f"{name} must be a positive int, got {name}={value!r}")
    for name in positive:
        if not getattr(config, name) > 0:
            raise ValueError(f"{name} must be > 0, got {name}={getattr(config, name)!r}")
    if lora_targets is None:
        return
    if config.lora_rank < 0:
        raise ValueError(f"lora_rank must be >= 0, got lora_rank={config.lora_rank}")
    object.__setattr__(config, "lora_targets", tuple(config.lora_targets))
    unknown = set(config.lora_targets) - set(lora_targets)
    if unknown:
        raise ValueError(f"lora_targets must be among {lora_targets}, got {unknown=}")
    if config.dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {DTYPES}, got dtype={config.dtype!r}")


def check_divides(config: Any, divisor: str, dividend: str) -> None:
    """ValueError unless field `divisor` divides field `dividend` (both positive ints)."""
    a, b = getattr(config, divisor), getattr(config, dividend)
    if b % a:
        raise ValueError(f"{divisor} must divide {dividend}, got {divisor}={a} and {dividend}={b}")
