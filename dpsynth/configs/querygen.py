"""Query-generator presets: tiny (tests), CPU demo, and the paper's GPU/TPU sizes.

A config file shipped with the package and loaded by path: `dpsynth.config_files.querygen_preset`
looks a name up in `PRESETS` (`--config NAME`), or in a copy of this file
(`--config path/to/file.py:NAME`).

Carranza et al. 2023 hyper-parameters (t5_small, t5_base): learning rate 1e-3, clip norm
0.1, batch 1024, 30 epochs, input 384 / target 128 tokens, delta = 1/(2n), nucleus p = 0.8.
T5 weights do not ship on PyPI: pass `--base /path/to/hf/t5-small` (config.json +
model.safetensors + spiece.model).
"""

import dataclasses

from synthgen.dp_plan import DPConfig
from synthgen.querygen_config import GeneratorConfig

_TINY_DP = DPConfig(
    batch_size=32,
    epochs=3,
    clip_norm=1.0,
    learning_rate=1e-2,
    target_epsilon=8.0,
    physical_batch=16,
    microbatch=8,
    checkpoint_every=20,
)

_TINY_T5 = GeneratorConfig(
    family="t5",
    base="random:tiny",
    dp=_TINY_DP,
    vocab_size=512,
    input_len=64,
    target_len=16,
    max_new_tokens=12,
    generation_batch=32,
)
# Carranza et al.'s sizes (module docstring); t5_base halves the physical batch for memory.
_T5_SMALL = GeneratorConfig(
    family="t5",
    base="t5-small",
    input_len=384,
    target_len=128,
    max_new_tokens=32,
    generation_batch=64,
    dp=DPConfig(
        batch_size=1024,
        epochs=30,
        clip_norm=0.1,
        learning_rate=1e-3,
        target_epsilon=8.0,
        physical_batch=128,
        microbatch=16,
        checkpoint_every=100,
    ),
)

PRESETS: dict[str, GeneratorConfig] = {
    "tiny_t5": _TINY_T5,
    "tiny_llama": _TINY_T5.replace(family="llama"),
    # The demo: LoRA on SmolLM2-135M-Instruct, sized to finish in ~10 minutes on 2 cores
    # (25 steps of ~32 pairs at ~1.5 pairs/s; the first sentence of a lead paragraph, within
    # 64 tokens, usually holds what its short description says).
    "smollm2_lora_cpu": GeneratorConfig(
        family="llama",
        base="smollm2-135m-instruct",
        lora_rank=8,
        lora_alpha=16.0,
        input_len=64,
        target_len=16,
        max_new_tokens=16,
        generation_batch=8,
        dp=dataclasses.replace(
            _TINY_DP,
            epochs=0.1,
            learning_rate=2e-3,
            physical_batch=8,
            microbatch=4,
            checkpoint_every=5,
        ),  # fmt: skip
    ),
    "t5_small": _T5_SMALL,
    "t5_base": _T5_SMALL.replace(base="t5-base", dp_physical_batch=64, dp_microbatch=8),
}


def get(name: str) -> GeneratorConfig:
    """Returns a preset by name; ValueError naming the presets otherwise."""
    try:
        return PRESETS[name]
    except KeyError:
        raise ValueError(f"unknown preset {name!r}; presets: {', '.join(PRESETS)}") from None
