"""The measured DP-RAG power cells: what `synthgen audit power` runs for `rag_epsilons`.

`demo_cells` runs `retriever.rag.one_run_audit.run_rag_power_cells` on a 200-record medical
world (`dpsynth.evaluation.medical_world`) with SmolLM2-135M-Instruct and all-MiniLM-L6-v2;
`generator_runners` hands `dpsynth.evaluation.audit_power.run_generators` what it needs from
retriever (this encoder for the Private Evolution cells, and these DP-RAG cells).

Privacy:
  As `retriever.rag.one_run_audit`: the results hold aggregates only; the canaries, coins
  and answers stay in memory.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from retriever.rag.one_run_audit import RagPowerResult, run_rag_power_cells

# The measured cells' public base collection (`dpsynth.evaluation.medical_world`) and models.
DEMO_WORLD = dict(num_records=200, num_diseases=20, symptom_pool=60, seed=0)
DEMO_LM = "smollm2-135m-instruct"
DEMO_ENCODER = "all-minilm-l6-v2"


def demo_cells(
    out_dir: str | Path,
    epsilons: Sequence[float],
    *,
    canaries: int = 1000,
    seed: int | None = None,
    log: Callable[[str], None] = print,
) -> list[RagPowerResult]:
    """The measured DP-RAG cells (see the module docstring), with the defaults of
    `retriever.rag.one_run_audit.power_config` (4-digit secrets, k = 1, tau 0.82)."""
    from dpsynth.evaluation.medical_world import MedicalWorldConfig, make_world
    from retriever.encoders import load_encoder
    from synthgen.lm_backends import FlaxLM

    world = make_world(MedicalWorldConfig(**DEMO_WORLD))
    return run_rag_power_cells(
        out_dir,
        [r.text for r in world.records],
        epsilons,
        lm=FlaxLM.load(DEMO_LM),
        encode=load_encoder(DEMO_ENCODER).encode,
        canaries=canaries,
        model=f"{DEMO_LM} + {DEMO_ENCODER}",
        seed=seed,
        progress=True,
        log=log,
    )


def generator_runners(config) -> dict[str, Callable]:
    """What `dpsynth.evaluation.audit_power.run_generators` needs from retriever for `config`
    (a `PowerAuditConfig`): the Private Evolution cells' encoder (`embed`, all-MiniLM-L6-v2)
    and the DP-RAG cells (`rag_cells`, `demo_cells`), each only when its cells are asked."""
    runners: dict[str, Callable] = {}
    if config.evolution_epsilons:
        from retriever.encoders import load_encoder

        encoder = load_encoder(DEMO_ENCODER)
        runners["embed"] = lambda batch: encoder.encode(list(batch))
    if config.rag_epsilons:
        runners["rag_cells"] = demo_cells
    return runners
