"""The main job's configuration: frozen dataclasses, one per stage, loaded from a Python file.

A config file (the packaged examples `dpsynth/configs/demo.py`, `tiny.py`, `gpu.py`, or a
user's copy) defines `get_config() -> PipelineConfig`; `load_pipeline_config(spec)` imports it
by path (as the flax examples and t5x do). A bare name (`demo`) is a packaged example
(`dpsynth.config_files.resolve_pipeline_config`), so it works from any folder and install.

Each stage reads only its own section (and the sections it names in `context.STAGE_SECTIONS`):
changing a section changes that stage's fingerprint, and through the chain of fingerprints
exactly the stages downstream of it.
"""

from __future__ import annotations

import dataclasses
import math
import re
from pathlib import Path
from typing import Literal

from dpsynth.pipeline.sample_collections import DEFAULT_SAMPLE, check_sample, fingerprint_fields
from synthgen.fewshot.config import FewShotConfig
from synthgen.privacy.ledger_types import COLLECTION
from synthgen.querygen_config import GeneratorConfig

# Field metadata: a field added after run folders existed is hashed into its stage's
# fingerprint only when it differs from its default, so old runs stay up to date.
FINGERPRINT_AT_DEFAULT = {"fingerprint": "omit-at-default"}
# Field metadata: a field that replaced others is hashed into its stage's fingerprint as the
# fields it replaced (a function of its value gives them), so old runs stay up to date.
FINGERPRINT_AS = "fingerprint-as"

GeneratorKind = Literal["querygen", "fewshot"]
# the fields of `DataConfig` that name the fields of the user's pairs and documents
PAIRS_FIELDS = ("query_field", "document_field", "doc_id_field", "text_field", "id_field")


@dataclasses.dataclass(frozen=True)
class DataConfig:
    """The private pairs: the built-in wiki summaries' (document, short description) rows, or
    a user's own (document, query) pairs (`synthgen.user_pairs`).

    Attributes:
      source: asset name or path of the wiki summaries (None with `pairs`).
      num_documents: first N documents (None: all); with `pairs`, the pairs of the first N
        documents they name.
      test_fraction: held-out share of documents (their real queries evaluate the encoders).
      pairs: a JSONL of private pairs (None: the wiki summaries); each line a query and the
        document's text, or the id of a document in `documents`.
      documents: a JSONL collection of public documents to index (None: the pairs'
        documents).
      query_field, document_field, doc_id_field: the fields of `pairs` (query, document
        text, document id); text_field, id_field: of `documents` (text; id, None: the
        pairs' doc_id_field).
    """

    source: str | None = "wiki-summaries-en"
    num_documents: int | None = 2000
    test_fraction: float = 0.2
    # added after run folders existed: left out of the stage's fingerprint at their default
    pairs: str | None = dataclasses.field(default=None, metadata=FINGERPRINT_AT_DEFAULT)
    documents: str | None = dataclasses.field(default=None, metadata=FINGERPRINT_AT_DEFAULT)
    query_field: str = dataclasses.field(default="query", metadata=FINGERPRINT_AT_DEFAULT)
    document_field: str = dataclasses.field(default="document", metadata=FINGERPRINT_AT_DEFAULT)
    doc_id_field: str = dataclasses.field(default="doc_id", metadata=FINGERPRINT_AT_DEFAULT)
    text_field: str = dataclasses.field(default="text", metadata=FINGERPRINT_AT_DEFAULT)
    id_field: str | None = dataclasses.field(default=None, metadata=FINGERPRINT_AT_DEFAULT)

    def __post_init__(self) -> None:
        if self.num_documents is not None and self.num_documents < 10:
            raise ValueError(f"need at least 10 documents, got {self.num_documents=}")
        if not 0 < self.test_fraction < 1:
            raise ValueError(f"test_fraction must be in (0, 1), got {self.test_fraction=}")
        if (self.source is None) == (self.pairs is None):
            raise ValueError("give data.source (the wiki summaries) or data.pairs, not both")
        if (self.documents is None) != (self.pairs is None):
            raise ValueError(
                "data.pairs needs data.documents, the public collection to index, and the other "
                "way round: which documents the private pairs name is private, so the main job "
                "indexes and writes queries for a public collection, never for those documents"
            )

    def pairs_source(self):
        """The `synthgen.user_pairs.PairsSource` of `pairs` (ValueError without it)."""
        from synthgen.user_pairs import PairsSource

        if self.pairs is None:
            raise ValueError("no data.pairs")
        fields = {name: getattr(self, name) for name in PAIRS_FIELDS}
        return PairsSource(self.pairs, self.documents, **fields)


@dataclasses.dataclass(frozen=True)
class PrivacyConfig:
    """The private pairs' ledger scope.

    Attributes:
      tenant: the ledger tenant of every charge of this run.
      epsilon_cap: cap of the private pairs' scope (every generator run is charged there).
      delta: delta of the private pairs (None: 1/(2n), n = train pairs).
    """

    tenant: str = "pipeline"
    epsilon_cap: float = 10.0
    delta: float | None = None

    def __post_init__(self) -> None:
        if not self.tenant or self.tenant == COLLECTION:
            raise ValueError(f"tenant must be a name ({COLLECTION!r} is every tenant's cap)")
        if not (math.isfinite(self.epsilon_cap) and self.epsilon_cap > 0):
            raise ValueError(f"epsilon_cap must be positive and finite, {self.epsilon_cap=}")
        if self.delta is not None and not 0 < self.delta < 1:
            raise ValueError(f"delta must be in (0, 1), got {self.delta=}")


@dataclasses.dataclass(frozen=True)
class GenerateConfig:
    """The DP synthetic-query stage.

    Attributes:
      kind: "querygen" (DP fine-tuned generator, Carranza et al. 2023) or "fewshot" (DP
        few-shot aggregation, Tang et al. 2024).
      querygen: the fine-tuned generator's config (its `dp.target_epsilon` is the release's
        epsilon).
      fewshot: the few-shot generator's config (its `target_epsilon` is the release's).
      fewshot_model: LM asset or path of the few-shot generator.
      synthetic_documents: train documents that get synthetic queries (None: all).
    """

    kind: GeneratorKind = "querygen"
    querygen: GeneratorConfig | None = None
    fewshot: FewShotConfig | None = None
    fewshot_model: str = "smollm2-135m-instruct"
    synthetic_documents: int | None = None

    def __post_init__(self) -> None:
        if self.kind not in ("querygen", "fewshot"):
            raise ValueError(f"kind must be 'querygen' or 'fewshot', got {self.kind=}")
        if getattr(self, self.kind) is None:
            raise ValueError(f"generator kind {self.kind!r} needs its config ({self.kind}=...)")
        if self.synthetic_documents is not None and self.synthetic_documents < 2:
            raise ValueError(f"synthetic_documents must be >= 2, got {self.synthetic_documents=}")


@dataclasses.dataclass(frozen=True)
class EncoderConfig:
    """The dual encoder trained (non-privately) on the synthetic pairs.

    Attributes:
      base: base encoder asset or folder (also the zero-shot baseline).
      batch_size, epochs, learning_rate, temperature: in-batch softmax training.
      max_query_len, max_doc_len: token budgets.
      real_upper_bound: also train on the real train pairs (not DP: the report's upper bound,
        kept in the private folder).
    """

    base: str = "all-minilm-l6-v2"
    batch_size: int = 32
    epochs: float = 1.0
    learning_rate: float = 5e-5
    temperature: float = 0.05
    max_query_len: int = 32
    max_doc_len: int = 64
    real_upper_bound: bool = True

    def retriever_config(self):
        """The trainer's `RetrieverConfig`: this section's fields that it has, else defaults."""
        from retriever.train_config import RetrieverConfig

        shared = {f.name for f in dataclasses.fields(RetrieverConfig)} & vars(self).keys()
        return RetrieverConfig(**{name: getattr(self, name) for name in shared})

    def __post_init__(self) -> None:
        self.retriever_config()  # validates


@dataclasses.dataclass(frozen=True)
class EvaluateConfig:
    """Evaluation on the held-out real pairs (exact search, the oracle).

    Attributes:
      k: the cut of NDCG@k and Recall@k.
      max_queries: first N held-out queries (None: all).
    """

    k: int = 10
    max_queries: int | None = None

    def __post_init__(self) -> None:
        if self.k < 1 or (self.max_queries is not None and self.max_queries < 1):
            raise ValueError(f"k and max_queries must be >= 1, got {self.k=}, {self.max_queries=}")


@dataclasses.dataclass(frozen=True)
class IndexConfig:
    """The serving index over the public corpus, built with the trained encoder.

    Attributes:
      kind: "scann", "exact" or "auto" (`retriever.index.build_searcher`).
      k: neighbours per query when the index's recall against exact search is measured.
    """

    kind: str = "scann"
    k: int = 10

    def __post_init__(self) -> None:
        if self.kind not in ("scann", "exact", "auto"):
            raise ValueError(f"kind must be scann, exact or auto, got {self.kind=}")
        if self.k < 1:
            raise ValueError(f"k must be >= 1, got {self.k=}")


@dataclasses.dataclass(frozen=True)
class RagStageConfig:
    """A few questions answered by the DP-RAG stage over a private collection.

    The collection is the user's own (`records`) or a packaged sample collection of
    fictional medical records (`dpsynth.pipeline.sample_collections`), scored with the
    pipeline's trained encoder.

    Attributes:
      enabled: run the stage.
      lm: LM asset or path, or "tiny" (the byte-level test model, as in the other commands).
      sample: the packaged collection used without `records`: "medical-40", "medical-200"
        or "medical-2000" (that many records).
      questions: how many questions (the first of the sample's or of `questions_file`).
      records: the user's private collection, a JSONL of {"doc_id", "text"} (None: `sample`).
      questions_file: with `records`: the public questions, a JSONL of {"question",
        optional "answer" (scored)} or one question per line.
      dataset: the collection's name in the run's ledger (None: "medical-records" for a
        sample, the records file's stem otherwise).
      epsilon: per-answer epsilon.
      mechanism: "icl", "keywords", "facts" or "auto" (`retriever.rag.defaults`); a retired
        one (`retriever.rag.plan.RETIRED`) is refused.
      k, max_tokens, delta: the answer stage's public parameters (`RagConfig`).
      epsilon_cap, delta_cap: caps of the run tenant's ledger scope on the collection and,
        in collection accounting, of its collection cap (every tenant of the run's ledger
        together); in individual accounting, the tenant's quota.
      accounting: "collection" (every answer composes on those scopes) or "individual" (each
        record's own filter over all answers, paying only for those it takes part in; icl).
      document_epsilon, document_delta: individual accounting: each record's target over
        all answers of all tenants (document_delta below 1/num_records).
      relevance_threshold: individual accounting: the public threshold tau on the [0, 1]
        score scale; records below it are not used and pay nothing.
      mode: "answers" (each question a charged DP answer) or "release" (the collection's
        facts released once at `release_epsilon` per record, `synthgen.knowledge.facts`,
        then every question answered from the release for free; delta: `delta_cap`).
      release_epsilon: release mode: the per-record epsilon of the one release.
    """

    enabled: bool = True
    lm: str = "smollm2-135m-instruct"
    # replaced the world's sizes (num_records, num_diseases, world_seed): hashed as them
    sample: str = dataclasses.field(
        default=DEFAULT_SAMPLE, metadata={FINGERPRINT_AS: fingerprint_fields}
    )
    questions: int = 3
    epsilon: float = 5.0
    mechanism: str = "auto"
    k: int = 4
    max_tokens: int = 8
    delta: float = 1e-6
    epsilon_cap: float = 20.0
    delta_cap: float = 1e-4
    # added after run folders existed: left out of the stage's fingerprint at their default
    accounting: str = dataclasses.field(default="collection", metadata=FINGERPRINT_AT_DEFAULT)
    document_epsilon: float | None = dataclasses.field(
        default=None, metadata=FINGERPRINT_AT_DEFAULT
    )
    document_delta: float | None = dataclasses.field(default=None, metadata=FINGERPRINT_AT_DEFAULT)
    relevance_threshold: float = dataclasses.field(default=0.5, metadata=FINGERPRINT_AT_DEFAULT)
    mode: str = dataclasses.field(default="answers", metadata=FINGERPRINT_AT_DEFAULT)
    release_epsilon: float = dataclasses.field(default=10.0, metadata=FINGERPRINT_AT_DEFAULT)
    records: str | None = dataclasses.field(default=None, metadata=FINGERPRINT_AT_DEFAULT)
    questions_file: str | None = dataclasses.field(default=None, metadata=FINGERPRINT_AT_DEFAULT)
    dataset: str | None = dataclasses.field(default=None, metadata=FINGERPRINT_AT_DEFAULT)

    def __post_init__(self) -> None:
        if (self.records is None) != (self.questions_file is None):
            raise ValueError(
                "rag.records (the private collection) and rag.questions_file (its public "
                f"questions) go together: {self.records=}, {self.questions_file=}"
            )
        if self.dataset_name == "train-pairs" or (
            self.records is not None and self.dataset_name == "medical-records"
        ):  # the generate stage's scope, or the packaged samples'
            raise ValueError(
                f"the collection's name {self.dataset_name!r} is the main job's own: set "
                "rag.dataset to another"
            )
        if not re.fullmatch(r"[A-Za-z0-9_.-]+", self.dataset_name):
            raise ValueError(
                f"the collection's name in the ledger must be plain ([A-Za-z0-9_.-]): "
                f"{self.dataset_name!r}; set rag.dataset"
            )
        if self.mode not in ("answers", "release"):
            raise ValueError(f"mode must be answers or release, {self.mode=}")
        if not (math.isfinite(self.release_epsilon) and self.release_epsilon > 0):
            raise ValueError(f"release_epsilon must be positive, {self.release_epsilon=}")
        if not (math.isfinite(self.epsilon_cap) and self.epsilon_cap > 0):
            raise ValueError(f"epsilon_cap must be positive and finite, {self.epsilon_cap=}")
        if not 0 < self.delta_cap < 1 or not 0 < self.delta <= self.delta_cap:
            raise ValueError(
                f"need 0 < delta <= delta_cap < 1, got {self.delta=}, {self.delta_cap=}"
            )
        from retriever.rag.plan import check_mechanism

        check_mechanism(self.mechanism, auto=True)
        if self.k < 1 or self.max_tokens < 1:
            raise ValueError(f"k and max_tokens must be >= 1, got {self.k=}, {self.max_tokens=}")
        check_sample(self.sample)
        if self.questions < 1:
            raise ValueError(f"questions must be >= 1, got {self.questions=}")
        if not (math.isfinite(self.epsilon) and self.epsilon > 0):
            raise ValueError(f"epsilon must be positive and finite, got {self.epsilon=}")
        self._check_accounting()

    def _check_accounting(self) -> None:
        if self.accounting not in ("collection", "individual"):
            raise ValueError(f"accounting must be collection or individual, {self.accounting=}")
        if not 0.0 <= self.relevance_threshold <= 1.0:
            raise ValueError(f"relevance_threshold must be in [0, 1], {self.relevance_threshold=}")
        documents = (self.document_epsilon, self.document_delta)
        if self.accounting == "collection":
            if documents != (None, None):
                raise ValueError(
                    f"document_epsilon and document_delta go with accounting='individual': "
                    f"{self.document_epsilon=}, {self.document_delta=}"
                )
            return
        if self.mechanism != "icl":
            raise ValueError(
                "individual accounting answers with icl only: set mechanism='icl', "
                f"{self.mechanism=}"
            )
        if self.document_epsilon is None or self.document_delta is None:
            raise ValueError(
                "individual accounting needs document_epsilon and document_delta: "
                f"{self.document_epsilon=}, {self.document_delta=}"
            )
        if not (math.isfinite(self.document_epsilon) and self.document_epsilon > 0):
            raise ValueError(
                f"document_epsilon must be positive and finite, {self.document_epsilon=}"
            )
        if not 0 < self.document_delta < 1:
            raise ValueError(f"document_delta must be in (0, 1), {self.document_delta=}")

    @property
    def individual(self) -> bool:
        """Whether each record pays individually (per-document filters)."""
        return self.accounting == "individual"

    @property
    def dataset_name(self) -> str:
        """The collection's name in the run's ledger."""
        if self.dataset is not None:
            return self.dataset
        return "medical-records" if self.records is None else Path(self.records).stem


@dataclasses.dataclass(frozen=True)
class ReportConfig:
    """The report.

    Attributes:
      samples: documents whose synthetic query the report shows next to the real one.
    """

    samples: int = 8

    def __post_init__(self) -> None:
        if self.samples < 0:
            raise ValueError(f"samples must be >= 0, got {self.samples=}")


@dataclasses.dataclass(frozen=True)
class PipelineConfig:
    """The whole job: private pairs -> DP synthetic queries -> encoder -> index -> report.

    Attributes:
      name: shown in the report.
      out: the run folder (the CLI's `--out` overrides it).
      seed: public seed of data order and initialisation; the mechanisms' noise always
        comes from OS entropy.
    """

    name: str = "demo"
    out: str = "runs/demo"
    seed: int = 0
    data: DataConfig = DataConfig()
    privacy: PrivacyConfig = PrivacyConfig()
    generate: GenerateConfig | None = None
    encoder: EncoderConfig = EncoderConfig()
    evaluate: EvaluateConfig = EvaluateConfig()
    index: IndexConfig = IndexConfig()
    rag: RagStageConfig = RagStageConfig()
    report: ReportConfig = ReportConfig()

    def __post_init__(self) -> None:
        if not isinstance(self.generate, GenerateConfig):
            raise ValueError("PipelineConfig needs generate=GenerateConfig(...)")

    def replace(self, **changes) -> PipelineConfig:
        return dataclasses.replace(self, **changes)


def load_pipeline_config(spec: str | Path) -> PipelineConfig:
    """Imports the config file `spec` names and returns its `get_config()`.

    Args:
      spec: a config file's path, or a packaged example's name (`demo`, `tiny`, `gpu`; see
        `dpsynth.config_files.resolve_pipeline_config`).

    Raises:
      FileNotFoundError: no such file.
      UnknownConfigError: a bare name that is no packaged example (a `ValueError`).
      ValueError: the file defines no `get_config` or it returns no `PipelineConfig`.
    """
    from dpsynth.config_files import load_config_module, resolve_pipeline_config

    path = resolve_pipeline_config(spec)
    module = load_config_module(path)
    get_config = getattr(module, "get_config", None)
    if not callable(get_config):
        raise ValueError(f"{path} defines no get_config()")
    config = get_config()
    if not isinstance(config, PipelineConfig):
        kind = type(config).__name__
        raise ValueError(f"{path}: get_config() returned {kind}, not a PipelineConfig")
    return config


def config_assets(config: object) -> list[str]:
    """The registered assets a config names (LMs, encoders, corpora), sorted.

    Walks the config's dataclass fields that a run reads (not the generator kind it does
    not run, not a disabled DP-RAG stage); a string field whose value is an asset name of
    `synthgen.assets.REGISTRY` counts (paths and other strings do not), and so does the
    public corpus of a random-init query generator's vocabulary.
    """
    from synthgen import assets
    from synthgen.querygen_config import VOCABULARY_CORPUS, GeneratorConfig

    unused = {"querygen": ("fewshot", "fewshot_model"), "fewshot": ("querygen",)}
    found: set[str] = set()
    stack = [config]
    while stack:
        item = stack.pop()
        if isinstance(item, GeneratorConfig) and item.base.startswith("random:"):
            found.add(VOCABULARY_CORPUS)
        if isinstance(item, RagStageConfig) and not item.enabled:
            continue
        if dataclasses.is_dataclass(item) and not isinstance(item, type):
            skip = unused.get(item.kind, ()) if isinstance(item, GenerateConfig) else ()
            stack.extend(
                getattr(item, f.name) for f in dataclasses.fields(item) if f.name not in skip
            )
        elif isinstance(item, list | tuple):
            stack.extend(item)
        elif isinstance(item, str) and item in assets.REGISTRY:
            found.add(item)
    return sorted(found)
