"""The main job at test size (CI): a random-init tiny Llama generator, 120 wiki documents,
DP-RAG answers by the byte-level test LM (``lm="tiny"``).

synthgen pipeline --config tiny --out /tmp/tiny-run
"""

from dpsynth import pipeline
from dpsynth.config_files import querygen_preset


def get_config() -> pipeline.PipelineConfig:
    # The packaged querygen preset tiny_llama (random init), one epoch of batch 16.
    generator = querygen_preset("tiny_llama").replace(
        max_new_tokens=8, dp_batch_size=16, dp_epochs=1.0, dp_checkpoint_every=2
    )
    rag = pipeline.RagStageConfig(
        lm="tiny", sample="medical-40", questions=2, k=3, max_tokens=3, epsilon=3.0,
        epsilon_cap=10.0,
    )  # fmt: skip
    return pipeline.PipelineConfig(
        name="tiny",
        out="runs/tiny",
        data=pipeline.DataConfig(num_documents=120),
        privacy=pipeline.PrivacyConfig(epsilon_cap=10.0),
        generate=pipeline.GenerateConfig(
            kind="querygen", querygen=generator, synthetic_documents=48
        ),
        encoder=pipeline.EncoderConfig(
            base="random:bert", batch_size=8, epochs=1.0, max_query_len=16, max_doc_len=32
        ),
        index=pipeline.IndexConfig(kind="scann"),
        rag=rag,
        report=pipeline.ReportConfig(samples=4),
    )
