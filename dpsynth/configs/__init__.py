"""The packaged example configs: Python files loaded by path, shipped inside the wheel.

`demo.py`, `tiny.py` and `gpu.py` are pipeline configs (`get_config() -> PipelineConfig`);
`querygen.py` holds the query-generator presets (`PRESETS`). They live in the package so a
non-editable install has them; `dpsynth.config_files` finds them here and loads them by
path, as it loads a user's copy (`synthgen pipeline init demo`, then `--config demo.py`).
Nothing imports these files as modules of this package; a pipeline config starts from a
`querygen.py` preset (`config_files.querygen_preset`) and changes only what differs.
"""
