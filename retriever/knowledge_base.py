"""Answer questions from a released knowledge folder: ordinary RAG, nothing charged.

A knowledge folder (`retriever knowledge release`, `retriever.network.knowledge`) holds DP
synthetic records, their index and the card. A fact release (``facts.json``) is answered by
`retriever.typed_answers` or `retriever.fact_answers`, or abstains; a folder of the retired
cluster release (no ``facts.json``) by `KnowledgeBase`: the top records by BM25
(`retriever.lexical`) or the index's encoder, answered greedily by a public LM, abstaining
when no record shares a word with the question. However many questions are asked, the
guarantee stays the card's (post-processing). See docs/guides/knowledge.md.

Privacy:
  Reads only the release folder (DP outputs and public parameters); charges nothing,
  spends no budget, and needs no ledger. Each answer carries ``"charged": false`` and the
  release's statement so a caller can show both.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from retriever.fact_answers import ABSTAIN
from retriever.rag.prompts import PromptFormat

RETRIEVALS = ("bm25", "dense")
DEFAULT_INSTRUCTION = (
    "Use the records to answer the question. Reply with the answer only, in a few words."
)


@dataclasses.dataclass(frozen=True)
class KnowledgeAnswer:
    """One answer from a release: its text, the records read and the release's guarantee."""

    question: str
    answer: str
    sources: list[str]
    guarantee: dict[str, Any]
    statement: str
    abstained: bool = False
    records: list[str] = dataclasses.field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "question": self.question,
            "answer": self.answer,
            "abstained": self.abstained,
            "charged": False,
            "epsilon_spent": 0.0,
            "sources": self.sources,
            "records": self.records,
            "guarantee": self.guarantee,
            "statement": self.statement,
        }


class KnowledgeBase:
    """A release folder opened for answering (index, records, card, a public LM)."""

    def __init__(
        self,
        folder: str | Path,
        lm: Any,
        *,
        prompt: PromptFormat | None = None,
        k: int = 1,
        max_tokens: int = 12,
        max_document_tokens: int = 96,
        retrieval: str = "bm25",
    ) -> None:
        from retriever.network.folder import KnowledgeFolder, read_card

        if k < 1 or max_tokens < 1 or max_document_tokens < 1:
            raise ValueError(f"k, max_tokens, max_document_tokens must be >= 1: {k=}")
        if retrieval not in RETRIEVALS:
            raise ValueError(f"retrieval must be one of {RETRIEVALS}, got {retrieval!r}")
        self.retrieval = retrieval
        self.folder = KnowledgeFolder(Path(folder))
        self.card = read_card(folder)
        self.lm, self.k = lm, k
        self.prompt = prompt or PromptFormat(instruction=DEFAULT_INSTRUCTION)
        self.max_tokens, self.max_document_tokens = max_tokens, max_document_tokens
        self.records: dict[str, str] = {}
        if self.folder.synthetic.is_file():
            for line in self.folder.synthetic.read_text().splitlines():
                if line.strip():
                    row = json.loads(line)
                    self.records[row["doc_id"]] = row["text"]
        self._lexical = None
        self.facts = None  # a fact release: `retriever.typed_answers` (or `fact_answers`)
        facts_path = self.folder.path / "facts.json"
        if facts_path.is_file():
            from retriever.fact_answers import FactAnswerer
            from synthgen.knowledge.facts import fact_records

            facts = json.loads(facts_path.read_text())
            extractor = facts.get("extractor", "phrases")  # releases before issue 69: phrases
            records = fact_records(facts["pairs"], facts["max_partners"], extractor)
            if extractor == "typed":
                from retriever.typed_answers import TypedFactAnswerer

                self.facts = TypedFactAnswerer(records, facts["noise_stddev"])
            else:
                self.facts = FactAnswerer(records, lm)
            # a fact record's doc_id by its phrase ("Phrase: partners."), to name sources
            self._fact_ids = {text.split(": ", 1)[0]: i for i, text in self.records.items()}

    @classmethod
    def open(cls, folder: str | Path, lm: str = "smollm2-135m-instruct", **kwargs) -> KnowledgeBase:
        """Opens `folder` with an LM asset or path (``"tiny"``: the test LM)."""
        from retriever.network.local import load_answer_lm

        model, fmt = load_answer_lm(lm)
        kwargs.setdefault("prompt", dataclasses.replace(fmt, instruction=DEFAULT_INSTRUCTION))
        return cls(folder, model, **kwargs)

    @property
    def statement(self) -> str:
        return str(self.card["statement"])

    def search(self, question: str, k: int | None = None) -> list[dict[str, Any]]:
        """The top records for `question`: ``{"doc_id", "score", "text"}``, best first."""
        from retriever.index_folder import search_index_folder

        if not self.records:
            return []
        if self.retrieval == "bm25":
            from retriever.lexical import BM25

            ids = list(self.records)
            if self._lexical is None:
                self._lexical = BM25([self.records[i] for i in ids])
            scores, top = self._lexical.search([question], k or self.k)
            return [
                {"doc_id": ids[int(i)], "score": float(s), "text": self.records[ids[int(i)]]}
                for s, i in zip(scores[0], top[0])
            ]
        if not self.folder.index.is_dir():
            return []
        hits = search_index_folder(self.folder.index, [question], k or self.k)[0]
        return [{**hit, "text": self.records[hit["doc_id"]]} for hit in hits]

    def answer(self, question: str) -> KnowledgeAnswer:
        """Greedy RAG answer over the release (post-processing: nothing is charged).

        Raises:
          ValueError: an empty question.
        """
        from retriever.network.local import local_answer

        if not question.strip():
            raise ValueError("the question is empty")
        if self.facts is not None:
            found = self.facts.answer(question)
            return KnowledgeAnswer(
                question,
                found.answer,
                [self._fact_ids.get(t, t) for t in found.records],
                dict(self.card["guarantee"]),
                self.statement,
                abstained=found.abstained,
                records=[self.facts.records[t]["text"] for t in found.records],
            )
        hits = self.search(question)
        if self.retrieval == "bm25":  # no word in common: nothing relevant
            hits = [h for h in hits if h["score"] > 0]
        if not hits:
            return KnowledgeAnswer(
                question, ABSTAIN, [], dict(self.card["guarantee"]), self.statement,
                abstained=True,
            )  # fmt: skip
        text = local_answer(
            self.lm,
            self.prompt,
            question,
            [h["text"] for h in hits],
            max_tokens=self.max_tokens,
            max_document_tokens=self.max_document_tokens,
        )
        return KnowledgeAnswer(
            question,
            text,
            [h["doc_id"] for h in hits],
            dict(self.card["guarantee"]),
            self.statement,
            records=[h["text"] for h in hits],
        )
