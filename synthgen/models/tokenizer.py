"""The tokenizer protocol shared by every model family."""

from __future__ import annotations

from typing import Protocol, runtime_checkable


@runtime_checkable
class Tokenizer(Protocol):
    """Text <-> ids. Implementations: SentencePiece (T5), GGUF/HF BPE (Llama)."""

    @property
    def vocab_size(self) -> int: ...

    @property
    def eos_id(self) -> int: ...

    @property
    def pad_id(self) -> int: ...

    @property
    def bos_id(self) -> int | None: ...

    def encode(self, text: str) -> list[int]:
        """Ids of `text` without special tokens (callers add BOS/EOS as the model needs)."""
        ...

    def decode(self, ids: list[int]) -> str:
        """Text of `ids`, skipping special tokens."""
        ...
