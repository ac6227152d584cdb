"""Corpus encoding speed: `TextEncoder.encode` (JAX) against sentence-transformers (torch).

Optional: needs ``sentence-transformers`` (and so torch), which are not dpsynth dependencies
and not part of ``make test``. Keep them out of the project venv; from the repository root:

    python3 -m venv /tmp/stvenv
    /tmp/stvenv/bin/pip install torch sentence-transformers  # a CPU build of torch will do
    /tmp/stvenv/bin/pip install -e .                         # dpsynth with jax, flax, ...
    /tmp/stvenv/bin/python scripts/bench_encoder.py          # ~10 min on 2 cores

Both encoders run all-MiniLM-L6-v2 from the same asset folder (``synthgen.assets.resolve``;
sentence-transformers reads its modules.json: Transformer, Pooling(mean), Normalize) on the
same documents with the same ``--max-len`` (256, the model's limit) and ``--batch-size`` (64).
Each tokenizes inside the timed call, and both sort texts by length and pad per batch:
sentence-transformers to the batch's longest text, ours to that text's bucketed length.

Threads: XLA's CPU client uses every core the process may run on, so torch's intra-op
threads are set to the same number, ``len(os.sched_getaffinity(0))`` (2 on the dev machine),
for a like-for-like comparison. The two encoders never run at the same time.

Documents (``--source``): by default ``--docs`` system man pages (English sections 1, 5, 7
and 8 of /usr/share/man, evenly spaced in name order), rendered with ``man -P cat``,
whitespace collapsed; each page is one document, truncated by both encoders at ``--max-len``
tokens (most pages are longer, so most documents have the full 256 tokens). Rendering takes
a minute or two, so the texts are cached under ``runs/bench_encoder/``. Without man pages (or
with ``--source wiki``) the wiki summaries are used: they are short, so neighbouring ones are
joined up to a length drawn uniformly from 20 to 220 words (fixed seed), which gives varied
lengths up to and past 256 tokens.

Timing: ours is warmed up by compiling the bucketed shapes these texts use (the seconds are
printed: a cold `encode` pays them once per shape), sentence-transformers by one batch. The
machine may be shared, so the two are timed interleaved: the documents in token-length order
(the order both batch them in) are cut into chunks of ``--chunk-batches`` batches, each
chunk is encoded by both, alternating which goes first, and each encoder's times are summed;
a change of load then hits both alike (the 1-minute load average is printed). Also printed:
the cosine between the two embeddings of each document (min, mean), and the speed of the
old fixed-length path (every text padded to max_len) on the first ``--old-path-docs``
documents with its cosine to the bucketed path.

The last line is exactly ``encoder_vs_sentence_transformers=<ratio> docs_per_s=<value>``:
our documents per second over sentence-transformers', and ours.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

try:
    import torch
    from sentence_transformers import SentenceTransformer
except ImportError:
    sys.exit(
        "bench_encoder.py needs sentence-transformers and torch, which dpsynth does not "
        "install: pip install sentence-transformers in a separate venv (see this script's "
        "docstring)"
    )

import jax  # noqa: E402
import numpy as np  # noqa: E402

from retriever import encoders  # noqa: E402
from synthgen import assets, corpora  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
CACHE_DIR = ROOT / "runs" / "bench_encoder"
MODEL = "all-minilm-l6-v2"
MAN_ROOT = Path("/usr/share/man")
MAN_SECTIONS = ("man1", "man5", "man7", "man8")


def man_pages(n: int) -> list[str]:
    """`n` rendered man pages, evenly spaced over the English pages (cached)."""
    pages = sorted(
        p for s in MAN_SECTIONS if (MAN_ROOT / s).is_dir() for p in (MAN_ROOT / s).iterdir()
    )
    pages = [p for p in pages if p.is_file()]
    if len(pages) < n:
        raise FileNotFoundError(f"only {len(pages)} man pages under {MAN_ROOT}, need {n}")
    picked = [pages[i] for i in np.linspace(0, len(pages) - 1, n).round().astype(int)]
    cache = CACHE_DIR / f"man_{n}.json"
    if cache.exists():
        cached = json.loads(cache.read_text())
        if cached["pages"] == [str(p) for p in picked]:
            return cached["texts"]
    env = {**os.environ, "MANWIDTH": "100", "LC_ALL": "C.UTF-8"}

    def render(page: Path) -> str:
        cmd = ["man", "-P", "cat", "-l", str(page)]
        done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)
        return " ".join(done.stdout.split())

    start = time.perf_counter()
    with ThreadPoolExecutor(2 * (os.cpu_count() or 1)) as pool:
        texts = list(pool.map(render, picked))
    print(f"rendered {n} man pages in {time.perf_counter() - start:.0f} s (cached in {cache})")
    CACHE_DIR.mkdir(parents=True, exist_ok=True)
    cache.write_text(json.dumps({"pages": [str(p) for p in picked], "texts": texts}))
    return texts


def wiki_documents(n: int, seed: int = 0) -> list[str]:
    """`n` documents of neighbouring wiki summaries joined to 20-220 words each."""
    docs = corpora.load_wiki_summaries()["document"]
    rng = np.random.default_rng(seed)
    out: list[str] = []
    position = 0
    while len(out) < n:
        target, words = int(rng.integers(20, 221)), []
        while len(words) < target:
            words += docs[position % len(docs)].split()
            position += 1
        out.append(" ".join(words[:target]))
    return out


def sentence_transformer(path: Path, max_len: int) -> SentenceTransformer:
    """The asset as sentence-transformers loads it (or its three modules, built here)."""
    if (path / "modules.json").exists():
        model = SentenceTransformer(str(path), device="cpu")
    else:  # the modules sentence-transformers would read from modules.json
        try:
            from sentence_transformers.sentence_transformer import modules as models
        except ImportError:  # before sentence-transformers 6
            from sentence_transformers import models
        body = models.Transformer(str(path), max_seq_length=max_len)
        pooling = models.Pooling(body.get_word_embedding_dimension(), "mean")
        model = SentenceTransformer(modules=[body, pooling, models.Normalize()], device="cpu")
    model.max_seq_length = max_len
    return model


def old_encode(encoder: encoders.TextEncoder, texts: list[str], max_len: int) -> np.ndarray:
    """One batch as `encode` ran before length bucketing: every text padded to max_len."""
    return np.asarray(encoder._jit_apply(encoder.params, encoder.tokenize(texts, max_len)))


def timed(fn: Callable[[], np.ndarray]) -> tuple[float, np.ndarray]:
    """(seconds, result as float32) of one call."""
    start = time.perf_counter()
    result = np.asarray(fn(), np.float32)
    return time.perf_counter() - start, result


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Row-wise cosine similarity."""
    a = a / np.linalg.norm(a, axis=1, keepdims=True)
    return np.sum(a * (b / np.linalg.norm(b, axis=1, keepdims=True)), axis=1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--docs", type=int, default=1000)
    parser.add_argument("--source", choices=("auto", "man", "wiki"), default="auto")
    parser.add_argument("--max-len", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--chunk-batches", type=int, default=2, help="batches per timed call")
    parser.add_argument("--old-path-docs", type=int, default=64, help="0 skips the old path")
    args = parser.parse_args()

    threads = len(os.sched_getaffinity(0))
    torch.set_num_threads(threads)
    source = args.source
    if source == "auto":
        has_man = shutil.which("man") and (MAN_ROOT / "man1").is_dir()
        source = "man" if has_man else "wiki"
    texts = man_pages(args.docs) if source == "man" else wiki_documents(args.docs)

    ours = encoders.load_encoder(MODEL, max_len=args.max_len)
    theirs = sentence_transformer(assets.resolve(MODEL), args.max_len)
    lengths = ours.tokenize(texts, args.max_len)["attention_mask"].sum(1)
    print(
        f"{len(texts)} {source} documents, tokens at max_len={args.max_len}: "
        f"median {np.median(lengths):.0f}, 10th percentile {np.percentile(lengths, 10):.0f}, "
        f"{np.mean(lengths == args.max_len):.0%} truncated; batch size {args.batch_size}; "
        f"jax {jax.__version__} on {jax.devices()[0].platform}, torch {torch.__version__} with "
        f"{torch.get_num_threads()} threads ({threads} cores)"
    )

    # Warm-up: compile the bucketed shapes `encode` will use on these texts (one per batch
    # at most: the bucket of each length-sorted batch's longest text; private helpers).
    size = min(args.batch_size, len(texts))
    ordered = np.sort(lengths)
    buckets = encoders._bucket_lengths(args.max_len)
    longest = [ordered[min(start + size, len(texts)) - 1] for start in range(0, len(texts), size)]
    widths = sorted({min(b for b in buckets if b >= n) for n in longest})
    compile_s = 0.0
    for width in widths:
        step = encoders._rows_per_step(width, size)  # cache-sized steps on CPU
        ones = np.ones((-(-size // step) * step, width), np.int32)
        batch = {"input_ids": ones, "attention_mask": ones}
        compile_s += timed(lambda b=batch, s=step: ours._jit_apply_in_steps(ours.params, b, s))[0]
    theirs.encode(texts[:size], batch_size=args.batch_size)
    print(
        f"ours: compiled the {len(widths)} of {len(buckets)} bucketed shapes these texts use "
        f"(lengths {widths}) in {compile_s:.1f} s"
    )

    # Interleaved: in token-length order (as both batch them) and in chunks of two batches,
    # each chunk encoded by both, alternating which goes first; times are summed per encoder.
    runs = {
        "ours": lambda t: ours.encode(t, batch_size=args.batch_size, max_len=args.max_len),
        "sentence-transformers": lambda t: theirs.encode(t, batch_size=args.batch_size),
    }
    total = dict.fromkeys(runs, 0.0)
    embeddings = {name: np.zeros((len(texts), ours.dim), np.float32) for name in runs}
    order = np.argsort(lengths, kind="stable")
    load = os.getloadavg()[0]
    for i, start in enumerate(range(0, len(texts), args.chunk_batches * size)):
        rows = order[start : start + args.chunk_batches * size]
        chunk = [texts[j] for j in rows]
        for name in list(runs)[:: 1 if i % 2 == 0 else -1]:
            seconds, embeddings[name][rows] = timed(lambda n=name, c=chunk: runs[n](c))
            total[name] += seconds
    for name, seconds in total.items():
        print(f"{name}: {seconds:.1f} s, {len(texts) / seconds:.2f} docs/s")
    print(f"load average (1 min) {load:.1f} before, {os.getloadavg()[0]:.1f} after the timing")
    ours_emb = embeddings["ours"]
    cos = cosines(ours_emb, embeddings["sentence-transformers"])
    print(f"cosine ours vs sentence-transformers: min {cos.min():.6f} mean {cos.mean():.6f}")

    if args.old_path_docs:
        few = texts[: args.old_path_docs]
        old_encode(ours, few[:size], args.max_len)  # compiles its one fixed shape
        old_s, old = 0.0, []
        for start in range(0, len(few), size):
            chunk = few[start : start + size]
            chunk += [""] * (size - len(chunk))  # full batches: one shape, as before
            seconds, emb = timed(lambda c=chunk: old_encode(ours, c, args.max_len))
            old_s, old = old_s + seconds, [*old, emb]
        old_cos = cosines(np.concatenate(old)[: len(few)], ours_emb[: len(few)])
        print(
            f"old fixed-length path on {len(few)} documents: {len(few) / old_s:.2f} docs/s, "
            f"cosine to the bucketed path min {old_cos.min():.7f}"
        )

    ours_rate = len(texts) / total["ours"]
    ratio = total["sentence-transformers"] / total["ours"]
    print(f"encoder_vs_sentence_transformers={ratio:.3f} docs_per_s={ours_rate:.2f}")


if __name__ == "__main__":
    main()
