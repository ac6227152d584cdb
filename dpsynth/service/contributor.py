"""A contributor of the retrieval network: its release served over HTTP, on its own ledger.

A contributor runs the DP-RAG service (`dpsynth.service.app`) over its knowledge folder
(`retriever.network.folder`): ``/retrieve`` over the released synthetic documents,
``/card``, and optionally ``/answer`` from its private collection. Its callers are tenants
of its own ledger, so a key of one contributor means nothing at another.

Privacy:
  ``/retrieve`` and ``/card`` serve the release folder only (a DP output; searching it is
  post-processing, free for any number of questions). ``/answer`` reads the private
  collection: each answer is an (epsilon, delta)-DP event for one document (add/remove
  one), charged before release to the caller's tenant and to the collection's cap
  (`retriever.rag.answer.DPRag`).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from dpsynth.service.app import Service, ServiceConfig
from dpsynth.service.public_index import PublicIndex
from dpsynth.service.tenants import TenantRegistry
from retriever.network.folder import KnowledgeFolder, read_card, read_private_record
from retriever.rag.answer import RELATION, RagConfig
from synthgen.privacy import PrivacyLedger


def _located(value: str, work: Path) -> str:
    """A path of private.json, relative ones read from the work folder; URLs unchanged."""
    if "://" in value:
        return value
    path = Path(value).expanduser()
    return str(path if path.is_absolute() else work / path)


def _record(work_dir: str | Path) -> dict[str, Any]:
    """private.json with its paths resolved and its required fields checked."""
    work = Path(work_dir)
    record = read_private_record(work)
    missing = [key for key in ("dataset", "ledger", "private_corpus") if not record.get(key)]
    if missing:
        raise ValueError(f"{work}/private.json lacks {', '.join(missing)}")
    record = dict(record)
    for key in ("ledger", "private_corpus", "private_index"):  # the first two are required
        if record.get(key):
            record[key] = _located(str(record[key]), work)
    return record


def served_card(
    card: dict[str, Any], *, answer: ServiceConfig | None, rag: RagConfig | None = None
) -> dict[str, Any]:
    """The release's card plus what this server serves (``"serves"``), as ``/card`` shows it.

    Args:
      card: the release folder's card (`read_card`).
      answer: the service's config when it serves ``/answer`` (None: it does not).
      rag: the answer stage's config (its delta is every answer's).
    """
    answers = None
    if answer is not None:
        rag = rag or RagConfig()
        answers = {
            "epsilon": answer.answer_epsilon,
            "delta": rag.delta,
            "mechanism": answer.mechanism,
            "privacy_unit": "one document of the contributor's private collection",
            "neighboring_relation": RELATION,
            "charged_to": "the caller's tenant at this contributor (and the collection's cap)",
        }
    return {
        **card,
        "serves": {
            "retrieve": True,
            "retrieve_epsilon": 0.0,
            "answer": answers,
        },
    }


def load_contributor(
    release_dir: str | Path,
    work_dir: str | Path,
    *,
    answer: bool = False,
    lm: str = "smollm2-135m-instruct",
    answer_epsilon: float | None = None,
    rag_config: RagConfig | None = None,
    config: ServiceConfig | None = None,
    replicas: int = 1,
) -> Service:
    """The service of one contributor: its release folder, its ledger, its tenants.

    Args:
      release_dir: the knowledge folder (card.json, synthetic.jsonl, index/).
      work_dir: the contributor's private work folder (private.json, the ledger).
      answer: also serve ``/answer`` from the private collection (needs ``private_index``
        in private.json and a collection cap in the ledger).
      lm: LM of the answers: asset or path, or ``"tiny"`` (the byte-level test model).
      answer_epsilon: every answer's epsilon (default: `config`'s).
      rag_config: public parameters of the answer stage (default `RagConfig()`).
      config: the service's limits (default `ServiceConfig()`).
      replicas: model replicas of ``/answer``.

    Returns:
      The `Service`, with the card (plus its ``"serves"`` block) for ``/card``.

    Raises:
      FileNotFoundError: no card, no private.json, or no index in the release.
      ValueError: a bad private.json, an index not built from the synthetic documents, or
        ``answer`` without an exact private index or a collection cap.

    Privacy:
      ``/retrieve`` reads the release folder only (post-processing of the DP release, free);
      ``/answer`` (when `answer`) charges each DP answer to the caller's tenant on this
      contributor's own ledger before anything is released.
    """
    from dpsynth.service.server import load_service

    folder = KnowledgeFolder(Path(release_dir))
    card = read_card(folder.path)
    record = _record(work_dir)
    config = config or ServiceConfig()
    if answer_epsilon is not None:
        config = dataclasses.replace(config, answer_epsilon=answer_epsilon)
    empty = int(card["releases"].get("synthetic_documents", 0)) == 0
    if not answer:
        ledger = PrivacyLedger(record["ledger"])
        public = _EmptyRelease() if empty else PublicIndex(folder.index, folder.synthetic)
        return Service(
            ledger,
            TenantRegistry(ledger),
            str(record["dataset"]),
            [],
            public,
            config,
            card=served_card(card, answer=None),
        )
    if not record.get("private_index"):
        raise ValueError(
            f"{work_dir}/private.json names no exact private index: /answer cannot be served"
        )
    rag_config = rag_config or RagConfig()
    service = load_service(
        record["private_index"],
        record["private_corpus"],
        ledger=record["ledger"],
        lm=lm,
        replicas=replicas,
        dataset=str(record["dataset"]),
        rag_config=rag_config,
        config=config,
        public_index=None if empty else folder.index,
        public_corpus=None if empty else folder.synthetic,
    )
    if empty:
        service.public = _EmptyRelease()
    service.card = served_card(card, answer=config, rag=rag_config)
    return service


class _EmptyRelease:
    """The index of a release with no document (no topic passed the DP threshold)."""

    def search(self, question: str, k: int) -> list[dict[str, Any]]:
        return []


def add_key(
    work_dir: str | Path,
    name: str,
    *,
    epsilon: float,
    delta: float,
    collection_epsilon: float | None = None,
    collection_delta: float | None = None,
) -> str:
    """Registers tenant `name` on the contributor's own ledger; returns its API key (once).

    The key is valid at this contributor only: its hash lives in this contributor's ledger.

    Args:
      work_dir: the contributor's private work folder.
      name: the tenant's name.
      epsilon: the tenant's epsilon cap for ``/answer`` on the private collection.
      delta: its delta cap.
      collection_epsilon: the cap over all tenants, when the collection has none yet.
      collection_delta: its delta.

    Raises:
      FileNotFoundError: no private.json in `work_dir`.
      ValueError: a bad name or cap, a name taken, or no collection cap (see
        `TenantRegistry.add`).

    Privacy:
      Registering a tenant releases nothing; its cap bounds what its ``/answer`` calls can
      learn about the private collection (``/retrieve`` is free whatever the cap).
    """
    record = _record(work_dir)
    return TenantRegistry.open(record["ledger"]).add(
        name,
        str(record["dataset"]),
        epsilon=epsilon,
        delta=delta,
        collection_epsilon=collection_epsilon,
        collection_delta=collection_delta,
    )
