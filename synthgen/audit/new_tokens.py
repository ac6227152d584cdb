"""New vocabulary rows for the black-box audit's new-token canaries (model surgery).

`extend_vocabulary` gives a query generator `num_new` tokens whose embedding rows (and output
columns, when untied) are trainable and drawn like the existing rows; `Extension` rebuilds
the full parameters and the per-example loss `dp_train.train` takes. With `num_new = 0` it
is the unchanged generator (the rare-token kind). Panda et al. 2025 (arXiv 2503.06808).

Privacy:
  The new rows are drawn from the public canary-material stream; nothing here reads a
  private example.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import traverse_util

from synthgen import dp_train
from synthgen.generator_models import merge_params, split_trainable, token_nll

PyTree = Any


def embedding_paths(params: PyTree) -> tuple[tuple[str, ...], tuple[str, ...] | None]:
    """(input embedding path, untied output kernel path or None) of a T5 or Llama tree."""
    flat = traverse_util.flatten_dict(params)
    embed = next((p for p in (("embed", "embedding"), ("shared", "embedding")) if p in flat), None)
    if embed is None:
        raise ValueError("no token embedding (embed/embedding or shared/embedding) in the model")
    head = ("lm_head", "kernel")
    return embed, head if head in flat else None


@dataclasses.dataclass(frozen=True)
class Extension:
    """A generator with `num_new` new tokens: ids V .. V + num_new - 1, trainable rows.

    `trainable` is {"model": the base trainable tree (LoRA adapters or all), "new": the new
    rows} and `frozen` the base frozen tree; `full_params` rebuilds the model's parameters
    (embedding [V + num_new, d], and the output kernel [d, V + num_new] when untied) and
    `loss_fn` is the per-example loss `dp_train.train` takes. With `num_new = 0` it is the
    unchanged generator (the `rare` kind).

    A change inside `synthgen.generator_models` (a `split_trainable` that can name extra
    trainable embedding rows) would make this wrapper unnecessary; it lives here so that
    the audit touches no training code.
    """

    family: Any
    trainable: PyTree
    frozen: PyTree
    base_vocab: int
    num_new: int
    embed_path: tuple[str, ...]
    head_path: tuple[str, ...] | None

    def full_params(self, trainable: PyTree, frozen: PyTree | None = None) -> PyTree:
        """The model's parameters; `frozen` defaults to the extension's own frozen tree."""
        params = merge_params(trainable["model"], self.frozen if frozen is None else frozen)
        if not self.num_new:
            return params
        flat = dict(traverse_util.flatten_dict(params))
        table = flat[self.embed_path]
        flat[self.embed_path] = jnp.concatenate(
            [table, trainable["new"]["embedding"].astype(table.dtype)], axis=0
        )
        if self.head_path is not None:
            head = flat[self.head_path]
            flat[self.head_path] = jnp.concatenate(
                [head, trainable["new"]["lm_head"].astype(head.dtype)], axis=1
            )
        return traverse_util.unflatten_dict(flat)

    def loss_fn(self) -> dp_train.LossFn:
        logits_fn = self.family.logits_fn()

        def loss(trainable, frozen, ex):
            # `frozen` is an argument (not closed over): jit keeps it out of the program.
            logits = logits_fn(self.full_params(trainable, frozen), ex)
            return token_nll(logits, ex["targets"], ex["target_mask"])

        return loss


def _like(rng: np.random.Generator, table: np.ndarray, shape, *, axis: int) -> np.ndarray:
    mean = table.mean(axis=axis, keepdims=True)
    std = table.std(axis=axis, keepdims=True)
    return (mean + std * rng.standard_normal(shape)).astype(table.dtype)


def extend_vocabulary(
    family, params: PyTree, num_new: int, *, lora: bool, rng: np.random.Generator
) -> Extension:
    """Adds `num_new` tokens with trainable rows drawn like the existing rows.

    Each new row (and output column, when untied) is drawn from N(mean, diag(var)) of the
    existing rows, coordinate by coordinate: public values at the scale of the other rows,
    so Adafactor's parameter-scaled update (full fine-tuning) is not shrunk to nothing, as
    it would be for rows all set to the mean. The base score calibrates their differences.

    Args:
      family: a `synthgen.generator_models` family (T5Family or LlamaFamily).
      params: the base model's full parameters.
      num_new: new tokens (0: no change).
      lora: the base trainable tree is the LoRA adapters (else every parameter).
      rng: the public canary-material stream.
    """
    if num_new < 0:
        raise ValueError(f"num_new must be >= 0, got {num_new=}")
    embed_path, head_path = embedding_paths(params)
    flat = traverse_util.flatten_dict(params)
    base_vocab = int(flat[embed_path].shape[0])
    model_trainable, frozen = split_trainable(params, lora=lora)
    new: dict[str, jax.Array] = {}
    if num_new:
        table = np.asarray(flat[embed_path], np.float32)
        new["embedding"] = _like(rng, table, (num_new, table.shape[1]), axis=0)
        if head_path is not None:
            head = np.asarray(flat[head_path], np.float32)
            new["lm_head"] = _like(rng, head, (head.shape[0], num_new), axis=1)
        config = dataclasses.replace(family.config, vocab_size=base_vocab + num_new)
        family = dataclasses.replace(family, config=config)
    trainable = {"model": model_trainable, **({"new": new} if new else {})}
    return Extension(family, trainable, frozen, base_vocab, num_new, embed_path, head_path)
