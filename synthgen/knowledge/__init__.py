"""A private collection's knowledge, released once.

The default is the fact release (`release_facts`): DP set union over typed facts (a subject
and a value, `synthgen.knowledge.typed_facts`).
The DP-SynRAG release (Mori et al. 2025) stays available:

Keywords by PipelineDP's partition selection, soft clusters, DP few-shot records per
cluster, self-filtering: `release_knowledge`. Every question after the release is ordinary
RAG over its records, at no further privacy cost (post-processing).
"""

from synthgen.knowledge.config import (
    DEFAULT_PUBLIC_EXAMPLE,
    MEDICAL_FIELD_VALUES,
    MEDICAL_FIELDS,
    MEDICAL_PUBLIC_EXAMPLE,
    KnowledgeConfig,
)
from synthgen.knowledge.facts import FactConfig, FactPlan, plan_facts, release_facts
from synthgen.knowledge.plan import KnowledgePlan, plan_release
from synthgen.knowledge.release import KnowledgeRelease, release_knowledge

__all__ = [
    "DEFAULT_PUBLIC_EXAMPLE",
    "MEDICAL_FIELDS",
    "MEDICAL_FIELD_VALUES",
    "MEDICAL_PUBLIC_EXAMPLE",
    "FactConfig",
    "FactPlan",
    "plan_facts",
    "release_facts",
    "KnowledgeConfig",
    "KnowledgePlan",
    "KnowledgeRelease",
    "plan_release",
    "release_knowledge",
]
