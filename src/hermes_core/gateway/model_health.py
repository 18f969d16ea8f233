"""Does the model take serve's key? Watched from start-up on, so that a wrong key shows where an
operator looks instead of in every user's apology.

- Once `serve` listens it probes the endpoint in the background (models/probe.py: the request
  `doctor` makes, cut after 10 s): start-up never waits for it.
- A refused key (401/403) or an unknown model makes `model` a degraded component: GET /healthz lists
  it (still 200), GET /metrics has `hermes_degraded{component="model"} 1`, the console's status has
  it (`Gateway.status()`), and one ERROR line says so. The detail names the variable to fix
  (HERMES_API_KEY, or the provider's key variable), never the key.
- Meanwhile a turn the model refuses is answered with `MISCONFIGURED` in the user's language: the
  bot's model access is misconfigured and the administrator has been told. Asking the user to
  rephrase (the kernel's `model_rejected` reply) would send them after a fault that is not theirs.
- Every model call of every task is watched too (`ModelHealth` is a `TaskHooks` observer, told by the
  loop): an answer clears the state, a refused key or unknown model sets it (a key revoked while
  serve runs). While degraded the probe runs again every `REPROBE_INTERVAL` seconds, so a fixed
  endpoint (a key topped up, a model pulled) clears it without any user writing.

Other failures (no answer, a 5xx) are outages, not configuration: they are retried by the client
and answered with the "temporarily unavailable" reply, and do not mark the model degraded here.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from ..kernel.hooks import TaskHooks
from ..kernel.messages import JSON, ModelResponse
from ..kernel.model import ModelRequestRejected
from ..kernel.redaction import default_redactor
from ..kernel.replies import Language
from ..models.probe import PROBE_TIMEOUT, ProbeResult, probe_model, rejection
from ..models.providers import Endpoint

log = logging.getLogger("hermes_core.model")
REPROBE_INTERVAL = 60.0  # seconds between probes while the model is degraded

MISCONFIGURED: dict[Language, str] = {
    "zh": "抱歉，机器人访问模型服务的配置有误，暂时无法回答。管理员已收到通知，修复后即可恢复。",
    "en": "Sorry, this bot's access to its model service is misconfigured, so I cannot answer right now. "
    "The administrator has been told; it will work again once that is fixed.",
}


class ModelHealth(TaskHooks):
    """The model's state as `serve` last saw it: None, or the probe result that found it misconfigured."""

    def __init__(
        self, endpoint: Endpoint, *, interval: float = REPROBE_INTERVAL, timeout: float = PROBE_TIMEOUT
    ) -> None:
        self.endpoint = endpoint
        self.interval = interval
        self.timeout = timeout
        self.problem: ProbeResult | None = None
        self.since = 0.0  # when the problem was first seen
        self.probes = 0  # probes made, the first one included
        self._watcher: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Probe now, in the background, and again every `interval` while degraded."""
        self._watcher = asyncio.create_task(self._watch())

    async def stop(self) -> None:
        if self._watcher is not None:
            self._watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watcher

    async def probe(self) -> ProbeResult:
        found = await probe_model(self.endpoint, timeout=self.timeout)
        self.probes += 1
        if found.verdict in ("rejected", "unreachable"):  # says nothing about the key or the model
            log.warning("model probe: %s", self._redacted(found.detail))
        self._record(found)
        return found

    def degraded(self) -> list[dict[str, JSON]]:
        """The `model` component for /healthz while the key or the model is refused; else nothing."""
        if self.problem is None:
            return []
        return [{"component": "model", "detail": self._redacted(self.problem.detail),
                 "fix": self.problem.fix, "since": round(self.since, 3), "probes": self.probes}]  # fmt: skip

    def apology(self, language: Language) -> str | None:
        """What a user whose turn the model refused reads while it is misconfigured; None otherwise."""
        return MISCONFIGURED[language] if self.problem is not None else None

    async def on_model_end(self, response: ModelResponse | None, error: BaseException | None) -> None:
        if response is not None:
            self._record(ProbeResult("ok", "a model call was answered"))
        elif isinstance(error, ModelRequestRejected):
            self._record(rejection(self.endpoint, error))

    async def _watch(self) -> None:
        while True:
            try:
                await self.probe()
            except Exception:  # a probe must never take serve down
                log.exception("model probe failed")
            await asyncio.sleep(self.interval)
            while self.problem is None:  # healthy: probed again only once a refused call degrades it
                await asyncio.sleep(self.interval)

    def _record(self, found: ProbeResult) -> None:
        if found.misconfigured and self.problem is None:
            self.since = time.time()
            log.error("model degraded: %s — %s; users are told the bot is misconfigured until it works",
                      self._redacted(found.detail), found.fix)  # fmt: skip
        elif found.verdict == "ok" and self.problem is not None:
            log.info("model recovered: %s", found.detail)
        if found.misconfigured:
            self.problem = found
        elif found.verdict == "ok":
            self.problem = None

    @staticmethod
    def _redacted(text: str) -> str:
        return default_redactor().redact(text)  # an endpoint's own words may quote the key


__all__ = ["MISCONFIGURED", "REPROBE_INTERVAL", "ModelHealth"]
