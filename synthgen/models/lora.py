"""Dense layer with an optional low-rank adapter (LoRA, Hu et al. 2021).

y = x W (+ b) + (alpha / r) * x A B, with A [in, r] ~ N(0, 1/in) and B [r, out] = 0 at init,
so a fresh adapter leaves the model unchanged. Adapter parameters are named ``lora_a`` and
``lora_b``; training code selects trainable parameters by these names (`is_lora_path`).

Mind Adafactor: its default `multiply_by_parameter_scale=True` scales each update by the
parameter's RMS, which is 0 for B at init, so B would never move; DP training turns that
option off for LoRA.

Every product x @ W of the layer is tapped for ghost clipping (`synthgen.models.taps`).
"""

from __future__ import annotations

from collections.abc import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

from synthgen.models.taps import tap

LORA_NAMES = ("lora_a", "lora_b")


class LoraDense(nn.Module):
    """`nn.Dense` plus a rank-`rank` adapter when `rank > 0`.

    The base kernel is named ``kernel`` ([in, out], the Flax convention) and the bias
    ``bias``, so checkpoints load the same with or without an adapter.
    """

    features: int
    use_bias: bool = False
    rank: int = 0
    alpha: float = 16.0
    dtype: jnp.dtype = jnp.float32
    kernel_init: nn.initializers.Initializer = nn.initializers.lecun_normal()

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        in_features = x.shape[-1]
        kernel = self.param("kernel", self.kernel_init, (in_features, self.features))
        x = x.astype(self.dtype)
        y = self._product("kernel", x, kernel)
        if self.use_bias:
            y = y + self.param("bias", nn.initializers.zeros, (self.features,)).astype(self.dtype)
        if self.rank > 0:
            a = self.param(
                "lora_a", nn.initializers.normal(stddev=in_features**-0.5), (in_features, self.rank)
            )
            b = self.param("lora_b", nn.initializers.zeros, (self.rank, self.features))
            y = y + (self.alpha / self.rank) * self._product(
                "lora_b", self._product("lora_a", x, a), b
            )
        return y

    def _product(self, name: str, x: jax.Array, weight: jax.Array) -> jax.Array:
        """x @ weight, tapped for ghost clipping under the weight's name."""
        return tap(self, name, x, jnp.dot(x, weight.astype(self.dtype)))


def is_lora_path(path: Sequence[str]) -> bool:
    """True for parameter paths (tuples of keys) that belong to a LoRA adapter."""
    return bool(path) and str(path[-1]) in LORA_NAMES
