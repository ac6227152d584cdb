"""Canaries for memorisation audits: secret-bearing (document, query) pairs, half inserted.

Four kinds, after Carranza et al. 2023 (Table 7) and Panda et al. 2025; every canary's
private query is `"<key> <secret>"` (random key words, then the secret: only queries are
private in the query generator, so a secret in the document would be copied, not
memorised)::

  secret           no document; a random 10-digit secret.
  real_document    a real public document.
  random_document  a document of random words.
  rare_token       a random document; the secret is 10 of the base model's rarest tokens.

Each canary is repeated `repetitions` times and included with probability 1/2,
independently (Steinke et al. 2023). Reference secrets for exposure come from the same
space, with the same key and document. See docs/guides/audits.md ("What is measured").

Privacy:
  Canaries are made from public text and OS-entropy randomness; they are not private data.
  Which canaries were inserted, and their secrets, are the audit's ground truth: the record
  is written to the private work folder (`save_record`), never to the audit's report folder.

References: Carlini et al. 2019; Carranza et al. 2023; Panda et al. 2025; Steinke, Nasr,
Jagielski 2023.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Sequence
from pathlib import Path

import numpy as np

KINDS = ("secret", "real_document", "random_document", "rare_token")
DIGITS = 10
RECORD_FILE = "canaries.json"
_WORD = re.compile(r"^[a-z]{3,10}$")
_FALLBACK_WORDS = (
    "river stone garden window music paper orange silver market winter table lamp cloud "
    "forest engine letter bridge castle mirror planet rocket island yellow candle simple "
    "hidden summer travel doctor animal number morning pocket valley thunder velvet"
).split()


@dataclasses.dataclass(frozen=True)
class CanarySpec:
    """What to insert.

    Attributes:
      kinds: canary kinds (see the module docstring).
      repetitions: each canary of a cell is repeated this many times when included.
      per_cell: canaries per (kind, repetitions) cell; a dict maps a repetition count to its
        own number (fewer for large counts keeps the training set small).
      key_words: words in each canary's random query.
      document_words: words in a random document.
      rare_pool: size of the rare-token pool of `rare_token` secrets.
      references: reference secrets scored per canary for exposure.
    """

    kinds: tuple[str, ...] = KINDS
    repetitions: tuple[int, ...] = (1, 10, 100)
    per_cell: int | dict[int, int] = 8
    key_words: int = 3
    document_words: int = 24
    rare_pool: int = 64
    references: int = 100

    def __post_init__(self) -> None:
        unknown = [k for k in self.kinds if k not in KINDS]
        if unknown or not self.kinds:
            raise ValueError(f"kinds must be a non-empty subset of {KINDS}, got {self.kinds=}")
        if not self.repetitions or min(self.repetitions) < 1:
            raise ValueError(f"repetitions must be >= 1, got {self.repetitions=}")
        if min(self.cell_size(r) for r in self.repetitions) < 1:
            raise ValueError(f"every cell needs >= 1 canary, got {self.per_cell=}")
        if self.key_words < 1 or self.document_words < 1 or self.references < 3:
            raise ValueError(f"bad sizes: {self.key_words=}, {self.references=}")
        if self.rare_pool < 2:
            raise ValueError(f"rare_pool must be >= 2, got {self.rare_pool=}")

    def cell_size(self, repetitions: int) -> int:
        if isinstance(self.per_cell, dict):
            return int(self.per_cell.get(repetitions, 0))
        return int(self.per_cell)


@dataclasses.dataclass(frozen=True)
class Canary:
    """One canary: its pair, its secret's space, and whether it was inserted."""

    id: int
    kind: str
    repetitions: int
    document: str
    key: str
    secret: str
    included: bool

    @property
    def query(self) -> str:
        return f"{self.key} {self.secret}"

    def with_secret(self, secret: str) -> str:
        """The canary's query with another secret from the same space (a reference)."""
        return f"{self.key} {secret}"


def public_words(documents: Sequence[str], limit: int = 2000) -> list[str]:
    """Distinct lower-case words of public documents, for random queries and documents."""
    words: dict[str, None] = {}
    for document in documents:
        for word in document.lower().split():
            if _WORD.match(word):
                words.setdefault(word)
                if len(words) >= limit:
                    return list(words)
    return list(words) if len(words) >= 20 else list(_FALLBACK_WORDS)


def digit_secret(rng: np.random.Generator) -> str:
    """A uniformly random 10-digit string (space 10^10)."""
    return "".join(str(d) for d in rng.integers(0, 10, DIGITS))


def rare_token_pool(tokenizer, log_probs: np.ndarray, size: int) -> list[int]:
    """The `size` least likely tokens under the base model that are whole words on their own.

    Args:
      tokenizer: the generator's tokenizer.
      log_probs: the base model's log-probabilities of every token id (e.g. the first query
        token after a public prompt); public, computed on no private data.
      size: how many tokens to keep.
    """
    pool: list[int] = []
    for token in np.argsort(np.asarray(log_probs)):
        token = int(token)
        if token in (tokenizer.eos_id, tokenizer.pad_id, tokenizer.bos_id):
            continue
        text = tokenizer.decode([token]).strip()
        if not text.isalpha() or not text.isascii() or len(text) < 2:
            continue
        # One token as a space-separated word: a secret of 10 such words is ~10 tokens.
        if len(tokenizer.encode("a " + text)) != len(tokenizer.encode("a")) + 1:
            continue
        pool.append(token)
        if len(pool) == size:
            return pool
    raise ValueError(f"only {len(pool)} clean rare tokens, fewer than {size=}")


def rare_secret(rng: np.random.Generator, tokenizer, pool: Sequence[int]) -> str:
    """A secret of 10 tokens drawn uniformly from `pool` (space len(pool)^10)."""
    return " ".join(tokenizer.decode([int(t)]).strip() for t in rng.choice(pool, DIGITS))


def reference_secret(canary: Canary, rng: np.random.Generator, tokenizer=None, pool=()) -> str:
    """A secret drawn from the same space as `canary`'s."""
    if canary.kind == "rare_token":
        return rare_secret(rng, tokenizer, pool)
    return digit_secret(rng)


def space_size(canary: Canary, pool_size: int) -> float:
    """The size of the canary's secret space."""
    return float(pool_size) ** DIGITS if canary.kind == "rare_token" else 10.0**DIGITS


def make_canaries(
    spec: CanarySpec, public_documents: Sequence[str], rng: np.random.Generator
) -> list[Canary]:
    """Draws the canaries of every (kind, repetitions) cell; each is included w.p. 1/2.

    `rare_token` canaries get their secrets from `with_rare_secrets` once the tokenizer
    the generator trains with is known (a random-init vocabulary is trained on the
    documents, canary documents included); until then they hold a digit secret.

    Args:
      spec: what to insert.
      public_documents: public text: the real documents of `real_document` canaries and
        the words of random queries and documents.
      rng: the audit's generator (OS entropy in production).
    """
    if "real_document" in spec.kinds and not public_documents:
        raise ValueError("real_document canaries need public documents")
    words = public_words(public_documents)
    canaries: list[Canary] = []
    for repetitions in spec.repetitions:
        for kind in spec.kinds:
            for _ in range(spec.cell_size(repetitions)):
                key = " ".join(rng.choice(words, spec.key_words))
                if kind == "secret":
                    document = ""
                elif kind == "real_document":
                    document = str(public_documents[int(rng.integers(len(public_documents)))])
                else:
                    document = " ".join(rng.choice(words, spec.document_words))
                secret = digit_secret(rng)
                canaries.append(
                    Canary(
                        id=len(canaries),
                        kind=kind,
                        repetitions=repetitions,
                        document=document,
                        key=key,
                        secret=secret,
                        included=bool(rng.integers(2)),
                    )
                )
    return canaries


def with_rare_secrets(
    canaries: Sequence[Canary], rng: np.random.Generator, tokenizer, pool: Sequence[int]
) -> list[Canary]:
    """The canaries with every `rare_token` secret drawn from `pool` (see `rare_token_pool`)."""
    if any(c.kind == "rare_token" for c in canaries) and len(pool) < 2:
        raise ValueError("rare_token canaries need a rare-token pool of >= 2 tokens")
    return [
        dataclasses.replace(c, secret=rare_secret(rng, tokenizer, pool))
        if c.kind == "rare_token"
        else c
        for c in canaries
    ]


def insertions(canaries: Sequence[Canary]) -> tuple[list[str], list[str]]:
    """(documents, queries) of the included canaries, each repeated `repetitions` times."""
    documents: list[str] = []
    queries: list[str] = []
    for canary in canaries:
        if canary.included:
            documents += [canary.document] * canary.repetitions
            queries += [canary.query] * canary.repetitions
    return documents, queries


def split_by_repetitions(
    canaries: Sequence[Canary], scores: Sequence[float]
) -> dict[int, tuple[list[float], list[float]]]:
    """Per repetition count: (scores of the inserted canaries, scores of the held-out ones)."""
    groups: dict[int, tuple[list[float], list[float]]] = {}
    for canary, score in zip(canaries, scores, strict=True):
        inside, outside = groups.setdefault(canary.repetitions, ([], []))
        (inside if canary.included else outside).append(float(score))
    return dict(sorted(groups.items()))


def in_out_groups(drawn: Sequence[Canary], key=lambda c: c.repetitions):
    """(key, included, indices) of each non-empty group of `drawn`: keys sorted, in then out."""
    for value in sorted({key(c) for c in drawn}):
        for included in (True, False):
            idx = [i for i, c in enumerate(drawn) if key(c) == value and c.included == included]
            if idx:
                yield value, included, idx


def summary(spec: CanarySpec, drawn: Sequence[Canary]) -> dict:
    """The audit report's figures of the canaries: kinds, repetitions and counts."""
    return {
        "kinds": list(spec.kinds),
        "repetitions": list(spec.repetitions),
        "total": len(drawn),
        "included": sum(c.included for c in drawn),
        "references_per_canary": spec.references,
    }


def save_record(canaries: Sequence[Canary], work_dir: str | Path, **extra) -> Path:
    """Writes the canaries (with secrets and in/out labels) to the PRIVATE work folder."""
    from synthgen.work_folder import private_folder

    path = private_folder(work_dir) / RECORD_FILE
    record = {"canaries": [dataclasses.asdict(c) for c in canaries], **extra}
    path.write_text(json.dumps(record, indent=1))
    return path


def load_record(work_dir: str | Path) -> tuple[list[Canary], dict]:
    """Reads `save_record`'s file: (canaries, the extra fields)."""
    record = json.loads((Path(work_dir) / RECORD_FILE).read_text())
    canaries = [Canary(**c) for c in record.pop("canaries")]
    return canaries, record
