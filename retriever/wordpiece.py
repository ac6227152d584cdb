"""Fixed-length tokenizers of the text encoders, and the small WordPiece vocabulary.

`FixedLength` wraps a `tokenizers` tokenizer (BERT's WordPiece) and `AppendEos` a `synthgen`
SentencePiece tokenizer (T5): both return ``[n, max_len]`` ids and attention masks.
`wordpiece_tokenizer` and `build_vocab` make the lowercasing WordPiece tokenizer of a
randomly initialised encoder (tests, `random:` encoders) and of exported folders.
"""

from __future__ import annotations

import collections
import string
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
from tokenizers import Tokenizer as HFTokenizer


class FixedLength:
    """A `tokenizers` tokenizer with its own specials, truncated and padded to a fixed length.

    One configured copy per length, so concurrent callers with different lengths never see
    each other's truncation settings.
    """

    def __init__(self, tokenizer: HFTokenizer, pad_token: str) -> None:
        pad_id = tokenizer.token_to_id(pad_token)
        if pad_id is None:
            raise ValueError(f"the tokenizer has no padding token {pad_token=}")
        self._json = tokenizer.to_str()
        self.pad_token, self.pad_id = pad_token, pad_id
        self._by_length: dict[int, HFTokenizer] = {}

    def __call__(self, texts: list[str], max_len: int) -> tuple[np.ndarray, np.ndarray]:
        tok = self._by_length.get(max_len)
        if tok is None:
            tok = HFTokenizer.from_str(self._json)
            tok.enable_truncation(max_length=max_len)
            tok.enable_padding(length=max_len, pad_id=self.pad_id, pad_token=self.pad_token)
            self._by_length[max_len] = tok
        encodings = tok.encode_batch(texts, add_special_tokens=True)
        ids = np.array([e.ids for e in encodings], np.int32).reshape(len(texts), max_len)
        mask = np.array([e.attention_mask for e in encodings], np.int32)
        return ids, mask.reshape(len(texts), max_len)


class AppendEos:
    """A `synthgen` Tokenizer (SentencePiece for T5): ids + EOS, truncated, padded."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer

    def __call__(self, texts: list[str], max_len: int) -> tuple[np.ndarray, np.ndarray]:
        tok = self.tokenizer
        ids = np.full((len(texts), max_len), tok.pad_id, np.int32)
        mask = np.zeros((len(texts), max_len), np.int32)
        for row, text in enumerate(texts):
            seq = tok.encode(text)[: max_len - 1] + [tok.eos_id]
            ids[row, : len(seq)] = seq
            mask[row, : len(seq)] = 1
        return ids, mask


# T5 conventions (pad 0, eos 1, unk 2) hold for the random vocabulary's first three ids.
_SPECIALS = ("[PAD]", "[SEP]", "[UNK]", "[CLS]", "[MASK]")
_DEFAULT_WORDS = (
    "the of and to in is was for on that with as by at from his an it are were which be this "
    "has also or had its first their one after but not new who they two have her she been other "
    "all when there more into time during most would can may about up over world only some "
    "city state year years people school university team music film war game what where how "
    "why which query document search retrieval private data model text"
).split()


def wordpiece_tokenizer(vocab: Sequence[str], *, t5: bool = False) -> HFTokenizer:
    """A lowercasing BERT WordPiece tokenizer over `vocab` (tokens in id order).

    Args:
      vocab: tokens; must hold the specials ``[PAD] [SEP] [UNK] [CLS] [MASK]``.
      t5: ``$A [SEP]`` (T5 style, [SEP] playing EOS) instead of ``[CLS] $A [SEP]``.

    Raises:
      ValueError: `vocab` lacks one of the special tokens.
    """
    from tokenizers import models, normalizers, pre_tokenizers, processors

    index = {token: i for i, token in enumerate(vocab)}
    missing = [s for s in _SPECIALS if s not in index]
    if missing:
        raise ValueError(f"vocabulary lacks special tokens, got {missing=}")
    tok = HFTokenizer(models.WordPiece(index, unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.post_processor = processors.TemplateProcessing(
        single="$A [SEP]" if t5 else "[CLS] $A [SEP]",
        special_tokens=[("[CLS]", index["[CLS]"]), ("[SEP]", index["[SEP]"])],
    )
    return tok


def build_vocab(texts: Iterable[str] | None = None, *, size: int = 1024) -> list[str]:
    """A small WordPiece vocabulary: specials, characters, ##characters, frequent words.

    Args:
      texts: public texts whose most frequent words are added (default: a fixed list).
      size: maximum vocabulary size.

    Returns:
      Tokens in id order (deterministic for a given input).
    """
    chars = list(string.ascii_lowercase + string.digits + string.punctuation)
    vocab = [*_SPECIALS, *chars, *(f"##{c}" for c in string.ascii_lowercase + string.digits)]
    if size < len(vocab):
        raise ValueError(f"size must be >= {len(vocab)}, got {size=}")
    probe = wordpiece_tokenizer(vocab)
    counts: collections.Counter[str] = collections.Counter()
    for text in _DEFAULT_WORDS if texts is None else texts:
        normal = probe.normalizer.normalize_str(text)
        counts.update(w for w, _ in probe.pre_tokenizer.pre_tokenize_str(normal))
    known = set(vocab)
    words = sorted((w for w in counts if w not in known), key=lambda w: (-counts[w], w))
    return vocab + words[: size - len(vocab)]
