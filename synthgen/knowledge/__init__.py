"""A private collection's knowledge, released once: the fact release.

`release_facts` publishes the facts many records state, by DP set union over typed facts (a
subject and a value, `synthgen.knowledge.typed_facts`) or pairs of key phrases
(`synthgen.knowledge.phrases`); every question after the release is answered from its
records at no further privacy cost (post-processing). The cluster release (DP-SynRAG, Mori
et al. 2025: DP keywords, soft clusters, DP few-shot records per cluster) was retired after
losing to it on every world measured (docs/guides/knowledge.md).
"""

from synthgen.knowledge.facts import FactConfig, FactPlan, plan_facts, release_facts

__all__ = [
    "FactConfig",
    "FactPlan",
    "plan_facts",
    "release_facts",
]
