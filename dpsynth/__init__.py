"""The application over the two libraries: the command lines, the main job, the services.

`dpsynth` stands on `synthgen` (DP generators, the privacy core) and `retriever` (retrieval,
DP-RAG), which never import it: the `synthgen` and `retriever` console scripts
(`dpsynth.cli`), the main job (`dpsynth.pipeline`), the HTTP apps (`dpsynth.service`), the
packaged presets (`dpsynth.configs`, loaded by `dpsynth.config_files`) and the audit-power
harness (`dpsynth.evaluation`).
"""
