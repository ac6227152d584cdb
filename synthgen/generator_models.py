"""Model families behind the query generator: loading, task encoding, per-example loss, sampling.

Task: document -> query. T5 reads ``generate_query: {document}`` and writes the query.
A Llama-architecture decoder reads the same instruction as a prompt (through its chat template
when it has one) and writes the query after it. Documents are public; queries are private.

Encodings have static shapes (inputs padded to `input_len`, targets to `target_len`) so one
jitted per-example loss serves every example. Losses are per example: mean token
cross-entropy over that example's own target tokens; nothing depends on the batch.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np
from flax import traverse_util

from synthgen.models.llama import Llama
from synthgen.models.lora import is_lora_path
from synthgen.models.sampling import SamplingConfig
from synthgen.models.t5 import T5, shift_right
from synthgen.models.taps import TAP_INPUTS, TAP_OUTPUTS

TASK_PREFIX = "generate_query: "
CHAT_INSTRUCTION = "Write a short search query that this document answers.\n\n"
_SENTINEL = "\x00DOCUMENT\x00"

PyTree = Any


def split_trainable(params: PyTree, *, lora: bool) -> tuple[PyTree, PyTree]:
    """(trainable, frozen): the LoRA adapters and the rest, or everything and nothing."""
    if not lora:
        return params, {}
    flat = traverse_util.flatten_dict(params)
    trainable = {k: v for k, v in flat.items() if is_lora_path(k)}
    if not trainable:
        raise ValueError("lora_rank > 0 but the model has no LoRA parameters")
    frozen = {k: v for k, v in flat.items() if not is_lora_path(k)}
    return traverse_util.unflatten_dict(trainable), traverse_util.unflatten_dict(frozen)


def merge_params(trainable: PyTree, frozen: PyTree) -> PyTree:
    """Inverse of `split_trainable`."""
    if not frozen:
        return trainable
    flat = traverse_util.flatten_dict(frozen)
    flat.update(traverse_util.flatten_dict(trainable))
    return traverse_util.unflatten_dict(flat)


def token_nll(logits: jax.Array, targets: jax.Array, mask: jax.Array) -> jax.Array:
    """Mean negative log-likelihood of `targets` over positions where `mask` is 1."""
    logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    nll = -jnp.take_along_axis(logp, targets[..., None], axis=-1)[..., 0]
    return jnp.sum(nll * mask) / jnp.maximum(jnp.sum(mask), 1.0)


def _pad(ids: Sequence[int], length: int, pad: int) -> tuple[np.ndarray, np.ndarray]:
    out = np.full(length, pad, np.int32)
    mask = np.zeros(length, np.float32)
    out[: len(ids)] = ids
    mask[: len(ids)] = 1.0
    return out, mask


@dataclasses.dataclass(frozen=True)
class _Draw:
    """The public settings of every generation batch of one `generate` call."""

    size: int  # rows per batch (T5 pads a short batch to it: a static shape)
    samples: int  # samples per row
    input_len: int
    max_new_tokens: int
    sampling: SamplingConfig
    full_rows: int  # rows of the job's full batches (its one batch, when shorter)


@dataclasses.dataclass
class _Family:
    """A model family: its config and tokenizer, per-example losses and query generation.

    A family provides `_MODULE`, `_model_inputs` and `_sample_batch`; the rest derives from
    them.
    """

    config: Any
    tokenizer: Any

    _MODULE: ClassVar[type]  # the Flax module, built from `config`
    # True: a generation row is a document with all its samples (T5); False: a row is one
    # prompt, repeated for each of a document's samples (Llama).
    _ONE_ROW_PER_DOCUMENT: ClassVar[bool]

    @property
    def module(self):
        return self._MODULE(self.config)

    def logits_fn(self):
        """fn(params, example) -> [target_len, vocab] logits predicting `example["targets"]`."""
        apply = self.apply_fn()

        def logits(params, ex):
            return apply({"params": params}, ex, mutable=False)[0]

        return logits

    def loss_fn(self):
        """fn(trainable, frozen, example) -> the mean NLL of the example's own target tokens."""
        logits_fn = self.logits_fn()

        def loss(trainable, frozen, ex):
            logits = logits_fn(merge_params(trainable, frozen), ex)
            return token_nll(logits, ex["targets"], ex["target_mask"])

        return loss

    def tapped_loss_fn(self):
        """`loss_fn` with ghost-clipping taps (`synthgen.ghost_clipping.TappedLossFn`).

        fn(trainable, frozen, perturbations, example) -> (loss, the sown layer inputs).
        """
        apply = self.apply_fn()

        def loss(trainable, frozen, perturbations, ex):
            variables = {"params": merge_params(trainable, frozen), TAP_OUTPUTS: perturbations}
            logits, state = apply(variables, ex, mutable=[TAP_INPUTS])
            return token_nll(logits, ex["targets"], ex["target_mask"]), state.get(TAP_INPUTS, {})

        return loss

    def apply_fn(self):
        """fn(variables, example, mutable) -> ([target_len, vocab] logits, mutated state)."""
        module = self.module

        def apply(variables, ex, mutable):
            args, kwargs = self._model_inputs(ex)
            out = module.apply(variables, *args, **kwargs, mutable=mutable)
            logits, state = out if mutable else (out, {})
            return logits[0], state

        return apply

    def generate(
        self,
        params,
        documents: Sequence[str],
        *,
        input_len: int,
        max_new_tokens: int,
        sampling: SamplingConfig,
        key: jax.Array,
        num_samples: int,
        batch_size: int,
        progress: bool = False,
        first_document: int = 0,
    ) -> list[list[str]]:
        """Samples `num_samples` queries per document, `batch_size` rows per batch.

        A row is a document with its `num_samples` samples (T5) or one prompt per sample
        (Llama). Each batch's key is `key` folded with its first row's position in the whole
        job (`first_document` * rows per document + offset): a shard (`synthgen.shards`)
        that starts at document `first_document` draws exactly what the unsharded job draws.
        """
        from tqdm.auto import tqdm

        if num_samples < 1:
            raise ValueError(f"num_samples must be >= 1, got {num_samples=}")
        samples_per_row = num_samples if self._ONE_ROW_PER_DOCUMENT else 1
        rows_per_document = num_samples // samples_per_row
        rows = [d for d in documents for _ in range(rows_per_document)]
        first_row = first_document * rows_per_document
        full_rows = min(batch_size, len(rows))  # a short last batch is padded to it (Llama)
        draw = _Draw(batch_size, samples_per_row, input_len, max_new_tokens, sampling, full_rows)
        texts: list[str] = []
        total = len(rows) * samples_per_row
        bar = tqdm(total=total, desc="generate", unit="query", disable=not progress)
        with bar:
            for start in range(0, len(rows), batch_size):
                part = rows[start : start + batch_size]
                batch_key = jax.random.fold_in(key, first_row + start)
                texts += self._sample_batch(params, part, batch_key, draw)
                bar.update(len(part) * samples_per_row)
        return [texts[i : i + num_samples] for i in range(0, len(texts), num_samples)]


@dataclasses.dataclass
class T5Family(_Family):
    """T5 encoder-decoder (synthgen.models.t5)."""

    name: str = "t5"
    _MODULE = T5
    _ONE_ROW_PER_DOCUMENT = True

    def encode_input(self, document: str, input_len: int) -> list[int]:
        ids = self.tokenizer.encode(TASK_PREFIX + document)[: input_len - 1]
        return ids + [self.tokenizer.eos_id]

    def encode_pairs(self, documents, queries, input_len: int, target_len: int) -> dict:
        tok = self.tokenizer
        rows = {k: [] for k in ("input_ids", "input_mask", "targets", "target_mask")}
        for document, query in zip(documents, queries, strict=True):
            inp, inp_mask = _pad(self.encode_input(document, input_len), input_len, tok.pad_id)
            tgt_ids = tok.encode(query)[: target_len - 1] + [tok.eos_id]
            tgt, tgt_mask = _pad(tgt_ids, target_len, tok.pad_id)
            for key, value in zip(rows, (inp, inp_mask, tgt, tgt_mask), strict=True):
                rows[key].append(value)
        return {k: np.stack(v) for k, v in rows.items()}

    def _model_inputs(self, ex: dict) -> tuple[tuple, dict]:
        """`T5.__call__`'s arguments for one example (a batch of one), teacher-forced."""
        cfg = self.config
        targets = ex["targets"][None]
        decoder_in = shift_right(targets, cfg.decoder_start_token_id, cfg.pad_token_id)
        return (
            ex["input_ids"][None],
            ex["input_mask"][None],
            decoder_in,
            ex["target_mask"][None],
        ), {}

    def _sample_batch(self, params, documents: list[str], key: jax.Array, draw: _Draw):
        """The decoded samples of `documents`, `draw.samples` per document, in order."""
        from synthgen.models.t5_decoding import t5_generate

        tok = self.tokenizer
        part = documents + [""] * (draw.size - len(documents))  # static batch shape
        enc = [_pad(self.encode_input(d, draw.input_len), draw.input_len, tok.pad_id) for d in part]
        ids = np.stack([e[0] for e in enc])
        mask = np.stack([e[1] for e in enc]).astype(np.int32)
        gen = t5_generate(
            self.config,
            params,
            jnp.asarray(ids),
            jnp.asarray(mask),
            max_new_tokens=draw.max_new_tokens,
            sampling=draw.sampling,
            key=key,
            num_samples=draw.samples,
        )
        # Row d * samples + s is sample s of document d.
        gen = np.asarray(gen)[: len(documents) * draw.samples]
        return [tok.decode(_until_eos(r, tok.eos_id)) for r in gen]


def _until_eos(ids: Sequence[int], eos: int) -> list[int]:
    ids = [int(i) for i in ids]
    return ids[: ids.index(eos)] if eos in ids else ids


@dataclasses.dataclass
class LlamaFamily(_Family):
    """Llama-architecture decoder (synthgen.models.llama)."""

    name: str = "llama"
    _MODULE = Llama
    _ONE_ROW_PER_DOCUMENT = False

    def _prompt_parts(self) -> tuple[list[int], list[int]]:
        """Token ids before and after the document in the prompt."""
        tok = self.tokenizer
        template = getattr(tok, "apply_chat_template", None)
        text = None
        if template is not None and getattr(tok, "chat_template", None):
            text = template(
                [{"role": "user", "content": CHAT_INSTRUCTION + _SENTINEL}],
                add_generation_prompt=True,
            )
        if text is None:
            text = TASK_PREFIX + _SENTINEL + "\nquery:"
        before, after = text.split(_SENTINEL)
        prefix = [tok.bos_id] if tok.bos_id is not None and not text.startswith("<") else []
        return prefix + tok.encode(before), tok.encode(after)

    def encode_prompt(self, document: str, input_len: int) -> list[int]:
        before, after = self._prompt_parts()
        budget = input_len - len(before) - len(after)
        if budget < 1:
            raise ValueError(f"input_len={input_len} leaves no room for the document")
        return before + self.tokenizer.encode(document)[:budget] + after

    def encode_pairs(self, documents, queries, input_len: int, target_len: int) -> dict:
        tok = self.tokenizer
        total = input_len + target_len
        rows = {
            k: [] for k in ("tokens", "attention_mask", "target_start", "targets", "target_mask")
        }
        for document, query in zip(documents, queries, strict=True):
            prompt = self.encode_prompt(document, input_len)
            target = tok.encode(query)[: target_len - 1] + [tok.eos_id]
            tokens, attn = _pad(prompt + target, total, tok.pad_id)
            targets, target_mask = _pad(target, target_len, tok.pad_id)
            rows["tokens"].append(tokens)
            rows["attention_mask"].append(attn)
            # Position t predicts token t + 1: the target tokens are predicted by the
            # target_len positions starting at the prompt's last token.
            rows["target_start"].append(np.int32(len(prompt) - 1))
            rows["targets"].append(targets)
            rows["target_mask"].append(target_mask)
        return {k: np.stack(v) for k, v in rows.items()}

    def _model_inputs(self, ex: dict) -> tuple[tuple, dict]:
        """`Llama.__call__`'s arguments for one example (a batch of one), target window only."""
        window = dict(window_start=ex["target_start"][None], window_len=ex["targets"].shape[0])
        return (ex["tokens"][None], ex["attention_mask"][None]), window

    def _sample_batch(self, params, documents: list[str], key: jax.Array, draw: _Draw):
        """The decoded continuation of each document's prompt (one sample each), in order."""
        from synthgen.models.decoding import generate

        tok = self.tokenizer
        outs = generate(
            self.config,
            params,
            [self.encode_prompt(d, draw.input_len) for d in documents],
            max_new_tokens=draw.max_new_tokens,
            sampling=draw.sampling,
            key=key,
            eos_id=tok.eos_id,
            pad_id=tok.pad_id,
            min_rows=draw.full_rows,  # a short last batch: the full batches' program
        )
        return [tok.decode(_until_eos(o, tok.eos_id)).strip() for o in outs]
