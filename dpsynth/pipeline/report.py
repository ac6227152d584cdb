"""The main job's report: `report.html` (one self-contained page), `metrics.json` and PNGs.

Every figure comes from this run: the stage records in `<run>/stages/` and the run's ledger.
The page opens with the privacy statement (every charge, the composed (epsilon, delta) per
scope and privacy unit), then the retrieval metrics, the index, sample synthetic queries next
to real ones, the DP-RAG answers, and the timing and peak memory of every stage.

Privacy:
  The report is for the operator, not a release: it shows held-out and train real queries
  and evaluation figures computed on them (not DP). It says so at the top. What may be
  shipped is listed there too (generator/, synthetic/, encoder/, index/, rag/answers.json).
"""

from __future__ import annotations

import base64
import datetime
import html
import io
import json
from pathlib import Path

from dpsynth.pipeline.context import STAGES, StageContext
from synthgen.plots import pyplot
from synthgen.privacy.figures import DECIMALS, format_epsilon, round_up
from synthgen.work_folder import private_folder

PRIVACY_UNITS = {
    "train-pairs": "one (document, query) pair of the train split; documents public",
    "medical-records": "one record of the private medical collection",
}


def _unit(dataset: str, rag_dataset: str | None, default: str) -> str:
    """The privacy unit of a ledger scope's dataset."""
    if dataset in PRIVACY_UNITS:
        return PRIVACY_UNITS[dataset]
    return "one record of the private collection" if dataset == rag_dataset else default


def _correct_count(rag: dict) -> str:
    """ ": N correct" of a DP-RAG summary; nothing when no question had an expected answer."""
    return "" if rag.get("correct") is None else f": {rag['correct']} correct"


def _e(value) -> str:
    return html.escape(str(value))


def _num(value, digits: int = 4, *, up: bool = False) -> str:
    """`value` for the page; `up`: rounded up (a stated ε or δ never shows below itself)."""
    if not isinstance(value, float):
        return "-" if value is None else str(value)
    if abs(value) < 1e-3 or abs(value) >= 1e4:
        return f"{round_up(value, digits) if up else value:.{digits}g}"
    shown = format_epsilon(value) if up and digits == DECIMALS else f"{value:.{digits}f}"
    return shown.rstrip("0").rstrip(".")


def _up(value) -> str:
    return _num(value, up=True)  # a stated ε or δ


def _cells(record: dict, *keys: str) -> list[str]:
    """`record`'s values at `keys`, escaped; a key marked ``#`` is a number (`_num`), ``^``
    a stated ε or δ (rounded up)."""
    return [_num(record[k[1:]], up=k[0] == "^") if k[0] in "#^" else _e(record[k]) for k in keys]


def _is_collection_cap(scope: dict) -> bool:
    """Whether a `metrics["privacy"]` scope is a collection cap (every tenant's charges)."""
    from synthgen.privacy.ledger_types import COLLECTION

    return scope["tenant"] == COLLECTION


def _scope_label(scope: dict) -> str:
    return f"{scope['dataset']} (all tenants)" if _is_collection_cap(scope) else scope["dataset"]


def _table(header: list[str], rows: list[list]) -> str:
    head = "".join(f"<th>{_e(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _privacy(ledger_path: Path, rag_dataset: str | None = None) -> list[dict]:
    """Every scope of the run's ledger: its charges and the composed statement
    (`rag_dataset`: the name of the rag stage's collection, a user's own)."""
    from synthgen.privacy.ledger import PrivacyLedger

    if not ledger_path.is_file():
        return []
    ledger = PrivacyLedger(ledger_path)
    scopes = []
    for scope in ledger.scopes():
        spend = ledger.spent(scope.tenant, scope.dataset)
        charges = ledger.charges(scope.tenant, scope.dataset)
        scopes.append(
            {
                "tenant": scope.tenant,
                "dataset": scope.dataset,
                "privacy_unit": _unit(scope.dataset, rag_dataset, "see the stage that charged it"),
                "relation": scope.relation,
                "accountant": scope.accountant,
                "epsilon_cap": scope.epsilon_cap,
                "delta_cap": scope.delta_cap,
                "epsilon": spend.epsilon,
                "delta": spend.delta,
                "charges": [
                    {
                        "stage": c.stage,
                        "epsilon": c.epsilon,
                        "delta": c.delta,
                        "description": c.description,
                        "time": datetime.datetime.fromtimestamp(c.created_at).isoformat(
                            timespec="seconds"
                        ),
                    }
                    for c in charges
                ],
            }
        )
    ledger.close()
    return scopes


def _document_filters(ledger_path: Path) -> list[dict]:
    """The run ledger's collections in individual accounting: each record's target and
    the answers charged to the collection (by every tenant).

    Privacy:
      Public parameters and the number of answers only. The filters' summary (exhausted
      records, epsilons spent) depends on the private data and is not DP, so it stays in
      the ledger for the operator (`synthgen ledger documents`).
    """
    from synthgen.privacy.document_filters import DocumentFilters
    from synthgen.privacy.ledger import PrivacyLedger

    if not ledger_path.is_file():
        return []
    ledger = PrivacyLedger(ledger_path)
    filters = DocumentFilters(ledger.store)
    collections = []
    for dataset in filters.datasets():
        record = filters.get(dataset)
        answers = {  # one ref per answer, over every tenant's scope
            charge.ref or charge.id
            for scope in ledger.scopes()
            if scope.dataset == dataset
            for charge in ledger.charges(scope.tenant, scope.dataset)
        }
        collections.append(
            {
                "dataset": dataset,
                "privacy_unit": PRIVACY_UNITS.get(dataset, "one document of the collection"),
                "epsilon": record.budget.epsilon,
                "delta": record.budget.delta,
                "answers": len(answers),
                "answers_per_document": record.answers_per_document,
            }
        )
    ledger.close()
    return collections


def _png(fig) -> bytes:
    """`fig`, laid out, as PNG bytes; closes it."""
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110)
    pyplot().close(fig)
    return buffer.getvalue()


def _zoomed_limits(values: list[float]) -> tuple[float, float]:
    """A [0, 1] metric's y-limits around `values`: 0.78 against 0.85 stays visible, with
    room above the bars for their labels and the legend."""
    low, high = min(values), max(values)
    margin = max(0.3 * (high - low), 0.02)
    return max(0.0, low - margin), min(high + 2 * margin, high + 0.15)


def _plots(metrics: dict) -> dict[str, bytes]:
    plt = pyplot()

    plots = {}
    evaluation = metrics["evaluation"]
    if evaluation:
        rows, k = evaluation["rows"], evaluation["k"]
        fig, ax = plt.subplots(figsize=(6, 3.2))
        xs = range(len(rows))
        width = 0.38
        for offset, key, label in ((-1, "ndcg", f"NDCG@{k}"), (1, "recall", f"Recall@{k}")):
            bars = ax.bar(
                [x + offset * width / 2 for x in xs], [r[key] for r in rows], width, label=label
            )
            ax.bar_label(bars, fmt="%.3f", fontsize=7, padding=2)
        ax.set_xticks(list(xs), [r["encoder"] for r in rows])
        bottom, top = _zoomed_limits([r[key] for r in rows for key in ("ndcg", "recall")])
        ax.set_ylim(bottom, top)
        ax.set_ylabel(f"NDCG@{k} / Recall@{k}\n(held-out real queries)")
        ax.legend(loc="upper left", fontsize=8, ncols=2)
        zoomed = f" (y axis from {bottom:.2f})" if bottom > 0 else ""
        ax.set_title(f"Retrieval quality{zoomed}")
        plots["retrieval.png"] = _png(fig)
    stages = [s for s in metrics["stages"] if s.get("seconds") is not None]
    if stages:
        fig, (left, right) = plt.subplots(1, 2, figsize=(8, 3))
        names = [s["stage"] for s in stages]
        left.barh(names, [s["seconds"] / 60 for s in stages], color="tab:blue")
        left.set_xlabel("minutes")
        left.invert_yaxis()
        right.barh(
            names, [(s["peak_memory_bytes"] or 0) / 2**30 for s in stages], color="tab:orange"
        )
        right.set_xlabel("peak memory (GiB)")
        right.invert_yaxis()
        fig.suptitle("Time and peak memory per stage")
        plots["stages.png"] = _png(fig)
    scopes = [s for s in metrics["privacy"] if s["charges"]]
    if scopes:
        fig, ax = plt.subplots(figsize=(6, 2.6))
        for i, scope in enumerate(scopes):
            ax.barh(i, scope["epsilon_cap"], color="lightgray", label="cap" if i == 0 else None)
            ax.barh(i, scope["epsilon"], color="tab:red", label="spent" if i == 0 else None)
        ax.set_yticks(range(len(scopes)), [_scope_label(s) for s in scopes])
        ax.set_xlabel("epsilon (composed, at the scope's delta)")
        ax.legend(fontsize=8)
        ax.set_title("Privacy budget per scope")
        plots["privacy.png"] = _png(fig)
    return plots


def collect_metrics(ctx: StageContext) -> dict:
    """`metrics.json`'s content: stage summaries, timings, memory and the ledger's scopes."""
    run = ctx.run
    records = {s: run.record(s) for s in STAGES if s != "report"}
    done = {s: r["summary"] for s, r in records.items() if r and r["status"] == "done"}
    return {
        "name": ctx.config.name,
        "created": datetime.datetime.now().isoformat(timespec="seconds"),
        "privacy": _privacy(run.ledger, ctx.config.rag.dataset_name),
        "documents": _document_filters(run.ledger),
        "data": done.get("data"),
        "generate": done.get("generate"),
        "train": done.get("train"),
        "evaluation": done.get("evaluate"),
        "index": done.get("index"),
        "rag": done.get("rag"),
        "stages": [
            {
                "stage": s,
                "seconds": r.get("seconds") if r else None,
                "peak_memory_bytes": r.get("peak_memory_bytes") if r else None,
                "status": r["status"] if r else "missing",
            }
            for s, r in records.items()
        ],
    }


def _samples(ctx: StageContext, count: int) -> list[list[str]]:
    """(document, real query, synthetic query) rows of the first `count` synthetic documents."""
    path = ctx.run.root / "synthetic" / "queries.jsonl"
    if count <= 0 or not path.is_file():
        return []
    with open(ctx.run.private / "data" / "train_pairs.jsonl", encoding="utf-8") as f:
        real = {r["doc_id"]: r["query"] for r in map(json.loads, f)}
    rows, seen = [], set()
    with open(path, encoding="utf-8") as f:
        for row in map(json.loads, f):
            if row["doc_id"] in seen:
                continue
            seen.add(row["doc_id"])
            snippet = row["document"][:160] + ("…" if len(row["document"]) > 160 else "")
            rows.append([_e(snippet), _e(real.get(row["doc_id"], "")), _e(row["query"])])
            if len(rows) >= count:
                break
    return rows


_STYLE = """
body{font-family:system-ui,-apple-system,Segoe UI,sans-serif;max-width:980px;margin:2em auto;
padding:0 1em;color:#1b1b1b;line-height:1.45}
h1{margin-bottom:.2em}h2{border-bottom:1px solid #ddd;padding-bottom:.2em;margin-top:1.6em}
table{border-collapse:collapse;margin:.6em 0;font-size:.92em}
th,td{border:1px solid #ccc;padding:.3em .55em;text-align:left;vertical-align:top}
th{background:#f3f3f3}.statement{background:#eef6ee;border-left:4px solid #3a7d44;
padding:.6em 1em}.warning{background:#fff4e5;border-left:4px solid #e08a00;padding:.6em 1em}
img{max-width:100%}.muted{color:#666;font-size:.9em}
"""


def _html(metrics: dict, plots: dict[str, bytes], samples: list[list[str]]) -> str:
    parts = [
        f"<h1>dpsynth report: {_e(metrics['name'])}</h1>",
        f"<p class='muted'>Generated {_e(metrics['created'])} by <code>synthgen pipeline"
        "</code>. Every figure below was produced by this run.</p>",
    ]
    # ---- privacy statement -------------------------------------------------------------
    parts.append("<h2 id='privacy'>Privacy statement</h2>")
    gen = metrics.get("generate") or {}
    rag_dataset = (metrics.get("rag") or {}).get("dataset", "medical-records")  # older runs
    individual = {c["dataset"]: c for c in metrics.get("documents") or []}
    statements = []
    for scope in metrics["privacy"]:
        if scope["dataset"] in individual:
            statements.append(
                f"<li><b>{_e(scope['dataset'])}</b> (tenant {_e(scope['tenant'])}): the "
                f"tenant's quota, (ε = {_up(scope['epsilon'])}, δ = {_up(scope['delta'])}) "
                f"composed over {len(scope['charges'])} charge(s) (cap ε = "
                f"{_num(scope['epsilon_cap'])}); the collection is in individual accounting, "
                "whose statement is per record (below).</li>"
            )
            continue
        who = (
            "the collection cap: every tenant's answers together"
            if _is_collection_cap(scope)
            else f"tenant {_e(scope['tenant'])}"
        )
        statements.append(
            f"<li><b>{_e(scope['dataset'])}</b> ({who}): "
            f"(ε = {_up(scope['epsilon'])}, δ = {_up(scope['delta'])})-DP for "
            f"{_e(scope['privacy_unit'])} ({_e(scope['relation'])}, {_e(scope['accountant'])} "
            f"composition of {len(scope['charges'])} charge(s); cap ε = "
            f"{_num(scope['epsilon_cap'])}).</li>"
        )
    parts.append(
        "<div class='statement'><p>Composed guarantee per scope and privacy unit:</p>"
        f"<ul>{''.join(statements) or '<li>no charges</li>'}</ul>"
    )
    if individual:
        parts.append(
            "<p>Per-record guarantee of the collections in individual accounting:</p>"
            f"<ul>{''.join(_individual_statement(c) for c in individual.values())}</ul>"
        )
    if gen:
        parts.append(
            "<p>The generator (<code>generator/</code>), the synthetic queries "
            "(<code>synthetic/</code>), the encoder (<code>encoder/</code>) and the index "
            "(<code>index/</code>) are post-processing of the generate stage's release: "
            f"(ε = {_up(gen.get('epsilon'))}, δ = {_up(gen.get('delta'))})-DP for one pair."
            + (
                " Each DP-RAG answer (<code>rag/answers.json</code>) is charged to the "
                "records that took part in it and to the tenant's quota above."
                if rag_dataset in individual
                else f" The DP-RAG answers (<code>rag/answers.json</code>) are post-processing "
                f"of the one fact release charged to the (release, {_e(rag_dataset)}) scope above."
                if (metrics.get("rag") or {}).get("mode") == "release"
                else f" Each DP-RAG answer (<code>rag/answers.json</code>) is charged to the "
                f"tenant's {_e(rag_dataset)} scope above"
                + (
                    " and counted by its collection cap."
                    if any(_is_collection_cap(s) for s in metrics["privacy"])
                    else "."
                )
                if any(s["dataset"] == rag_dataset for s in metrics["privacy"])
                else ""
            )
            + "</p>"
        )
    parts.append("</div>")
    parts.append(
        "<p class='warning'>This report is for the operator and is <b>not a release</b>: it "
        "shows "
        + ("real queries and " if samples else "")
        + "evaluation figures computed on held-out real queries, which carry no "
        "privacy guarantee. Ship the folders named above, never this report, "
        "<code>ledger.sqlite</code> (its keyed digests of the private records, with the "
        "key, test whether a text is among them) or <code>private/</code>.</p>"
    )
    charge_rows = [
        [_e(s["dataset"]), *_cells(c, "stage", "^epsilon", "^delta", "description", "time")]
        for s in metrics["privacy"]
        if not _is_collection_cap(s)  # its charges are the tenants' rows, listed once
        for c in s["charges"]
    ]
    parts.append("<h3>Every charge in the ledger</h3>")
    parts.append(_table(["scope", "stage", "ε", "δ", "mechanism", "time"], charge_rows))
    if "privacy.png" in plots:
        parts.append(_img(plots, "privacy.png", "privacy budget per scope"))
    # ---- metrics -----------------------------------------------------------------------
    evaluation = metrics.get("evaluation")
    if evaluation:
        k = evaluation["k"]
        parts.append("<h2 id='metrics'>Retrieval quality</h2>")
        parts.append(
            f"<p>{evaluation['num_queries']} held-out real queries over "
            f"{evaluation['num_documents']} documents, exact search.</p>"
        )
        parts.append(
            _table(
                ["encoder", f"NDCG@{k}", f"Recall@{k}", f"MRR@{k}", "trained on"],
                [
                    _cells(r, "encoder", "#ndcg", "#recall", "#mrr", "note")
                    for r in evaluation["rows"]
                ],
            )
        )
        parts.append(_img(plots, "retrieval.png", "retrieval quality per encoder"))
    if gen:
        parts.append("<h2 id='generator'>DP synthetic queries</h2>")
        parts.append(
            f"<p>{_e(gen.get('generator'))}: {gen.get('synthetic_queries')} non-empty "
            f"synthetic queries for {gen.get('synthetic_documents')} train documents "
            f"({gen.get('empty_queries')} empty), from {gen.get('private_pairs')} private "
            "pairs.</p>"
        )
        if samples:
            parts.append(
                _table(
                    ["document (public)", "real query (private)", "synthetic query (DP)"], samples
                )
            )
    index = metrics.get("index")
    if index:
        recall_key = next((key for key in index if key.startswith("recall_at_")), None)
        parts.append("<h2 id='index'>Serving index</h2>")
        parts.append(
            f"<p>{_e(index['kind'])} index over {index['documents']} documents "
            f"(dim {index['dim']}): {recall_key.replace('_', ' ') if recall_key else ''} "
            f"{_num(index.get(recall_key))}, {_num(index['queries_per_second'], 3)} "
            "queries/s in one batch.</p>"
        )
    rag = metrics.get("rag")
    if rag and rag.get("enabled"):
        parts.append("<h2 id='rag'>DP-RAG answers</h2>")
        if rag.get("mode") == "release":
            parts.append(
                f"<p>The {rag['records']} private records were released once as "
                f"{rag['synthetic_records']} DP synthetic records (ε = "
                f"{_up(rag['release_epsilon'])}, δ = {_up(rag['release_delta'])} per record); "
                f"{rag['questions']} questions answered from the release with "
                f"{_e(rag['lm'])}, charged nothing{_correct_count(rag)}.</p>"
            )
        else:
            parts.append(
                f"<p>{rag['questions']} questions over {rag['records']} private records with "
                f"{_e(rag['lm'])} ({_e(rag['mechanism'])}, ε = {_up(rag['epsilon_per_answer'])} "
                f"per answer){_correct_count(rag)}, {rag.get('abstained', 0)} abstained. "
                "An answer abstains when the private records did not move it (nothing the "
                "records support at this ε); it is charged all the same.</p>"
            )
        target = rag.get("document_target")
        if rag.get("accounting") == "individual" and target:
            parts.append(
                "<p>Individual accounting: an answer uses, and charges, only the records "
                f"scoring at least the public relevance threshold τ = "
                f"{_num(target['relevance_threshold'])} whose filter still admits it; each "
                f"record can take part in {target['answers_per_document']} answer(s) within "
                f"(ε = {_up(target['epsilon'])}, δ = {_up(target['delta'])}).</p>"
            )
        parts.append(
            _table(
                ["question", "DP answer", "expected", "correct", "ε"],
                [
                    [
                        _e(a["question"]),
                        "<em>abstained</em>" if a.get("abstained") else _e(a["answer"]),
                        "-" if a["expected"] is None else _e(a["expected"]),
                        {True: "yes", False: "no", None: "-"}[a["correct"]],
                        _up(a["epsilon"]),
                    ]
                    for a in rag["answers"]
                ],
            )
        )
    parts.append("<h2 id='stages'>Stages: time and peak memory</h2>")
    parts.append(
        _table(
            ["stage", "status", "seconds", "peak memory (GiB)"],
            [
                [
                    _e(s["stage"]),
                    _e(s["status"]),
                    _num(s["seconds"], 3),
                    _num((s["peak_memory_bytes"] or 0) / 2**30, 3),
                ]
                for s in metrics["stages"]
            ],
        )
    )
    if "stages.png" in plots:
        parts.append(_img(plots, "stages.png", "time and peak memory per stage"))
    body = "\n".join(parts)
    return (
        "<!doctype html><html lang='en'><head><meta charset='utf-8'>"
        f"<title>dpsynth report: {_e(metrics['name'])}</title><style>{_STYLE}</style></head>"
        f"<body>{body}</body></html>\n"
    )


def _individual_statement(collection: dict) -> str:
    """The plain-words per-record statement of a collection in individual accounting."""
    return (
        f"<li><b>{_e(collection['dataset'])}</b> ({_e(collection['privacy_unit'])}): "
        f"Each private record is (ε = {_up(collection['epsilon'])}, δ = "
        f"{_up(collection['delta'])})-DP over all {collection['answers']} answers, whichever "
        "tenant asked; records pay only for answers they took part in. How many records "
        "are exhausted, and what they spent, is not DP: the operator reads it with "
        f"<code>synthgen ledger documents --dataset {_e(collection['dataset'])}</code> on the "
        "run's ledger.</li>"
    )


def _img(plots: dict[str, bytes], name: str, alt: str) -> str:
    if name not in plots:
        return ""
    data = base64.b64encode(plots[name]).decode()
    return f"<p><img alt='{_e(alt)}' src='data:image/png;base64,{data}'></p>"


def write_report(ctx: StageContext) -> dict:
    """Writes `report/report.html`, `report/metrics.json` and the PNGs; returns the paths."""
    metrics = collect_metrics(ctx)
    plots = _plots(metrics)
    out = private_folder(ctx.run.root / "report")  # real queries: operator only
    (out / "metrics.json").write_text(json.dumps(metrics, indent=1, allow_nan=False))
    for name, data in plots.items():
        (out / name).write_bytes(data)
    page = out / "report.html"
    page.write_text(
        _html(
            metrics,
            plots,
            _samples(
                ctx,
                0
                if getattr(getattr(ctx.config, "data", None), "pairs", None)
                else ctx.config.report.samples,
            ),
        ),
        encoding="utf-8",
    )
    ctx.log("report", "report.html, metrics.json and the plots written")
    return {"report": str(page.resolve()), "plots": sorted(plots)}
