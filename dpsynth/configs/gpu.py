"""The paper's sizes on an accelerator (Carranza et al. 2023): T5-base, batch 1024, 30 epochs.

DP-Adafactor over all local devices of one host (data parallel: `synthgen.dp_train` shards
each physical batch over `jax.local_devices()`). The pipeline runs on one host; multi-host
training is a library feature of `dp_train` (see docs/guides/scaling.md). T5 weights
do not ship on PyPI: point DPSYNTH_T5_BASE at a Hugging Face t5-base folder (config.json,
model.safetensors, spiece.model). Every wiki document; one synthetic query per train document.

    DPSYNTH_T5_BASE=/models/t5-base synthgen pipeline --config gpu
"""

import os

from dpsynth import pipeline
from dpsynth.config_files import querygen_preset


def get_config() -> pipeline.PipelineConfig:
    # The packaged querygen preset t5_base (Carranza et al.'s sizes) with a larger physical
    # batch: bfloat16 matmuls with float32 parameters, optimizer state, clipped sum and noise;
    # blocks rematerialised: the float32 step at physical batch 256 asked XLA for 121 GiB
    # on an H200 (issue 61). The clip bound holds in bfloat16 (synthgen.clip_rounding).
    generator = querygen_preset("t5_base").replace(
        base=os.environ.get("DPSYNTH_T5_BASE", "t5-base"),
        generation_batch=256,
        dtype="bfloat16",
        remat=True,
        dp_physical_batch=256,
        dp_microbatch=32,
    )
    return pipeline.PipelineConfig(
        name="gpu",
        out="runs/gpu",
        data=pipeline.DataConfig(num_documents=None),
        privacy=pipeline.PrivacyConfig(epsilon_cap=10.0),
        generate=pipeline.GenerateConfig(kind="querygen", querygen=generator),
        encoder=pipeline.EncoderConfig(
            batch_size=256, epochs=3.0, learning_rate=1e-4, max_query_len=32, max_doc_len=256
        ),
        index=pipeline.IndexConfig(kind="scann"),
        rag=pipeline.RagStageConfig(
            sample="medical-2000", questions=10, epsilon=1.0, k=8, max_tokens=16
        ),
    )
