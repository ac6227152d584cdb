"""DP-RAG as a service: tenants with hashed API keys, budgets in the ledger, a bounded queue
in front of the model replicas, and one page (`retriever serve`); the same app serves a
network contributor (`contributor`) and a knowledge release (`knowledge_app`)."""
