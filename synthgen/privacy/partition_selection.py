"""DP partition selection with counts over an unknown domain, through PipelineDP.

Each privacy unit (a record) holds a set of keys. `release_key_counts` releases the keys
many units share, with noisy counts: PipelineDP's partition selection, one Gaussian draw for
selection and count (``post_aggregation_thresholding``, the Gaussian sparse histogram). The
``"local"`` backend runs it in this process, ``"beam"`` as one Apache Beam pipeline (an
``extract`` rule then runs on the workers too); see docs/guides/knowledge.md ("Beyond one
machine"). The noise is python-dp's secure noise (OS entropy), not a seeded generator.

Privacy:
  Unit: one record, add/remove-one. A record contributes each key once and at most
  `max_keys` keys (cut before the aggregation, bounded again by PipelineDP), so the count
  vector has L2 sensitivity sqrt(max_keys); PipelineDP calibrates noise and threshold so
  that the whole aggregation (which keys appear, and their counts) is (epsilon, delta)-DP,
  the same mechanism on both backends, charged as that (epsilon, delta) event. A key one
  record holds is released with probability at most delta. The keys are private: the
  Beam backend reads the released keys back from a private temporary folder (0700, or a
  fresh one under ``--temp_location``) and deletes it; nothing of a key is logged.

References:
  Google, PipelineDP (pipeline-dp.org) and python-dp; Gopi et al. 2020 (DP set union);
  Wilkins, Kifer, Zhang, Karrer 2024 (exact analysis of the Gaussian sparse histogram).
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import logging
import math
import secrets
import shutil
import tempfile
from collections.abc import Callable, Hashable, Iterable, Sequence
from typing import Any

from dp_accounting import dp_event

from synthgen.privacy import events

BACKENDS = ("local", "beam")
MECHANISM = "PipelineDP Gaussian count with post-aggregation thresholding (DP partition selection)"


@dataclasses.dataclass(frozen=True)
class KeyCountRelease:
    """The released keys with their noisy counts (descending) and the release's event."""

    counts: dict[Hashable, float]
    epsilon: float
    delta: float
    max_keys: int

    @property
    def event(self) -> dp_event.DpEvent:
        return events.epsilon_delta_event(self.epsilon, self.delta)

    def to_dict(self) -> dict:
        return {
            "mechanism": MECHANISM,
            "max_keys": self.max_keys,
            "l2_sensitivity": math.sqrt(self.max_keys),
            "epsilon": self.epsilon,
            "delta": self.delta,
            "released_keys": len(self.counts),
            "unit": "one record",
            "neighboring_relation": "ADD_OR_REMOVE_ONE",
        }


BEAM_IMPORT_WARNING = "apitools not found"  # Apache Beam's BigQuery clients, never used here


@contextlib.contextmanager
def _beam_import_quiet():
    """Imports inside hide Apache Beam's import-time root-logger warning ("apitools not
    found, ...": its BigQuery clients, never used here), printed to every command's stderr,
    and undo the `logging.basicConfig` that warning's `logging.warning` call makes."""
    root = logging.getLogger()
    handlers = list(root.handlers)

    def keep(record: logging.LogRecord) -> bool:  # never formats: another caller's args
        return not (isinstance(record.msg, str) and record.msg.startswith(BEAM_IMPORT_WARNING))

    root.addFilter(keep)
    try:
        yield
    finally:
        root.removeFilter(keep)
        if not handlers:  # `logging.warning` calls basicConfig only on a root without any
            for handler in list(root.handlers):
                root.removeHandler(handler)


def _pipeline_dp():
    """The `pipeline_dp` module (it imports Apache Beam), imported quietly."""
    with _beam_import_quiet():
        import pipeline_dp
    return pipeline_dp


def _strategy(epsilon: float, delta: float, max_keys: int):
    """python-dp's Gaussian thresholding strategy for one aggregation holding the whole
    (epsilon, delta): the one PipelineDP's post-aggregation thresholding runs."""
    pipeline_dp = _pipeline_dp()
    from pipeline_dp import partition_selection

    return partition_selection.create_partition_selection_strategy(
        pipeline_dp.PartitionSelectionStrategy.GAUSSIAN_THRESHOLDING, epsilon, delta, max_keys
    )


def selection_threshold(epsilon: float, delta: float, max_keys: int) -> float:
    """The noisy count a key needs to be released by `release_key_counts` (public)."""
    return float(_strategy(epsilon, delta, max_keys).threshold)


def noise_stddev(epsilon: float, delta: float, max_keys: int) -> float:
    """The standard deviation of the Gaussian noise on each released count (public): read
    off the threshold and the keep probability of a key one unit holds, P(1 + N(0, s^2) >=
    threshold), which is how python-dp's strategy draws it."""
    from scipy.stats import norm

    strategy = _strategy(epsilon, delta, max_keys)
    sigma = float((strategy.threshold - 1.0) / norm.isf(strategy.probability_of_keep(1)))
    if not (math.isfinite(sigma) and sigma > 0):
        raise ValueError(
            f"no usable noise at {epsilon=}, {delta=}: python-dp's threshold keeps a key one "
            "unit holds half the time; use a smaller epsilon"
        )
    return sigma


def keep_probability(count: int, epsilon: float, delta: float, max_keys: int) -> float:
    """The probability that a key held by `count` units is released (public arithmetic)."""
    return float(_strategy(epsilon, delta, max_keys).probability_of_keep(int(count)))


class _UnitRows:
    """A record's (unit, key) rows: its first `max_keys` distinct keys (public rule).

    A class rather than a closure so that Beam pickles it by value with its `extract`."""

    def __init__(self, extract: Callable[[Any], Iterable[Hashable]] | None, max_keys: int):
        self.extract = extract
        self.max_keys = max_keys

    def __call__(self, unit_record: tuple[int, Any]) -> list[tuple[int, Hashable]]:
        unit, record = unit_record
        keys = record if self.extract is None else self.extract(record)
        return [(unit, key) for key in list(dict.fromkeys(keys))[: self.max_keys]]


def release_key_counts(
    unit_keys: Sequence[Any],
    *,
    epsilon: float,
    delta: float,
    max_keys: int,
    extract: Callable[[Any], Iterable[Hashable]] | None = None,
    backend: str = "local",
    beam_options: Sequence[str] | None = None,
) -> KeyCountRelease:
    """Releases the keys many units share, with Gaussian-noised counts.

    Args:
      unit_keys: one item per privacy unit: its sequence of keys, or with `extract` its
        record. A unit's duplicate keys count once; keys past its first `max_keys` distinct
        ones are dropped.
      epsilon: epsilon of the whole release.
      delta: delta of the whole release (selection included).
      max_keys: most keys one unit contributes (public).
      extract: a public rule from one record to its keys, run inside the pipeline (on
        Beam: on the workers; it must pickle). None: the items are the keys already.
      backend: ``"local"`` (PipelineDP's local backend, this process) or ``"beam"``
        (Apache Beam; keys must be JSON strings or numbers).
      beam_options: Beam pipeline flags, e.g. ``["--runner=FlinkRunner", ...]`` (default:
        the DirectRunner). A runner whose workers cannot write this machine's temporary
        folder needs ``--temp_location`` on a filesystem both reach.

    Returns:
      The released keys by descending noisy count, and the (epsilon, delta) event.

    Raises:
      ValueError: epsilon not finite and positive, delta outside (0, 1), max_keys < 1, an
        unknown backend, or beam_options without the Beam backend.
      ImportError: backend ``"beam"`` without apache-beam installed.

    Privacy:
      (epsilon, delta)-DP for one unit under add/remove-one, the same mechanism on either
      backend; see the module docstring.
    """
    if not (math.isfinite(epsilon) and epsilon > 0):
        raise ValueError(f"epsilon must be finite and > 0, got {epsilon=}")
    events.check_open_delta(delta)
    if max_keys < 1:
        raise ValueError(f"max_keys must be >= 1, got {max_keys=}")
    check_backend(backend)
    if beam_options is not None and backend != "beam":
        raise ValueError(f"beam_options need backend='beam', got {backend=}")
    rows_of = _UnitRows(extract, max_keys)
    if backend == "beam":
        units = list(enumerate(unit_keys))
        pairs = _beam_aggregate(units, rows_of, epsilon, delta, max_keys, beam_options)
    else:
        pairs = _local_aggregate(
            [row for unit in enumerate(unit_keys) for row in rows_of(unit)],
            epsilon,
            delta,
            max_keys,
        )
    pairs.sort(key=lambda kv: (-kv[1], str(kv[0])))
    return KeyCountRelease(dict(pairs), epsilon, delta, max_keys)


def check_backend(backend: str, *, installed: bool = False) -> None:
    """Raises ValueError unless `backend` is one of `BACKENDS`; with `installed`, also
    ImportError when its engine is missing (before anything is charged)."""
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend=}")
    if installed and backend == "beam":
        _import_beam()


def _engine(epsilon: float, delta: float, max_keys: int, backend):
    """PipelineDP's engine, accountant and parameters: the one mechanism of both backends."""
    pipeline_dp = _pipeline_dp()

    accountant = pipeline_dp.NaiveBudgetAccountant(total_epsilon=epsilon, total_delta=delta)
    engine = pipeline_dp.DPEngine(accountant, backend)
    params = pipeline_dp.AggregateParams(
        metrics=[pipeline_dp.Metrics.PRIVACY_ID_COUNT],
        noise_kind=pipeline_dp.NoiseKind.GAUSSIAN,
        max_partitions_contributed=max_keys,
        max_contributions_per_partition=1,
        partition_selection_strategy=pipeline_dp.PartitionSelectionStrategy.GAUSSIAN_THRESHOLDING,
        post_aggregation_thresholding=True,
    )
    extractors = pipeline_dp.DataExtractors(
        privacy_id_extractor=_unit_of,
        partition_extractor=_key_of,
        value_extractor=_no_value,
    )
    return engine, accountant, params, extractors


def _unit_of(row):
    return row[0]


def _key_of(row):
    return row[1]


def _no_value(row):
    return 0


def _local_aggregate(rows, epsilon, delta, max_keys) -> list[tuple[Hashable, float]]:
    pipeline_dp = _pipeline_dp()

    if not rows:  # what the mechanism outputs on such data (PipelineDP refuses empty input)
        return []
    engine, accountant, params, extractors = _engine(
        epsilon, delta, max_keys, pipeline_dp.LocalBackend()
    )
    result = engine.aggregate(rows, params, extractors)
    accountant.compute_budgets()  # after the graph, before it runs (the result is lazy)
    return [(key, float(metrics.privacy_id_count)) for key, metrics in result]


def _import_beam():
    try:
        with _beam_import_quiet():
            import apache_beam
    except ImportError as error:
        raise ImportError(
            "backend 'beam' needs Apache Beam: pip install 'dpsynth[beam]'"
        ) from error
    return apache_beam


def _encode(key_metrics) -> str:
    key, metrics = key_metrics
    return json.dumps([key, float(metrics.privacy_id_count)])


def _beam_aggregate(
    units, rows_of, epsilon, delta, max_keys, beam_options
) -> list[tuple[Hashable, float]]:
    """The aggregation as one Beam pipeline: records -> (unit, key) rows -> PipelineDP.

    The released (key, count) pairs come back through text files in a private folder made
    for this release (0700 on this machine, or a fresh folder under ``--temp_location``),
    deleted once read."""
    beam = _import_beam()
    pipeline_dp = _pipeline_dp()
    from apache_beam.io.filesystems import FileSystems
    from apache_beam.options.pipeline_options import (
        GoogleCloudOptions,
        PipelineOptions,
        StandardOptions,
    )

    options = PipelineOptions(list(beam_options or ()))
    if options.view_as(StandardOptions).runner is None:
        options.view_as(StandardOptions).runner = "DirectRunner"
    remote = options.view_as(GoogleCloudOptions).temp_location
    if remote:
        folder = FileSystems.join(remote, f"dpsynth-release-{secrets.token_hex(16)}")
    else:
        folder = tempfile.mkdtemp(prefix="dpsynth-release-")  # mode 0700
    try:
        engine, accountant, params, extractors = _engine(
            epsilon, delta, max_keys, pipeline_dp.BeamBackend()
        )
        with beam.Pipeline(options=options) as pipeline:  # runs on leaving the block
            rows = (
                pipeline
                | "Records" >> beam.Create(units)
                | "Keys of each record" >> beam.FlatMap(rows_of)
            )
            result = engine.aggregate(rows, params, extractors)
            accountant.compute_budgets()  # after the graph, before it runs
            _ = (
                result
                | "Encode" >> beam.Map(_encode)
                | "Write" >> beam.io.WriteToText(FileSystems.join(folder, "released"))
            )
        pairs = []
        for match in FileSystems.match([FileSystems.join(folder, "released*")]):
            for found in match.metadata_list:
                with FileSystems.open(found.path) as stream:
                    for line in io.TextIOWrapper(stream, encoding="utf-8"):
                        key, count = json.loads(line)
                        pairs.append((key, float(count)))
        return pairs
    finally:
        if remote:
            with contextlib.suppress(Exception):
                FileSystems.delete([folder])
        else:
            shutil.rmtree(folder, ignore_errors=True)
