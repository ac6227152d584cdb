"""Ghost-clipping taps: what a layer records so that per-example norms need no gradients.

A tapped use of a weight W (`synthgen.ghost_clipping` reads them):

* a product x @ W (`LoraDense`: ``kernel``, ``lora_a``, ``lora_b``) sows x under W's name;
* a lookup W[ids] (`TappedEmbed.__call__`) sows the ids under ``lookup``;
* a product q @ W^T (`TappedEmbed.attend`, a tied output layer) sows q under ``attend``;

each into the ``intermediates`` collection, and, when a ``perturbations`` collection is passed
to `apply`, adds its zero array (named after the use and its call index) to the output, so the
gradient with respect to that array is the output gradient dL/d(output). Without those
collections (every ordinary `init` and `apply`) a tap does nothing.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

TAP_INPUTS = "intermediates"
TAP_OUTPUTS = "perturbations"
LOOKUP, ATTEND = "lookup", "attend"


def tap(module: nn.Module, name: str, recorded: jax.Array, output: jax.Array) -> jax.Array:
    """Sows `recorded` under `name`; adds the perturbation of this call to `output`."""
    calls = (
        len(module.get_variable(TAP_INPUTS, name)) if module.has_variable(TAP_INPUTS, name) else 0
    )
    module.sow(TAP_INPUTS, name, recorded)
    key = perturbation_name(name, calls)
    if module.has_variable(TAP_OUTPUTS, key):
        output = output + module.get_variable(TAP_OUTPUTS, key).astype(output.dtype)
    return output


def perturbation_name(name: str, call: int) -> str:
    """The perturbation of a tap's `call`-th use: the name itself for the first."""
    return name if call == 0 else f"{name}_{call}"


class TappedEmbed(nn.Module):
    """A token embedding [num_embeddings, features] (param ``embedding``, as `nn.Embed`) with taps.

    `__call__` looks rows up; `attend` is the tied output layer q @ embedding^T.
    """

    num_embeddings: int
    features: int
    dtype: jnp.dtype | None = None
    embedding_init: nn.initializers.Initializer = nn.initializers.normal(1.0)

    def setup(self) -> None:
        self.embedding = self.param(
            "embedding", self.embedding_init, (self.num_embeddings, self.features)
        )

    def __call__(self, ids: jax.Array) -> jax.Array:
        ids = jnp.asarray(ids, jnp.int32)
        table = self.embedding if self.dtype is None else self.embedding.astype(self.dtype)
        return tap(self, LOOKUP, ids, jnp.take(table, ids, axis=0))

    def attend(self, query: jax.Array, *, preferred_element_type=None) -> jax.Array:
        dtype = self.dtype or query.dtype
        query = query.astype(dtype)
        logits = jnp.dot(
            query, self.embedding.T.astype(dtype), preferred_element_type=preferred_element_type
        )
        return tap(self, ATTEND, query, logits)
