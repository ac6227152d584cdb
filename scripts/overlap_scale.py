"""Term-overlap retrieval at a million records: build, memory and scoring time.

`retriever.lexical.OverlapEncoder` hashes each word into one of `WIDTH` (2^20) buckets and
holds the documents as a sparse CSR matrix [documents, WIDTH]; DP retrieval scores every
document for every question (`DPRag._scores`: the matrix times the question's vector).
This script builds ``--records`` synthetic records (default 1,000,000) of ``--min-words`` to
``--max-words`` words drawn from a Zipf-like (rank^-``--zipf``) vocabulary of ``--vocabulary``
invented words (fixed seed, numpy), then prints:

* the seconds to build the encoder from the texts (tokenising, hashing, the CSR matrix);
* the matrix's stored entries and bytes (data + indices + indptr);
* the median seconds, over ``--repeats`` questions of ``--question-words`` distinct words of a
  random record, to encode a question and score every record (the work of `DPRag._scores`);
* documents credited by a collision: per question, records whose hashed score exceeds
  the exact overlap (computed over exact word ids), median and largest;
* what the previous design's dense float32 [documents, vocabulary] matrix would need.

Figures are single runs on a possibly shared machine: indicative, no assertions. The last
line is exactly ``build_s=<s> matrix_mib=<MiB> score_ms=<ms> dense_gib=<GiB>``.

    python scripts/overlap_scale.py                                   # 1M records (~2 min)
    python scripts/overlap_scale.py --records 20000 --repeats 3       # smoke run
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from scipy import sparse

from retriever.lexical import GRID, WIDTH, OverlapEncoder


def invented_words(count: int) -> np.ndarray:
    """`count` distinct lower-case words ("q" + the index in base 26), none a question word."""
    letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))
    out = []
    for i in range(count):
        digits = []
        while True:
            i, r = divmod(i, 26)
            digits.append(letters[r])
            if i == 0:
                break
        out.append("q" + "".join(digits))
    return np.array(out, dtype=object)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--vocabulary", type=int, default=500_000)
    parser.add_argument("--min-words", type=int, default=20)
    parser.add_argument("--max-words", type=int, default=40)
    parser.add_argument("--zipf", type=float, default=1.0)
    parser.add_argument("--question-words", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng = np.random.default_rng(args.seed)

    start = time.perf_counter()
    vocabulary = invented_words(args.vocabulary)
    p = 1.0 / np.arange(1, args.vocabulary + 1) ** args.zipf
    lengths = rng.integers(args.min_words, args.max_words + 1, args.records)
    ids = rng.choice(args.vocabulary, int(lengths.sum()), p=p / p.sum()).astype(np.int32)
    bounds = np.concatenate([[0], np.cumsum(lengths)])
    texts = [" ".join(vocabulary[ids[a:b]]) for a, b in zip(bounds[:-1], bounds[1:])]
    print(f"generated {args.records:,} records, {len(ids):,} words in "
          f"{time.perf_counter() - start:.1f} s")  # fmt: skip

    start = time.perf_counter()
    encoder = OverlapEncoder(texts)
    documents = encoder.documents()
    build = time.perf_counter() - start
    matrix_bytes = documents.data.nbytes + documents.indices.nbytes + documents.indptr.nbytes
    print(f"build: {build:.1f} s; matrix [{documents.shape[0]:,}, {WIDTH:,}], "
          f"{documents.nnz:,} stored entries, {matrix_bytes / 2**20:.0f} MiB "
          f"(data + indices + indptr)")  # fmt: skip

    # exact overlap over word ids, to count the documents a collision credits
    rows = np.repeat(np.arange(args.records), lengths)
    exact = sparse.csr_matrix(
        (np.ones(len(ids), np.float32), (rows, ids)), shape=(args.records, args.vocabulary)
    )
    exact.sum_duplicates()
    exact.data[:] = 1.0
    distinct = int(np.count_nonzero(np.bincount(ids, minlength=args.vocabulary)))

    times, credited = [], []
    for _ in range(args.repeats):
        # a question's words: distinct words of a random record (it holds them all)
        record = int(rng.integers(args.records))
        own = np.unique(ids[bounds[record] : bounds[record + 1]])
        chosen = rng.choice(own, min(args.question_words, len(own)), replace=False)
        question = " ".join(vocabulary[chosen])
        start = time.perf_counter()
        scores = documents @ encoder.encode([question])[0]
        times.append(time.perf_counter() - start)
        target = np.zeros(args.vocabulary, np.float32)
        target[chosen] = np.floor(GRID / len(chosen)) / GRID
        credited.append(int(np.count_nonzero(scores > exact @ target)))
    score = float(np.median(times))
    print(f"encode + score all {args.records:,} records: median {score * 1e3:.1f} ms "
          f"over {args.repeats} questions of {args.question_words} words "
          f"(min {min(times) * 1e3:.1f}, max {max(times) * 1e3:.1f})")  # fmt: skip
    print(f"records credited by a collision per question: median {np.median(credited):.0f}, "
          f"largest {max(credited)}")  # fmt: skip
    dense = args.records * distinct * 4
    print(f"previous dense design: [{args.records:,}, {distinct:,} distinct words] float32 = "
          f"{dense / 2**30:,.0f} GiB ({dense / matrix_bytes:,.0f}x the sparse matrix)")  # fmt: skip
    print(f"build_s={build:.1f} matrix_mib={matrix_bytes / 2**20:.0f} score_ms={score * 1e3:.1f} "
          f"dense_gib={dense / 2**30:.0f}")  # fmt: skip


if __name__ == "__main__":
    main()
