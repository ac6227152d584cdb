"""Release a private collection's knowledge once: DP keywords, soft clusters, DP records.

`release_knowledge` turns private records into a DP synthetic knowledge base that any
number of questions can then read as ordinary RAG, at no further cost (DP-SynRAG, Mori et
al. 2025):

1. keywords: each record's K keywords by a public rule; PipelineDP releases those many
   records share (`synthgen.knowledge.keywords`);
2. clusters: the top released keywords are the clusters; each record joins at most L
   (`synthgen.knowledge.clusters`); each cluster's co-occurring keywords are released by
   the Gaussian mechanism;
3. generation: per cluster, R synthetic records by DP few-shot token aggregation
   (`synthgen.fewshot.generate`): M voter prompts, each with at most one record of the
   cluster drawn by Poisson sampling, one public prompt with the cluster's keywords and a
   public demonstration; the candidates are the public top-K plus the cluster keywords'
   tokens (public after stage 1). By default a record states public fields instead
   ("Diagnosis", ...), each one release over the cluster's keywords whose voters score them
   by likelihood after their record (`synthgen.knowledge.fields`): voters agree on a
   record's facts far more than on its every token;
4. self-filtering (post-processing, free text): a generated text the public LM finds
   incoherent (mean log-probability per token below a public threshold) is dropped; a
   synthetic record is the cluster's released keywords and its text when kept.

Clusters are independent work: ``shard=(i, n)`` generates the clusters ``c % n == i``, each
from its own stream of the release key, so any split joins to the same bytes as one job.
The private work folder holds the release key, the clusters' members and each cluster's
output (resume state); it is never part of the release. The key is deleted once every
cluster is generated (`forget_key`): kept, it would replay stage 3's noise; a cluster
missing after that is refused, never drawn again with fresh noise. Shards agree on who
prepares stages 1 and 2 by an exclusive lock on a file of the work folder
(`synthgen.knowledge.work_lock`, an `fcntl.flock`): that holds between processes of one
machine on a local filesystem; on NFS without lockd, or on object-store mounts, the lock may
not exclude, and two shards could draw stages 1 and 2 twice. Run shards on one machine, or
prepare with one shard before starting the others.

Privacy:
  Unit: one record of the collection; add/remove-one. The three stages are fixed by public
  figures (`synthgen.knowledge.plan`) and their composition is charged to the ledger once,
  before any noise is drawn (a restart re-charges with the same idempotency key: never
  twice). Logs and progress show counts and epsilon only, never a record or keyword.
"""

from __future__ import annotations

import dataclasses
import json
import secrets
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from synthgen.fewshot.generation import generate
from synthgen.fewshot.plan import RELATION
from synthgen.fewshot.prompts import PromptTemplate
from synthgen.knowledge.clusters import assign_clusters
from synthgen.knowledge.config import KnowledgeConfig
from synthgen.knowledge.keywords import (
    record_keywords,
    release_cluster_keywords,
    release_keywords,
)
from synthgen.knowledge.plan import KnowledgePlan, plan_release
from synthgen.knowledge.work_lock import work_lock
from synthgen.privacy.ledger import PrivacyLedger

TEMPLATE = PromptTemplate(
    header="Here are records about {label} (keywords: {keywords}).\n\n{example}",
    shot="Record: {text}\n\n",
    stem="Record:",
)
STATE_FILE = "knowledge_state.json"  # private: members, release key (never shipped)
CHARGE_FILE = "knowledge_charge.json"  # the charge's idempotency key, written before it
CLUSTER_DIR = "clusters"
LOCK_FILE = "knowledge.lock"  # held while stages 1 and 2 are prepared


@dataclasses.dataclass
class KnowledgeRelease:
    """What a release produced (all DP or public) and whether every cluster is done.

    Attributes:
      records: the synthetic records, ``{"text", "topic", "keywords", "generated"}``
        (``generated``: the DP text survived the self-filter); empty until complete.
      keyword_counts: the released keywords' noisy counts (stage 1).
      clusters: each cluster's released keywords (stage 2), its own first.
      plan: the plan (guarantee, every stage's parameters).
      complete: every cluster generated (a shard may finish before the others).
      clusters_done: clusters generated so far.
    """

    records: list[dict]
    keyword_counts: dict[str, float]
    clusters: list[list[str]]
    plan: KnowledgePlan
    complete: bool
    clusters_done: int


def _token_count(lm) -> Callable[[str], int]:
    return lambda word: len(lm.encode(" " + word))


def _prepare(lm, texts, config, plan, *, encode, rng, ledger, ledger_scope, state_path):
    """Stages 1 and 2 (run once; the result is the private state file)."""
    from synthgen.privacy import secure_rng

    key = secrets.randbits(128) if rng is None else int(rng.integers(2**63))
    rng = secure_rng() if rng is None else rng
    if ledger is not None:
        _charge(ledger, ledger_scope, plan, state_path.parent)
    keywords = record_keywords(
        texts,
        max_keywords=config.max_keywords,
        token_count=_token_count(lm),
        min_tokens=config.min_keyword_tokens,
    )
    stage1 = release_keywords(keywords, plan)  # PipelineDP's own secure noise
    vocabulary = [str(w) for w in stage1.counts]
    vectors = {}
    if encode is not None and vocabulary:
        vectors = {  # each record alone: a batch of others must not move its ranking
            "record_vectors": np.stack([np.asarray(encode([t]))[0] for t in texts]),
            "centre_vectors": np.asarray(encode(vocabulary)),
        }
    # Every released keyword is a candidate cluster; a record joins at most L of them.
    memberships = assign_clusters(
        keywords, vocabulary, config.clusters_per_record, **vectors,
        specific_first=config.specific_first,
    )  # fmt: skip
    named, strongest = (
        release_cluster_keywords(keywords, memberships, vocabulary, len(vocabulary), plan, rng)
        if vocabulary
        else ([], [])
    )
    # post-processing of stages 1 and 2: cohesive clusters, one per topic
    own = [float(stage1.counts[w]) for w in vocabulary]
    cohesive = [s >= config.min_cohesion * max(o, 1e-9) for s, o in zip(strongest, own)]
    chosen = distinct_clusters(named, config.max_clusters, cohesive)
    position = {c: j for j, c in enumerate(chosen)}
    members = [[] for _ in chosen]
    for i, clusters in enumerate(memberships):
        for c in clusters:
            if c in position:
                members[position[c]].append(i)
    named = [named[c] for c in chosen]
    state = {
        "plan": plan.to_dict(),
        "keyword_counts": {str(k): v for k, v in stage1.counts.items()},
        "clusters": named,
        "members": members,  # private
        "key": key,  # private
        "num_records": len(texts),
        "collection": _fingerprint(texts),  # private: which collection this state is for
        "ledger_scope": list(ledger_scope) if ledger_scope else None,
    }
    tmp = state_path.with_suffix(".tmp")
    tmp.write_text(json.dumps(state))
    tmp.replace(state_path)  # atomic: a crash leaves no half-written state
    return state


def forget_key(state_path: Path) -> None:
    """Deletes the release key from the private state once every cluster is generated.

    The key seeds stage 3's draws and noise (stage 2 draws from the OS): kept after
    publication, anyone who reads the work folder could replay that noise and subtract it
    from the release. Nothing needs it
    once the clusters' outputs are written (a rerun finds them done)."""
    state = json.loads(state_path.read_text())
    if state.get("key") is None:
        return
    state["key"] = None
    tmp = state_path.with_suffix(f".{secrets.token_hex(4)}.tmp")
    tmp.write_text(json.dumps(state))
    tmp.replace(state_path)


def _fingerprint(texts: Sequence[str]) -> str:
    import hashlib

    digest = hashlib.sha256()
    for text in texts:
        digest.update(hashlib.sha256(text.encode()).digest())
    return digest.hexdigest()


def _charge(ledger, ledger_scope, plan: KnowledgePlan, work: Path) -> None:
    """Charges the release once: the idempotency key is written before the first charge,
    and every later run (a resume, another shard) charges again with it, which the ledger
    answers with the first charge."""
    ref_path = work / CHARGE_FILE
    if not ref_path.is_file():
        tmp = ref_path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"ref": f"knowledge-{secrets.token_hex(16)}"}))
        tmp.replace(ref_path)
    ref = json.loads(ref_path.read_text())["ref"]
    ledger.charge(
        *ledger_scope,
        stage="knowledge-release",
        event=plan.event,
        relation=RELATION,
        description=f"DP knowledge release (keywords, clusters, generation), "
        f"eps={plan.epsilon:.4g}",
        ref=ref,
    )


def distinct_clusters(
    named: Sequence[Sequence[str]], limit: int, cohesive: Sequence[bool] | None = None
) -> list[int]:
    """Clusters in rank order, skipping one whose keyword a kept cluster already names.

    A disease's name, symptoms and treatment are separate keywords that name each other:
    the first (most frequent) stands for the topic, so `limit` clusters cover `limit`
    topics rather than a few topics many times; a cluster marked not `cohesive` is skipped.
    Reads only the released keywords and counts.
    """
    kept, covered = [], set()
    for c, words in enumerate(named):
        if len(kept) == limit:
            break
        if words[0] in covered or (cohesive is not None and not cohesive[c]):
            continue
        kept.append(c)
        covered.update(words)
    return kept


def _cluster_rng(key: int | None, cluster: int) -> np.random.Generator:
    if key is None:  # forgotten once every cluster was done: never fresh entropy
        raise ValueError("the release key was deleted: this release is finished")
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence(key, spawn_key=(cluster,))))


def generate_cluster(
    lm, texts: Sequence[str], state: dict, cluster: int, plan: KnowledgePlan
) -> list[str]:
    """Stage 3 for one cluster: ``records_per_cluster`` DP texts (already charged).

    With fields, a text is ``"<Field>: <Keyword>[, ...]"`` lines, each one release over the
    cluster's keywords (`synthgen.knowledge.fields`); without, free text token by token.

    Privacy:
      ``records_per_cluster * draws_per_record`` draws of one pool of the generation plan
      (`plan.generation` counts exactly these): Poisson voters at rate q, the Gaussian
      mechanism on the mean of M distributions (Tang et al. 2024); candidates read only
      public inputs (the cluster's released keywords, the public prompt).
    """
    from synthgen.knowledge.fields import release_field

    config = plan.config
    words = state["clusters"][cluster]
    rng = _cluster_rng(state["key"], cluster)
    if config.fields:
        pool = np.asarray(state["members"][cluster], np.int64)
        out = []
        for _ in range(config.records_per_cluster):
            lines, left = [], list(words)
            for field, values in zip(config.fields, config.field_values, strict=True):
                if len(left) < 2:  # one candidate or none: nothing for a vote to say
                    break
                chosen = release_field(lm, texts, pool, field, left, values, plan, rng)
                left = [w for w in left if w not in chosen]  # released: public
                lines.append(f"{field}: {', '.join(w.capitalize() for w in chosen)}")
            out.append("\n".join(lines))
        return out
    label = words[0]
    rows = [{"text": texts[i], "label": label} for i in state["members"][cluster]]
    spellings = [v for w in words for v in (w, " " + w, w.capitalize(), " " + w.capitalize())]
    extra = sorted({t for v in spellings for t in lm.encode(v)})
    fewshot = dataclasses.replace(plan.fewshot, extra_candidates=tuple(extra))
    example = f"Record: {config.public_example}\n\n" if config.public_example else ""
    target = {"label": label, "keywords": ", ".join(words), "example": example}
    result = generate(
        lm, rows, [target] * config.records_per_cluster, TEMPLATE, fewshot,
        pool_field="label", rng=rng, plan=plan.generation,
    )  # fmt: skip
    return result.texts


def mean_logprob(lm, text: str, prefix: str = "Record:") -> float:
    """Mean log-probability per token of `text` after a public `prefix` (-inf: empty)."""
    prompt = lm.encode(prefix, bos=True)
    ids = lm.encode(" " + text.strip())
    if not ids or not text.strip():
        return -np.inf
    rows = np.asarray(lm.score([prompt + ids[:j] for j in range(len(ids))]))
    return float(np.mean([rows[j][t] for j, t in enumerate(ids)]))


def render_record(keywords_line: str, text: str) -> str:
    """A synthetic record's text: the generated text (fields), then its keywords line."""
    return f"{text.strip()}\n{keywords_line}" if text.strip() else keywords_line


def synthetic_records(
    clusters: Sequence[Sequence[str]],
    texts: Sequence[Sequence[str]],
    keep: Callable[[str, str], bool],
) -> list[dict]:
    """Post-processing: one record per generated text, "<text if kept>\\nKeywords: ...".

    The text comes first: read by SmolLM2-135M with the question, a record that opens with
    its fields is answered from (0.29 of the stream's first 300 questions on the epsilon-10
    release, BM25 top record) far more often than one that opens with its keywords (0.16),
    which the small reader echoes. A cluster that names no co-keyword and whose texts were
    all dropped says nothing beyond its own keyword: it yields no record.
    """
    out = []
    for words, generated in zip(clusters, texts, strict=True):
        for text in generated:
            head = f"Keywords: {', '.join(words)}."
            kept = bool(text.strip()) and keep(head, text)
            if not kept and len(words) < 2:
                continue
            body = render_record(head, text if kept else "")
            out.append(
                {"text": body, "topic": words[0], "keywords": list(words), "generated": kept}
            )
    return out


def release_knowledge(
    lm,
    texts: Sequence[str],
    config: KnowledgeConfig,
    *,
    work: str | Path,
    encode: Callable[[list[str]], np.ndarray] | None = None,
    rng: np.random.Generator | None = None,
    ledger: PrivacyLedger | None = None,
    ledger_scope: tuple[str, str] | None = None,
    shard: tuple[int, int] = (0, 1),
    on_cluster: Callable[[int, int], None] | None = None,
) -> KnowledgeRelease:
    """Releases the collection's knowledge, or this shard's part of it (resumable).

    Args:
      lm: the frozen public LM (`synthgen.lm_backends.NextTokenLM`).
      texts: the private records.
      config: public parameters.
      work: the private work folder (state, members, the release key, cluster outputs).
      encode: a public encoder (texts -> vectors) ranking a record's clusters; None: rank
        order.
      rng: tests only: fixed randomness for stage 2 and the release key (production: None,
        OS entropy). Stage 1's noise is PipelineDP's own secure noise either way.
      ledger: charged the whole release once, before any noise (with `ledger_scope`).
      ledger_scope: (tenant, dataset).
      shard: (i, n): generate clusters c with c % n == i.
      on_cluster: progress callback (clusters done, clusters in all).

    Returns:
      The release; ``records`` is filled once every cluster is done (by any shard).

    Raises:
      ValueError: a bad shard, no record, or a work folder prepared for another plan.
      synthgen.privacy.BudgetExceededError: the ledger cannot pay (nothing is drawn).

    Privacy:
      (plan.epsilon, plan.delta)-DP for one record under add/remove-one (module docstring).
    """
    from synthgen.work_folder import private_folder

    index, count = shard
    if not 0 <= index < count:
        raise ValueError(f"shard must be (i, n) with 0 <= i < n, got {shard=}")
    if not texts:
        raise ValueError("the collection holds no record")
    if config.delta >= 1.0 / len(texts):
        raise ValueError(
            f"delta={config.delta:g} is not below 1/n = {1.0 / len(texts):.3g}: a release "
            "could then publish a whole record; use a smaller delta"
        )
    if ledger is not None and ledger_scope is None:
        raise ValueError("ledger_scope=(tenant, dataset) is required with a ledger")
    plan = plan_release(config)
    work = private_folder(work)
    state_path = work / STATE_FILE
    # One preparer at a time: a shard that starts while another prepares waits for it, then
    # reads its state (stages 1 and 2 are drawn once, whatever the number of shards).
    with work_lock(work / LOCK_FILE):
        if state_path.is_file():
            state = json.loads(state_path.read_text())
            if state["plan"] != json.loads(json.dumps(plan.to_dict())):
                raise ValueError(f"{work} holds a release with another plan; use a new one")
            if state.get("collection") != _fingerprint(texts):
                raise ValueError(f"{work} holds a release of another collection")
            scope = list(ledger_scope) if ledger_scope else None
            if state.get("ledger_scope") != scope:
                raise ValueError(f"{work} holds a release charged to another ledger scope")
            if ledger is not None:  # idempotent: the first run's charge, or refused
                _charge(ledger, ledger_scope, plan, work)
        else:
            if ledger is not None and not (work / CHARGE_FILE).is_file():
                # a dry run before anything is drawn; after a crash past the charge the
                # scope is full, and the idempotent charge below answers instead
                ledger.check(*ledger_scope, stage="knowledge-release", event=plan.event,
                             relation=RELATION)  # fmt: skip
            state = _prepare(
                lm,
                texts,
                config,
                plan,
                encode=encode,
                rng=rng,
                ledger=ledger,
                ledger_scope=ledger_scope,
                state_path=state_path,
            )
    clusters = state["clusters"]
    out_dir = private_folder(work / CLUSTER_DIR)

    def path(c: int) -> Path:
        return out_dir / f"cluster-{c:05d}.json"

    done = sum(path(c).is_file() for c in range(len(clusters)))
    for c in range(index, len(clusters), count):
        if path(c).is_file():
            continue
        generated = generate_cluster(lm, texts, state, c, plan)
        tmp = path(c).with_suffix(".tmp")
        tmp.write_text(json.dumps(generated))
        tmp.replace(path(c))
        done += 1
        if on_cluster is not None:
            on_cluster(done, len(clusters))
    done = sum(path(c).is_file() for c in range(len(clusters)))
    complete = done == len(clusters)
    records = []
    if complete:
        outputs = [json.loads(path(c).read_text()) for c in range(len(clusters))]

        def keep(head: str, text: str) -> bool:
            if config.fields:  # keywords chosen by DP votes: nothing to judge
                return True
            return mean_logprob(lm, text, prefix=head) >= config.min_text_logprob

        records = synthetic_records(clusters, outputs, keep)
        with work_lock(work / LOCK_FILE):  # shards finishing together
            forget_key(state_path)
    return KnowledgeRelease(records, state["keyword_counts"], clusters, plan, complete, done)
