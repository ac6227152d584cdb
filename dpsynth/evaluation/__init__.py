"""Evaluation worlds and harnesses, which no library imports.

The worlds: a fictional medical collection (`medical_world`), templated fact worlds
(`fact_world`) and natural-text ones (`natural_world`), each with questions and their
answers. The harnesses: DP-RAG over a world (`rag_eval`, `stream_eval`, `release_eval`,
`single_fact_eval`) and the audit-power table over the packaged presets (`audit_power`,
`querygen_audit_power`, `rag_audit_power_cells`; `synthgen audit power`).
"""
