"""Answer text a person can read: no replacement characters, no control characters.

A byte-level BPE can end a released sequence in the middle of a multi-byte character (or
release byte tokens that never form one); the decoder then writes U+FFFD.
`clean_answer_text` drops those and any control character (post-processing).
"""

from __future__ import annotations

import re
import unicodedata

REPLACEMENT_CHARACTER = "\ufffd"


def is_unreadable_char(char: str) -> bool:
    """U+FFFD, or a control/format/unassigned/surrogate character other than whitespace."""
    if char == REPLACEMENT_CHARACTER:
        return True
    if char in "\n\t ":
        return False
    return unicodedata.category(char) in ("Cc", "Cf", "Cn", "Cs", "Co")


def unreadable_count(text: str) -> int:
    """How many characters of `text` are U+FFFD or control characters."""
    return sum(is_unreadable_char(c) for c in text)


def clean_answer_text(text: str) -> str:
    """`text` without U+FFFD or control characters, whitespace runs collapsed, stripped."""
    kept = "".join(c for c in text if not is_unreadable_char(c))
    return re.sub(r"\s+", " ", kept).strip()
