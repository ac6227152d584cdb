"""Query-generator model adapters: encodings and per-example losses."""

import jax
import jax.numpy as jnp
import numpy as np

from synthgen.generator_models import LlamaFamily, split_trainable, token_nll
from synthgen.models.llama import Llama, LlamaConfig


class ByteTokenizer:
    """Bytes as ids 3..258; 0 pad, 1 BOS, 2 EOS; no chat template."""

    pad_id, bos_id, eos_id, vocab_size = 0, 1, 2, 259

    def encode(self, text):
        return [b + 3 for b in text.encode()]

    def decode(self, ids):
        return bytes(i - 3 for i in ids if i >= 3).decode(errors="replace")


def test_llama_windowed_loss_equals_full_logits_loss():
    config = LlamaConfig.tiny(vocab_size=ByteTokenizer.vocab_size)
    family = LlamaFamily(config, ByteTokenizer())
    docs = ["a short public document", "another, longer public document about things"]
    queries = ["what doc", "longer query here"]
    data = family.encode_pairs(docs, queries, input_len=40, target_len=20)
    params = Llama(config).init(jax.random.key(0), data["tokens"][:1])["params"]
    loss = jax.jit(family.loss_fn())
    for i in range(len(docs)):
        ex = {k: v[i] for k, v in data.items()}
        # Reference: logits at every position, next-token targets, mask over the positions
        # that predict the query tokens (and EOS).
        logits = Llama(config).apply({"params": params}, ex["tokens"][None])[0]
        start, n_target = int(ex["target_start"]), int(ex["target_mask"].sum())
        mask = np.zeros(len(ex["tokens"]), np.float32)
        mask[start : start + n_target] = 1
        want = token_nll(logits, jnp.roll(ex["tokens"], -1), mask)
        np.testing.assert_allclose(loss(params, {}, ex), want, rtol=1e-5)
        # The window holds exactly the query's tokens then EOS.
        target = ex["targets"][:n_target].tolist()
        assert target[-1] == ByteTokenizer.eos_id
        assert ByteTokenizer().decode(target[:-1]) == queries[i]


def test_split_trainable_selects_lora_adapters():
    config = LlamaConfig.tiny(vocab_size=64, lora_rank=2)
    params = Llama(config).init(jax.random.key(0), np.zeros((1, 4), np.int32))["params"]
    trainable, frozen = split_trainable(params, lora=True)
    names = {p[-1].key for p, _ in jax.tree_util.tree_leaves_with_path(trainable)}
    assert names == {"lora_a", "lora_b"}
    n_all = sum(x.size for x in jax.tree.leaves(params))
    n_split = sum(x.size for x in jax.tree.leaves((trainable, frozen)))
    assert n_split == n_all
