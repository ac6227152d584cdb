"""Test helper: a byte-level copying LM, the planted-leak model of the few-shot audits.

Imported by tests/synthgen/audit/test_fewshot_audit.py and test_release_audit.py.
"""

import numpy as np

from synthgen.lm_backends import TinyLM


class CopyLM(TinyLM):
    """Byte-level copy model: p(b | context) ∝ floor + count of b after the longest suffix
    (up to 8 bytes) of the context that occurs earlier in it. A key seen in a shot is
    followed, in the prompt, by its secret, so the prompt's examples are copied verbatim."""

    def _logprobs(self, row):
        data = bytes(t for t in row if t < 256)
        counts = np.full(self.vocab_size, self.floor)
        counts[[self.BOS, self.PAD]] = 0.0
        for n in (8, 4, 2, 1):
            if len(data) <= n:
                continue
            suffix, start, found = data[-n:], 0, False
            while (i := data.find(suffix, start, len(data) - 1)) >= 0:
                counts[data[i + n]] += 1.0
                start, found = i + 1, True
            if found:
                break
        with np.errstate(divide="ignore"):
            return np.log(counts / counts.sum()).astype(np.float32)
