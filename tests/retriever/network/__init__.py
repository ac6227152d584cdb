"""Tests of the privacy-preserving retrieval network (`retriever.network`)."""
