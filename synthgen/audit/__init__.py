"""Empirical privacy audits: canaries, exposure, membership inference, one-run epsilon bounds.

Canary audits of the query generator (`querygen_audit`, `synthgen audit run`; `blackbox`),
the DP-SGD step (`whitebox`), the few-shot generator (`fewshot_audit`,
`fewshot_release_audit`), Private Evolution (`evolution_release_audit`) and a fact release
(`fact_release`), on one cell loop (`cells`), one figures record (`whitebox.CellResult`)
and jax-privacy's auditor (`auditor`, `whitebox.score_stats`). The DP-RAG audits are in
`retriever.rag` (synthgen never imports retriever). See docs/guides/audits.md.
"""
