"""Release the facts many records state, once: DP set union over typed facts.

Each record contributes at most K facts (`synthgen.knowledge.typed_facts`; or, with
``extractor="phrases"``, the release before issue 69: unordered pairs of key phrases) and
PipelineDP's partition selection with counts (`synthgen.privacy.partition_selection`)
releases the facts many records share, with noisy counts (DP set union: Gopi et al. 2020;
DPNE: Kim et al. 2021). The synthetic records, one per released subject, and every answer
read from them are post-processing. The records a fact needs are the threshold's
(`FactPlan.records_needed`), known from n, epsilon, delta and K before any record is read.
See docs/guides/knowledge.md.

Privacy:
  Unit: one record, add/remove-one. One (epsilon, delta)-DP release: a record contributes
  each fact once and at most K of them (L2 sensitivity sqrt(K)); a value's kind is a
  function of the released value's text. A fact one record holds is released with
  probability `FactPlan.singleton_probability` (delta / 2K, at most delta). The ledger is
  charged that one event before the selection runs; the draw is kept in the private work
  folder, under its lock (`synthgen.knowledge.work_lock`) from the charge until the draw is
  written, so a rerun or a concurrent run returns it instead of drawing again. The running
  time of the rule and of PipelineDP grows with n and the number of distinct pairs.
  ``FactConfig.backend="beam"`` runs the same mechanism on Beam's workers.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import secrets
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

from dp_accounting import dp_event

from synthgen.knowledge.phrases import record_pairs, split_pair, zipf
from synthgen.knowledge.typed_facts import (
    KIND_LABELS,
    record_fact_keys,
    split_fact,
    value_kind,
)
from synthgen.knowledge.work_lock import work_lock
from synthgen.privacy import accounting, calibration
from synthgen.privacy.partition_selection import (
    MECHANISM,
    check_backend,
    keep_probability,
    noise_stddev,
    release_key_counts,
    selection_threshold,
)
from synthgen.privacy.receipts import Payer, paid
from synthgen.work_folder import private_folder, write_private

RELATION = "ADD_OR_REMOVE_ONE"
EXTRACTORS = ("typed", "phrases")
PLAN_SUPPORTS = (1, 3, 5, 10, 20, 50, 100)
CHARGE_FILE = "facts_charge.json"  # the charge's idempotency key (private work folder)
RESULT_FILE = "facts_result.json"  # the released pairs, kept so a rerun draws nothing new
DRAWING_FILE = "facts_drawing"  # written before the selection draws: one draw a charge
LOCK_FILE = "facts.lock"  # held from the charge until the draw is written


@dataclasses.dataclass(frozen=True)
class FactConfig:
    """Public parameters of a fact release.

    Attributes:
      epsilon, delta: the whole release, per record (delta < 1/n is checked by the plan).
      max_pairs: K, most facts one record contributes. Chosen on the validation domains
        (docs/guides/knowledge.md): 1.
      max_partners: most partners a synthetic record lists (by noisy count).
      extractor: what a fact is: ``typed`` (the default), a (subject, value) pair whose
        value is typed (`synthgen.knowledge.typed_facts`: metadata dropped, technical
        values whole, the subject each value is said of); ``phrases``, an unordered pair of
        key phrases (`synthgen.knowledge.phrases`, the release before issue 69).
      backend: where the extraction and selection run: ``local`` (PipelineDP's local
        backend, the default) or ``beam`` (Apache Beam, ``pip install 'dpsynth[beam]'``:
        each record's facts are read inside the pipeline). The same mechanism, so the same
        guarantee; not a privacy parameter (the plan's dict does not hold it).
      beam_options: Beam pipeline flags for ``beam`` (e.g. a runner; default: the
        DirectRunner).
    """

    epsilon: float
    delta: float = 1e-6
    max_pairs: int = 1
    max_partners: int = 8
    extractor: str = "typed"
    backend: str = "local"
    beam_options: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        if not (math.isfinite(self.epsilon) and self.epsilon > 0):
            raise ValueError(f"epsilon must be finite and > 0, {self.epsilon=}")
        if not 0 < self.delta < 1:
            raise ValueError(f"delta must be in (0, 1), {self.delta=}")
        if self.max_pairs < 1 or self.max_partners < 1:
            raise ValueError(f"max_pairs and max_partners must be >= 1: {self}")
        if self.extractor not in EXTRACTORS:
            raise ValueError(f"extractor must be one of {EXTRACTORS}, got {self.extractor=}")
        check_backend(self.backend)
        if self.beam_options is not None:
            object.__setattr__(self, "beam_options", tuple(self.beam_options))
        if self.beam_options is not None and self.backend != "beam":
            raise ValueError(f"beam_options need backend='beam', got {self.backend=}")


@dataclasses.dataclass(frozen=True)
class FactPlan:
    """What a release at (epsilon, delta, K) can carry, from public figures only.

    A `synthgen.privacy.release_plan.ReleasePlan`: one (epsilon, delta) event, charged
    under `relation` through the payer `release_facts` is handed.
    """

    config: FactConfig
    num_records: int

    @property
    def epsilon(self) -> float:
        return self.config.epsilon

    @property
    def delta(self) -> float:
        return self.config.delta

    @property
    def relation(self) -> accounting.NeighboringRelation:
        """The neighbouring relation of `event` (`RELATION`: the one the payer charges)."""
        return accounting.NeighboringRelation[RELATION]

    @property
    def _selection(self) -> tuple[float, float, int]:
        """(epsilon, delta, K): the partition selection's public parameters."""
        return self.config.epsilon, self.config.delta, self.config.max_pairs

    @property
    def threshold(self) -> float:
        """The noisy count a pair needs (PipelineDP's Gaussian thresholding)."""
        return selection_threshold(*self._selection)

    def keep_probability(self, records: int) -> float:
        """Probability that a pair stated by `records` records is released."""
        return keep_probability(records, *self._selection)

    @property
    def noise_stddev(self) -> float:
        """The standard deviation of the noise on each released count (public)."""
        return noise_stddev(*self._selection)

    @property
    def singleton_probability(self) -> float:
        """Probability that a pair one record states is released (at most delta)."""
        return self.keep_probability(1)

    def records_needed(self, probability: float = 0.5) -> int:
        """Fewest records stating a pair for it to be released with `probability`."""

        def enough(records: float) -> bool:
            return self.keep_probability(int(records)) >= probability

        if enough(1):
            return 1
        low, high = calibration.grow(
            lambda n: not enough(n), 1, 2, limit=10**9, error="no count reaches that probability"
        )
        return int(calibration.bisect(enough, high, low, integer=True))

    @property
    def event(self) -> dp_event.DpEvent:
        return accounting.epsilon_delta_event(self.config.epsilon, self.config.delta)

    def problems(self) -> list[str]:
        """Why this release should not run (empty: it may)."""
        c, n = self.config, self.num_records
        out = []
        if n < 1:
            out.append("the collection holds no record")
        elif c.delta >= 1.0 / n:
            out.append(
                f"delta={c.delta:g} is not below 1/n = {1.0 / n:.3g}: a release could then "
                "publish a whole record; use a smaller --delta"
            )
        elif self.singleton_probability > c.delta:
            out.append(
                f"at epsilon={c.epsilon:g} the selection would release a fact one record "
                f"states with probability {self.singleton_probability:.2g}, above delta: use a "
                "smaller --epsilon"
            )
        elif self.records_needed(0.5) > n:
            out.append(
                f"a fact needs about {self.records_needed(0.5)} of the {n} records to be "
                f"released at epsilon={c.epsilon:g} (K={c.max_pairs}): this release could "
                "carry nothing; raise --epsilon or release a larger collection"
            )
        return out

    def to_dict(self) -> dict:
        c = self.config
        return {
            "epsilon": c.epsilon,
            "delta": c.delta,
            "unit": "one record of the collection",
            "neighboring_relation": RELATION,
            "accountant": "one (epsilon, delta) event (PipelineDP partition selection)",
            "stages": [
                {
                    "stage": "fact-pairs",
                    "mechanism": MECHANISM,
                    "extractor": c.extractor,
                    "noise_stddev": self.noise_stddev,
                    "max_pairs_per_record": c.max_pairs,
                    "l2_sensitivity": math.sqrt(c.max_pairs),
                    "threshold": self.threshold,
                    "epsilon": c.epsilon,
                    "delta": c.delta,
                }
            ],
            "records_needed": {
                "for_50_percent": self.records_needed(0.5),
                "for_90_percent": self.records_needed(0.9),
            },
            "singleton_release_probability": self.singleton_probability,
        }

    def table(self) -> list[dict]:
        """Release probability of a fact by the records that state it (the dry run)."""
        return [{"records": s, "released": self.keep_probability(s)} for s in PLAN_SUPPORTS]


def plan_facts(config: FactConfig, num_records: int) -> FactPlan:
    return FactPlan(config, num_records)


@dataclasses.dataclass(frozen=True)
class FactRelease:
    """The released pairs with noisy counts, and the records they make."""

    pairs: dict[str, float]
    records: list[dict]
    plan: FactPlan


def fact_records(
    pairs: dict[str, float], max_partners: int, extractor: str = "phrases"
) -> list[dict]:
    """Post-processing: one record per released phrase, its partners by noisy count.

    ``{"text": "Dara Quill: Velmora Dynamics; Poswick.", "topic": "Dara Quill",
    "partners": [...]}``, phrases by their total noisy count, most stated first. A typed
    release (`extractor` ``typed``) makes one record per subject, each value with its kind
    and noisy count: ``{"text": "payments gateway: team Team Heron (31); version v2.28.5
    (25).", "topic", "partners", "facts": [{"value", "kind", "count"}, ...]}``.
    """
    if extractor == "typed":
        return _typed_records(pairs, max_partners)
    out = []
    for phrase, ranked in _grouped(pairs, split_pair, both=True):
        partners = [b for _, b in ranked[:max_partners]]
        out.append(
            {"text": f"{phrase}: {'; '.join(partners)}.", "topic": phrase, "partners": partners}
        )
    return out


def _grouped(pairs: dict, split, *, both: bool) -> list[tuple[str, list[tuple[float, str]]]]:
    """Each head of a split key (and its other part, with `both`) with its (count, other)
    by descending count; heads by descending total count, then by name."""
    grouped: dict[str, list[tuple[float, str]]] = defaultdict(list)
    for key, count in pairs.items():
        a, b = split(key)
        grouped[a].append((float(count), b))
        if both:
            grouped[b].append((float(count), a))
    order = sorted(grouped, key=lambda h: (-sum(c for c, _ in grouped[h]), h))
    return [(h, sorted(grouped[h], key=lambda cb: (-cb[0], cb[1]))) for h in order]


def _typed_records(facts: dict[str, float], max_values: int) -> list[dict]:
    out = []
    for subject, ranked in _grouped(facts, split_fact, both=False):
        rows = [{"value": v, "kind": value_kind(v), "count": c} for c, v in ranked[:max_values]]
        said = "; ".join(f"{KIND_LABELS[r['kind']]} {r['value']} ({r['count']:.0f})" for r in rows)
        out.append(
            {
                "text": f"{subject}: {said}.",
                "topic": subject,
                "partners": [r["value"] for r in rows],
                "facts": rows,
            }
        )
    return out


def charge_ref(work: Path, scope: tuple[str, str], plan: FactPlan) -> str:
    """The release's idempotency key, written to the work folder before its first charge
    (called under the folder's lock) with the scope and plan it is for: a rerun after a
    crash is charged under the same key, so the ledger answers with the first charge, never
    a second; a rerun for another scope or plan is refused before any charge."""
    path = work / CHARGE_FILE
    bound = {"scope": list(scope), "plan": json.loads(json.dumps(plan.to_dict()))}
    if not path.is_file():
        write_private(path, json.dumps({"ref": f"facts-{secrets.token_hex(16)}", **bound}))
    record = json.loads(path.read_text())
    for key, value in bound.items():
        if key in record and record[key] != value:  # (a key file of an older version: none)
            raise ValueError(
                f"{work} holds the charge of a fact release for another {key}; use a new work "
                "folder (nothing was charged)"
            )
    return record["ref"]


def release_facts(
    texts: Sequence[str],
    config: FactConfig,
    *,
    work: str | Path | None = None,
    pay: Payer | None = None,
) -> FactRelease:
    """Releases the fact pairs many records state, and the synthetic records they make.

    Args:
      texts: the private records.
      config: public parameters.
      work: the private work folder (the charge's idempotency key and the released pairs:
        a rerun, or a run started while another holds the folder's lock and so waits for
        it, returns them and draws nothing); needed with a payer.
      pay: the payer (`synthgen.privacy.receipts`) charged the release once, before the
        selection, under the work folder's idempotency key (`charge_ref`).

    Raises:
      ValueError: a release that should not run (`FactPlan.problems`), refused before any
        charge.
      ImportError: ``backend="beam"`` without apache-beam, refused before any charge.
      synthgen.privacy.BudgetExceededError: the ledger cannot pay (nothing is drawn).

    Privacy:
      (config.epsilon, config.delta)-DP for one record, add/remove-one (module docstring).
      The noise is python-dp's own secure noise.
    """
    plan = plan_facts(config, len(texts))
    problems = plan.problems()
    if problems:
        raise ValueError("; ".join(problems))
    if pay is not None and work is None:
        raise ValueError("a paid release needs a work folder (its charge's idempotency key)")
    check_backend(config.backend, installed=True)  # a missing engine is refused uncharged
    if work is None:  # nothing kept: an audit's or an evaluation's one-off release
        return _select(texts, config, plan)
    work = private_folder(work)
    # One run at a time: a second run started meanwhile waits, then reads the first's draw
    # (one charge, one draw, however many runs race on the folder).
    with work_lock(work / LOCK_FILE):
        stored = work / RESULT_FILE
        kept = json.loads(stored.read_text()) if stored.is_file() else None
        if kept is not None and (
            kept["plan"] != json.loads(json.dumps(plan.to_dict())) or kept["n"] != len(texts)
        ):  # refused before any charge
            raise ValueError(f"{work} holds a fact release with another plan; use a new one")
        if kept is not None and pay is not None and kept.get("paid") is False:
            raise ValueError(  # its noise was drawn before any charge: never a paid release
                f"{work} holds a fact release drawn without a charge; use a new work folder"
            )
        if kept is None and (work / DRAWING_FILE).is_file():  # drawn once, never stored:
            raise ValueError(  # refused before any charge (a paid draw's charge stands)
                f"{work} holds a fact release whose draw was lost (the run stopped before "
                "storing it); drawing again needs a new work folder and, if paid, a new charge"
            )
        description = f"DP fact release ({config.extractor}), eps={config.epsilon:.4g}"
        ref = charge_ref(work, pay.scope, plan) if pay is not None else None
        paid(pay, plan, description, ref=ref)
        if kept is not None:  # a rerun: the first draw, never a second
            return _release(kept["pairs"], config, plan)
        write_private(work / DRAWING_FILE, "{}")
        release = _select(texts, config, plan)
        # written before anything is returned: a crash after it replays
        kept = {"plan": plan.to_dict(), "n": len(texts), "pairs": release.pairs}
        write_private(stored, json.dumps({**kept, "paid": pay is not None}))
    return release


def _select(texts: Sequence[str], config: FactConfig, plan: FactPlan) -> FactRelease:
    """The selection itself (charged by the caller): the one place noise is drawn. On
    Beam each record's facts are read inside the pipeline, where the records are."""
    extract = record_fact_keys if config.extractor == "typed" else record_pairs
    kwargs = {"epsilon": config.epsilon, "delta": config.delta, "max_keys": config.max_pairs}
    try:
        if config.backend == "beam":
            selected = release_key_counts(
                texts,
                **kwargs,
                extract=functools.partial(_record_keys, extract=extract, k=config.max_pairs),
                backend="beam",
                beam_options=config.beam_options,
            )
        else:
            keys = [extract(text, config.max_pairs) for text in texts]
            selected = release_key_counts(keys, **kwargs)
    finally:
        zipf.cache_clear()  # the rule's cache holds the records' words: not kept after reading
    return _release(selected.counts, config, plan)


def _release(counts: dict, config: FactConfig, plan: FactPlan) -> FactRelease:
    """The release of the selected (or kept) pairs: post-processing only."""
    pairs = {str(k): float(v) for k, v in counts.items()}
    return FactRelease(pairs, fact_records(pairs, config.max_partners, config.extractor), plan)


def _record_keys(text: str, *, extract, k: int) -> list[str]:
    """One record's at most `k` fact keys by `extract` (picklable for Beam's workers)."""
    return extract(text, k)
