"""Empirical privacy audits: canaries, exposure, membership inference, one-run epsilon bounds.

Modules:
  canaries: canary (document, query) pairs, each included with probability 1/2; the record
    of what was inserted stays in the private work folder.
  exposure: scoring secrets under a trained generator, rank and exposure (Carlini et al.
    2019), the skew-normal extrapolation, and greedy extraction.
  auditor: membership AUC, TPR at low FPR and empirical epsilon lower bounds (one-run and
    Clopper-Pearson) from in/out canary scores: a thin adapter over jax-privacy's
    `CanaryScoreAuditor` (validation, the ROC points, the verdict against a claim).
  querygen_audit: `synthgen audit run` for the DP query generator.
  fewshot_audit: the same questions for the few-shot generator (the DP-RAG canary audit is
    `retriever.rag.canary_audit`: synthgen never imports retriever).
  report: audit.json, the Markdown table and the plots.
"""
