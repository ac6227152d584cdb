"""The tokenizer protocol shared by every model family, and what the `tokenizers` wrappers
share."""

from __future__ import annotations

from collections.abc import Iterable
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


class TokenizersWrapper:
    """The `Tokenizer` protocol of a wrapper around a `tokenizers.Tokenizer`.

    The subclass sets `_tok` (the `tokenizers.Tokenizer`), `_eos`, `_pad` and, if the model
    has one, `_bos`.
    """

    _bos: int | None = None

    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size(with_added_tokens=True)

    @property
    def eos_id(self) -> int:
        return self._eos

    @property
    def pad_id(self) -> int:
        return self._pad

    @property
    def bos_id(self) -> int | None:
        return self._bos

    def encode(self, text: str) -> list[int]:
        """Ids of `text`, none added; a special token written in it (``<|im_start|>``) is one id."""
        return self._tok.encode(text, add_special_tokens=False).ids

    def decode(self, ids: Iterable[int]) -> str:
        """Text of `ids`, skipping special tokens (pad, EOS, control tokens, T5's sentinels)."""
        return self._tok.decode([int(i) for i in ids], skip_special_tokens=True)
