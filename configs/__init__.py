"""Presets (frozen dataclasses): tiny for tests, CPU demo, GPU/TPU sizes, added per stage."""
