"""Flax language models (T5, Llama), tokenizers, LoRA and KV-cache decoding."""
