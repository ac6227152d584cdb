"""The main job: private pairs -> DP synthetic queries -> dual encoder -> index -> DP-RAG answers
-> report, one resumable stage at a time (`synthgen pipeline --config demo`).

This is the application layer: it may import both `synthgen` and `retriever`.
"""

from dpsynth.pipeline.config import (
    DataConfig,
    EncoderConfig,
    EvaluateConfig,
    GenerateConfig,
    IndexConfig,
    PipelineConfig,
    PrivacyConfig,
    RagStageConfig,
    ReportConfig,
    load_pipeline_config,
)
from dpsynth.pipeline.context import (
    STAGES,
    RunFolder,
    StageNotReadyError,
    fingerprints,
    stage_status,
)

__all__ = [
    "STAGES",
    "DataConfig",
    "EncoderConfig",
    "EvaluateConfig",
    "GenerateConfig",
    "IndexConfig",
    "PipelineConfig",
    "PrivacyConfig",
    "RagStageConfig",
    "ReportConfig",
    "RunFolder",
    "StageNotReadyError",
    "fingerprints",
    "load_pipeline_config",
    "run_pipeline",
    "run_stage",
    "stage_status",
]


def __getattr__(name: str):
    """`run_pipeline` and `run_stage` load the runner, which imports every stage and the
    numeric libraries, on first use: `synthgen pipeline status` reads a config without them."""
    if name in ("run_pipeline", "run_stage"):
        from dpsynth.pipeline import runner

        return getattr(runner, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
