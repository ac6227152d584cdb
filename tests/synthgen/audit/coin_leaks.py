"""No inclusion coin in any output file: the check of the audit-power scripts' tests.

Imported by tests/synthgen/audit/test_blackbox.py and tests/dpsynth/evaluation/test_audit_power.py.
"""

import dataclasses
import json

import numpy as np

from synthgen.audit.whitebox import HISTOGRAM_BINS, ROC_FPR


def coin_forms(coins) -> list[bytes]:
    """The forms a leaked coin vector could take in a file: bits, JSON, packed bytes."""
    coins = np.asarray(coins, bool)
    bits = "".join("1" if c else "0" for c in coins)
    packed = np.packbits(coins).tobytes()
    return [
        bits.encode(),
        bits[:64].encode(),
        json.dumps(coins.astype(int).tolist()).encode(),
        json.dumps(coins.tolist()).encode(),
        packed,
        packed.hex().encode(),
    ]


def check_no_coins(files, coins, prefix: str, result_type: type) -> list[dict]:
    """Asserts that no form of any of `coins` is in `files`, and that each `<prefix>*.json`
    cell file holds `result_type`'s fields and aggregates only; returns those records."""
    patterns = [form for c in coins for form in coin_forms(c)]
    fields = {f.name for f in dataclasses.fields(result_type)} | {"violation"}
    records = []
    for path in files:
        data = path.read_bytes()
        for pattern in patterns:
            assert pattern not in data, path.name
        if path.suffix == ".json" and path.name.startswith(prefix):
            record = json.loads(data)
            assert set(record) == fields
            # aggregates: a ROC at fixed FPRs and binned histograms, no list per canary
            for stats in record["stats"]:
                lengths = {len(v) for v in stats.values() if isinstance(v, list)}
                assert lengths <= {len(ROC_FPR), HISTOGRAM_BINS, HISTOGRAM_BINS + 1}
            records.append(record)
    return records
