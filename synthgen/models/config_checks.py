"""Validation shared by the model configs (`T5Config`, `LlamaConfig`, `BertConfig`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

DTYPES = ("float32", "bfloat16", "float16")


def check_positive_ints(config: Any, names: Sequence[str]) -> None:
    """ValueError naming the first field of `names` that is not a positive int."""
    for name in names:
        value = getattr(config, name)
        if not isinstance(value, int) or value <= 0:
            raise ValueError(f"{name} must be a positive int, got {name}={value!r}")


def check_divides(config: Any, divisor: str, dividend: str) -> None:
    """ValueError unless field `divisor` divides field `dividend` (both positive ints)."""
    a, b = getattr(config, divisor), getattr(config, dividend)
    if b % a:
        raise ValueError(f"{divisor} must divide {dividend}, got {divisor}={a} and {dividend}={b}")


def check_lora_and_dtype(config: Any, lora_targets: Sequence[str]) -> None:
    """Checks `lora_rank`, `dtype` and `lora_targets` (among `lora_targets`; made a tuple)."""
    if config.lora_rank < 0:
        raise ValueError(f"lora_rank must be >= 0, got lora_rank={config.lora_rank}")
    object.__setattr__(config, "lora_targets", tuple(config.lora_targets))
    unknown = set(config.lora_targets) - set(lora_targets)
    if unknown:
        raise ValueError(f"lora_targets must be among {lora_targets}, got {unknown=}")
    if config.dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {DTYPES}, got dtype={config.dtype!r}")
