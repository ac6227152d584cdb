"""One-run canary audits of a generator's released text: the shared design.

The few-shot generator and Private Evolution train nothing and release text; their audits
(`fewshot_release_audit`, `evolution_release_audit`) share this design (Steinke, Nasr &
Jagielski 2023): m canaries made from public material only (a secret of random words from
`secret_vocabulary`, mid-frequency public words; where the generator needs outliers, an
`invented_name`), each included by a fair coin (`coins.draw_coins`); ONE run of the
generator on ordinary private examples (wiki stand-ins, `wiki_stand_ins`) plus the included
canaries, every size it declares fixed from ordinary rows + m, never from the coins, so the
claim does not depend on them; each canary scored from its own text and the released texts
ONLY (`secret_word_scores`, `max_cosine_scores`); the bounds and the cap of
`whitebox.canary_figures` (`ReleaseCell`). A bound above the claim is a defect to report,
never a setting to tune away. One JSON file per cell (`run_cells`): an interrupted table
resumes; a cell is re-run whole, with fresh coins. See docs/guides/audits.md ("Few-shot,
Private Evolution and DP-RAG with power").

Privacy:
  The canaries are public (public words, OS-entropy randomness); which went in (the
  coins), the per-canary scores and the released texts are the audit's secrets: they
  live in memory, or in the PRIVATE work folder a caller names (`save_private`, mode
  0700), and are never logged, returned or written into a cell file. A cell file holds
  aggregates only (counts, rates, areas, epsilons, public settings, seconds). The audited
  runs are not charged to a ledger: nothing but the aggregates leaves, and publishing the
  aggregates of a run at epsilon costs that epsilon; an epsilon = inf cell is NOT private.

References: Steinke, Nasr, Jagielski 2023 (arXiv 2305.08846); Mahloujifar, Melis, Chaudhuri
2024 (arXiv 2410.22235); Panda et al. 2025 (arXiv 2503.06808: canaries with a typical prefix
and a secret); Carlini et al. 2019 (the secret sharer).
"""

from __future__ import annotations

import collections
import dataclasses
import json
import math
import re
import sys
import time
import zlib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from synthgen.audit.cells import resumable_cells, settings_of
from synthgen.audit.claims import epsilon_tag
from synthgen.audit.coins import draw_coins, streams
from synthgen.audit.whitebox import canary_figures

_WORD = re.compile(r"[a-z]+")
_CONSONANTS = "bdfgklmnprstvz"
_VOWELS = "aeiou"
NOISE_OFF = 1e-9  # the noise multiplier of an epsilon = inf run: argmax / exact counts


def words_of(text: str) -> list[str]:
    """The lower-case alphabetic words of `text`, in order."""
    return _WORD.findall(text.lower())


def secret_vocabulary(
    documents: Sequence[str], *, size: int = 2000, skip_common: int = 300, min_len: int = 5
) -> list[str]:
    """A public word list for secrets: mid-frequency words of public documents.

    Words of `min_len` to 12 letters are ranked by their count in `documents` (ties by
    first appearance); the `skip_common` most frequent are left out, so that a secret word
    appears in an unrelated text rarely, and the next `size` are kept.

    Raises:
      ValueError: fewer than 20 words remain.
    """
    counts = collections.Counter(
        w for doc in documents for w in words_of(doc) if min_len <= len(w) <= 12
    )
    ranked = [w for w, _ in counts.most_common()]
    words = ranked[skip_common : skip_common + size]
    if len(words) < 20:
        raise ValueError(f"only {len(words)} usable secret words; give more public documents")
    return words


def invented_name(rng: np.random.Generator) -> str:
    """A made-up two-word subject ("Velkora Tumbris"): random syllables, no real entity."""

    def word() -> str:
        syllables = int(rng.integers(2, 4))
        text = "".join(
            rng.choice(list(_CONSONANTS)) + rng.choice(list(_VOWELS)) for _ in range(syllables)
        )
        return (text + rng.choice(list(_CONSONANTS))).capitalize()

    return f"{word()} {word()}"


class ReleaseCanaries:
    """m canaries: their texts and secrets (word tuples). Public material: no coins."""

    def __init__(self, texts: Sequence[str], secrets: Sequence[tuple[str, ...]]) -> None:
        if len(texts) != len(secrets):
            raise ValueError("one secret per canary text is needed")
        self.texts = tuple(texts)
        self.secrets = tuple(tuple(s) for s in secrets)

    def __len__(self) -> int:
        return len(self.texts)


def make_release_canaries(
    num: int,
    words: Sequence[str],
    rng: np.random.Generator,
    *,
    template: str,
    secret_words: int = 3,
) -> ReleaseCanaries:
    """`num` canaries: `template` filled with a secret (and an invented subject).

    Args:
      num: m.
      words: the public word list of the secrets (`secret_vocabulary`).
      rng: the public canary-material stream.
      template: the canary's text, with "{secret}" (the secret's words, space-separated)
        and optionally "{name}" (an `invented_name`, distinct per canary).
      secret_words: words per secret, distinct within a secret, drawn uniformly.

    Raises:
      ValueError: bad sizes or a template without "{secret}".
    """
    if num < 2 or secret_words < 1:
        raise ValueError(f"need num >= 2 and secret_words >= 1, got {num=}, {secret_words=}")
    check_canary_template(template)
    if len(set(words)) < secret_words:
        raise ValueError(f"need >= {secret_words} distinct secret words, got {len(set(words))}")
    vocabulary = sorted(set(words))
    names: set[str] = set()
    texts, secrets = [], []
    for _ in range(num):
        secret = tuple(str(w) for w in rng.choice(vocabulary, secret_words, replace=False))
        name = ""
        if "{name}" in template:
            while not name or name in names:
                name = invented_name(rng)
            names.add(name)
        texts.append(template.format(secret=" ".join(secret), name=name))
        secrets.append(secret)
    return ReleaseCanaries(texts, secrets)


# ---- scores: functions of a canary and the released texts only --------------------------------


def secret_word_score(secret: Sequence[str], text_words: Sequence[str]) -> float:
    """run + hits / (k + 1) for one released text's words (k = len(secret)).

    `run` is the longest stretch of the secret's words that appears consecutively and in
    order in the text; `hits` the number of distinct secret words in it (the tie-break
    between equal runs). 0 when no secret word appears.
    """
    k = len(secret)
    present = set(text_words)
    hits = sum(1 for w in set(secret) if w in present)
    if not hits:
        return 0.0
    run = 1
    for i in range(len(text_words)):
        length = 0
        while (
            length < k
            and i + length < len(text_words)
            and any(
                secret[s : s + length + 1] == tuple(text_words[i : i + length + 1])
                for s in range(k - length)
            )
        ):
            length += 1
        run = max(run, length)
    return float(run) + hits / (k + 1)


def secret_word_scores(secrets: Sequence[Sequence[str]], texts: Sequence[str]) -> np.ndarray:
    """[m] scores: per canary, the best `secret_word_score` over the released texts."""
    tokenised = [words_of(t) for t in texts]
    index: dict[str, list[int]] = collections.defaultdict(list)
    for j, ws in enumerate(tokenised):
        for w in set(ws):
            index[w].append(j)
    out = np.zeros(len(secrets))
    for i, secret in enumerate(secrets):
        secret = tuple(secret)
        candidates = {j for w in secret for j in index.get(w, ())}
        out[i] = max((secret_word_score(secret, tokenised[j]) for j in candidates), default=0.0)
    return out


def word_embedding(texts: Sequence[str], dim: int = 4096) -> np.ndarray:
    """[n, dim] hashed bag-of-words vectors (CRC32 of each word), L2-normalised.

    A public, deterministic encoder that needs no model: identical word multisets map to
    the same vector, and texts sharing no word are orthogonal (up to hash collisions).
    """
    out = np.zeros((len(texts), dim), np.float32)
    for i, text in enumerate(texts):
        for word in words_of(text):
            out[i, zlib.crc32(word.encode()) % dim] += 1.0
    norms = np.linalg.norm(out, axis=1, keepdims=True)
    return out / np.where(norms > 0, norms, 1.0)


def max_cosine_scores(canaries: np.ndarray, released: np.ndarray) -> np.ndarray:
    """[m] scores: each canary's largest cosine similarity with any released sample."""
    a = np.asarray(canaries, np.float64)
    b = np.asarray(released, np.float64)
    a = a / np.maximum(np.linalg.norm(a, axis=1, keepdims=True), 1e-12)
    b = b / np.maximum(np.linalg.norm(b, axis=1, keepdims=True), 1e-12)
    if not len(b):
        return np.zeros(len(a))
    return (a @ b.T).max(axis=1)


# ---- statistics, private records, cells ---------------------------------------------------


@dataclasses.dataclass(frozen=True)
class ReleaseCell:
    """The arguments every release-audit cell shares (named as the cells' own), the steps
    it runs with them, and its clock, started on creation.

    Creation checks the public arguments; `draw` refuses the plan's delta, then draws the
    canaries and the coins; `result` scores them and makes the cell's record.

    Attributes:
      epsilon: the run's target epsilon; math.inf switches the noise off (claim: inf).
      canaries: m, each included with probability 1/2.
      significance: level of both bounds (0.05: 95%).
      canary_template: a canary's text, with "{secret}" (and "{name}" for outliers).
      secret_words: words per secret.
      seed: None (production): 128 bits of OS entropy; fixed seeds are for tests only.
      work_dir: a PRIVATE folder for the coins, scores and released texts (None: memory).

    Raises:
      ValueError: fewer than 2 canaries, epsilon not > 0 (NaN included), a significance
        outside (0, 0.5), no secret word, or a template without "{secret}".
    """

    epsilon: float
    canaries: int
    significance: float
    canary_template: str
    secret_words: int
    seed: int | None = dataclasses.field(repr=False)  # it draws the secret coins
    work_dir: str | Path | None
    start: float = dataclasses.field(default_factory=time.perf_counter, repr=False)

    def __post_init__(self) -> None:
        num_canaries, epsilon, significance = self.canaries, self.epsilon, self.significance
        if num_canaries < 2:
            raise ValueError(f"need >= 2 canaries, got {num_canaries=}")
        if math.isnan(epsilon) or not epsilon > 0:
            raise ValueError(f"epsilon must be > 0 or math.inf, got {epsilon=}")
        if not 0 < significance < 0.5:
            raise ValueError(f"significance must be in (0, 0.5), got {significance=}")
        if self.secret_words < 1:
            raise ValueError(f"need secret_words >= 1, got {self.secret_words=}")
        check_canary_template(self.canary_template)

    def draw(self, public_texts: Sequence[str], plan: Any) -> tuple[ReleaseCanaries, Any, int]:
        """(canaries, coins, run seed): independent streams of the audit seed
        (`coins.streams`) give the canaries' public material (secrets from
        `secret_vocabulary(public_texts)`), the secret coins and the run's seed.

        Raises:
          ValueError: 2 m delta > 1 (the one-run p-value is monotone only below it).
        """
        delta, num_canaries = plan.delta, self.canaries
        if 2 * num_canaries * delta > 1:
            raise ValueError(
                f"delta must be <= 1/(2 m) for m canaries, got {delta=}, {num_canaries=}"
            )
        material, coin_rng, run_seed = streams(self.seed)
        drawn = make_release_canaries(
            self.canaries,
            secret_vocabulary(public_texts),
            material,
            template=self.canary_template,
            secret_words=self.secret_words,
        )
        return drawn, draw_coins(coin_rng, self.canaries), run_seed

    def result(
        self,
        result_type: type,
        observable: str,
        scores: np.ndarray,
        coins: np.ndarray,
        released: Sequence[str],
        *,
        found_at: float,
        found: tuple[str, str],
        tag: str,
        plan: Any,
        **fields: Any,
    ) -> Any:
        """The cell's `result_type`: `whitebox.canary_figures` for the claim `plan`, `fields`,
        the secret words and the seconds.

        `found` names the fields counting the included / excluded canaries that score at
        least `found_at`. The secrets (coins, scores, released texts) go to the PRIVATE
        `work_dir` only (`save_private`, `<tag>_eps<epsilon>`).
        """
        coins = np.asarray(coins, bool)
        figures = canary_figures(
            {observable: scores},
            coins,
            target_epsilon=self.epsilon,
            claimed_epsilon=plan.epsilon,
            delta=plan.delta,
            significance=self.significance,
        )
        save_private(
            self.work_dir,
            f"{tag}_eps{epsilon_tag(self.epsilon)}",
            coins=coins,
            scores=scores,
            released=list(released),
        )
        hit = scores >= found_at
        fields[found[0]], fields[found[1]] = int(np.sum(hit & coins)), int(np.sum(hit & ~coins))
        seconds = time.perf_counter() - self.start
        return result_type(secret_words=self.secret_words, seconds=seconds, **fields, **figures)


def check_canary_template(template: str, *, name: bool = False) -> None:
    """Refuses a canary template without "{secret}" (or without "{name}" when `name`)."""
    if "{secret}" not in template:
        raise ValueError(f"the canary template needs {{secret}}, got {template=}")
    if name and "{name}" not in template:
        raise ValueError(f"these canaries need an invented {{name}} (outliers), got {template=}")


def save_private(work_dir: str | Path | None, tag: str, **values: Any) -> None:
    """Writes the audit's secrets (coins, scores, released texts) to the PRIVATE folder.

    Nothing is written when `work_dir` is None. Arrays go to `<tag>.npz`, lists of texts
    to `<tag>_texts.json`; the folder is created with mode 0700, the files 0600.
    """
    if work_dir is None:
        return
    from synthgen.work_folder import private_folder, write_private

    folder = private_folder(work_dir)
    texts = {k: v for k, v in values.items() if isinstance(v, list)}
    arrays = {k: np.asarray(v) for k, v in values.items() if k not in texts}
    np.savez(folder / f"{tag}.npz", **arrays)
    (folder / f"{tag}.npz").chmod(0o600)
    if texts:
        write_private(folder / f"{tag}_texts.json", json.dumps(texts))


def wiki_stand_ins(
    num_private: int,
    num_public: int,
    private_texts: Sequence[str] | None = None,
    public_texts: Sequence[str] | None = None,
) -> tuple[list[str], list[str]]:
    """(private texts, public documents): those given, else consecutive wiki summaries.

    The first `num_private` documents play the private examples (as the query generator's
    audit-power cells do); the next `num_public` are public material (secret words, fillers).
    """
    if private_texts is None or public_texts is None:
        from synthgen.corpora import load_wiki_summaries

        documents = load_wiki_summaries()["document"]
        if num_private + num_public > len(documents):
            raise ValueError(
                f"{num_private} + {num_public} documents exceed the corpus's {len(documents)}"
            )
        if private_texts is None:
            private_texts = documents[:num_private]
        if public_texts is None:
            public_texts = documents[num_private : num_private + num_public]
    return [str(t) for t in private_texts], [str(t) for t in public_texts]


def cell_path(out_dir: str | Path, kind: str, label: str, num_canaries: int, eps: float) -> Path:
    """`<kind>_<label>_m<m>_eps<tag>.json` in `out_dir`."""
    return Path(out_dir) / f"{kind}_{label}_m{num_canaries}_eps{epsilon_tag(eps)}.json"


def run_cells(
    out_dir: str | Path,
    kind: str,
    label: str,
    epsilons: Sequence[float],
    canaries: int,
    cell: Callable[..., Any],
    result_type: type,
    *,
    backend: Any = None,
    seed: int | None = None,
    work_dir: str | Path | None = None,
    log: Callable[[str], None] = print,
    **settings: Any,
) -> list:
    """Runs (or reads back) one cell per epsilon; resumable by cell.

    Cell k runs `cell(backend, epsilon=, canaries=, seed=seed + k, work_dir=, **settings)`
    and is written to `cell_path(out_dir, kind, label, canaries, epsilon)`.

    Args:
      out_dir: the results folder (aggregates only); created if needed.
      kind: the file-name kind ("fewshot_power", "evolution_power").
      label: a public label of the audited setting (file-name safe).
      epsilons: the cells' target epsilons (math.inf: noise off).
      canaries: m per cell (in the file name).
      cell: the one-cell function (`run_fewshot_power_cell`, `run_evolution_power_cell`).
      result_type: the result dataclass (its `from_dict` reads a file back).
      backend: the cell's first argument (the LM or sampler).
      seed: None (OS entropy) except in tests; cell k uses seed + k.
      work_dir: a PRIVATE folder for each cell's coins, scores and texts (None: memory).
      log: progress lines (file names and seconds only).
      **settings: further `cell` arguments; a file that records other settings (or
        `cell`'s other defaults) is refused (`cells.read_back`), not reused.

    Returns:
      One result per epsilon, in order.

    Raises:
      ValueError: a bad label, or a cell file made with other settings.
    """
    if not re.fullmatch(r"[A-Za-z0-9_.-]+", label):
        raise ValueError(f"label must be file-name safe ([A-Za-z0-9_.-]), got {label=}")

    def run(epsilon: float, k: int) -> Any:
        seed_k = None if seed is None else seed + k
        return cell(
            backend, epsilon=epsilon, canaries=canaries, seed=seed_k, work_dir=work_dir, **settings
        )

    return resumable_cells(
        epsilons,
        lambda epsilon: cell_path(out_dir, kind, label, canaries, epsilon),
        run,
        result_type,
        expect=settings_of(cell, **settings, num_canaries=canaries),
        log=log,
    )


def cell_runner(kind: str, label: str, cell: Callable[..., Any], result_type: type) -> Callable:
    """`run_<kind>_cells`: `run_cells` for one audit's `cell` and `result_type`."""

    def runner(
        out_dir: str | Path,
        backend: Any,
        epsilons: Sequence[float],
        *,
        label: str = label,
        canaries: int = 1000,
        **options: Any,
    ) -> list:
        # the module's cell at call time, as a module global is looked up (tests replace it)
        bound = getattr(sys.modules[cell.__module__], cell.__name__)
        return run_cells(
            out_dir, kind, label, epsilons, canaries, bound, result_type, backend=backend, **options
        )

    runner.__name__ = runner.__qualname__ = f"run_{kind}_cells"
    runner.__module__ = cell.__module__
    runner.__doc__ = f"""Runs (or reads back) one `{cell.__name__}` per epsilon; resumable by cell.

    Writes `{kind}_<label>_m<canaries>_eps<tag>.json` files (aggregates only) in `out_dir`;
    `backend` is the cell's LM or sampler; `options` are `run_cells`'s seed (cell k uses
    seed + k), log and work_dir, and further `{cell.__name__}` arguments. Returns one
    `{result_type.__name__}` per epsilon, in order.
    """
    return runner
