"""DP few-shot generation (Tang et al. 2024): synthetic text from a frozen LM, no training.

Each synthetic example is generated token by token. For a token, the private examples of its
pool (its label's examples, or all) are Poisson-subsampled with rate q; every sampled example
joins one of M prompts uniformly at random (at most `max_shots` per prompt, the rest
dropped in random order). The M next-token distributions are averaged and one token is
released through `synthgen.privacy.mechanisms`:

  * ``gaussian``: N(0, (sigma * sqrt(2) / M)^2) noise on each candidate's mean probability,
    then argmax;
  * ``rnm``: the exponential mechanism (report-noisy-max with Gumbel noise) on the mean
    probabilities, `token_epsilon` per token.

Candidates are the whole vocabulary or, with `public_vocab=K` (RVP), the K most likely
tokens of the *public* prompt (the same prompt without private examples); `public_prior`
adds lambda * p_public to the noisy scores (post-processing of a public quantity). The
released token is appended to every prompt; generation stops at EOS, at a newline
(`stop_at_newline`) or at `max_new_tokens`.

`resample="token"` draws fresh examples for every token (Tang et al.'s analysis: every token
is amplified by subsampling; the prompts change, so each token is a full forward of the M
prompts). `resample="example"` draws once per synthetic example and decodes with the KV
cache (one cached step per token), at a higher privacy cost: its tokens share one draw.
Either way the public prompt is scored alone, in its own call.

Privacy:
  Unit: one private example; add/remove-one neighbours. Adding an example changes at most
  one of the M prompts of a token of its own pool, so the mean distribution moves by at
  most sqrt(2)/M in L2 (two distributions differ by at most sqrt(2)) and 1/M in L-infinity;
  every row is normalised to a probability distribution before the mean, whatever the
  backend returns. A token is a Gaussian mechanism of multiplier sigma (or a
  token_epsilon-DP exponential mechanism) on a Poisson subsample of rate q;
  `accounting.fewshot_event` composes them with the PLD accountant.
  Only declared public figures fix the guarantee: q = M * shots / public_pool_size for
  every pool, and each example of a pool joins the sample with probability exactly q, so
  a real pool larger than declared only means more expected examples (each prompt still
  keeps at most `max_shots`); a pool smaller than declared is refused before anything is
  charged, naming its (public) label but never its size. delta defaults to 1 / (10 N)
  with N = public_pool_size x pools, and must be below 1 / N. The charge covers the worst
  pool's token budget (examples of that pool x max_new_tokens), charged before the first
  token; stopping early at EOS only spends less. The public prompt is scored in calls
  whose inputs are all public (batched numerics would otherwise make it depend on the
  private rows); it, the candidate set and the stopping rule read only public text and
  released tokens.

References: Tang, Shin, Inan, Manoel, Mireshghallah, Lin, Gopi, Kulkarni, Sim 2024,
"Privacy-Preserving In-Context Learning with Differentially Private Few-Shot Generation"
(ICLR 2024).
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

import numpy as np

from synthgen.lm_backends import NextTokenLM
from synthgen.privacy import accounting, mechanisms
from synthgen.privacy.ledger import PrivacyLedger

Mechanism = Literal["gaussian", "rnm"]
Resample = Literal["token", "example"]
RELATION = "ADD_OR_REMOVE_ONE"
DELTA_SAFETY = 10  # default delta = 1 / (DELTA_SAFETY * N)


@dataclasses.dataclass(frozen=True)
class FewShotConfig:
    """Hyper-parameters of a DP few-shot generation run.

    Attributes:
      public_pool_size: declared public figure N_pool (required): the accounting assumes
        q = M * shots / N_pool for every pool; a real pool smaller than this is refused.
      subsets: M, prompts per token.
      shots: expected private examples per prompt in a pool of exactly N_pool examples.
      max_shots: most examples a prompt keeps (default 2 * shots).
      shot_tokens: every text field (of a private example or a target) is cut to this
        many tokens in a prompt.
      max_new_tokens: token limit of a synthetic example.
      mechanism: "gaussian" or "rnm".
      target_epsilon: calibrate the noise to this epsilon (or give the noise directly).
      noise_multiplier: sigma of ``gaussian``.
      token_epsilon: per-token epsilon of ``rnm``.
      delta: must be below 1 / N, N = public_pool_size x pools; default 1 / (10 N).
      public_vocab: K of RVP; None = the whole vocabulary.
      public_prior: lambda of the public soft prior (0 = none).
      resample: "token" (fresh draw per token) or "example" (one draw, KV cache).
      stop_at_newline: a token containing a newline ends the example (single paragraphs).
    """

    public_pool_size: int = dataclasses.field(kw_only=True)
    subsets: int = 10
    shots: int = 4
    max_shots: int | None = None
    shot_tokens: int = 96
    max_new_tokens: int = 64
    mechanism: Mechanism = "gaussian"
    target_epsilon: float | None = None
    noise_multiplier: float | None = None
    token_epsilon: float | None = None
    delta: float | None = None
    public_vocab: int | None = None
    public_prior: float = 0.0
    resample: Resample = "token"
    stop_at_newline: bool = True

    def __post_init__(self) -> None:
        for name in ("subsets", "shots", "shot_tokens", "max_new_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {name}={getattr(self, name)}")
        need = self.subsets * self.shots
        if self.public_pool_size < need:
            raise ValueError(
                f"public_pool_size must be >= subsets * shots = {need} (rate <= 1), "
                f"got {self.public_pool_size=}"
            )
        if self.max_shots is not None and self.max_shots < self.shots:
            raise ValueError(f"max_shots must be >= shots, got {self.max_shots=}")
        if self.mechanism not in accounting.FEWSHOT_MECHANISMS:
            raise ValueError(f"mechanism must be gaussian or rnm, got {self.mechanism=}")
        if self.resample not in accounting.FEWSHOT_RESAMPLING:
            raise ValueError(f"resample must be token or example, got {self.resample=}")
        noise = self.noise_multiplier if self.mechanism == "gaussian" else self.token_epsilon
        if (self.target_epsilon is None) == (noise is None):
            param = "noise_multiplier" if self.mechanism == "gaussian" else "token_epsilon"
            raise ValueError(f"give exactly one of target_epsilon and {param}")
        for name in ("target_epsilon", "noise_multiplier", "token_epsilon"):
            value = getattr(self, name)
            if value is not None and not (math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be a finite positive number, got {name}={value}")
        if self.delta is not None and not 0 < self.delta < 1:
            raise ValueError(f"delta must be in (0, 1), got {self.delta=}")
        if self.public_vocab is not None and self.public_vocab < 1:
            raise ValueError(f"public_vocab must be >= 1, got {self.public_vocab=}")
        if self.public_prior < 0:
            raise ValueError(f"public_prior must be >= 0, got {self.public_prior=}")

    @property
    def shots_cap(self) -> int:
        return self.max_shots or 2 * self.shots

    @property
    def sampling_rate(self) -> float:
        """q = M * shots / public_pool_size: each example's inclusion probability."""
        return self.subsets * self.shots / self.public_pool_size


def resolve_delta(delta: float | None, num_private: int) -> float:
    """delta, or its default 1 / (10 N); refuses delta >= 1 / N.

    A mechanism that publishes each record with probability delta is (0, delta)-DP, so
    delta >= 1 / N allows publishing a record outright; 1 / (10 N) leaves a margin.

    Args:
      delta: the requested delta, or None for the default.
      num_private: N, a declared public figure (never a count of the private rows).

    Raises:
      ValueError: N < 1 or delta outside (0, 1 / N).
    """
    if num_private < 1:
        raise ValueError(f"num_private must be >= 1, got {num_private=}")
    if delta is None:
        return 1.0 / (DELTA_SAFETY * num_private)
    accounting.check_delta(delta, num_private)
    return float(delta)


@dataclasses.dataclass(frozen=True)
class PromptTemplate:
    """How prompts are written: header + shots + stem, then the generated tokens.

    `header` and `stem` are formatted with the synthetic example's target fields (its
    label, or the public document a query is generated for); `shot` with a private row.
    The public prompt is header + stem with no shots.
    """

    header: str
    shot: str
    stem: str

    def fields(self) -> tuple[set[str], set[str]]:
        """(fields of a private row, fields of a target) the template reads."""
        import string

        def names(text: str) -> set[str]:
            return {f for _, f, _, _ in string.Formatter().parse(text) if f}

        return names(self.shot), names(self.header) | names(self.stem)


DOCUMENT_TEMPLATE = PromptTemplate(
    header="Here are paragraphs from encyclopedia articles about {label}.\n\n",
    shot="Paragraph: {text}\n\n",
    stem="Paragraph:",
)
QUERY_TEMPLATE = PromptTemplate(
    header="Here are documents and search queries that find them.\n\n",
    shot="Document: {document}\nQuery: {query}\n\n",
    stem="Document: {document}\nQuery:",
)


@dataclasses.dataclass(frozen=True)
class FewShotPlan:
    """The guarantee of a run, fixed before it starts from declared public figures only."""

    public_pool_size: int
    pools: int
    sampling_rate: float
    tokens: int
    tokens_per_draw: int
    mechanism: str
    noise_multiplier: float | None
    token_epsilon: float | None
    subsets: int
    delta: float
    epsilon: float

    @property
    def event(self):
        return accounting.fewshot_event(
            sampling_rate=self.sampling_rate,
            tokens=self.tokens,
            mechanism=self.mechanism,
            noise_multiplier=self.noise_multiplier,
            token_epsilon=self.token_epsilon,
            tokens_per_draw=self.tokens_per_draw,
        )

    def to_dict(self) -> dict:
        out = dataclasses.asdict(self)
        out.update(
            unit="one private example",
            neighboring_relation=RELATION,
            accountant="pld",
            sampling=(
                "poisson per pool (label): each example joins with probability "
                "q = subsets * shots / public_pool_size (declared, public); real pool "
                "sizes are neither used nor published"
            ),
            noise_std=None
            if self.noise_multiplier is None
            else self.noise_multiplier * math.sqrt(2) / self.subsets,
            mechanism_description=(
                "Gaussian noise sigma*sqrt(2)/M on the mean of M next-token distributions, "
                "argmax (Tang et al. 2024)"
                if self.mechanism == "gaussian"
                else "exponential mechanism (report-noisy-max, Gumbel) on the mean of M "
                "next-token distributions, sensitivity 1/M (Tang et al. 2024)"
            ),
            dp_event=json.loads(accounting.event_to_json(self.event)),
        )
        return out


def plan_privacy(config: FewShotConfig, tokens_per_pool: int, pools: int = 1) -> FewShotPlan:
    """Resolves delta and the noise of a run from declared public figures only.

    Args:
      config: the run's hyper-parameters (its `public_pool_size` sets the rate).
      tokens_per_pool: most tokens released for one pool (examples x max_new_tokens).
      pools: pools that have synthetic examples to generate (public: from the targets).

    Raises:
      ValueError: delta >= 1 / N with N = public_pool_size x pools.

    Privacy:
      Nothing here reads private data: q = M * shots / public_pool_size, delta and the
      noise follow from public figures, so the plan may be published whole.
    """
    if pools < 1 or tokens_per_pool < 1:
        raise ValueError(f"pools and tokens_per_pool must be >= 1, got {pools=}")
    delta = resolve_delta(config.delta, config.public_pool_size * pools)
    rate = config.sampling_rate
    per_draw = 1 if config.resample == "token" else config.max_new_tokens
    shape = dict(
        sampling_rate=rate,
        tokens=tokens_per_pool,
        mechanism=config.mechanism,
        tokens_per_draw=per_draw,
    )
    noise_name = "noise_multiplier" if config.mechanism == "gaussian" else "token_epsilon"
    noise = getattr(config, noise_name)
    if noise is None:
        noise = accounting.calibrate_fewshot(
            target_epsilon=config.target_epsilon, delta=delta, **shape
        )
    eps = accounting.fewshot_epsilon(delta, **shape, **{noise_name: noise})
    return FewShotPlan(
        public_pool_size=config.public_pool_size,
        pools=pools,
        sampling_rate=rate,
        tokens=tokens_per_pool,
        tokens_per_draw=per_draw,
        mechanism=config.mechanism,
        noise_multiplier=noise if config.mechanism == "gaussian" else None,
        token_epsilon=noise if config.mechanism == "rnm" else None,
        subsets=config.subsets,
        delta=delta,
        epsilon=eps,
    )


# ---- one token ---------------------------------------------------------------------------


def distributions(logprobs: np.ndarray) -> np.ndarray:
    """Rows of log-probs [B, V] -> probability distributions (float64, each sums to 1).

    Whatever a backend returns (rows summing to 1.8, NaN, +inf), each row is mapped on its
    own to the simplex: non-finite or negative probabilities count as 0, the row is divided
    by its sum, and an all-zero row becomes uniform. The sqrt(2) sensitivity of the mean
    needs exactly this: each prompt's row a distribution that depends on that prompt only.
    """
    with np.errstate(over="ignore", invalid="ignore"):
        probs = np.exp(np.asarray(logprobs, np.float64))
    probs = np.where(np.isfinite(probs) & (probs > 0), probs, 0.0)
    totals = probs.sum(axis=-1, keepdims=True)
    uniform = np.full_like(probs, 1.0 / probs.shape[-1])
    return np.where(totals > 0, probs / np.where(totals > 0, totals, 1.0), uniform)


def private_mean(logprobs: np.ndarray) -> np.ndarray:
    """Mean of the M private next-token distributions (rows 1..M of [1 + M, V] log-probs).

    The statistic each token's mechanism releases: between neighbouring datasets it moves
    by at most sqrt(2)/M in L2 and 1/M in L-infinity (one prompt changes; every row is
    normalised by `distributions` first).
    """
    return distributions(logprobs[1:]).mean(axis=0)


def public_candidates(public: np.ndarray, config: FewShotConfig) -> np.ndarray:
    """Candidate token ids: all, or the K most likely under the public distribution."""
    if config.public_vocab is None:
        return np.arange(public.size)
    k = min(config.public_vocab, public.size)
    return np.argpartition(-public, k - 1)[:k]


def release_token(
    logprobs: np.ndarray,
    config: FewShotConfig,
    plan: FewShotPlan,
    rng: np.random.Generator,
) -> int:
    """Releases one token from log-probs [1 + M, V]: row 0 public, rows 1..M private.

    Privacy:
      One Gaussian mechanism (L2 sensitivity sqrt(2)/M, multiplier sigma) or one
      token_epsilon-DP exponential mechanism (L-inf sensitivity 1/M) on the mean of the M
      private distributions (each normalised to sum to 1); candidates and prior come from
      the public row only. See the module docstring (Tang et al. 2024).
    """
    m = config.subsets
    if logprobs.shape[0] != m + 1:
        raise ValueError(f"expected {m + 1} rows of log-probs, got {logprobs.shape[0]}")
    public = distributions(logprobs[:1])[0]
    candidates = public_candidates(public, config)
    mean = private_mean(logprobs)[candidates]
    prior = config.public_prior * public[candidates]
    if plan.mechanism == "gaussian":
        noisy = mechanisms.gaussian_mechanism(
            mean, sensitivity=math.sqrt(2) / m, noise_multiplier=plan.noise_multiplier, rng=rng
        )
        return int(candidates[np.argmax(noisy + prior)])
    if config.public_prior:
        # exp-mechanism on u + lambda * p_pub: the public term does not change sensitivity.
        mean = mean + prior
    choice = mechanisms.exponential_mechanism(
        mean, epsilon=plan.token_epsilon, sensitivity=1.0 / m, rng=rng
    )
    return int(candidates[choice])


# ---- prompts -----------------------------------------------------------------------------


class _Prompts:
    """Token ids of prompt pieces, encoded once; every field's ids cut to `field_tokens`.

    A piece is its template's literal text and its fields, each encoded separately, so a
    shot has at most `shot_bound()` tokens whatever the private text (a public bound).
    """

    def __init__(self, lm: NextTokenLM, template: PromptTemplate, rows, field_tokens: int):
        self.lm, self.template, self.rows, self.field_tokens = lm, template, rows, field_tokens
        self._shots: dict[int, list[int]] = {}

    def _render(self, text: str, row: Mapping[str, Any], *, bos: bool = False) -> list[int]:
        import string

        ids = self.lm.encode("", bos=True) if bos else []
        for literal, field, _, _ in string.Formatter().parse(text):
            ids += self.lm.encode(literal) if literal else []
            if field:
                ids += self.lm.encode(str(row[field]))[: self.field_tokens]
        return ids

    def _bound(self, text: str) -> int:
        import string

        parsed = list(string.Formatter().parse(text))
        literals = sum(len(self.lm.encode(lit)) for lit, _, _, _ in parsed if lit)
        return literals + self.field_tokens * sum(1 for _, f, _, _ in parsed if f)

    def shot_bound(self) -> int:
        """Most tokens a shot can have (public: template and `field_tokens` only)."""
        return self._bound(self.template.shot)

    def shot(self, index: int) -> list[int]:
        if index not in self._shots:
            self._shots[index] = self._render(self.template.shot, self.rows[index])
        return self._shots[index]

    def frame(self, target: Mapping[str, Any]) -> tuple[list[int], list[int]]:
        """(header ids, stem ids) of a target."""
        header = self._render(self.template.header, target, bos=True)
        return header, self._render(self.template.stem, target)

    def prompt(self, frame: tuple[list[int], list[int]], shots: Sequence[int]) -> list[int]:
        header, stem = frame
        return header + [t for i in shots for t in self.shot(i)] + stem


def draw_subsets(
    pool: np.ndarray, config: FewShotConfig, rate: float, rng: np.random.Generator
) -> list[list[int]]:
    """Poisson-samples `pool` at `rate` and deals the sample to M prompts at random.

    Each example of the pool, whatever the pool's size, joins the sample with probability
    exactly `rate` (the accountant's q) and a uniformly random prompt; a prompt keeps at
    most `config.shots_cap` of its examples (those of smallest random priority, in that
    order), so a larger pool only fills prompts up to the cap. Adding one example to the
    pool changes at most one prompt: the sensitivity argument of the module docstring.
    """
    # One row of uniforms per pool example (inclusion, prompt, priority), so an example's
    # fate is independent of the others': the coupling of the sensitivity argument.
    draws = rng.random((pool.size, 3))
    keep = draws[:, 0] < rate
    sampled, slots, priority = (
        pool[keep],
        (draws[keep, 1] * config.subsets).astype(int),
        draws[keep, 2],
    )
    subsets = []
    for j in range(config.subsets):
        members = np.flatnonzero(slots == j)
        order = members[np.argsort(priority[members])][: config.shots_cap]
        subsets.append(sampled[order].tolist())
    return subsets


def _is_stop(lm: NextTokenLM, token: int, config: FewShotConfig) -> bool:
    if token in lm.eos_ids:
        return True
    return config.stop_at_newline and "\n" in lm.decode([token])


# ---- the generation loop ------------------------------------------------------------------


@dataclasses.dataclass
class FewShotResult:
    """Generated texts (one per target), the plan and the number of released tokens.

    No timings: how long private work took is not part of a release.
    """

    texts: list[str]
    plan: FewShotPlan
    tokens_released: int


def _public_logprobs(lm: NextTokenLM, public: list[int]) -> np.ndarray:
    """Log-probs [1, V] after the public prompt, from a call whose inputs are all public."""
    return np.asarray(lm.score([public]), np.float32)[:1]


def generate(
    lm: NextTokenLM,
    private_rows: Sequence[Mapping[str, Any]],
    targets: Sequence[Mapping[str, Any]],
    template: PromptTemplate,
    config: FewShotConfig,
    *,
    pool_field: str | None = None,
    rng: np.random.Generator,
    ledger: PrivacyLedger | None = None,
    ledger_scope: tuple[str, str] | None = None,
    plan: FewShotPlan | None = None,
    on_token: Callable[[int, FewShotPlan], None] | None = None,
) -> FewShotResult:
    """Generates one synthetic text per target by DP few-shot aggregation.

    Args:
      lm: the frozen LM backend.
      private_rows: private examples (mappings with the fields `template.shot` reads).
      targets: one mapping per synthetic example with the fields header and stem read
        (e.g. {"label": ...} from a public label list, or a public document); public.
      template: prompt layout.
      config: hyper-parameters, with the declared `public_pool_size`.
      pool_field: if set, a target uses only the private rows whose `pool_field` equals
        its own (label-conditioned generation); else all rows. Rows whose value is no
        target's are never used.
      rng: host randomness (subsampling and noise); production: `secure_rng()`.
      ledger: charge the run's guarantee here before the first token.
      ledger_scope: (tenant, dataset) of the charge.
      plan: a plan from `plan_for` (computed here if None).
      on_token: called after every released token with the total released so far.

    Returns:
      The texts (without the stop token) and the plan.

    Raises:
      ValueError: a pool smaller than `config.public_pool_size` (its label is named, its
        size never), a plan that does not cover the run, or prompts that may overflow the
        model's context; all before the charge.

    Privacy:
      See the module docstring: (plan.epsilon, plan.delta)-DP for one private example
      under add/remove-one, charged to `ledger` before any token is released.
    """
    plan = plan or plan_for(private_rows, targets, template, config, pool_field=pool_field)
    pools = _pools(private_rows, targets, pool_field, config.public_pool_size)
    _check_plan(plan, config, pools)
    prompts = _Prompts(lm, template, private_rows, config.shot_tokens)
    frames = [prompts.frame(target) for target in targets]
    # A prompt's length depends on the private examples drawn: refuse, before the charge,
    # any run whose public worst case does not fit the model's context.
    context = getattr(lm, "max_context", None)
    longest = max(len(h) + len(st) for h, st in frames)
    worst = longest + config.shots_cap * prompts.shot_bound()
    if context is not None and worst + config.max_new_tokens > context:
        raise ValueError(
            f"a prompt may reach {worst} + {config.max_new_tokens} new tokens, more than the "
            f"model's context {context}: lower shots, max_shots, shot_tokens or max_new_tokens"
        )
    if ledger is not None:
        if ledger_scope is None:
            raise ValueError("ledger_scope=(tenant, dataset) is required with a ledger")
        ledger.charge(
            *ledger_scope,
            stage="fewshot-generate",
            event=plan.event,
            relation=RELATION,
            description=f"DP few-shot generation: {len(targets)} examples, "
            f"{plan.tokens} tokens per pool, eps={plan.epsilon:.4g}",
        )
    sample_rng, noise_rng = rng.spawn(2)
    released, texts = 0, []
    for frame, pool in zip(frames, pools, strict=True):
        public = prompts.prompt(frame, [])
        generated: list[int] = []
        if config.resample == "example":
            subsets = draw_subsets(pool, config, plan.sampling_rate, sample_rng)
            private = lm.start([prompts.prompt(frame, s) for s in subsets], config.max_new_tokens)
        for _ in range(config.max_new_tokens):
            if config.resample == "token":
                subsets = draw_subsets(pool, config, plan.sampling_rate, sample_rng)
                private = lm.score([prompts.prompt(frame, s) + generated for s in subsets])
            logprobs = np.vstack([_public_logprobs(lm, public + generated), private])
            token = release_token(logprobs, config, plan, noise_rng)
            released += 1
            if on_token is not None:
                on_token(released, plan)
            if _is_stop(lm, token, config):
                break
            generated.append(token)
            if config.resample == "example" and len(generated) < config.max_new_tokens:
                private = lm.append(token)
        texts.append(lm.decode(generated).strip())
    return FewShotResult(texts, plan, released)


def _check_plan(plan: FewShotPlan, config: FewShotConfig, pools: Sequence[np.ndarray]) -> None:
    """Refuses a plan that does not cover this run (it would under-charge)."""
    per_draw = 1 if config.resample == "token" else config.max_new_tokens
    counts: dict[int, int] = {}
    for pool in pools:
        counts[id(pool)] = counts.get(id(pool), 0) + 1
    if (
        plan.subsets != config.subsets
        or plan.mechanism != config.mechanism
        or plan.tokens_per_draw != per_draw
        or plan.public_pool_size != config.public_pool_size
        or plan.sampling_rate != config.sampling_rate
        or plan.pools < len(counts)
        or max(counts.values()) * config.max_new_tokens > plan.tokens
    ):
        raise ValueError("the privacy plan does not cover this run; make it with plan_for")


def _pools(rows, targets, pool_field: str | None, declared: int) -> list[np.ndarray]:
    """The private row indices of each target's pool; refuses pools below `declared`.

    The refusal names the pool by its label (public: it comes from the targets) and says
    only that the pool is smaller than the declared size, never how large it is.
    """
    if pool_field is None:
        if len(rows) < declared:
            raise ValueError("the private dataset is smaller than the declared public pool size")
        everything = np.arange(len(rows))
        return [everything] * len(targets)
    by_value: dict[Any, list[int]] = {}
    for i, row in enumerate(rows):
        by_value.setdefault(row[pool_field], []).append(i)
    arrays = {value: np.asarray(indices, np.int64) for value, indices in by_value.items()}
    empty = np.zeros(0, np.int64)
    pools = []  # one shared array per pool, so pools can be told apart by identity
    for target in targets:
        value = target[pool_field]
        pool = arrays.setdefault(value, empty)
        if pool.size < declared:
            raise ValueError(
                f"the private pool of {pool_field}={value!r} is smaller than the declared "
                "public pool size"
            )
        pools.append(pool)
    return pools


def plan_for(
    private_rows: Sequence[Mapping[str, Any]],
    targets: Sequence[Mapping[str, Any]],
    template: PromptTemplate,
    config: FewShotConfig,
    *,
    pool_field: str | None = None,
) -> FewShotPlan:
    """Validates the inputs and fixes the run's guarantee (before any model is loaded).

    The plan depends only on public figures (the config and the targets); the private rows
    are read only to refuse a pool smaller than `config.public_pool_size`.

    Raises:
      ValueError: no targets, a field the template reads is missing, a pool smaller than
        the declared public pool size (named by its label, size never shown), or a bad
        delta.
    """
    if not targets:
        raise ValueError("nothing to generate: no targets")
    shot_fields, target_fields = template.fields()
    if private_rows:
        missing = shot_fields - set(private_rows[0])
        if pool_field is not None and pool_field not in private_rows[0]:
            missing |= {pool_field}
        if missing:
            raise ValueError(
                f"private rows lack field(s) {sorted(missing)}; have {sorted(private_rows[0])}"
            )
    missing = target_fields - set(targets[0])
    if missing:
        raise ValueError(f"targets lack field(s) {sorted(missing)}")
    pools = _pools(private_rows, targets, pool_field, config.public_pool_size)
    per_pool: dict[int, int] = {}
    for pool in pools:
        per_pool[id(pool)] = per_pool.get(id(pool), 0) + 1
    tokens = max(per_pool.values()) * config.max_new_tokens
    return plan_privacy(config, tokens, len(per_pool))


# ---- output ------------------------------------------------------------------------------


def round_robin_targets(labels: Sequence[Any], num_examples: int) -> list[dict]:
    """`num_examples` targets cycling over the sorted distinct labels (a public schedule).

    `labels` must be a public list (never read from the private rows).
    """
    if num_examples < 1:
        raise ValueError(f"num_examples must be >= 1, got {num_examples=}")
    distinct = sorted(set(labels), key=str)
    if not distinct:
        raise ValueError("no labels")
    return [{"label": distinct[i % len(distinct)]} for i in range(num_examples)]


SEEDED_NOTE = (
    "the mechanism's randomness came from a fixed seed: reproducible by anyone who knows "
    "the seed, so this output is for tests only, not for publication"
)


def write_output(
    out_dir: str,
    columns: Mapping[str, Sequence[Any]],
    result: FewShotResult,
    config: FewShotConfig,
    *,
    model: str,
    template: PromptTemplate,
    name: str = "synthetic",
    rows: str = "all rows of the private data",
    seeded: bool = False,
) -> dict:
    """Writes `<name>.jsonl`, `<name>.parquet` and metadata.json (with the guarantee).

    Args:
      out_dir: output folder (released: public figures and DP outputs only).
      columns: the released columns.
      result: the run's result.
      config: the run's hyper-parameters (all public, the pool size declared).
      model: backend description.
      template: the prompt layout.
      name: file stem.
      rows: which private rows the guarantee covers (e.g. a split or a limit).
      seeded: the mechanism's randomness came from a fixed seed (tests only).

    Privacy:
      Metadata holds only declared or DP figures: the plan (from `public_pool_size`),
      the config and the count of released tokens; no real pool size and no timing.
    """
    from pathlib import Path

    import datasets

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    dataset = datasets.Dataset.from_dict({k: list(v) for k, v in columns.items()})
    dataset.to_json(out / f"{name}.jsonl", lines=True, force_ascii=False)
    dataset.to_parquet(out / f"{name}.parquet")
    privacy = result.plan.to_dict()
    privacy["rows_covered"] = rows
    metadata = {
        "privacy": privacy,
        "randomness": {"seeded": seeded, "note": SEEDED_NOTE if seeded else "OS entropy"},
        "post_processing": "texts are decoded from DP-released tokens and stripped",
        "model": {"backend": model},
        "generation": {
            "method": "DP few-shot generation (Tang et al. 2024)",
            "config": dataclasses.asdict(config),
            "template": dataclasses.asdict(template),
            "tokens_released": result.tokens_released,
        },
        "num_examples": len(dataset),
    }
    (out / "metadata.json").write_text(json.dumps(metadata, indent=1, default=str))
    return metadata
