"""The two command lines, `synthgen` and `retriever`, one package each, and the writer of
their options reference (`reference`)."""
