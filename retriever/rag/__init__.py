"""Online DP-RAG answer stage: DP retrieval thresholds, DP answer tokens, per-answer
accounting, and the `DPRag` object that charges each answer to a tenant's budget."""

from retriever.rag.aggregation import AggregationConfig, dp_icl_token
from retriever.rag.answer import DPRag, RagConfig
from retriever.rag.answer_types import Answer, StageCharge
from retriever.rag.plan import AnswerPlan, make_plan
from retriever.rag.prompts import PromptFormat
from retriever.rag.retrieval import ScoreRange, dp_top_k_threshold, dp_top_p_threshold, select

__all__ = [
    "AggregationConfig",
    "Answer",
    "AnswerPlan",
    "DPRag",
    "PromptFormat",
    "RagConfig",
    "ScoreRange",
    "StageCharge",
    "dp_icl_token",
    "dp_top_k_threshold",
    "dp_top_p_threshold",
    "make_plan",
    "select",
]
