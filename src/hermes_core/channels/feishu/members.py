"""Members' names, for the speaker labels of group turns (events.py `speaker_label`).

The message event carries the sender's open_id, not their name. The contact API gives it
(`GET /open-apis/contact/v3/users/:user_id?user_id_type=open_id`, scope
`contact:user.base:readonly`, and the member inside the app's contact range: open.feishu.cn/
document/server-docs/contact-v3/user/get). It is asked when a turn runs, never on the ack path;
one attempt with a short timeout, and each answer is kept for an hour — a refusal (no scope, a
member outside the range) or a timeout for ten minutes — so a group turn costs at most one call
per member per hour, and a bot without the scope still answers, with the member's id only.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .api import FeishuAPI

log = logging.getLogger("hermes_core.feishu")


class MemberNames:
    def __init__(
        self,
        api: FeishuAPI,
        *,
        keep: float = 3600.0,
        keep_failure: float = 600.0,
        timeout: float = 2.0,
        size: int = 10_000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.api, self.keep, self.keep_failure, self.timeout = api, keep, keep_failure, timeout
        self.size, self.clock = size, clock
        self._names: OrderedDict[str, tuple[str, float]] = OrderedDict()  # open_id → (name, until)

    async def name_of(self, open_id: str) -> str:
        """The member's name, or "" when the platform does not give it (never raises)."""
        from .api import FeishuError

        known = self._names.get(open_id)
        if known is not None and known[1] > self.clock():
            return known[0]
        try:
            name, keep = await asyncio.wait_for(self.api.user_name(open_id), self.timeout), self.keep
        except (FeishuError, asyncio.TimeoutError) as exc:
            log.info("feishu: no name for %s (%s); the model sees the id only", open_id, exc or "timeout")
            name, keep = "", self.keep_failure
        self._names[open_id] = (name, self.clock() + keep)
        self._names.move_to_end(open_id)
        while len(self._names) > self.size:
            self._names.popitem(last=False)
        return name
