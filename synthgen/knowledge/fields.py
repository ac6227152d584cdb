"""A synthetic record's facts by private prediction over the cluster's released keywords.

Free-text generation token by token needs voters that agree on every token; with SmolLM2-135M
and a cluster's varied records they agree on about a fifth of the probability mass at best
(the disease's first token after "Diagnosis:", measured on the DP-RAG world), which the
noise of a 32-token record at epsilon 7 drowns: token salad. Here each public field
("Diagnosis", "Symptoms", "Treatment") is one release instead: every voter reads one record of
the cluster (Poisson-sampled) and scores each candidate, the cluster's DP-released keywords,
by the public LM's likelihood of "<field>: <Candidate>" after its record, behind public
worked examples (`KnowledgeConfig.field_examples`); the softmax over
candidates is the voter's distribution. The Gaussian mechanism releases the mean of the M
distributions once per field, and the field states the candidates of highest noisy score
(the top n of one release: post-processing). A voter with no record scores after an empty
record, so the batch is always M x candidates rows.

Privacy:
  Unit: one record, add/remove-one. A record sits in at most one voter of a draw, and each
  voter's row is a probability distribution over the candidates, so the mean moves by at
  most sqrt(2)/M in L2: one Gaussian mechanism per field and draw, Poisson-subsampled at
  q = M / public_pool_size (the few-shot plan with one token per draw, `synthgen.fewshot`;
  Tang et al. 2024). Candidates are public (stage 1 and 2 releases).

References:
  Mori et al. 2025 (DP-SynRAG, private prediction per cluster); Tang et al. 2024; the
  likelihood scoring of candidates follows DP-KSA's keyword-level release (2026).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from synthgen.fewshot.mechanism import private_mean
from synthgen.fewshot.sampling import draw_subsets
from synthgen.knowledge.plan import KnowledgePlan
from synthgen.privacy import mechanisms


def candidate_logprobs(
    lm,
    records: Sequence[str],
    field: str,
    candidates: Sequence[str],
    shot_tokens: int,
    examples: Sequence[tuple[str, str]] = (),
) -> np.ndarray:
    """[len(records), len(candidates)]: log p("<field>: <Candidate>" | record) under `lm`.

    Each record is cut to `shot_tokens` tokens (a public bound) and written after
    ``Record:``, behind the public worked `examples` (record, this field's value); an
    empty string is a voter with no record. Prompts are padded to the public bound, so the
    shapes never depend on the records.
    """
    from synthgen.lm_backends import continuation_logprobs

    shown = "".join(f"Record: {text}\n{field}: {value}\n\n" for text, value in examples)
    head, tail = lm.encode(shown + "Record:", bos=True), lm.encode(f"\n{field}:")
    prompts = [
        head + (lm.encode(" " + text)[:shot_tokens] if text else []) + tail for text in records
    ]
    forms = [lm.encode(" " + c.capitalize()) for c in candidates]
    bound = len(head) + shot_tokens + len(tail)
    return continuation_logprobs(lm, prompts, forms, length=bound)


def release_field(
    lm,
    texts: Sequence[str],
    pool: np.ndarray,
    field: str,
    candidates: Sequence[str],
    values: int,
    plan: KnowledgePlan,
    rng: np.random.Generator,
) -> list[str]:
    """One field of one synthetic record: the `values` candidates of highest noisy score.

    Args:
      lm: the public LM.
      texts: all private records; `pool` indexes the cluster's.
      pool: the cluster's record indices.
      field: the field's public name.
      candidates: the cluster's released keywords (public).
      values: how many candidates the field states (public).
      plan: the release's plan (M, q, sigma).
      rng: the draw's and the noise's randomness.

    Privacy:
      One Poisson-subsampled Gaussian mechanism (module docstring).
    """
    config = plan.fewshot
    sample_rng, noise_rng = rng.spawn(2)  # separate streams: sampling, noise
    subsets = draw_subsets(pool, config, plan.generation.sampling_rate, sample_rng)
    voters = [texts[s[0]] if s else "" for s in subsets]
    slot = plan.config.fields.index(field)
    examples = [(text, values[slot]) for text, values in plan.config.field_examples]
    logits = candidate_logprobs(lm, ["", *voters], field, candidates, config.shot_tokens, examples)
    # rows 1..M as log-probs over the candidates: `private_mean` normalises each row
    logprobs = logits - np.logaddexp.reduce(logits, axis=1, keepdims=True)
    mean = private_mean(logprobs)
    noisy = mechanisms.gaussian_mechanism(
        mean,
        sensitivity=math.sqrt(2) / config.subsets,
        noise_multiplier=plan.generation.noise_multiplier,
        rng=noise_rng,
    )
    order = np.argsort(-noisy, kind="stable")[:values]
    return [candidates[int(i)] for i in order]
