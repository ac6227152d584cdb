"""The audit-power harness: which audits see a planted leak, over the packaged presets and a
built-in medical world, cell by cell (`synthgen audit power`, `scripts/audit_power.py`)."""
