"""The unseen-domain holdout: retrieval on this machine's man pages (issue 37).

Query = a page's one-line summary from its NAME section ("list directory contents"),
document = the page's name and the start of its DESCRIPTION section, as wiki-summaries-en
pairs a short description with a lead paragraph. Nothing here was seen in training: the
retrievers under test were trained on wiki pairs (real or synthetic), so the holdout says
whether their gain over the zero-shot encoder carries to another domain. The pages are
`--docs` of the English sections 1 and 8 under /usr/share/man (files, not the symlinked
aliases), evenly spaced in path order, rendered with `man`; the files are built once into
`<out>/corpus.jsonl` and `<out>/queries.jsonl` (the format `retriever evaluate` reads) and
reused while `<out>/holdout.json` records the same settings.

Each `--encoder NAME=PATH` is evaluated with exact search (NDCG@10, Recall@10, MRR@10 and
percentile-bootstrap 95% intervals over queries); every encoder after the first also gets
its NDCG@10 gain over the first (the zero-shot baseline, say) with a paired-bootstrap
interval. The last line is exactly ``holdout_ndcg=<v>``: the NDCG@10 of the encoder named by
`--headline`.

    python scripts/man_pages_holdout.py --out runs/man_holdout \\
        --encoder zero-shot=all-minilm-l6-v2 --encoder real=runs/pu/models/real \\
        --encoder synthetic-1=runs/pu/models/synthetic-1 --headline synthetic-1
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

MAN_ROOT = Path("/usr/share/man")
SECTIONS = ("man1", "man8")
DOC_WORDS = 120
METRICS = ("ndcg@10", "recall@10", "mrr@10")
_HEADING = re.compile(r"^[A-Z][A-Z0-9 ]*$")


def parse_page(rendered: str) -> tuple[str, str, str] | None:
    """The (name, summary, description) of a page rendered by ``man -P cat``.

    Returns:
      The page's first name, its NAME summary and the first `DOC_WORDS` words of its
      DESCRIPTION section (whitespace collapsed); None when it has no "name - summary" line
      or no DESCRIPTION text.
    """
    sections: dict[str, list[str]] = {}
    current = None
    for line in rendered.splitlines():
        if line and not line[0].isspace() and _HEADING.match(line.strip()):
            current = line.strip()
            sections.setdefault(current, [])
        elif current is not None:
            sections[current].append(line)
    name_text = " ".join(" ".join(sections.get("NAME", [])).split())
    description = " ".join(" ".join(sections.get("DESCRIPTION", [])).split()).split()
    if " - " not in name_text or not description:
        return None
    names, summary = name_text.split(" - ", 1)
    name = names.split(",")[0].strip()
    if not name or not summary.strip():
        return None
    return name, summary.strip(), " ".join(description[:DOC_WORDS])


def _render(page: Path) -> str:
    env = {**os.environ, "MANWIDTH": "100", "LC_ALL": "C.UTF-8"}
    done = subprocess.run(
        ["man", "--nh", "--nj", "-P", "cat", "-l", str(page)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    return done.stdout


def build(out: Path, docs: int) -> tuple[Path, Path]:
    """Writes (or reuses) `out`/corpus.jsonl and `out`/queries.jsonl from `docs` pages."""
    corpus, queries, record = out / "corpus.jsonl", out / "queries.jsonl", out / "holdout.json"
    settings = {"root": str(MAN_ROOT), "sections": list(SECTIONS), "docs": docs}
    settings["doc_words"] = DOC_WORDS
    if corpus.is_file() and queries.is_file() and record.is_file():
        if json.loads(record.read_text()) != settings:
            raise SystemExit(f"{out} holds a holdout built with other settings: use another --out")
        return corpus, queries
    pages = sorted(p for s in SECTIONS if (MAN_ROOT / s).is_dir() for p in (MAN_ROOT / s).iterdir())
    pages = [p for p in pages if p.is_file() and not p.is_symlink()]
    if len(pages) < docs:
        raise SystemExit(
            f"only {len(pages)} man pages under {MAN_ROOT}/{{{','.join(SECTIONS)}}}, need "
            f"{docs}: install Debian's manpages and man-db, or pass a smaller --docs"
        )
    step = len(pages) / docs
    picked = [pages[int(i * step)] for i in range(docs)]
    with ThreadPoolExecutor(4) as pool:
        parsed = [parse_page(text) for text in pool.map(_render, picked)]
    rows = [p for p in parsed if p is not None]
    out.mkdir(parents=True, exist_ok=True)
    with corpus.open("w") as c, queries.open("w") as q:
        for i, (name, summary, description) in enumerate(rows):
            doc_id = f"man-{i}"
            c.write(json.dumps({"doc_id": doc_id, "text": f"{name}: {description}"}) + "\n")
            q.write(json.dumps({"query": summary, "doc_id": doc_id}) + "\n")
    record.write_text(json.dumps(settings))
    print(f"[holdout] {len(rows)} of {docs} pages have a summary and a description")
    return corpus, queries


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("runs/man_holdout"))
    parser.add_argument("--docs", type=int, default=2000, help="man pages sampled")
    parser.add_argument("--max-doc-len", type=int, default=64)
    parser.add_argument(
        "--encoder",
        action="append",
        default=[],
        metavar="NAME=PATH",
        help="an encoder to evaluate (asset name or folder); repeat",
    )
    parser.add_argument("--headline", help="the NAME whose NDCG@10 the last line reports")
    parser.add_argument(
        "--files-only",
        action="store_true",
        help="write corpus.jsonl and queries.jsonl and stop (a pairs file for the main job: "
        "synthgen pipeline init --pairs OUT/queries.jsonl --documents OUT/corpus.jsonl)",
    )
    args = parser.parse_args()
    if args.files_only:
        corpus, queries = build(args.out, args.docs)
        print(f"wrote {corpus} and {queries}")
        return
    if not args.encoder or any("=" not in e for e in args.encoder):
        parser.error("give at least one --encoder NAME=PATH")
    encoders = dict(e.split("=", 1) for e in args.encoder)
    if args.headline is not None and args.headline not in encoders:
        parser.error(f"--headline {args.headline!r} is not one of the --encoder names")

    from retriever.data import read_corpus
    from retriever.evaluate import evaluate
    from retriever.metrics import bootstrap_interval
    from synthgen.corpora import read_jsonl

    corpus, queries = build(args.out, args.docs)
    doc_ids, texts = read_corpus(corpus)
    rows = read_jsonl(queries)
    print(f"[holdout] {len(doc_ids)} documents, {len(rows)} query lines")
    first = next(iter(encoders))
    print(
        f"| encoder | NDCG@10 | Recall@10 | MRR@10 | NDCG@10 gain over {first} |\n"
        "|---|---|---|---|---|"
    )
    results, baseline = {}, None
    for name, encoder in encoders.items():
        report = evaluate(
            encoder, doc_ids, texts, rows, max_doc_len=args.max_doc_len, per_query=True
        )
        figures = []
        for k in METRICS:
            lo, hi = bootstrap_interval(lambda m: m, report["per_query"][k])
            figures.append(f"{report[k]:.4f} [{lo:.4f}, {hi:.4f}]")
        ndcg = report["per_query"]["ndcg@10"]
        results[name] = {k: report[k] for k in (*METRICS, "num_queries")}
        if baseline is None:
            baseline, gain = ndcg, "-"
        else:
            diff = report["ndcg@10"] - results[first]["ndcg@10"]
            lo, hi = bootstrap_interval(lambda z, b: b - z, baseline, ndcg)
            results[name]["ndcg@10_gain"] = [diff, lo, hi]
            gain = f"{diff:+.4f} [{lo:+.4f}, {hi:+.4f}]"
        print(f"| {name} | " + " | ".join(figures) + f" | {gain} |", flush=True)
    print(f"({results[first]['num_queries']} distinct queries)")
    (args.out / "results.json").write_text(json.dumps(results, indent=1))
    value = results[args.headline]["ndcg@10"] if args.headline else float("nan")
    print(f"holdout_ndcg={value:.4f}")


if __name__ == "__main__":
    main()
