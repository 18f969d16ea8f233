"""Arguments as an approver reads them: inert text, the same on every channel.

An approval is only as good as what the person approving reads. A model can write arguments that
display as something else: a right-to-left override (U+202E) reorders what follows it (Unicode
TR9; the "Trojan Source" attack, CVE-2021-42574), a zero-width character hides inside a word.
`visible` writes out every format (Cf) and control (Cc) character and the line and paragraph
separators (Zl, Zp) as `<U+202E>`; `shown_arguments` makes a call's arguments one line of JSON that
way. The gateway applies it to every approval request it sends (gateway/server.py), the Feishu card
shows the arguments in a code block besides (channels/feishu/formatting.py), the console's pages
and the terminal's prompt use it too. A few lines of the standard library: no package does this.
"""

from __future__ import annotations

import json
import unicodedata

from ..kernel.messages import JSON

_UNSEEN = frozenset({"Cf", "Cc", "Zl", "Zp"})


def visible(text: str, *, lines: bool = False) -> str:
    """`text` with every unseen character written out (`<U+202E>`); `lines`: newlines stay."""
    kept = "\n" if lines else ""
    return "".join(
        f"<U+{ord(c):04X}>" if unicodedata.category(c) in _UNSEEN and c not in kept else c for c in text
    )


def shown_arguments(arguments: JSON) -> str:
    """A call's arguments as one line of JSON (a parsed object, or the model's text re-read when it
    is JSON, else as written), every unseen character written out."""
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            return visible(arguments)
    return visible(json.dumps(arguments, ensure_ascii=False))
