"""Who may run which tool (T4). The model proposes; this code decides.

Every tool call passes `ToolRegistry.execute`, which asks `Policy.refusal` before anything else:
a refused call is never executed, whatever its arguments, its wording or the number of attempts;
the model reads "you do not have permission to call X" and the refusal is logged. The same check
decides which tools are offered at all, so the model is not even shown what it cannot use.

- roles: per identity, from configuration (`admins`, `roles`) or a callback; "member" by default.
  A tool with `required_role` runs only for that role (admins may run everything a role may).
- identities are qualified by channel: `feishu:ou_abc` is the Feishu user `ou_abc`, and a webhook
  caller who sends `user_id: "ou_abc"` is `webhook:ou_abc`, someone else. Every list and every
  comparison (roles, who decides an approval, whose answer a question gets) uses the qualified
  form, so one channel's ids cannot be claimed through another. An entry without a channel is an
  error at start-up, never guessed.
- levels: 0 read-only, 1 reversible write, 2 irreversible. Level-2 tools run only when the
  configuration names them in `allow_irreversible`; non-interactive (batch) runs mount only
  levels up to `batch_max_level` (1).
- `allowed_models`: a tool may be limited to some models.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .declare import Tool

ADMIN = "admin"
MEMBER = "member"
_QUALIFIED = re.compile(r"^[a-z][a-z0-9_-]*:.+$")


def qualified(channel: str, user_id: str) -> str:
    """The identity `user_id` has on `channel`: `feishu:ou_abc`, `webhook:u1`, `terminal:alice`."""
    return f"{channel}:{user_id}"


def unqualified(entries: Iterable[str]) -> list[str]:
    """The entries that name no channel (`ou_abc` rather than `feishu:ou_abc`)."""
    return [entry for entry in entries if not _QUALIFIED.match(entry)]


@dataclass(frozen=True)
class Caller:
    """The person a task runs for, as the channel identified them."""

    user_id: str = ""
    role: str = MEMBER
    channel: str = ""
    interactive: bool = True
    preapproved: tuple[str, ...] = ()  # tools approved in advance (a job an admin made: gateway/runner.py)
    withheld: tuple[str, ...] = ()  # tools not offered to this turn (a fired job's: gateway/runner.py)

    @property
    def identity(self) -> str:
        """`channel:user_id` (`:user_id` when no channel is named: a library caller's own namespace,
        never an admin's), or "" for nobody in particular."""
        return qualified(self.channel, self.user_id) if self.user_id else ""


NOBODY = Caller()  # a call with no caller named (read only)


@dataclass
class Policy:
    admins: frozenset[str] = frozenset()  # qualified identities: "feishu:ou_abc"
    roles: Mapping[str, str] = field(default_factory=dict)  # qualified identity → custom role
    role_of: Callable[[str, str], str | None] | None = None  # (channel, user id) → role, overrides the lists
    allow_irreversible: frozenset[str] = frozenset()  # level-2 tools the operator explicitly allows
    batch_max_level: int = 1

    def __post_init__(self) -> None:
        bare = unqualified([*self.admins, *self.roles])
        if bare:
            raise ValueError(
                f"permissions: {', '.join(map(repr, bare))} names no channel; write the channel before "
                f"the id, e.g. 'feishu:{bare[0]}' or 'webhook:{bare[0]}'"
            )

    @classmethod
    def from_lists(
        cls,
        admins: Iterable[str] = (),
        roles: Mapping[str, str] | None = None,
        allow_irreversible: Iterable[str] = (),
        batch_max_level: int = 1,
    ) -> Policy:
        return cls(frozenset(admins), dict(roles or {}), None, frozenset(allow_irreversible), batch_max_level)

    def caller(self, user_id: str, channel: str = "", *, interactive: bool = True) -> Caller:
        """Resolve a user's role on `channel`: the callback first, then the admin list, then custom
        roles, both keyed by the qualified identity. No id or no channel: a member."""
        role = self.role_of(channel, user_id) if self.role_of is not None else None
        if role is None:
            identity = qualified(channel, user_id) if user_id and channel else ""
            role = ADMIN if identity in self.admins else self.roles.get(identity, MEMBER)
        return Caller(user_id, role, channel, interactive)

    def refusal(self, tool: Tool, caller: Caller | None, model: str) -> str | None:
        """Why `caller` may not run `tool` through `model`, or None if it may."""
        caller = caller or NOBODY
        if tool.level >= 2 and tool.name not in self.allow_irreversible:
            why = ": irreversible tools are disabled unless the operator allows them"
        elif not caller.interactive and tool.level > self.batch_max_level:
            why = " in a non-interactive run"
        elif tool.required_role and caller.role not in (tool.required_role, ADMIN):
            why = f": it requires the {tool.required_role} role"
        elif tool.allowed_models and model not in tool.allowed_models:
            why = " with this model"
        elif tool.name in caller.withheld:
            why = " in this turn"
        else:
            return None
        return f"you do not have permission to call {tool.name}{why}"
