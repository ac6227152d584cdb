"""Retrieval on DP synthetic data: dual encoders, metrics, ScaNN index, DP-RAG."""
