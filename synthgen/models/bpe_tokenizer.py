"""Byte-level BPE tokenizer (GPT-2 family) from GGUF metadata or a tokenizer.json, with chat
templates.

Built with the Hugging Face `tokenizers` library. From a GGUF file (``tokenizer.ggml.model ==
"gpt2"``) the vocabulary, merges and token types are rebuilt into a `tokenizers.Tokenizer`:
control tokens (type 3) become special added tokens (one id each, matched in text, skipped
when decoding) and user-defined tokens (type 4) become plain added tokens. The pre-tokenizer
follows llama.cpp's ``tokenizer.ggml.pre`` (see `PRE_TOKENIZERS`): "smollm" and the StarCoder
family split every digit before the GPT-2 byte-level regex, "llama-bpe" and "qwen2" use their
own split regexes. The chat template (``tokenizer.chat_template``) is a Jinja string rendered
the way `transformers` does it (sandboxed, ``trim_blocks``, ``lstrip_blocks``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import jinja2
import jinja2.ext
import jinja2.sandbox
import tokenizers
from tokenizers import decoders, models, pre_tokenizers

from synthgen.models.tokenizer import TokenizersWrapper

GGUF_NORMAL, GGUF_CONTROL, GGUF_USER_DEFINED = 1, 3, 4

_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_DIGITS_THEN_GPT2 = ("smollm", "starcoder", "refact", "command-r", "codeshell", "exaone")
PRE_TOKENIZERS = ("default", "gpt2", "llama-bpe", "qwen2", *_DIGITS_THEN_GPT2)


def _pre_tokenizer(pre: str) -> tuple[pre_tokenizers.PreTokenizer, bool]:
    """(pre-tokenizer, ignore_merges) for llama.cpp's ``tokenizer.ggml.pre`` name."""
    if pre in ("default", "gpt2"):
        return pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True), False
    if pre in _DIGITS_THEN_GPT2:
        return pre_tokenizers.Sequence(
            [
                pre_tokenizers.Digits(individual_digits=True),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
            ]
        ), False
    if pre in ("llama-bpe", "qwen2"):
        regex = _LLAMA3_SPLIT if pre == "llama-bpe" else _QWEN2_SPLIT
        return pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(tokenizers.Regex(regex), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        ), pre == "llama-bpe"
    raise ValueError(f"unsupported tokenizer.ggml.pre; known: {PRE_TOKENIZERS}, got {pre=}")


def _field(fields: Mapping[str, Any], key: str, default: Any = None) -> Any:
    field = fields.get(key)
    return default if field is None else field.contents()


class BpeTokenizer(TokenizersWrapper):
    """A `synthgen.models.tokenizer.Tokenizer` over a `tokenizers.Tokenizer`.

    Args:
      tokenizer: the underlying tokenizer (no post-processor is used; `encode` adds nothing).
      eos_id: end-of-sequence id (the end-of-turn token for chat models).
      pad_id: padding id (the EOS id when the model defines none).
      bos_id: beginning-of-sequence id, or None.
      add_bos: whether the model expects BOS in front of every input.
      chat_template: Jinja chat template, or None.
    """

    def __init__(
        self,
        tokenizer: tokenizers.Tokenizer,
        *,
        eos_id: int,
        pad_id: int | None = None,
        bos_id: int | None = None,
        add_bos: bool = False,
        chat_template: str | None = None,
    ) -> None:
        vocab = tokenizer.get_vocab_size(with_added_tokens=True)
        for name, value in (("eos_id", eos_id), ("pad_id", pad_id), ("bos_id", bos_id)):
            if value is not None and not 0 <= value < vocab:
                raise ValueError(f"{name} out of the vocabulary ({vocab=}), got {name}={value}")
        self._tok = tokenizer
        self._eos = int(eos_id)
        self._pad = int(eos_id if pad_id is None else pad_id)
        self._bos = None if bos_id is None else int(bos_id)
        self.add_bos = bool(add_bos)
        self.chat_template = chat_template
        self._template: jinja2.Template | None = None

    # ---- construction -------------------------------------------------------------------

    @classmethod
    def from_gguf(cls, path_or_reader: str | Path | Any) -> BpeTokenizer:
        """Builds the tokenizer stored in a GGUF file's ``tokenizer.ggml.*`` metadata.

        Args:
          path_or_reader: a .gguf path or an open `gguf.GGUFReader`.

        Raises:
          ValueError: the file holds no tokenizer, or not a byte-level BPE ("gpt2") one.
        """
        if isinstance(path_or_reader, str | Path):
            import gguf

            path_or_reader = gguf.GGUFReader(str(path_or_reader))
        fields = path_or_reader.fields
        kind = _field(fields, "tokenizer.ggml.model")
        if kind != "gpt2":
            raise ValueError(f"only byte-level BPE ('gpt2') GGUF tokenizers are supported, {kind=}")
        tokens = list(_field(fields, "tokenizer.ggml.tokens"))
        types = list(_field(fields, "tokenizer.ggml.token_type", [GGUF_NORMAL] * len(tokens)))
        merges = [tuple(m.split(" ", 1)) for m in _field(fields, "tokenizer.ggml.merges", [])]
        pre, ignore_merges = _pre_tokenizer(_field(fields, "tokenizer.ggml.pre", "default"))
        vocab = {tok: i for i, tok in enumerate(tokens)}
        tok = tokenizers.Tokenizer(
            models.BPE(vocab=vocab, merges=merges, fuse_unk=False, ignore_merges=ignore_merges)
        )
        tok.pre_tokenizer = pre
        tok.decoder = decoders.ByteLevel()
        added = [
            tokenizers.AddedToken(t, special=ty == GGUF_CONTROL, normalized=False)
            for t, ty in zip(tokens, types)
            if ty in (GGUF_CONTROL, GGUF_USER_DEFINED)
        ]
        tok.add_special_tokens([a for a in added if a.special])
        tok.add_tokens([a for a in added if not a.special])
        eos = _field(fields, "tokenizer.ggml.eos_token_id")
        if eos is None:
            raise ValueError("GGUF tokenizer has no tokenizer.ggml.eos_token_id")
        return cls(
            tok,
            eos_id=eos,
            pad_id=_field(fields, "tokenizer.ggml.padding_token_id"),
            bos_id=_field(fields, "tokenizer.ggml.bos_token_id"),
            add_bos=bool(_field(fields, "tokenizer.ggml.add_bos_token", False)),
            chat_template=_field(fields, "tokenizer.chat_template"),
        )

    @classmethod
    def from_pretrained_dir(cls, directory: str | Path) -> BpeTokenizer:
        """Builds the tokenizer of a Hugging Face model folder.

        Reads tokenizer.json, and the special tokens, ``add_bos_token`` and chat template
        from tokenizer_config.json (or chat_template.jinja), falling back to config.json's
        token ids.

        Raises:
          FileNotFoundError: the folder has no tokenizer.json.
          ValueError: no EOS token can be found.
        """
        directory = Path(directory)
        if not (directory / "tokenizer.json").is_file():
            raise FileNotFoundError(f"no tokenizer.json in {directory}")
        tok = tokenizers.Tokenizer.from_file(str(directory / "tokenizer.json"))
        tok.post_processor = None  # `encode` adds no special tokens; callers add BOS
        meta = _read_json(directory / "tokenizer_config.json")
        model = _read_json(directory / "config.json")

        def token_id(name: str) -> int | None:
            value = meta.get(f"{name}_token")
            if isinstance(value, dict):
                value = value.get("content")
            if isinstance(value, str) and tok.token_to_id(value) is not None:
                return tok.token_to_id(value)
            fallback = model.get(f"{name}_token_id")
            return fallback[0] if isinstance(fallback, list) else fallback

        template = meta.get("chat_template")
        if isinstance(template, list):  # [{"name": "default", "template": ...}, ...]
            by_name = {t.get("name"): t.get("template") for t in template}
            template = by_name.get("default")
        jinja_file = directory / "chat_template.jinja"
        if template is None and jinja_file.is_file():
            template = jinja_file.read_text()
        eos = token_id("eos")
        if eos is None:
            raise ValueError(f"no eos token in {directory} (tokenizer_config.json/config.json)")
        return cls(
            tok,
            eos_id=eos,
            pad_id=token_id("pad"),
            bos_id=token_id("bos"),
            add_bos=bool(meta.get("add_bos_token", False)),
            chat_template=template,
        )

    def save_pretrained_dir(self, directory: str | Path) -> None:
        """Writes tokenizer.json and tokenizer_config.json that `from_pretrained_dir` reads
        back to an equal tokenizer (same ids, special tokens, BOS rule and chat template)."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "tokenizer.json").write_text(self._tok.to_str())
        meta: dict[str, Any] = {
            "add_bos_token": self.add_bos,
            "chat_template": self.chat_template,
        }
        for name, token_id in (("eos", self._eos), ("pad", self._pad), ("bos", self._bos)):
            if token_id is not None:
                meta[f"{name}_token"] = self._tok.id_to_token(token_id)
        (directory / "tokenizer_config.json").write_text(json.dumps(meta))

    @property
    def backend(self) -> tokenizers.Tokenizer:
        """The underlying `tokenizers.Tokenizer` (e.g. to save it as tokenizer.json)."""
        return self._tok

    # ---- vocabulary (the Tokenizer protocol: TokenizersWrapper) -------------------------

    def token_to_id(self, token: str) -> int | None:
        """Id of one vocabulary entry, or None."""
        return self._tok.token_to_id(token)

    def id_to_token(self, token_id: int) -> str | None:
        """Vocabulary entry of one id, or None."""
        return self._tok.id_to_token(int(token_id))

    # ---- chat ---------------------------------------------------------------------------

    def apply_chat_template(
        self,
        messages: Sequence[Mapping[str, str]],
        add_generation_prompt: bool = True,
        **kwargs: Any,
    ) -> str:
        """Renders a conversation with the model's chat template.

        Args:
          messages: ``[{"role": "system"|"user"|"assistant", "content": str}, ...]``.
          add_generation_prompt: end with the header of an assistant turn.
          **kwargs: extra template variables.

        Returns:
          The prompt text (special tokens written out, to be passed to `encode`).

        Raises:
          ValueError: the tokenizer has no chat template, or the template rejects the input.
        """
        if not self.chat_template:
            raise ValueError("this tokenizer has no chat template; pass a plain prompt")
        if self._template is None:
            env = jinja2.sandbox.ImmutableSandboxedEnvironment(
                trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols]
            )
            env.globals["raise_exception"] = _raise_exception
            self._template = env.from_string(self.chat_template)
        special = {
            name: (None if i is None else self._tok.id_to_token(i))
            for name, i in (("bos_token", self._bos), ("eos_token", self._eos))
        }
        return self._template.render(
            messages=[dict(m) for m in messages],
            add_generation_prompt=add_generation_prompt,
            **special,
            **kwargs,
        )

    def encode_chat(
        self, messages: Sequence[Mapping[str, str]], add_generation_prompt: bool = True
    ) -> list[int]:
        """Ids of the rendered conversation, with BOS first if the model wants one."""
        ids = self.encode(self.apply_chat_template(messages, add_generation_prompt))
        if self.add_bos and self._bos is not None and (not ids or ids[0] != self._bos):
            ids = [self._bos, *ids]
        return ids


def _raise_exception(message: str) -> None:
    raise ValueError(f"chat template error: {message}")


def _read_json(path: Path) -> dict:
    return json.loads(path.read_text()) if path.is_file() else {}
