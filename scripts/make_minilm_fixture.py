"""Builds the all-MiniLM-L6-v2 parity fixture with sentence-transformers (run once, needs torch).

Encodes a fixed set of sentences (short and long, punctuation, uppercase, an accent, one past
the 256-token limit so truncation is covered) with the reference implementation and writes
tests/fixtures/minilm/expected.npz with:

* sentences: the texts (unicode array, loads without pickle);
* embeddings: float32 [n, 384], `SentenceTransformer.encode(..., normalize_embeddings=False)`
  (the model's own Normalize module already makes them unit vectors);
* input_ids, attention_mask: the reference tokenization (`SentenceTransformer.preprocess`,
  `tokenize` before version 6), padded to the longest sentence;
* max_seq_length: the model's truncation length (256);
* versions: torch, transformers and sentence-transformers versions used.

torch and sentence-transformers are not project dependencies: use a throwaway venv.

Usage:
  python3 -m venv /tmp/stvenv
  /tmp/stvenv/bin/pip install torch==2.13.0 sentence-transformers
  MODEL=$(.venv/bin/python -c 'from synthgen.assets import resolve; \
print(resolve("all-minilm-l6-v2"))')
  HF_HUB_OFFLINE=1 /tmp/stvenv/bin/python scripts/make_minilm_fixture.py --model "$MODEL"
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np  # noqa: E402
import sentence_transformers  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402
from sentence_transformers import SentenceTransformer  # noqa: E402

_LONG = (
    "Differential privacy bounds how much any single record can change the output of an "
    "analysis; a retriever trained on synthetic queries inherits the guarantee of the "
    "generator by post-processing, so the dual encoder, its index and every answer it "
    "serves cost no further privacy budget. The encoder here is a small BERT with six "
    "layers, mean pooling over real tokens and L2 normalisation, as in Sentence-BERT. "
)
SENTENCES = (
    "Hello world!",
    "What is the capital of France?",
    "THE QUICK BROWN FOX JUMPS OVER THE LAZY DOG.",
    "Café au lait, s'il vous plaît: 3.50€ (cash-only) -- e-mail me at bob@example.org?!",
    "Mean pooling averages the token states, weighted by the attention mask, before the "
    "vector is normalised to unit length.",
    _LONG,  # ~110 tokens
    _LONG * 3,  # > 256 tokens: truncated to max_seq_length
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="all-minilm-l6-v2 asset folder")
    parser.add_argument("--out", default="tests/fixtures/minilm", help="output folder")
    args = parser.parse_args()

    torch.manual_seed(0)
    model = SentenceTransformer(args.model, device="cpu")
    model.eval()
    sentences = list(SENTENCES)
    # `preprocess` replaced `tokenize` in sentence-transformers 6.
    tokens = getattr(model, "preprocess", model.tokenize)(sentences)
    with torch.no_grad():
        embeddings = model.encode(
            sentences, batch_size=len(sentences), convert_to_numpy=True, normalize_embeddings=False
        )
    lengths = tokens["attention_mask"].sum(1).tolist()
    print(f"tokens per sentence: {lengths}, max_seq_length {model.max_seq_length}")
    print(f"norms: {np.linalg.norm(embeddings, axis=1).round(6).tolist()}")

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(
        out / "expected.npz",
        sentences=np.array(sentences),
        embeddings=embeddings.astype(np.float32),
        input_ids=tokens["input_ids"].numpy().astype(np.int32),
        attention_mask=tokens["attention_mask"].numpy().astype(np.int32),
        max_seq_length=np.int32(model.max_seq_length),
        versions=np.array(
            [
                f"torch {torch.__version__}",
                f"transformers {transformers.__version__}",
                f"sentence-transformers {sentence_transformers.__version__}",
            ]
        ),
    )
    print(f"wrote {out / 'expected.npz'} ({(out / 'expected.npz').stat().st_size} bytes)")


if __name__ == "__main__":
    main()
