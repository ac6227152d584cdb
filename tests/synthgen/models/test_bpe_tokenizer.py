"""Byte-level BPE tokenizer from GGUF metadata / tokenizer.json, and chat templates."""

from __future__ import annotations

import json

import gguf
import pytest
from tokenizers import pre_tokenizers

from synthgen import assets
from synthgen.models.bpe_tokenizer import BpeTokenizer
from synthgen.models.tokenizer import Tokenizer

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
MERGES = ["Ġ t", "h e", "Ġt he", "Ġ c", "a p"]
TEMPLATE = (
    "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory):
    """A GGUF holding only a tokenizer: 3 control tokens, the 256 byte symbols, 5 merges."""
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    tokens = SPECIALS + alphabet + ["Ġt", "he", "Ġthe", "Ġc", "ap"]
    types = [3] * len(SPECIALS) + [1] * (len(tokens) - len(SPECIALS))
    path = tmp_path_factory.mktemp("tok") / "tok.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("smollm")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(MERGES)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_add_bos_token(True)
    writer.add_chat_template(TEMPLATE)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_gguf_tokenizer_merges_specials_and_digits(tiny_gguf):
    tok = BpeTokenizer.from_gguf(tiny_gguf)
    assert isinstance(tok, Tokenizer)
    assert (tok.vocab_size, tok.bos_id, tok.eos_id, tok.pad_id) == (264, 1, 2, 2)
    the = tok.token_to_id("Ġthe")
    assert tok.encode(" the") == [the]
    ids = tok.encode("<|im_start|>user the<|im_end|>")
    assert ids[0] == 1 and ids[-1] == 2 and the in ids
    assert tok.decode(ids) == "user the"  # control tokens are skipped
    assert len(tok.encode("2024")) == 4  # "smollm" splits every digit
    text = "Ünïcödé 🤖 tabs\t and  spaces\n"
    assert tok.decode(tok.encode(text)) == text


def test_chat_template_and_bos(tiny_gguf):
    tok = BpeTokenizer.from_gguf(tiny_gguf)
    messages = [{"role": "user", "content": "hi"}]
    text = tok.apply_chat_template(messages)
    assert text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert tok.apply_chat_template(messages, add_generation_prompt=False).endswith("<|im_end|>\n")
    ids = tok.encode_chat(messages)
    assert ids[0] == 1 and ids.count(1) == 2  # add_bos: BOS is <|im_start|> here, not doubled


def test_tokenizer_json_folder_matches_gguf(tiny_gguf, tmp_path):
    tok = BpeTokenizer.from_gguf(tiny_gguf)
    tok.backend.save(str(tmp_path / "tokenizer.json"))
    meta = {"eos_token": "<|im_end|>", "bos_token": {"content": "<|im_start|>"}}
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({**meta, "chat_template": TEMPLATE}))
    folder = BpeTokenizer.from_pretrained_dir(tmp_path)
    assert (folder.bos_id, folder.eos_id) == (1, 2)
    text = "<|im_start|>the cap 42"
    assert folder.encode(text) == tok.encode(text)
    assert folder.apply_chat_template([{"role": "user", "content": "x"}]).startswith("<|im_start|>")


def test_errors(tiny_gguf, tmp_path):
    tok = BpeTokenizer(BpeTokenizer.from_gguf(tiny_gguf).backend, eos_id=2)
    with pytest.raises(ValueError, match="no chat template"):
        tok.apply_chat_template([{"role": "user", "content": "x"}])
    with pytest.raises(ValueError, match="eos_id out of the vocabulary"):
        BpeTokenizer(tok.backend, eos_id=10**6)
    with pytest.raises(FileNotFoundError):
        BpeTokenizer.from_pretrained_dir(tmp_path)


@pytest.fixture(scope="module")
def smollm2():
    return BpeTokenizer.from_gguf(assets.resolve("smollm2-135m-instruct"))


@pytest.mark.slow
def test_smollm2_vocabulary(smollm2):
    tok = smollm2
    assert (tok.vocab_size, tok.bos_id, tok.eos_id) == (49152, 1, 2)
    # ids checked against transformers' GGUF tokenizer for this file
    assert tok.encode("The capital of France") == [504, 3575, 282, 4649]
    assert tok.encode("<|im_start|>user\nhi<|im_end|>") == [1, 4093, 198, 6004, 2]
    assert tok.encode("12345")[:2] == [33, 34]
    for text in ("The capital of France", "  Ünïcödé 🤖\n\nnew line", "it's 3.14"):
        assert tok.decode(tok.encode(text)) == text
    prompt = tok.apply_chat_template([{"role": "user", "content": "What is the capital?"}])
    assert prompt.startswith("<|im_start|>system\n")
    assert prompt.endswith(
        "<|im_start|>user\nWhat is the capital?<|im_end|>\n<|im_start|>assistant\n"
    )


def test_saved_folder_reloads_the_same_tokenizer(tiny_gguf, tmp_path):
    """`save_pretrained_dir` -> `from_pretrained_dir` keeps ids, specials, BOS and template
    (the converted-weights cache stores a GGUF's tokenizer this way)."""
    tok = BpeTokenizer.from_gguf(tiny_gguf)
    tok.save_pretrained_dir(tmp_path / "tok")
    back = BpeTokenizer.from_pretrained_dir(tmp_path / "tok")
    text = "<|im_start|>the cap<|im_end|> théâtre 42"
    assert back.encode(text) == tok.encode(text)
    assert back.decode(tok.encode(text)) == tok.decode(tok.encode(text))
    assert (back.eos_id, back.pad_id, back.bos_id, back.add_bos) == (
        tok.eos_id,
        tok.pad_id,
        tok.bos_id,
        tok.add_bos,
    )
    assert back.chat_template == tok.chat_template == TEMPLATE
