"""What the fact-world scripts share: a world by its domain's name, and one row per question.

`scripts/fact_world_eval.py` and `scripts/clusters_vs_facts.py` import it as a sibling module
(a script's own folder is first on `sys.path`).
"""

from __future__ import annotations


def make_fact_world(domain: str, seed: int, **sizes):
    """(the world, its answer check): templated or natural text, by the domain's name.

    Args:
        domain: a domain of `dpsynth.evaluation.natural_world.DOMAINS` (natural text) or of
            `dpsynth.evaluation.fact_world` (templated text).
        seed: the world's seed.
        **sizes: passed on to the world's maker (e.g. ``facts_per_level``).
    """
    from dpsynth.evaluation import fact_world, natural_world

    if domain in natural_world.DOMAINS:
        world = natural_world.make_natural_world(domain, seed=seed, **sizes)
        return world, natural_world.natural_answer_is_right
    return fact_world.make_world(domain, seed=seed, **sizes), fact_world.answer_is_right


def answer_rows(world, answer, is_right) -> list[dict]:
    """One row per question of `world`: its support, whether `answer` (question -> an answer
    with ``answer`` and ``abstained``) got it right, and whether it abstained."""
    rows = []
    for q in world.questions:
        found = answer(q.question)
        rows.append(
            {
                "support": q.support,
                "right": bool(q.answer) and is_right(found.answer, q.answer),
                "abstained": bool(found.abstained),
            }
        )
    return rows
