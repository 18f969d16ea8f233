"""How long what the service stores is kept: every store's pruning by age, in one table.

| what | setting | default |
|---|---|---|
| conversation history, long-term outcomes | `memory.retention_days` | 365 |
| files users sent (`<workspace>/<media.folder>/`) | `media.retention_days` | 30 |
| task journals, traces, scheduled jobs' fires | `gateway.retention_days` | 30 |
| inbox dedup keys and finished rows | fixed (`DEDUP_RETENTION`, 48 h) | |

History goes message by message; a conversation's notes and summary go once it has no message
left and no change since. `serve` runs them hourly on the stores it already holds (`pruners`);
the `prune` command runs them once on stores it opens (`prune_now`), for an operator who wants it
now or from cron, and for the engine temporal, whose processes do not prune history themselves.
`null` keeps that kind forever.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .config import Settings
    from .memory.conversation import ConversationMemory

DAY = 86400.0
Prune = Callable[[float], Awaitable[Any]]  # deletes what is older than a UNIX time; a count or None


@dataclass(frozen=True)
class Kept:
    """One kind of record, its setting and how long it is kept (None: forever)."""

    what: str
    setting: str
    days: float | None


def kinds(settings: Settings) -> dict[str, Kept]:
    history, uploads, records = (
        settings.memory.retention_days, settings.media.retention_days, settings.gateway.retention_days,
    )  # fmt: skip
    return {
        "history": Kept("conversation history and long-term memory", "memory.retention_days", history),
        "uploads": Kept("files users sent", "media.retention_days", uploads),
        "journal": Kept("task journals", "gateway.retention_days", records),
        "traces": Kept("traces", "gateway.retention_days", records),
        "fires": Kept("scheduled jobs' fires", "gateway.retention_days", records),
    }


def uploads_pruner(settings: Settings) -> Prune | None:
    """The uploads' pruning, in a thread (a walk of the folder), or None without a workspace."""
    if not settings.agent.workspace:
        return None
    from .config import workspace_of

    space = workspace_of(settings)
    return lambda older_than: asyncio.to_thread(space.prune_private, older_than)


def pruners(settings: Settings, owners: dict[str, Prune | None]) -> list[Callable[[], Awaitable[None]]]:
    """For serve's hourly pruning: each of `owners` (by kind) that is kept for a limited time."""
    limits = kinds(settings)

    def pruner(prune: Prune, days: float) -> Callable[[], Awaitable[None]]:
        async def run() -> None:
            await prune(time.time() - days * DAY)

        return run

    return [
        pruner(prune, days)
        for kind, prune in owners.items()
        if prune is not None and (days := limits[kind].days) is not None
    ]


async def prune_now(settings: Settings) -> list[str]:
    """`hermes-kernel prune`: every kind pruned once by its setting; one line each for the operator."""
    from . import stores
    from .gateway.dispatcher import DEDUP_RETENTION
    from .gateway.server import build_memory

    lines, now = [], time.time()
    gateway = stores.gateway_store(settings)
    memory: ConversationMemory = build_memory(settings)
    journal, traces, fires = (
        stores.task_journal(settings),
        stores.trace_store(settings),
        stores.schedule_store(settings),
    )
    owners: dict[str, Prune | None] = {
        "history": memory.prune, "uploads": uploads_pruner(settings), "journal": journal.prune,
        "traces": traces.prune, "fires": fires.prune,
    }  # fmt: skip
    try:
        for kind, kept in kinds(settings).items():
            prune = owners[kind]
            if prune is None:
                lines.append(f"{kept.what}: none here (no agent.workspace)")
            elif kept.days is None:
                lines.append(f"{kept.what}: kept ({kept.setting} is null)")
            else:
                count = await prune(now - kept.days * DAY)
                gone = "deleted" if count is None else f"{count:,} deleted"
                lines.append(f"{kept.what} older than {kept.days:g} days ({kept.setting}): {gone}")
        await gateway.prune(now - DEDUP_RETENTION)
        lines.append(f"inbox dedup keys and finished rows older than {DEDUP_RETENTION / 3600:g} h: deleted")
    finally:
        for store in (gateway, memory, journal, traces, fires):
            await store.close()
    return lines


__all__ = ["Kept", "kinds", "prune_now", "pruners", "uploads_pruner"]
