"""The main job's hot loops on one accelerator, each next to a torch/transformers peer.

One run measures, in the order below, each figure next to its peer measured in the same
call of this script (random weights and random tokens: speed only; static shapes; every
figure timed after a compile / warm-up call, whose seconds are printed separately):

* ``gen``: T5 query generation, `synthgen.models.t5_decoding.t5_generate` (encoder once, KV
  cache, top-p 0.8 sampling inside one `lax.while_loop`) at generation batch 256 (the gpu
  config's), t5-small dims with 128 input tokens and t5-base dims with 384, 32 new tokens.
  Tokens/s = rows x 32 / seconds per call (encoder included, output copied to the host as
  `synthgen.generator_models` does). Peer: transformers
  ``T5ForConditionalGeneration(T5Config(same dims)).generate(do_sample=True, top_p=0.8,
  top_k=0, max_new_tokens=32, min_new_tokens=32)``.
* ``encoder``: the dual encoder at all-MiniLM-L6-v2 dims (`retriever.bert.Bert`, float32).
  Training: `retriever.train.train_retriever`'s step (shared tower, in-batch softmax,
  AdamW, log-scale frozen; batch 256, queries 32 and documents 256 tokens, the gpu config's),
  timed as its loop runs it (batch put on the device, step, ``float(loss)`` every step), and
  also pipelined (no host read between steps), in examples/s. Corpus encoding:
  `TextEncoder.encode` on full-length 256-token documents at batch 64 (the pipeline's
  default) and 512, in documents/s; a stand-in tokenizer makes the ids (no text is
  tokenized on either side). Peer: transformers ``BertModel(BertConfig(same dims, dropout
  0))``: forward, mean pool, L2 norm (``.cpu()`` per batch), and for training the same
  loss, backward and ``torch.optim.AdamW``, with ``loss.item()`` every step.
* ``decode``: the Flax Llama at SmolLM2-135M dims (30 layers, d 576, 9/3 heads, vocab 49152)
  on 33 rows of 256-token prompts, 32 new tokens, tokens/s = 33 x 32 / seconds (prefill
  included). Two paths: `synthgen.models.decoding.generate` (one jitted while loop; it pads
  33 rows to 64) against transformers ``LlamaForCausalLM(LlamaConfig(same)).generate(
  do_sample=True, top_k=0, min_new_tokens=32)``; and the session few-shot and DP-RAG use,
  `synthgen.lm_backends.FlaxLM` ``start`` + one ``append`` per token (one jitted step per
  token and a host copy of the [33, V] log-probabilities, which the DP aggregation reads)
  against the same loop in torch (its KV cache, ``log_softmax(...).cpu()`` per token).

Precision: ``--dtypes`` (default float32, what the pipeline runs). For float32 torch runs
with TF32 matmuls allowed, as XLA's default float32 dot precision does on recent NVIDIA
GPUs; for bfloat16 ours computes in bfloat16 (T5 keeps float32 parameters, the Llama's are
cast) and torch's model is cast to bfloat16. The encoder section runs in float32 only
(`BertConfig` has no dtype).

Peers are optional: without torch or transformers each peer line says ``peer: not
installed`` and the run goes on. The torch peer runs on CUDA when JAX runs on a GPU, on the
CPU when JAX does (there, as with ``--tiny``, the figures are a smoke test, not a
comparison: on a 2-core machine torch's threads contend with XLA's). JAX is limited to half
the GPU memory (XLA_PYTHON_CLIENT_MEM_FRACTION, unless set) so that both fit. Needs jax,
flax, optax and transformers' tokenizers, safetensors and tqdm; not dp-accounting (without
`retriever.train`'s imports the loss is this script's copy of `in_batch_softmax_loss`).
Each figure's line says what ran; the last lines are a table, ``| what | ours | peer |
ratio |``, ratio = ours / peer (> 1: ours faster). ``--out FILE.json`` also writes every
figure (seconds per call, compile seconds, calls, notes). Exit status 1 if one of ours failed.

From the repository root (dpsynth need not be installed: PYTHONPATH=. finds it):

    PYTHONPATH=. python scripts/bench_main_job_device.py --out runs/bench_main_job_device.json
    PYTHONPATH=. python scripts/bench_main_job_device.py --dtypes bfloat16 --sections gen,decode
    PYTHONPATH=. python scripts/bench_main_job_device.py --tiny  # tiny dims, < 1 min on 2 cores

The first is sized for about 3 minutes on one H200 (an estimate from the compile times on
a CPU, not yet a measurement); each further ``--dtypes`` entry repeats gen and decode.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import inspect
import json
import os
import statistics
import subprocess
import sys
import time
import types
from collections.abc import Callable
from pathlib import Path

os.environ.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.5")  # room for torch's peer
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SECTIONS = ("gen", "encoder", "decode")
# all-MiniLM-L6-v2's config.json and SmolLM2-135M-Instruct's GGUF metadata
MINILM = dict(vocab_size=30522, hidden_size=384, num_hidden_layers=6, num_attention_heads=12,
              intermediate_size=1536, max_position_embeddings=512)  # fmt: skip
SMOLLM2_135M = dict(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_layers=30,
                    num_heads=9, num_kv_heads=3, head_dim=64, rope_theta=100000.0,
                    rms_norm_eps=1e-5, max_seq_len=8192, tie_word_embeddings=True)  # fmt: skip


@dataclasses.dataclass(frozen=True)
class Sizes:
    """Shapes of one run: the main job's (`FULL`) or a smoke run's (`TINY`).

    Attributes:
      t5_models: (label, `T5Config` preset, input_len) per generation figure.
      gen_batch, gen_new: generation batch and new tokens.
      bert: "minilm" (all-MiniLM-L6-v2 dims) or "tiny" (`BertConfig.tiny`).
      train_batch, query_len, doc_len: the encoder's training step (doc_len also encodes).
      encode_docs, encode_batches: documents and batch sizes of corpus encoding.
      llama: "smollm2-135m" or "tiny" (`LlamaConfig.tiny`).
      rows, prompt_len, decode_new: the decoding batch.
      target_s, max_calls: timed calls per figure: until target_s seconds (at least one
        call, at most max_calls).
    """

    t5_models: tuple[tuple[str, str, int], ...]
    gen_batch: int
    gen_new: int
    bert: str
    train_batch: int
    query_len: int
    doc_len: int
    encode_docs: int
    encode_batches: tuple[int, ...]
    llama: str
    rows: int
    prompt_len: int
    decode_new: int
    target_s: float
    max_calls: int


FULL = Sizes(
    t5_models=(("t5-small", "small", 128), ("t5-base", "base", 384)),
    gen_batch=256,
    gen_new=32,
    bert="minilm",
    train_batch=256,
    query_len=32,
    doc_len=256,
    encode_docs=8192,
    encode_batches=(64, 512),
    llama="smollm2-135m",
    rows=33,
    prompt_len=256,
    decode_new=32,
    target_s=2.0,
    max_calls=10,
)
TINY = Sizes(
    t5_models=(("t5-tiny", "tiny", 32),),
    gen_batch=8,
    gen_new=8,
    bert="tiny",
    train_batch=8,
    query_len=16,
    doc_len=32,
    encode_docs=64,
    encode_batches=(16,),
    llama="tiny",
    rows=5,
    prompt_len=16,
    decode_new=8,
    target_s=0.0,
    max_calls=1,
)


@dataclasses.dataclass
class Figure:
    """One measurement: ours and its peer, rates in `unit` (higher is faster)."""

    section: str
    what: str
    unit: str
    ours: float | None = None
    ours_call_s: float | None = None
    ours_calls: int = 0
    compile_s: float | None = None  # the first call: compile + warm-up
    peer: float | None = None
    peer_call_s: float | None = None
    peer_calls: int = 0
    peer_warmup_s: float | None = None
    peer_note: str = ""
    note: str = ""
    error: str | None = None

    @property
    def ratio(self) -> float | None:
        return self.ours / self.peer if self.ours and self.peer else None


def timed_calls(call: Callable[[int], object], sizes: Sizes) -> tuple[float, float, int]:
    """(first call's seconds, median seconds of the later calls, their number).

    `call(i)` must return only once its work is done (a host copy or a block)."""
    start = time.perf_counter()
    call(0)
    first = time.perf_counter() - start
    times: list[float] = []
    while not times or (sum(times) < sizes.target_s and len(times) < sizes.max_calls):
        start = time.perf_counter()
        call(len(times) + 1)
        times.append(time.perf_counter() - start)
    return first, statistics.median(times), len(times)


# ---- the peer (torch + transformers), optional ----------------------------------------------


class Peer:
    """torch and transformers if importable, on the device JAX uses (else why not)."""

    def __init__(self, platform: str) -> None:
        self.torch = self.transformers = None
        self.device = None
        try:
            import torch
            import transformers
        except ImportError as e:
            self.reason = f"peer: not installed ({e})"
            return
        if platform == "gpu" and not torch.cuda.is_available():
            self.reason = "peer: torch has no CUDA here while JAX runs on the GPU"
            return
        if platform not in ("gpu", "cpu"):
            self.reason = f"peer: no torch device for JAX platform {platform!r}"
            return
        self.torch, self.transformers = torch, transformers
        self.device = torch.device("cuda" if platform == "gpu" else "cpu")
        transformers.logging.set_verbosity_error()
        torch.backends.cuda.matmul.allow_tf32 = True  # XLA's default f32 dot on GPU
        torch.backends.cudnn.allow_tf32 = True
        if platform == "cpu":
            torch.set_num_threads(len(os.sched_getaffinity(0)))
        self.reason = ""

    @property
    def available(self) -> bool:
        return self.torch is not None

    def describe(self) -> str:
        if not self.available:
            return self.reason
        t = self.torch
        name = t.cuda.get_device_name(0) if self.device.type == "cuda" else "cpu"
        return (
            f"peer: torch {t.__version__}, transformers {self.transformers.__version__} on "
            f"{self.device.type} ({name}), TF32 matmuls allowed"
        )

    def dtype(self, name: str):
        return {"float32": self.torch.float32, "bfloat16": self.torch.bfloat16}[name]

    def free(self) -> None:
        if self.device is not None and self.device.type == "cuda":
            self.torch.cuda.empty_cache()

    def build(self, cls, config, dtype: str):
        """`cls(config)` with random weights, on the peer's device, in `dtype`, eval mode."""
        with self.device:
            model = cls(config)
        return model.to(self.device, dtype=self.dtype(dtype)).eval()

    def sample(self, model, x, new: int, top_p: float):
        """`model.generate` sampling at temperature 1 (no top-k cut, nucleus `top_p`) exactly
        `new` tokens per row of `x` (min_new_tokens, as our side runs no early stop); the
        output on the CPU."""
        with self.torch.inference_mode():
            out = model.generate(
                input_ids=x,
                attention_mask=self.torch.ones_like(x),
                do_sample=True,
                top_p=top_p,
                top_k=0,
                temperature=1.0,
                max_new_tokens=new,
                min_new_tokens=new,
            )
        return out.cpu()


def measure(
    fig: Figure, ours: Callable[[int], object], peer: Peer, theirs, sizes: Sizes, rate: float
) -> Figure:
    """Times `ours` and then `theirs()` (a call factory, or None) at `rate` units per call."""
    label = f"[{fig.section}] {fig.what}"
    try:
        fig.compile_s, fig.ours_call_s, fig.ours_calls = timed_calls(ours, sizes)
        fig.ours = rate / fig.ours_call_s
        print(
            f"{label}: ours {fig.ours:.1f} {fig.unit} ({fig.ours_call_s:.4f} s/call, "
            f"median of {fig.ours_calls}; compile + first call {fig.compile_s:.1f} s)"
            + (f"; {fig.note}" if fig.note else ""),
            flush=True,
        )
    except Exception as e:  # noqa: BLE001 - one failed figure must not end the run
        fig.error = f"{type(e).__name__}: {e}"
        print(f"{label}: ours failed: {fig.error}", flush=True)
    if theirs is None:
        return fig
    if not peer.available:
        fig.peer_note = peer.reason
        print(f"{label}: {peer.reason}", flush=True)
        return fig
    try:
        call, fig.peer_note = theirs()
        fig.peer_warmup_s, fig.peer_call_s, fig.peer_calls = timed_calls(call, sizes)
        fig.peer = rate / fig.peer_call_s
        print(
            f"{label}: peer {fig.peer:.1f} {fig.unit} ({fig.peer_call_s:.4f} s/call, median of "
            f"{fig.peer_calls}; first call {fig.peer_warmup_s:.1f} s) [{fig.peer_note}]",
            flush=True,
        )
    except Exception as e:  # noqa: BLE001
        fig.peer_note = f"peer failed: {type(e).__name__}: {e}"
        print(f"{label}: {fig.peer_note}", flush=True)
    finally:
        peer.free()
    return fig


# ---- gen: T5 query generation ----------------------------------------------------------------


def bench_gen(sizes: Sizes, dtype: str, peer: Peer) -> list[Figure]:
    return [gen_figure(sizes, dtype, peer, *model) for model in sizes.t5_models]


def gen_figure(
    sizes: Sizes, dtype: str, peer: Peer, label: str, preset: str, input_len: int
) -> Figure:
    """`t5_generate` at one T5 size against transformers' `generate`."""
    from synthgen.models.sampling import SamplingConfig
    from synthgen.models.t5 import T5, T5Config
    from synthgen.models.t5_decoding import t5_generate

    b, new = sizes.gen_batch, sizes.gen_new
    cfg = T5Config.preset(preset, dtype=dtype)
    ids = np.random.default_rng(0).integers(2, cfg.vocab_size, (b, input_len), dtype=np.int32)
    ids[:, -1] = cfg.eos_token_id
    mask = np.ones_like(ids)
    one = jnp.ones((1, 4), jnp.int32)
    params = jax.jit(lambda k: T5(cfg).init(k, one, one, one)["params"])(jax.random.key(0))
    sampling = SamplingConfig(temperature=1.0, top_p=0.8)  # the querygen default
    key = jax.random.key(1)
    steps = []

    def ours(i):  # as synthgen.generator_models.T5Family.generate calls it
        out = t5_generate(
            cfg,
            params,
            jnp.asarray(ids),
            jnp.asarray(mask),
            max_new_tokens=new,
            sampling=sampling,
            key=jax.random.fold_in(key, i),
        )
        out = np.asarray(out)
        ran = np.flatnonzero((out != cfg.pad_token_id).any(axis=0))
        steps.append(int(ran[-1]) + 1 if len(ran) else 0)
        return out

    def theirs():
        torch, tf = peer.torch, peer.transformers
        hf = cfg.to_hf_config()
        hf = {k: v for k, v in hf.items() if k not in ("architectures", "model_type")}
        model = peer.build(tf.T5ForConditionalGeneration, tf.T5Config(**hf), dtype)

        def call(_):
            x = torch.from_numpy(ids).to(peer.device)
            out = peer.sample(model, x, new, top_p=0.8)
            if out.shape[1] != new + 1:
                raise RuntimeError(f"generate returned {out.shape[1] - 1} new tokens")
            return out

        return call, f"T5ForConditionalGeneration.generate, {dtype}"

    fig = Figure("gen", f"{label} {dtype} b{b} in{input_len} new{new}", "tokens/s")
    measure(fig, ours, peer, theirs, sizes, b * new)
    if steps and min(steps) < new:
        fig.note = f"WARNING: a call stopped after {min(steps)} of {new} steps (all EOS)"
        print(f"[gen] {fig.what}: {fig.note}")
    return fig


# ---- encoder: dual-encoder training step and corpus encoding ---------------------------------


def bench_encoder(sizes: Sizes, peer: Peer) -> list[Figure]:
    from retriever.bert import Bert, BertConfig
    from retriever.encoders import TextEncoder

    config = BertConfig(**MINILM) if sizes.bert == "minilm" else BertConfig.tiny()
    one = jnp.ones((1, 4), jnp.int32)
    params = jax.jit(lambda k: Bert(config).init(k, one, one)["params"])(jax.random.key(0))

    def tokenize(texts: list[str], max_len: int) -> tuple[np.ndarray, np.ndarray]:
        """Stand-in tokenizer: text ``"doc <i>"`` gets max_len ids made from i."""
        index = np.array([int(t.split()[1]) for t in texts], np.int64)[:, None]
        ids = (index * 7919 + np.arange(max_len) * 31) % (config.vocab_size - 1000) + 1000
        ids[:, 0] = 101
        return ids.astype(np.int32), np.ones(ids.shape, np.int32)

    encoder = TextEncoder(
        name="random:bert",
        family="bert",
        config=config,
        params=params,
        tokenize_fn=tokenize,
        max_len=config.max_position_embeddings,
    )
    figures = train_figures(encoder, sizes, peer)
    for size in sizes.encode_batches:
        figures.append(encode_figure(encoder, tokenize, size, sizes, peer))
    return figures


def _torch_bert(peer: Peer, config, train: bool):
    """transformers' BertModel with `config`'s dims (a `retriever.bert.BertConfig`), no
    pooler, no dropout, float32."""
    tf = peer.transformers
    hf = tf.BertConfig(
        **dataclasses.asdict(config), hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0
    )
    model = peer.build(functools.partial(tf.BertModel, add_pooling_layer=False), hf, "float32")
    return model.train(train)


def _torch_embed(torch, model, ids, mask):
    """Mean pool over real tokens and L2 norm, as `TextEncoder.apply`."""
    states = model(input_ids=ids, attention_mask=mask).last_hidden_state
    m = mask.unsqueeze(-1).to(states.dtype)
    pooled = (states * m).sum(1) / m.sum(1).clamp(min=1e-9)
    return torch.nn.functional.normalize(pooled, dim=-1)


def _in_batch_loss():
    """`retriever.train.in_batch_softmax_loss`, or (where retriever.train's imports, e.g.
    dp-accounting or datasets, are missing) the same formula without hard negatives."""
    try:
        from retriever.train import in_batch_softmax_loss

        return in_batch_softmax_loss, "retriever.train.in_batch_softmax_loss"
    except ImportError as e:

        def loss(q, d, doc_keys, scale):
            logits = scale * (q @ d.T)
            same = (doc_keys[:, None] == doc_keys[None, :]) & ~jnp.eye(len(q), dtype=bool)
            logits = jnp.where(same, -jnp.inf, logits)
            return -jnp.mean(jnp.diagonal(jax.nn.log_softmax(logits, axis=-1)))

        return loss, f"the script's copy of in_batch_softmax_loss (retriever.train: {e})"


def train_figures(encoder, sizes: Sizes, peer: Peer) -> list[Figure]:
    """`train_retriever`'s step (its parameters, optimizer, loss and jit), as its loop runs
    it and pipelined, against the same step in torch."""
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    b, lq, ld = sizes.train_batch, sizes.query_len, sizes.doc_len
    lr, temperature = 1e-4, 0.05
    loss_of, loss_note = _in_batch_loss()
    state = {"query": encoder.params, "log_scale": jnp.log(jnp.float32(1.0 / temperature))}
    labels = jax.tree.map(lambda _: "train", state)
    labels["log_scale"] = "fixed"
    optimizer = optax.multi_transform(
        {"train": optax.adamw(lr, weight_decay=0.01), "fixed": optax.set_to_zero()}, labels
    )

    def loss_fn(state, batch):
        q = encoder.apply(
            state["query"], {"input_ids": batch["q_ids"], "attention_mask": batch["q_mask"]}
        )
        d = encoder.apply(
            state["query"], {"input_ids": batch["d_ids"], "attention_mask": batch["d_mask"]}
        )
        return loss_of(q, d, batch["doc_key"], jnp.exp(state["log_scale"]))

    @jax.jit
    def train_step(state, opt_state, batch):
        loss, grads = jax.value_and_grad(loss_fn)(state, batch)
        updates, opt_state = optimizer.update(grads, opt_state, state)
        return optax.apply_updates(state, updates), opt_state, loss

    rng = np.random.default_rng(0)
    vocab = encoder.config.vocab_size
    host = {
        "q_ids": rng.integers(1000, vocab, (b, lq), dtype=np.int32),
        "q_mask": np.ones((b, lq), np.int32),
        "d_ids": rng.integers(1000, vocab, (b, ld), dtype=np.int32),
        "d_mask": np.ones((b, ld), np.int32),
        "doc_key": np.arange(b, dtype=np.int32),
    }
    mesh = Mesh(np.array(jax.devices()), ("data",))
    replicated, sharded = NamedSharding(mesh, P()), NamedSharding(mesh, P("data"))
    carry = [jax.device_put(state, replicated), jax.device_put(optimizer.init(state), replicated)]

    def ours_loop(_):  # as train_retriever's loop: put the batch, step, float(loss)
        batch = jax.device_put(host, sharded)
        carry[0], carry[1], loss = train_step(carry[0], carry[1], batch)
        return float(loss)

    pipelined = 8 if sizes.max_calls > 1 else 1

    def ours_pipelined(_):  # the same steps, no host read in between
        batch = jax.device_put(host, sharded)
        for _ in range(pipelined):
            carry[0], carry[1], loss = train_step(carry[0], carry[1], batch)
        return jax.block_until_ready(loss)

    def theirs():
        torch = peer.torch
        model = _torch_bert(peer, encoder.config, train=True)
        opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
        target = torch.arange(b, device=peer.device)

        def call(_):
            x = {k: torch.from_numpy(v).to(peer.device) for k, v in host.items()}
            q = _torch_embed(torch, model, x["q_ids"], x["q_mask"])
            d = _torch_embed(torch, model, x["d_ids"], x["d_mask"])
            loss = torch.nn.functional.cross_entropy(q @ d.T / temperature, target)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            return loss.item()

        return call, "BertModel forward + backward + torch.optim.AdamW, loss.item(), float32"

    what = f"train step b{b} q{lq} d{ld} float32"
    loop = Figure("encoder", what, "examples/s", note=f"loss: {loss_note}")
    measure(loop, ours_loop, peer, theirs, sizes, b)
    steps = Figure("encoder", f"{what}, pipelined ({pipelined} per call)", "examples/s")
    measure(steps, ours_pipelined, peer, None, sizes, b * pipelined)
    return [loop, steps]


def encode_figure(encoder, tokenize, size: int, sizes: Sizes, peer: Peer) -> Figure:
    """`TextEncoder.encode` (as the pipeline's index stage calls it, at batch `size`)
    against transformers' BertModel on the same batches; the first call of each (one batch)
    compiles and warms up."""
    n, length = sizes.encode_docs, sizes.doc_len
    texts = [f"doc {i}" for i in range(n)]

    def ours(i):
        return encoder.encode(texts if i else texts[:size], batch_size=size, max_len=length)

    def theirs():
        torch = peer.torch
        model = _torch_bert(peer, encoder.config, train=False)
        ids, mask = tokenize(texts, length)

        def call(i):
            out = []
            with torch.inference_mode():
                for start in range(0, n if i else size, size):
                    x = torch.from_numpy(ids[start : start + size]).to(peer.device)
                    m = torch.from_numpy(mask[start : start + size]).to(peer.device)
                    out.append(_torch_embed(torch, model, x, m).cpu())
            return out

        return call, "BertModel forward + mean pool + L2 norm, .cpu() per batch, float32"

    what = f"encode {n} docs x {length} tokens, batch {size}, float32"
    return measure(Figure("encoder", what, "docs/s"), ours, peer, theirs, sizes, n)


# ---- decode: the Flax Llama's batched decoding (few-shot, DP-RAG) ----------------------------


def bench_decode(sizes: Sizes, dtype: str, peer: Peer) -> list[Figure]:
    from synthgen.lm_backends import FlaxLM
    from synthgen.models.decoding import bucket, generate
    from synthgen.models.llama import LlamaConfig, init_params
    from synthgen.models.sampling import SamplingConfig

    if sizes.llama == "smollm2-135m":
        config = LlamaConfig(**SMOLLM2_135M, dtype=dtype)
    else:
        config = LlamaConfig.tiny(dtype=dtype)
    params = init_params(config, jax.random.key(0))
    if dtype != "float32":  # as llama_loading with dtype=: parameters in the compute dtype
        params = jax.tree.map(lambda a: a.astype(config.jnp_dtype), params)
    rows, length, new = sizes.rows, sizes.prompt_len, sizes.decode_new
    prompts = np.random.default_rng(0).integers(10, config.vocab_size, (rows, length))
    prompt_lists = prompts.tolist()
    sampling = SamplingConfig(temperature=1.0)
    key = jax.random.key(1)
    figures = []
    tag = f"{rows} rows, prompt {length}, new {new}, {dtype}"
    hf_dims = dict(
        vocab_size=config.vocab_size,
        hidden_size=config.hidden_size,
        intermediate_size=config.intermediate_size,
        num_hidden_layers=config.num_layers,
        num_attention_heads=config.num_heads,
        num_key_value_heads=config.num_kv_heads,
        head_dim=config.head_dim,
        rope_theta=config.rope_theta,
        rms_norm_eps=config.rms_norm_eps,
        max_position_embeddings=config.max_seq_len,
        tie_word_embeddings=config.tie_word_embeddings,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )

    def ours_generate(i):  # eos_id -1: no row stops early (as min_new_tokens)
        out = generate(
            config,
            params,
            prompt_lists,
            max_new_tokens=new,
            sampling=sampling,
            key=jax.random.fold_in(key, i),
            eos_id=-1,
            pad_id=0,
        )
        if min(len(o) for o in out) != new:
            raise RuntimeError("generate returned fewer tokens than asked")
        return out

    torch_models = []

    def torch_llama():  # one random model for both peers
        if not torch_models:
            tf = peer.transformers
            torch_models.append(peer.build(tf.LlamaForCausalLM, tf.LlamaConfig(**hf_dims), dtype))
        return torch_models[0]

    def theirs_generate():
        torch = peer.torch
        model = torch_llama()
        x = torch.from_numpy(prompts).to(peer.device)

        def call(_):
            return peer.sample(model, x, new, top_p=1.0)

        return call, f"LlamaForCausalLM.generate, {dtype}"

    fig = Figure(
        "decode",
        f"decoding.generate {tag}",
        "tokens/s",
        note=f"decoding.generate runs {bucket(rows)} rows for these {rows}",
    )
    figures.append(measure(fig, ours_generate, peer, theirs_generate, sizes, rows * new))

    lm = FlaxLM(config, params, types.SimpleNamespace(pad_id=0, eos_id=2, bos_id=1))
    token = 11

    def ours_session(_):  # what fewshot.generate / rag Sessions do per answer
        logprobs = lm.start(prompt_lists, new)
        for _ in range(new - 1):
            logprobs = lm.append(token)
        return logprobs

    def theirs_session():
        torch = peer.torch
        model = torch_llama()
        x = torch.from_numpy(prompts).to(peer.device)
        accepts = inspect.signature(model.forward).parameters
        last = {"logits_to_keep": 1} if "logits_to_keep" in accepts else {}
        cache = "cache" if "cache" in accepts else "past_key_values"  # transformers >= 5.2x

        def call(_):
            with torch.inference_mode():
                out = model(input_ids=x, use_cache=True, **last)
                logprobs = torch.log_softmax(out.logits[:, -1].float(), -1).cpu().numpy()
                step = torch.full((rows, 1), token, device=peer.device)
                for _ in range(new - 1):
                    out = model(input_ids=step, use_cache=True, **{cache: out.get(cache)})
                    logprobs = torch.log_softmax(out.logits[:, -1].float(), -1).cpu().numpy()
            return logprobs

        return call, f"LlamaForCausalLM forward with its KV cache, log_softmax().cpu(), {dtype}"

    fig = Figure(
        "decode",
        f"FlaxLM session (start + append) {tag}",
        "tokens/s",
        note="host copy of [rows, V] log-probs per token",
    )
    figures.append(measure(fig, ours_session, peer, theirs_session, sizes, rows * new))
    return figures


# ---- main ---------------------------------------------------------------------------------------


def git_commit() -> str:
    try:
        done = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        )
        dirty = subprocess.run(
            ["git", "status", "--porcelain"], cwd=ROOT, capture_output=True, text=True, timeout=10
        ).stdout.strip()
        return done.stdout.strip() + ("+dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def _cell(value: float | None, digits: int = 1) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true", help="tiny dims: a CPU smoke run")
    parser.add_argument("--sections", default=",".join(SECTIONS), help="gen,encoder,decode")
    parser.add_argument("--dtypes", default="float32", help="float32 and/or bfloat16")
    parser.add_argument("--out", type=Path, help="also write every figure to this JSON file")
    args = parser.parse_args(argv)
    sections = [s for s in args.sections.split(",") if s]
    dtypes = [d for d in args.dtypes.split(",") if d]
    if set(sections) - set(SECTIONS) or set(dtypes) - {"float32", "bfloat16"} or not dtypes:
        parser.error(f"sections among {SECTIONS}, dtypes among float32, bfloat16")
    sizes = TINY if args.tiny else FULL

    device = jax.devices()[0]
    platform = device.platform
    commit = git_commit()
    print(f"device: {device.device_kind} ({platform}, {jax.device_count()} device(s))")
    print(
        f"jax {jax.__version__}, default matmul precision "
        f"{getattr(jax.config, 'jax_default_matmul_precision', None) or 'XLA default'}; "
        f"commit {commit}"
    )
    peer = Peer(platform)
    print(peer.describe(), flush=True)

    start = time.perf_counter()
    figures: list[Figure] = []
    runs = {
        "gen": [functools.partial(bench_gen, sizes, d, peer) for d in dtypes],
        "encoder": [functools.partial(bench_encoder, sizes, peer)],  # float32 only
        "decode": [functools.partial(bench_decode, sizes, d, peer) for d in dtypes],
    }
    for section in sections:
        for run in runs[section]:
            try:
                figures += run()
            except Exception as e:  # noqa: BLE001 - e.g. a module missing on the machine
                failed = Figure(section, "section", "", error=f"{type(e).__name__}: {e}")
                print(f"[{section}] failed: {failed.error}", flush=True)
                figures.append(failed)
    total = time.perf_counter() - start

    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        report = {
            "device": device.device_kind,
            "platform": platform,
            "jax_version": jax.__version__,
            "commit": commit,
            "peer": peer.describe(),
            "tiny": args.tiny,
            "sections": sections,
            "dtypes": dtypes,
            "seconds": total,
            "figures": [{**dataclasses.asdict(f), "ratio": f.ratio} for f in figures],
        }
        args.out.write_text(json.dumps(report, indent=2) + "\n")
        print(f"wrote {args.out}")
    print(f"{len(figures)} figures in {total:.0f} s; ratio = ours / peer (> 1: ours faster)")
    print("| what | ours | peer | ratio |")
    print("|---|---|---|---|")
    for f in figures:
        ours = "failed" if f.error else _cell(f.ours)
        print(
            f"| {f.section}: {f.what} ({f.unit}) | {ours} | {_cell(f.peer)} | {_cell(f.ratio, 2)} |"
        )
    return 1 if any(f.error for f in figures) else 0


if __name__ == "__main__":
    sys.exit(main())
