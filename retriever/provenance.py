"""Provenance of an encoder: what it was trained on, and the privacy statement that follows.

Every encoder folder `retriever.train` writes holds ``provenance.json`` (format 1: the base
model, ``trained_on``, ``guarantee`` and ``statement``), and every export carries it with a
model card (`retriever.export`). ``trained_on.kind`` is ``"dp-synthetic"`` (only pairs of a
DP generator release whose metadata describes exactly that file, `for_pairs_file`: the
encoder is (ε, δ)-DP by post-processing, Dwork and Roth 2014, Prop. 2.1), ``"real-dp-sgd"``
(that DP-SGD run's guarantee), ``"real"`` (no guarantee) or ``"pretrained"`` (not trained
here). See docs/guides/retriever.md (Provenance).

Privacy:
  Provenance holds public figures only: the guarantee, the privacy unit, the ledger scope
  names, the number of training pairs (a count the released generator's metadata already
  states for synthetic data) and descriptions; never a text, score or path of private data.

References:
  Dwork and Roth 2014, "The Algorithmic Foundations of Differential Privacy", Prop. 2.1.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from synthgen.assets import file_sha256
from synthgen.privacy.figures import round_up

PROVENANCE_FILE = "provenance.json"
FORMAT = 1
METADATA_FILE = "metadata.json"  # what a generator release writes beside its synthetic rows
REAL_STATEMENT = "trained on real data: no privacy guarantee"
UNKNOWN_STATEMENT = "no provenance recorded: treated as " + REAL_STATEMENT
SEEDED_NOTE = " (the release's noise came from a fixed seed: for tests only, not for publication)"
_RELATIONS = {"ADD_OR_REMOVE_ONE": "add/remove-one", "REPLACE_ONE": "replace-one"}


def _number(value: Any) -> float | None:
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def _figures(epsilon: float, delta: float) -> str:
    return f"ε = {round_up(epsilon, 4):.4g}, δ = {round_up(delta, 3):.3g}"  # never below


def _guarantee(kind: str, privacy: dict | None) -> dict:
    privacy = privacy or {}
    relation = privacy.get("neighboring_relation")
    return {
        "kind": kind,
        "epsilon": _number(privacy.get("epsilon")),
        "delta": _number(privacy.get("delta")),
        "privacy_unit": privacy.get("unit"),
        "neighboring_relation": relation,
        "mechanism": privacy.get("mechanism") or privacy.get("mechanism_description"),
        "accountant": privacy.get("accountant"),
        "ledger_scope": _scope(privacy.get("ledger_scope")),
    }


def _scope(scope: Any) -> dict | None:
    """{"tenant", "dataset"} from a (tenant, dataset) pair or such a dict; None if unknown."""
    if scope is None:
        return None
    if isinstance(scope, dict):
        return {"tenant": str(scope["tenant"]), "dataset": str(scope["dataset"])}
    tenant, dataset = scope
    return {"tenant": str(tenant), "dataset": str(dataset)}


def _is_dp(privacy: dict | None) -> bool:
    """A stated, finite (ε, δ) of a private run (a noise-free reference run is not DP)."""
    if not privacy or privacy.get("private") is False:
        return False
    epsilon, delta = _number(privacy.get("epsilon")), _number(privacy.get("delta"))
    return (
        epsilon is not None
        and delta is not None
        and math.isfinite(epsilon)
        and epsilon >= 0
        and 0 <= delta < 1
    )


def _unit_text(guarantee: dict) -> str:
    unit = guarantee["privacy_unit"] or "one private example"
    relation = _RELATIONS.get(guarantee["neighboring_relation"], guarantee["neighboring_relation"])
    return f"{unit} ({relation} neighbours)" if relation else unit


def _generator(metadata: dict) -> str:
    """A one-line description of the generator a synthetic release came from."""
    model = metadata.get("model") or {}
    if "family" in model:  # synthgen.querygen
        lora = f", LoRA rank {model['lora_rank']}" if model.get("lora_rank") else ""
        return f"DP fine-tuned query generator {model.get('base')} ({model['family']}{lora})"
    method = (metadata.get("generation") or {}).get("method", "DP few-shot generation")
    backend = model.get("backend")
    return f"{method} with {backend}" if backend else method


def _num_rows(metadata: dict) -> int | None:
    for key in ("num_queries", "num_examples"):
        if isinstance(metadata.get(key), int):
            return metadata[key]
    return None


def synthetic(
    metadata: dict, *, num_pairs: int | None = None, description: str | None = None
) -> dict:
    """Provenance of an encoder trained only on a generator release's synthetic pairs.

    Args:
      metadata: the release's ``metadata.json`` (querygen or few-shot), with its
        "privacy" block (epsilon, delta, unit, neighboring_relation, ledger_scope).
      num_pairs: synthetic pairs used for training.
      description: where the synthetic data came from (default: "DP synthetic queries").

    Returns:
      The provenance dict (see the module docstring). A release of a non-private
      reference run (no noise, ε = ∞) gives guarantee "none".

    Raises:
      ValueError: `metadata` has no "privacy" block.

    Privacy:
      Post-processing (Dwork and Roth 2014, Prop. 2.1): the encoder is a function of the
      release (and public documents) only, so it is (ε, δ)-DP for the release's privacy
      unit and relation, and its training spends no further budget.
    """
    privacy = metadata.get("privacy")
    if not isinstance(privacy, dict):
        raise ValueError("synthetic data metadata has no 'privacy' block: not a DP release")
    generator = _generator(metadata)
    dataset = {
        "generator": generator,
        "epsilon": _number(privacy.get("epsilon")),
        "delta": _number(privacy.get("delta")),
        "privacy_unit": privacy.get("unit"),
        "neighboring_relation": privacy.get("neighboring_relation"),
        "rows_covered": privacy.get("rows_covered"),
        "ledger_scope": _scope(privacy.get("ledger_scope")),
        "num_rows": _num_rows(metadata),
    }
    trained_on = _trained_on(
        "dp-synthetic", description or "DP synthetic queries", num_pairs, dataset
    )
    if not _is_dp(privacy):
        return _provenance(
            trained_on,
            _guarantee("none", None),
            f"trained on synthetic data from a NON-private generator run ({generator}, "
            "no noise, ε = ∞): no privacy guarantee",
        )
    guarantee = _guarantee("post-processing", privacy)
    statement = (
        f"post-processing of an (ε, δ)-DP release: trained only on synthetic queries from "
        f"the {generator}, which is ({_figures(guarantee['epsilon'], guarantee['delta'])})-DP for "
        f"{_unit_text(guarantee)}; the encoder inherits that guarantee and spent no "
        "further budget"
    )
    if (metadata.get("randomness") or {}).get("seeded"):
        dataset["seeded"] = True
        statement += SEEDED_NOTE
    return _provenance(trained_on, guarantee, statement)


def dp_sgd(privacy: dict, *, num_pairs: int | None = None) -> dict:
    """Provenance of an encoder trained on private pairs by DP-SGD (`train_retriever_dp`).

    Args:
      privacy: the run's privacy block (`dp_train.PrivacyPlan.to_dict` with "unit" and
        "mechanism", and "ledger_scope": the (tenant, dataset) the run was charged to, if
        any).
      num_pairs: private pairs (the plan's public `num_examples` if not given).

    Privacy:
      The run's own (ε, δ) guarantee w.r.t. its unit (see `train_retriever_dp`); a
      noise-free run gives guarantee "none".
    """
    if num_pairs is None and isinstance(privacy.get("num_examples"), int):
        num_pairs = privacy["num_examples"]
    trained_on = _trained_on(
        "real-dp-sgd", "private (query, document) pairs, trained with DP-SGD", num_pairs
    )
    if not _is_dp(privacy):
        return _provenance(
            trained_on,
            _guarantee("none", None),
            "NON-private run (no noise, ε = ∞): " + REAL_STATEMENT,
        )
    guarantee = _guarantee("dp-sgd", privacy)
    statement = (
        f"({_figures(guarantee['epsilon'], guarantee['delta'])})-DP for "
        f"{_unit_text(guarantee)}: DP-SGD on the private pairs"
    ) + (SEEDED_NOTE if privacy.get("seeded") else "")
    return _provenance(trained_on, guarantee, statement)


def real_data(*, num_pairs: int | None = None, description: str | None = None) -> dict:
    """Provenance of an encoder trained on real data (or data of unrecorded origin)."""
    trained_on = _trained_on("real", description or "real (query, document) pairs", num_pairs)
    return _provenance(trained_on, _guarantee("none", None), REAL_STATEMENT)


def pretrained(name: str) -> dict:
    """Provenance of a base model that was not trained here (asset, folder, random init)."""
    trained_on = _trained_on("pretrained", f"the pretrained model {name}, not trained by dpsynth")
    statement = (
        f"pretrained model {name}, not trained on the operator's data by dpsynth: "
        "no privacy statement applies"
    )
    return _provenance(trained_on, _guarantee("none", None), statement, base_model=name)


def _trained_on(
    kind: str, description: str, num_pairs: int | None = None, dataset: dict | None = None
) -> dict:
    """The "trained_on" block: what kind of data, described, how many pairs, which release."""
    return {"kind": kind, "description": description, "num_pairs": num_pairs, "dataset": dataset}


def _provenance(trained_on: dict, guarantee: dict, statement: str, **more: Any) -> dict:
    return {
        "format": FORMAT,
        "base_model": more.get("base_model"),
        "trained_on": trained_on,
        "guarantee": guarantee,
        "statement": statement,
    }


def for_pairs_file(
    pairs: str | Path, *, metadata: str | Path | None = None, num_pairs: int | None = None
) -> dict:
    """Provenance of training on a pairs file: DP synthetic if its release metadata says so.

    The release's metadata is `metadata`, or else the ``metadata.json`` beside `pairs`. It
    counts only when it describes exactly that file: a "privacy" block and, under "files",
    the SHA-256 of a file of that name equal to this file's (the generators record the
    digests of what they write). Anything else, an edited file or a release written before
    digests were recorded included, is real data (no guarantee): a DP statement is never
    made on a guess.

    Args:
      pairs: the training pairs (JSON lines).
      metadata: the release's metadata.json, if not beside `pairs`.
      num_pairs: pairs used for training (e.g. after a limit); default: all rows.

    Raises:
      FileNotFoundError: `metadata` was given and does not exist.
      ValueError: `metadata` was given but does not describe `pairs`.
    """
    pairs = Path(pairs)
    explicit = metadata is not None
    path = Path(metadata) if explicit else pairs.parent / METADATA_FILE
    if not path.is_file():
        if explicit:
            raise FileNotFoundError(f"no such metadata file: {path}")
        return real_data(num_pairs=num_pairs)
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError:
        meta = None
    files = meta.get("files") if isinstance(meta, dict) else None
    declared = files.get(pairs.name) if isinstance(files, dict) else None
    if "privacy" not in (meta or {}) or declared != file_sha256(pairs):
        if explicit:
            raise ValueError(
                f"{path} does not describe {pairs}: no privacy block, or no SHA-256 of "
                f"{pairs.name!r} equal to the file's (edited, or not the released file)"
            )
        return real_data(num_pairs=num_pairs)
    return synthetic(
        meta,
        num_pairs=_count_rows(pairs) if num_pairs is None else num_pairs,
        description=f"DP synthetic queries ({pairs.name})",
    )


def _count_rows(path: Path) -> int:
    with open(path, encoding="utf-8") as f:
        return sum(1 for line in f if line.strip())


def write_provenance(folder: str | Path, provenance: dict) -> Path:
    """Writes ``provenance.json`` into `folder` (which must exist); returns its path."""
    path = Path(folder) / PROVENANCE_FILE
    path.write_text(json.dumps(provenance, indent=1, ensure_ascii=False) + "\n", "utf-8")
    return path


def read_provenance(folder: str | Path) -> dict | None:
    """The ``provenance.json`` of `folder`, or None when it has none.

    The pipeline's earlier form (``{"trained_on": str, "guarantee": str, "privacy": the
    generator release's privacy block}``) is read as `synthetic` of that block.
    """
    path = Path(folder) / PROVENANCE_FILE
    if not path.is_file():
        return None
    record = json.loads(path.read_text(encoding="utf-8"))
    if "format" not in record:  # the pipeline's train stage wrote this before format 1
        if isinstance(record.get("privacy"), dict):
            described = record.get("trained_on")
            return synthetic(
                {"privacy": record["privacy"]},
                description=described if isinstance(described, str) else None,
            )
        return {**real_data(description="not recorded"), "statement": UNKNOWN_STATEMENT}
    return record


def encoder_provenance(name_or_path: str | Path) -> dict:
    """The provenance of any encoder `retriever.encoders.load_encoder` accepts.

    A folder's ``provenance.json``; for a trained folder without one (written before
    provenance was recorded) the unknown case, stated as real data; for an asset, a Hugging
    Face folder or a random initialisation, `pretrained`.
    """
    from retriever.encoders import ENCODER_FILE, RANDOM_PREFIX
    from synthgen import assets

    name = str(name_or_path)
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        recorded = read_provenance(path)
        if recorded is not None:
            return recorded
        if (path / ENCODER_FILE).is_file():
            base = json.loads((path / ENCODER_FILE).read_text()).get("base")
            unknown = real_data(description="not recorded")
            return {**unknown, "base_model": base, "statement": UNKNOWN_STATEMENT}
        if (path / "config.json").is_file():
            return pretrained(name)  # a Hugging Face model folder
    elif name.startswith(RANDOM_PREFIX) or name in assets.REGISTRY:
        return pretrained(name)
    # A path that is gone (a moved run folder) or unknown: never assume an untouched model.
    unknown = real_data(description=f"unknown encoder {name!r}")
    return {**unknown, "statement": UNKNOWN_STATEMENT}


def continued_from(start: dict, trained: dict) -> dict:
    """Provenance of training that starts from an encoder whose provenance is `start`.

    Starting from a pretrained model changes nothing. Starting from an encoder trained here,
    the weights carry what it was trained on, so the new statement cannot be that of
    `trained` alone: no guarantee is stated (composing the two would need both to be DP
    statements about the same unit), and both are recorded.
    """
    if start["trained_on"]["kind"] == "pretrained":
        return trained
    description = (
        f"{trained['trained_on']['description']}, continued from an encoder whose "
        f"provenance says: {start['statement']}"
    )
    record = real_data(num_pairs=trained["trained_on"]["num_pairs"], description=description)
    statement = (
        "no privacy guarantee: training continued from an encoder trained on other data "
        f"({start['statement']})"
    )
    return {**record, "statement": statement, "started_from": start, "this_run": trained}


def collection_independence(name_or_path: str | Path) -> str | None:
    """Why an encoder may score a private collection under DP-RAG, from its provenance.

    DP-RAG's sensitivity arguments (`retriever.rag`) hold the question encoder and the
    document embeddings fixed: they must not depend on the private collection. Established
    for a public pretrained model (an asset, a random initialisation, a folder whose
    provenance says ``"pretrained"``) and for a DP-trained encoder (``"post-processing"`` or
    ``"dp-sgd"`` with a finite (ε, δ): it depends on the collection only through that DP
    release, whose ε then composes with the answers'). Not established (None): real data
    without DP, a non-private generator, training continued from such an encoder, or a
    folder of unrecorded origin.

    Args:
      name_or_path: anything `retriever.encoders.load_encoder` accepts.

    Returns:
      A one-line public statement of why the encoder qualifies, or None.

    Privacy:
      Reads public provenance only. The statement is what the answers' guarantee assumes
      of the encoder (Dwork and Roth 2014, Prop. 2.1 for post-processing; Thm. 3.16 for
      the composition with a DP-trained encoder).
    """
    path = Path(name_or_path).expanduser()
    if path.is_dir() and read_provenance(path) is None:
        return None  # a folder of unrecorded origin
    record = encoder_provenance(name_or_path)
    guarantee = record["guarantee"]
    if record["trained_on"]["kind"] == "pretrained":
        return f"public pretrained model, not trained on the collection ({record['statement']})"
    if guarantee["kind"] in ("post-processing", "dp-sgd") and _is_dp(
        {"epsilon": guarantee["epsilon"], "delta": guarantee["delta"]}
    ):
        return (
            f"DP-trained encoder ({record['statement']}): if its training data came from this "
            "collection, the answers' guarantee composes with the encoder's"
        )
    return None
