"""The task-id rule lives in channels/seam.py (`task_id_of`, the form in `new_task_id`): every path
that names a task — the gateway, the Temporal client and workflow — and every reader of an id's
parts (`eval add`'s case names) goes through it."""

from __future__ import annotations

import ast
from pathlib import Path

import hermes_core
from hermes_core.channels.seam import InboundMessage, new_task_id, task_id_of, unique_of

ROOT = Path(hermes_core.__file__).parent


def message(message_id: str, row: int | None = None) -> InboundMessage:
    return InboundMessage("webhook", "webhook:u1", "u1", "hi", message_id, id=row)


def test_a_task_id_is_the_channel_the_message_id_and_a_part_of_its_own() -> None:
    long_id = "m~" + "x" * 80  # a client's id may hold a `~` and be long: cut at 64
    stored = message(long_id, row=7)
    assert task_id_of(stored) == new_task_id("webhook", long_id, "r7") == f"webhook:{long_id[:64]}~r7"
    assert task_id_of(stored) == stored.extra["task_id"]  # assigned once, kept with the message
    fresh = task_id_of(message("m1"))
    assert fresh.startswith("webhook:m1~") and len(unique_of(fresh) or "") == 12
    assert unique_of(task_id_of(stored)) == "r7"
    assert unique_of("3f9a0c2b71de3f9a") is None  # an agent's own id (agent.py): not of the form


def test_no_other_module_builds_a_task_id() -> None:
    """Attack: the Temporal workflow wrote its own copy of the form for a message signalled without
    a task id. A formatted string with `~` before a value is that form; only seam.py may write it."""
    found = []
    for path in sorted(ROOT.rglob("*.py")):
        if path == ROOT / "channels" / "seam.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.JoinedStr):
                continue
            parts = node.values
            for before, after in zip(parts, parts[1:], strict=False):
                if isinstance(before, ast.Constant) and str(before.value).endswith("~"):
                    if isinstance(after, ast.FormattedValue):
                        found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert found == []
