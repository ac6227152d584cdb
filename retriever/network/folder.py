"""A contributor's knowledge folder: what it releases to the network, and nothing else.

The release folder (safe to ship; `retriever contributor build` writes it) holds
``card.json`` (what the contributor releases, under which guarantee), ``synthetic.jsonl``
(rows ``{"doc_id", "text", "topic"}``), ``facts.json`` (the released pairs and their noisy
counts), ``metadata.json`` (the release's privacy block and file digests) and ``index/``
over the synthetic rows. The private work folder lives elsewhere (mode 0700): the
contributor's ledger and ``private.json``. See docs/guides/network.md.

Privacy:
  Every file of the release folder is a DP output or public: the synthetic texts and their
  topics are written from the DP fact release's pairs and noisy counts (facts.json), the
  card and the metadata hold declared parameters and the guarantee. Serving it (`/retrieve`) is
  post-processing and costs nothing.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from synthgen.privacy.figures import round_up

CARD_FILE = "card.json"
SYNTHETIC_FILE = "synthetic.jsonl"
METADATA_FILE = "metadata.json"
INDEX_DIR = "index"
PRIVATE_FILE = "private.json"
CARD_FORMAT = "dpsynth-contributor-card/1"
RELATION = "ADD_OR_REMOVE_ONE"


def _member(name: str) -> property:
    """A `KnowledgeFolder` property: the path of `name` inside the folder."""
    return property(lambda folder: folder.path / name)


@dataclasses.dataclass(frozen=True)
class KnowledgeFolder:
    """Paths of a contributor's release folder."""

    path: Path
    card = _member(CARD_FILE)
    synthetic = _member(SYNTHETIC_FILE)
    metadata = _member(METADATA_FILE)
    index = _member(INDEX_DIR)


def make_card(
    *,
    contributor: str,
    epsilon: float,
    delta: float,
    generator: str,
    model: str,
    encoder: str,
    num_documents: int,
    stages: Sequence[dict[str, Any]] = (),
    seeded: bool = False,
) -> dict[str, Any]:
    """The card of a release: what it holds and its (epsilon, delta) guarantee.

    Args:
      contributor: the contributor's public name.
      epsilon: epsilon of the whole release (all its DP stages composed).
      delta: its delta.
      generator: how the synthetic documents were made.
      model: the LM that generated them.
      encoder: the encoder of the index (questions must be embedded with it).
      num_documents: synthetic documents released.
      stages: the release's DP stages, each ``{"stage", "epsilon", "delta", ...}``.
      seeded: the mechanism's randomness came from a fixed seed (tests only).

    Raises:
      ValueError: a bad epsilon or delta.
    """
    import datetime

    if not (math.isfinite(epsilon) and epsilon >= 0) or not 0 <= delta < 1:
        raise ValueError(f"need a finite epsilon >= 0 and 0 <= delta < 1, got {epsilon=} {delta=}")
    created = datetime.datetime.now(datetime.UTC).date().isoformat()
    statement = (
        f"({round_up(epsilon, 4):.4g}, {round_up(delta, 3):.3g})-DP for one document of the "
        f"private collection '{contributor}' (add/remove one document): the synthetic "
        "documents, their topics, the released pairs of a fact release (facts.json) and this "
        "index are the only things released; retrieving from them is post-processing and "
        "spends no budget, however many questions are asked"
    )
    if seeded:
        statement += " (noise from a fixed seed: for tests only, not for publication)"
    return {
        "format": CARD_FORMAT,
        "contributor": contributor,
        "created": created,
        "releases": {
            "synthetic_documents": int(num_documents),
            "generator": generator,
            "model": model,
            "encoder": encoder,
        },
        "guarantee": {
            "epsilon": float(epsilon),
            "delta": float(delta),
            "privacy_unit": f"one document of the private collection '{contributor}'",
            "neighboring_relation": RELATION,
            "stages": [dict(s) for s in stages],
            "seeded": bool(seeded),
        },
        "statement": statement,
    }


def write_knowledge_folder(
    out: str | Path,
    texts: Sequence[str],
    topics: Sequence[str],
    card: dict[str, Any],
    *,
    metadata: dict[str, Any] | None = None,
    extra: dict[str, str] | None = None,
) -> KnowledgeFolder:
    """Writes synthetic.jsonl, card.json, metadata.json and the exact index of a release.

    card.json is written last: a folder with a card is complete (a crash before it leaves a
    folder that no reader takes for a release).

    Args:
      out: the release folder (created).
      texts: the synthetic documents (DP outputs).
      topics: each document's topic (a DP-released key phrase of its facts).
      card: from `make_card`; its encoder builds the index.
      metadata: the generator's metadata (written as metadata.json when given).
      extra: other public files of the release, name -> text (a fact release's
        facts.json), written before the card.

    An empty release (no fact passed the threshold) has an empty synthetic.jsonl and no
    index: retrieving from it finds nothing.

    Raises:
      ValueError: texts and topics differ in length.
    """
    from retriever.data import write_jsonl
    from retriever.index_folder import build_index_folder

    if len(texts) != len(topics):
        raise ValueError(f"one topic per text: {len(texts)=} {len(topics)=}")
    folder = KnowledgeFolder(Path(out))
    folder.path.mkdir(parents=True, exist_ok=True)
    rows = [
        {"doc_id": f"syn-{i:05d}", "text": str(text), "topic": str(topic)}
        for i, (text, topic) in enumerate(zip(texts, topics))
    ]
    write_jsonl(folder.synthetic, rows)
    if metadata is not None:
        from synthgen.corpora import file_sha256

        metadata = {**metadata, "files": {SYNTHETIC_FILE: file_sha256(folder.synthetic)}}
        folder.metadata.write_text(json.dumps(metadata, indent=1, default=str))
    if rows:
        encoder = card["releases"]["encoder"]
        build_index_folder(folder.synthetic, folder.index, encoder=encoder, kind="exact")
    for name, text in (extra or {}).items():
        (folder.path / name).write_text(text)
    folder.card.write_text(json.dumps(card, indent=1))
    return folder


def read_card(folder: str | Path) -> dict[str, Any]:
    """The card of a release folder.

    Raises:
      FileNotFoundError: no card.json in `folder`.
      ValueError: not a card of this format.
    """
    path = KnowledgeFolder(Path(folder)).card
    if not path.is_file():
        raise FileNotFoundError(f"{folder} is not a contributor's release (no {CARD_FILE})")
    card = json.loads(path.read_text())
    if not isinstance(card, dict) or card.get("format") != CARD_FORMAT:
        raise ValueError(f"{path} is not a {CARD_FORMAT} card")
    return card


def write_private_record(work: str | Path, record: dict[str, Any]) -> Path:
    """Writes ``private.json`` (private corpus, exact index, dataset) in the work folder."""
    from synthgen.work_folder import private_folder

    path = private_folder(work) / PRIVATE_FILE
    path.write_text(json.dumps(record, indent=1))
    return path


def read_private_record(work: str | Path) -> dict[str, Any]:
    """The work folder's ``private.json``.

    Raises:
      FileNotFoundError: the work folder has none.
    """
    path = Path(work) / PRIVATE_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{work} is not a contributor's work folder (no {PRIVATE_FILE})")
    return json.loads(path.read_text())
