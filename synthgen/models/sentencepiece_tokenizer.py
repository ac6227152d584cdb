"""SentencePiece tokenizers for T5: a `spiece.model` or its `tokenizer.json` serialisation.

T5 conventions: pad = 0, eos = 1, unk = 2, no BOS; callers append EOS to encoder inputs and
targets. HF T5 vocabularies end with `extra_ids` sentinel tokens (<extra_id_0> is the last id)
that the SentencePiece model does not contain; they count in `vocab_size` and `decode` skips
them, as HF's `skip_special_tokens` does.

`train_sentencepiece` builds a small unigram vocabulary offline (tests, random-init models).

References:
  Kudo and Richardson 2018, "SentencePiece: A simple and language independent subword
  tokenizer and detokenizer for Neural Text Processing"; Kudo 2018 (unigram LM).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterable
from pathlib import Path

import sentencepiece as spm

from synthgen.models.tokenizer import TokenizersWrapper

MODEL_FILE = "spiece.model"


def _extra_ids(directory: Path) -> int:
    """`extra_ids` from a HF tokenizer_config.json next to the model (0 if absent)."""
    config = directory / "tokenizer_config.json"
    if not config.exists():
        return 0
    return int(json.loads(config.read_text()).get("extra_ids", 0) or 0)


class SentencePieceTokenizer:
    """A `Tokenizer` backed by a SentencePiece model file (T5's spiece.model)."""

    def __init__(self, model_file: str | Path, *, extra_ids: int = 0) -> None:
        """Opens `model_file`.

        Args:
          model_file: path of the .model file.
          extra_ids: sentinel ids appended after the SentencePiece pieces (HF T5: 100).

        Raises:
          ValueError: the model has no pad or eos piece, or extra_ids < 0.
        """
        if extra_ids < 0:
            raise ValueError(f"extra_ids must be >= 0, got {extra_ids=}")
        self.model_file = Path(model_file)
        self._sp = spm.SentencePieceProcessor(model_file=str(self.model_file))
        self._pieces = self._sp.get_piece_size()
        self._extra_ids = extra_ids
        if self._sp.pad_id() < 0 or self._sp.eos_id() < 0:
            raise ValueError(
                f"model needs pad and eos pieces, got {self._sp.pad_id()=}, {self._sp.eos_id()=}"
            )
        self._special = {self._sp.pad_id(), self._sp.eos_id()}
        if self._sp.bos_id() >= 0:
            self._special.add(self._sp.bos_id())

    @classmethod
    def load(cls, path: str | Path) -> SentencePieceTokenizer:
        """From a .model file or a directory holding spiece.model (or one ``*.model`` file)."""
        path = Path(path)
        if path.is_dir():
            extra = _extra_ids(path)
            candidates = (
                [path / MODEL_FILE]
                if (path / MODEL_FILE).exists()
                else sorted(path.glob("*.model"))
            )
            if len(candidates) != 1:
                raise FileNotFoundError(f"expected {MODEL_FILE} (or one *.model) in {path}")
            return cls(candidates[0], extra_ids=extra)
        return cls(path, extra_ids=_extra_ids(path.parent))

    def save(self, directory: str | Path) -> Path:
        """Copies the model to `directory`/spiece.model (HF's name) and returns that path."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        target = directory / MODEL_FILE
        if target.resolve() != self.model_file.resolve():
            shutil.copyfile(self.model_file, target)
        if self._extra_ids:
            (directory / "tokenizer_config.json").write_text(
                json.dumps({"extra_ids": self._extra_ids}) + "\n"
            )
        return target

    @property
    def vocab_size(self) -> int:
        return self._pieces + self._extra_ids

    @property
    def eos_id(self) -> int:
        return self._sp.eos_id()

    @property
    def pad_id(self) -> int:
        return self._sp.pad_id()

    @property
    def bos_id(self) -> int | None:
        bos = self._sp.bos_id()
        return bos if bos >= 0 else None

    @property
    def unk_id(self) -> int:
        return self._sp.unk_id()

    def encode(self, text: str) -> list[int]:
        """Ids of `text` without special tokens."""
        return list(self._sp.encode(text, out_type=int))

    def decode(self, ids: Iterable[int]) -> str:
        """Text of `ids`, skipping pad/eos/bos and ids outside the SentencePiece model."""
        kept = [int(i) for i in ids if 0 <= int(i) < self._pieces and int(i) not in self._special]
        return self._sp.decode(kept)


class TokenizerJsonTokenizer(TokenizersWrapper):
    """A `Tokenizer` for a HF `tokenizer.json` (the fast-tokenizer form of spiece.model)."""

    def __init__(self, path: str | Path, *, pad_token: str = "<pad>", eos_token: str = "</s>"):
        """Opens `path` with the `tokenizers` library.

        Raises:
          ValueError: the vocabulary lacks the pad or eos token.
        """
        from tokenizers import Tokenizer as HFTokenizer

        self.path = Path(path)
        self._tok = HFTokenizer.from_file(str(self.path))
        self._pad = self._tok.token_to_id(pad_token)
        self._eos = self._tok.token_to_id(eos_token)
        if self._pad is None or self._eos is None:
            raise ValueError(f"tokenizer.json lacks {pad_token=} or {eos_token=}")

    def save(self, directory: str | Path) -> Path:
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        self._tok.save(str(directory / "tokenizer.json"))
        return directory / "tokenizer.json"


def load_tokenizer(
    directory: str | Path, *, required: bool = True
) -> SentencePieceTokenizer | TokenizerJsonTokenizer | None:
    """The tokenizer of a HF T5 directory: spiece.model if present, else tokenizer.json.

    Raises:
      FileNotFoundError: neither file exists and `required`.
    """
    directory = Path(directory)
    if (directory / MODEL_FILE).exists():
        return SentencePieceTokenizer.load(directory)
    if (directory / "tokenizer.json").exists():
        return TokenizerJsonTokenizer(directory / "tokenizer.json")
    if required:
        raise FileNotFoundError(f"no {MODEL_FILE} or tokenizer.json in {directory}")
    return None


def train_sentencepiece(
    texts: Iterable[str],
    vocab_size: int,
    out_dir: str | Path,
    *,
    character_coverage: float = 0.9995,
    num_threads: int | None = None,
    cache: str | Path | None = None,
) -> SentencePieceTokenizer:
    """Trains a T5-style unigram SentencePiece model on `texts` (pad 0, eos 1, unk 2, no bos).

    Training is deterministic for a given input order (no sentence sampling: the same pieces
    and scores; the file's bytes may differ in the last bits of a score). Each text is one
    training sentence; long documents are kept whole (max_sentence_length is raised).
    With `cache`, a model trained before on the same texts and settings (the same
    SentencePiece version) is copied from there instead of trained again.

    Args:
      texts: training texts (public data only: the vocabulary is not a DP release).
      vocab_size: exact number of pieces; the corpus must support it.
      out_dir: where spiece.model and spiece.vocab are written (created).
      character_coverage: share of characters covered by the alphabet (rest map to unk).
      num_threads: trainer threads (default: CPU count, at most 8).
      cache: a folder of trained models, one subfolder per key (a SHA-256 of the texts and
        settings); public texts only, as above.

    Returns:
      The trained tokenizer.

    Raises:
      ValueError: vocab_size < 8 or no non-empty text.
    """
    if vocab_size < 8:
        raise ValueError(f"vocab_size must be >= 8, got {vocab_size=}")
    sentences = [t for t in (text.strip() for text in texts) if t]
    if not sentences:
        raise ValueError("train_sentencepiece needs at least one non-empty text")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    if cache is not None:
        return _cached(sentences, vocab_size, character_coverage, out_dir, Path(cache))
    prefix = out_dir / MODEL_FILE.removesuffix(".model")
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(sentences),
        model_prefix=str(prefix),
        vocab_size=vocab_size,
        model_type="unigram",
        pad_id=0,
        eos_id=1,
        unk_id=2,
        bos_id=-1,
        character_coverage=character_coverage,
        max_sentence_length=max(4192, max(len(s.encode("utf-8")) for s in sentences)),
        num_threads=num_threads or min(os.cpu_count() or 1, 8),
        minloglevel=2,
    )
    return SentencePieceTokenizer(out_dir / MODEL_FILE)


def _cached(
    sentences: list[str], vocab_size: int, coverage: float, out_dir: Path, cache: Path
) -> SentencePieceTokenizer:
    """`train_sentencepiece` through `cache`: trained once per key into a temporary folder
    renamed into place (concurrent processes may train the same key; one rename wins)."""
    key = hashlib.sha256(f"{spm.__version__}|{vocab_size}|{coverage}|".encode())
    for sentence in sentences:
        key.update(sentence.encode("utf-8") + b"\0")
    entry = cache / key.hexdigest()
    if not (entry / MODEL_FILE).exists():
        cache.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=".training-", dir=cache))
        try:
            train_sentencepiece(sentences, vocab_size, staging, character_coverage=coverage)
            with contextlib.suppress(OSError):  # another process put the key in place first
                staging.rename(entry)
        finally:
            shutil.rmtree(staging, ignore_errors=True)  # gone after a rename
    for name in (MODEL_FILE, MODEL_FILE.replace(".model", ".vocab")):
        shutil.copyfile(entry / name, out_dir / name)
    return SentencePieceTokenizer(out_dir / MODEL_FILE)
