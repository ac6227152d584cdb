"""A byte-level test LM whose forks share one record of what the answer loop gave them."""

from synthgen.lm_backends import TinyLM


class RecordingLM(TinyLM):
    """TinyLM whose forks append to one shared list, `seen`.

    The answer loop forks its LM for each session (the public prompt's, the private rows'),
    so a record kept per instance would miss them; a subclass says what it records by
    overriding `start` (and `append`) to add to `self.seen`.
    """

    def __init__(
        self, seen: list | None = None, floor: float = 1e-3, eos_after_newline: float = 0.0
    ):
        super().__init__(floor, eos_after_newline)
        self.seen = [] if seen is None else seen

    def fork(self):
        return type(self)(self.seen, self.floor, self.eos_after_newline)
