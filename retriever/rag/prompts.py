"""Prompts of the answer stage: one per selected document (or voter), one public.

The public prompt holds the question and no document; a private prompt adds its
documents' text, already tokenized and cut to a public length. The default format is
ChatML (SmolLM2-Instruct's chat template); `chat=False` gives plain text for base models
and the byte-level test model.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

DEFAULT_INSTRUCTION = "Answer the question in a few words, using the documents if they help."


@dataclasses.dataclass(frozen=True)
class PromptFormat:
    """How a question and its documents become token ids.

    Attributes:
      instruction: the system instruction (public).
      chat: ChatML turns (True) or plain "Documents / Question / Answer" text (False).
      answer_prefix: text the assistant turn starts with (public; e.g. "The disease is").
    """

    instruction: str = DEFAULT_INSTRUCTION
    chat: bool = True
    answer_prefix: str = ""

    def _pieces(self, question: str, has_documents: bool) -> tuple[str, str]:
        """(text before the documents, text after them)."""
        docs_header = "Documents:\n" if has_documents else ""
        if self.chat:
            head = (
                f"<|im_start|>system\n{self.instruction}<|im_end|>\n<|im_start|>user\n{docs_header}"
            )
            tail = f"\nQuestion: {question}<|im_end|>\n<|im_start|>assistant\n{self.answer_prefix}"
        else:
            head = f"{self.instruction}\n{docs_header}"
            tail = f"\nQuestion: {question}\nAnswer:{self.answer_prefix}"
        return head, tail.rstrip(" ") if self.answer_prefix else tail

    def document_parts(self, lm, question: str) -> tuple[list[int], list[int]]:
        """(prefix, suffix): a one-document prompt is prefix + document ids + suffix, the
        same ids as `encode(lm, question, [document])`, with the text encoded once."""
        head, tail = self._pieces(question, True)
        prefix = lm.encode(head, bos=True) + lm.encode("- ")
        return prefix, lm.encode("\n") + lm.encode(tail)

    def encode(self, lm, question: str, documents: Sequence[Sequence[int]]) -> list[int]:
        """Token ids of the prompt; `documents` are token ids of each document's text."""
        head, tail = self._pieces(question, bool(documents))
        ids = lm.encode(head, bos=True)
        for doc in documents:
            ids += lm.encode("- ") + list(doc) + lm.encode("\n")
        return ids + lm.encode(tail)
