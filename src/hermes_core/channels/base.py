"""The one extension point for channels: deliver an outbound message, start and stop."""

from __future__ import annotations

from abc import ABC, abstractmethod

from ..gateway.messages import OutboundMessage


class DeliveryError(Exception):
    """A send failed. `retry_after` (seconds) is set when trying again later may succeed."""

    def __init__(self, message: str, *, retry_after: float | None = None, permanent: bool = False) -> None:
        super().__init__(message)
        self.retry_after = retry_after
        self.permanent = permanent


class Channel(ABC):
    name: str = "channel"

    @abstractmethod
    async def send(self, message: OutboundMessage) -> str | None:
        """Deliver one message; return the platform's id for it. Raise DeliveryError on failure."""

    async def start(self) -> None:
        """Connect, fetch what the channel needs (e.g. the bot's own id). Default: nothing."""
        return None

    async def stop(self) -> None:
        """Close connections. Safe to call more than once."""
        return None
