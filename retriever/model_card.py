"""The model card (README.md) of an exported encoder: its privacy statement and provenance,
the base model and its licence, and evaluation figures when the user supplies them.

Privacy:
  The card repeats the encoder's provenance (`retriever.provenance`: public figures only).
  Evaluation figures are computed on whatever queries the user evaluated with, often private
  held-out ones, and are not covered by the privacy statement: they go into a card only when
  a `retriever evaluate` report of that very encoder folder is passed, and the card says so.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

CARD_FILE = "README.md"


def base_licence(name: str, folder: Path | None) -> str | None:
    """The base model's licence: the asset registry's, else its model card's ``license:``."""
    from synthgen import assets

    if name in assets.REGISTRY:
        return assets.REGISTRY[name].license
    card = None if folder is None else folder / CARD_FILE
    if card is not None and card.is_file():
        found = re.search(r"^license:\s*(\S+)\s*$", card.read_text(errors="replace"), re.M)
        if found:
            return found.group(1)
    return None


def read_evaluation(report: str | Path | dict, encoder_dir: str | Path) -> dict:
    """A `retriever evaluate --out` report, checked to be of the encoder folder `encoder_dir`.

    Raises:
      FileNotFoundError: no such report file.
      ValueError: the report is of another encoder, or not an evaluation report.
    """
    if not isinstance(report, dict):
        path = Path(report)
        if not path.is_file():
            raise FileNotFoundError(f"no such evaluation report: {path}")
        report = json.loads(path.read_text())
    if "num_queries" not in report or "encoder" not in report:
        raise ValueError("not a `retriever evaluate` report (no num_queries or encoder)")
    want = str(Path(encoder_dir).expanduser().resolve())
    if report["encoder"] != want:
        raise ValueError(f"the evaluation report is of encoder {report['encoder']!r}, not {want!r}")
    return report


def _described(name: str) -> str:
    """What an asset is, in parentheses (its registry description up to a colon), else ""."""
    from synthgen import assets

    if name not in assets.REGISTRY:
        return ""
    return f" ({assets.REGISTRY[name].description.split(':')[0]})"


def _scope_text(scope: dict | None) -> str:
    if not scope:
        return "not recorded"
    return f"tenant {scope['tenant']!r}, dataset {scope['dataset']!r}"


def _figure(value: Any, fmt: str = ".4g") -> str:
    if value is None:
        return "not recorded"
    if isinstance(value, float) and not math.isfinite(value):
        return "∞"
    return format(value, fmt) if isinstance(value, int | float) else str(value)


def model_card(
    record: dict,
    *,
    base: str,
    licence: str | None,
    evaluation: dict | None = None,
    doc_tower: bool = False,
    max_seq_length: int | None = None,
    training: dict | None = None,
) -> str:
    """The export's README.md: privacy statement, training data, base and licence, figures.

    Args:
      record: the encoder's provenance (`retriever.provenance`).
      base: the base model's name; licence: its licence, if known.
      evaluation: a `read_evaluation` report, if given.
      doc_tower: the export has a separate document tower.
      max_seq_length: the export's sentence-transformers truncation length.
      training: the training config (encoder.json), for the token budgets it trained with.
    """
    guarantee, trained = record["guarantee"], record["trained_on"]
    front = ["---", "library_name: sentence-transformers", "pipeline_tag: sentence-similarity"]
    if licence:
        front.append(f"license: {licence.lower()}")
    front += [
        "tags:",
        "- sentence-transformers",
        "- feature-extraction",
        "- dpsynth",
        *(["- differential-privacy"] if guarantee["kind"] != "none" else []),
        "---",
        "",
    ]
    lines = [
        "# Dual encoder exported by dpsynth",
        "",
        f"A text encoder fine-tuned with dpsynth from the base model `{base}`: mean pooling "
        "over real tokens, L2-normalised embeddings (compare them by dot product or cosine).",
        "",
        "## Privacy",
        "",
        f"**{record['statement']}**",
        "",
        f"- Guarantee: {guarantee['kind']}",
    ]
    if guarantee["kind"] != "none":
        lines += [
            f"- ε = {_figure(guarantee['epsilon'])}, δ = {_figure(guarantee['delta'], '.3g')}",
            f"- Privacy unit: {_figure(guarantee['privacy_unit'])}",
            f"- Neighbouring relation: {_figure(guarantee['neighboring_relation'])}",
            f"- Ledger scope: {_scope_text(guarantee['ledger_scope'])}",
        ]
    lines += ["", "## Training data", "", f"- {trained['description']}"]
    if trained.get("num_pairs") is not None:
        lines.append(f"- Training pairs: {trained['num_pairs']}")
    dataset = trained.get("dataset")
    if dataset:
        lines += [
            f"- Generator: {dataset['generator']}",
            f"- Release guarantee: ε = {_figure(dataset['epsilon'])}, "
            f"δ = {_figure(dataset['delta'], '.3g')}, unit: {_figure(dataset['privacy_unit'])}",
            f"- Ledger scope of the release: {_scope_text(dataset['ledger_scope'])}",
        ]
    lines += [
        "",
        "## Base model and licence",
        "",
        f"- Base model: `{base}`{_described(base)}",
        f"- Licence of the base model: {licence or 'not recorded: see the base model terms'}",
        "",
        "## Evaluation",
        "",
    ]
    if evaluation is None:
        lines.append("No evaluation figures were given at export.")
    else:
        k = next((n.split("@")[1] for n in evaluation if n.startswith("ndcg@")), "10")
        lines += [
            f"On {evaluation['num_queries']} queries over {evaluation['num_documents']} "
            f"documents ({evaluation.get('index', 'exact')} search):",
            "",
            f"| NDCG@{k} | Recall@{k} | MRR@{k} |",
            "|---|---|---|",
            f"| {evaluation[f'ndcg@{k}']:.4f} | {evaluation[f'recall@{k}']:.4f} "
            f"| {evaluation[f'mrr@{k}']:.4f} |",
            "",
            "These figures are computed on the evaluation queries and are not covered by the "
            "privacy statement above: publish them only if those queries may be published.",
        ]
    lines += [
        "",
        "## Usage",
        "",
        "```python",
        "from sentence_transformers import SentenceTransformer",
        "",
        'model = SentenceTransformer("path/to/this/folder")',
        'embeddings = model.encode(["a query", "a document"])',
        "```",
    ]
    budgets = training or {}
    if max_seq_length and budgets.get("max_doc_len"):
        lines += [
            "",
            f"Texts are truncated to {max_seq_length} tokens (`model.max_seq_length`). The "
            f"encoder was trained on queries of up to {budgets.get('max_query_len')} and "
            f"documents of up to {budgets['max_doc_len']} tokens; set `model.max_seq_length = "
            f"{budgets['max_doc_len']}` to embed documents exactly as a dpsynth index built "
            "with that budget did.",
        ]
    if doc_tower:
        lines += [
            "",
            "Queries and documents have separate towers: embed queries with this folder and "
            "documents with `doc_tower/` (a sentence-transformers folder too).",
        ]
    return "\n".join(front + lines) + "\n"
