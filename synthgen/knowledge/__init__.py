"""A private collection's knowledge, released once (DP-SynRAG, Mori et al. 2025).

Keywords by PipelineDP's partition selection, soft clusters, DP few-shot records per
cluster, self-filtering: `release_knowledge`. Every question after the release is ordinary
RAG over its records, at no further privacy cost (post-processing).
"""

from synthgen.knowledge.config import DEFAULT_PUBLIC_EXAMPLE, KnowledgeConfig
from synthgen.knowledge.plan import KnowledgePlan, plan_release
from synthgen.knowledge.release import KnowledgeRelease, release_knowledge

__all__ = [
    "DEFAULT_PUBLIC_EXAMPLE",
    "KnowledgeConfig",
    "KnowledgePlan",
    "KnowledgeRelease",
    "plan_release",
    "release_knowledge",
]
