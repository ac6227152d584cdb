"""The main job at test size (CI): a random-init tiny Llama generator, 120 wiki documents.

synthgen pipeline --config tiny --out /tmp/tiny-run
"""

from dpsynth.pipeline.config import (
    DataConfig,
    EncoderConfig,
    GenerateConfig,
    IndexConfig,
    PipelineConfig,
    PrivacyConfig,
    RagStageConfig,
    ReportConfig,
)
from synthgen.dp_train import DPConfig
from synthgen.querygen import GeneratorConfig


def get_config() -> PipelineConfig:
    generator = GeneratorConfig(
        family="llama",
        base="random:tiny",
        vocab_size=512,
        input_len=64,
        target_len=16,
        max_new_tokens=8,
        generation_batch=32,
        dp=DPConfig(
            batch_size=16,
            epochs=1.0,
            clip_norm=1.0,
            learning_rate=1e-2,
            target_epsilon=8.0,
            physical_batch=16,
            microbatch=8,
            checkpoint_every=2,
        ),
    )
    return PipelineConfig(
        name="tiny",
        out="runs/tiny",
        data=DataConfig(num_documents=120),
        privacy=PrivacyConfig(epsilon_cap=10.0),
        generate=GenerateConfig(kind="querygen", querygen=generator, synthetic_documents=48),
        encoder=EncoderConfig(
            base="random:bert", batch_size=8, epochs=1.0, max_query_len=16, max_doc_len=32
        ),
        index=IndexConfig(kind="scann"),
        rag=RagStageConfig(
            num_records=40,
            num_diseases=5,
            questions=2,
            k=3,
            max_tokens=3,
            epsilon=3.0,
            epsilon_cap=10.0,
        ),
        report=ReportConfig(samples=4),
    )
