"""Writes the main job's packaged sample collections from the fictional medical worlds.

For each sample of `dpsynth.pipeline.sample_collections.SAMPLES` (its world's records,
diseases and seed), builds the world of the DP-RAG evaluation
(`dpsynth.evaluation.medical_world`, a symptom pool of max(60, 2 * diseases + 2)) and writes
``NAME.corpus.jsonl`` (its records, ``{"doc_id", "text"}``) and ``NAME.questions.jsonl``
(one question per disease in the world's disease order, ``{"question", "answer"}``). Run
once when a sample is added; tests/scripts/test_make_sample_collection.py checks the
packaged files are what this writes.

Usage:
  .venv/bin/python scripts/make_sample_collection.py            # into the package's folder
  .venv/bin/python scripts/make_sample_collection.py --out DIR medical-40
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from dpsynth.evaluation.medical_world import MedicalWorldConfig, make_world, write_corpus
from dpsynth.pipeline.sample_collections import FOLDER, SAMPLES, check_sample


def write_sample(name: str, out: str | Path) -> tuple[Path, Path]:
    """Writes the sample `name`'s corpus and questions files into `out`; returns their paths."""
    sample = check_sample(name)
    world = make_world(
        MedicalWorldConfig(
            num_diseases=sample.diseases,
            symptom_pool=max(60, 2 * sample.diseases + 2),
            num_records=sample.records,
            seed=sample.seed,
        )
    )
    corpus, questions = Path(out) / f"{name}.corpus.jsonl", Path(out) / f"{name}.questions.jsonl"
    write_corpus(world, corpus)
    rows = ({"question": q.question, "answer": q.answer} for q in world.questions())
    questions.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), "utf-8")
    return corpus, questions


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "names", nargs="*", help=f"samples to write (default: all of {list(SAMPLES)})"
    )
    parser.add_argument("--out", type=Path, default=FOLDER, help="folder (default: the package's)")
    args = parser.parse_args(argv)
    for name in args.names or SAMPLES:
        try:
            for path in write_sample(name, args.out):
                print(f"{path} ({path.stat().st_size} bytes)")
        except ValueError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
