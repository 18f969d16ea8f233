"""The gateway node's side of `engine: temporal`: `TemporalInbox` is what the channels are given
instead of the embedded `Gateway` (channels/seam.py `Inbox`), so the webhook and Feishu channels
work unchanged on any number of nodes.

- `accept`: signal-with-start of the conversation's workflow (id: the conversation key). It is
  durable once it returns and needs no worker, so acks stay fast while workers are busy or down.
  Duplicates are dropped by the workflow, whichever node they reached (workflow.py), so `accept`
  never answers None: a webhook retry of a message id then waits for that message's reply.
  With the cluster down or restarting, `accept` gives up after `ACCEPT_TIMEOUT` (`NotAccepted`):
  the channel answers 503 within the platform's deadline and the platform delivers it again.
- The webhook's synchronous answer: the reply is recorded in the workflow, and the node that holds
  the request reads it with the `replies` query and hands it to its channel's waiter; a reply
  whose text the workflow no longer carries (an older one, workflow.py `carried`) is read from
  the stored turn (`stored_reply`, state.py).
- `decide`: the `decide` update of the workflow the approval id names; its validator refuses what
  `DecisionRefused` refuses (who may decide, expiry, decided already), from any node.
- Signed webhook requests taken once (`claim_nonce`): remembered by this node only; a replay sent
  to another node within the signature window is a new message id only if the client chose none
  (docs/scale-out.md, limits).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import sys
import time
from collections.abc import Awaitable, Callable
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from ...channels.seam import Earlier, InboundMessage, OutboundMessage, task_id_of
from .activities import conversation_of
from .workflow import DECIDE, REPLIES_QUERY, RESEND, SIGNAL, STATUS_QUERY, SYNCHRONOUS, WORKFLOW, Options

if TYPE_CHECKING:
    from temporalio.client import Client
    from temporalio.service import TLSConfig

    from ...channels.base import Channel
    from ...config import TemporalConfig
    from ...kernel.approvals import Pending
    from ...kernel.tools.permissions import Policy

log = logging.getLogger("hermes_core.engine.temporal")
REFUSALS = ("approval_unknown", "approval_not_allowed", "approval_expired", "approval_already_decided")
WORKFLOW_TASK_TIMEOUT = 3.0  # seconds: a workflow task of a worker that died is given to another one
ACCEPT_TIMEOUT = 2.5  # seconds for the signal-with-start, within Feishu's 3 s: past it a 503, and a retry


def leave(code: int) -> NoReturn:
    """End a `serve` or `worker` process of this engine with `code`, logs and output flushed, but
    without the interpreter's teardown: the SDK's native threads may still be running then, and
    finalizing under them aborts the process (temporalio/sdk-python issue 300, open)."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


class NotAccepted(RuntimeError):
    """The cluster did not take a message in time: the channel answers 503, the sender retries."""


class Unreachable(Exception):
    """The configured Temporal cluster cannot be reached (said in one line by the commands)."""


async def connect(config: TemporalConfig) -> Client:
    """A client of the configured cluster (`temporal.address`, `temporal.namespace`); `Unreachable`
    saying where and why when there is none."""
    from temporalio.client import Client

    try:
        tls, api_key = credentials(config)
        return await Client.connect(config.address, namespace=config.namespace, tls=tls, api_key=api_key)
    except OSError as exc:  # a certificate or key file that cannot be read
        raise Unreachable(f"cannot read temporal.tls's {exc.filename}: {exc.strerror}") from None
    except RuntimeError as exc:  # the SDK's "Failed client connect: …"
        reason = " ".join(str(exc).split())[:300]
        raise Unreachable(
            f"cannot reach Temporal at {config.address} (namespace {config.namespace}): {reason}"
        ) from None


def workflow_options(config: TemporalConfig) -> dict[str, Any]:
    """The `Options` every conversation workflow starts with (workflow.py)."""
    fields = {f.name for f in dataclasses.fields(Options)}
    return {name: value for name, value in config.model_dump().items() if name in fields}


class TemporalInbox:
    """The channels' `Inbox` on a gateway node of `engine: temporal`."""

    def __init__(
        self,
        client: Client,
        config: TemporalConfig,
        policy: Policy,
        *,
        reply_timeout: float = 120.0,
        stored_reply: Callable[[str, str], Awaitable[str | None]] | None = None,
    ):
        self.client, self.config, self.policy = client, config, policy
        self.reply_timeout = reply_timeout
        self.stored_reply = stored_reply  # (conversation, task id) → the stored turn's reply
        self.accepting = False
        self.channels: dict[str, Channel] = {}
        self.accepted = 0
        self._last_id = 0
        self._nonces: dict[str, float] = {}
        self._watchers: set[asyncio.Task[None]] = set()

    @property
    def store(self) -> TemporalInbox:  # channels/seam.py `Records`: replies_of, claim_nonce
        return self

    def add_channel(self, channel: Channel) -> None:
        self.channels[channel.name] = channel

    async def start(self) -> None:
        for channel in self.channels.values():
            await channel.start()
        self.accepting = True

    async def stop(self) -> None:
        self.accepting = False
        for watcher in list(self._watchers):
            watcher.cancel()
        await asyncio.gather(*self._watchers, return_exceptions=True)
        for channel in self.channels.values():
            await channel.stop()

    async def accept(self, message: InboundMessage) -> int | None:
        from ...observe.metrics import ACKS

        if not self.accepting:
            ACKS.inc(channel=message.channel, outcome="refused")
            raise RuntimeError("the gateway is not accepting messages (starting or shutting down)")
        message.received_at = message.received_at or time.time()
        try:
            await self.signal(message)
        except BaseException:
            ACKS.inc(channel=message.channel, outcome="error")
            raise
        ACKS.inc(channel=message.channel, outcome="accepted")
        self.accepted += 1
        local = self._next_id()
        if message.channel in SYNCHRONOUS and not message.callback_url:
            self._watch(local, message.channel, message.conversation, message.message_id, 0)
        return local

    async def signal(self, message: InboundMessage) -> None:
        """Signal-with-start `message` into its conversation's workflow: durable once this returns
        (a message id seen before is dropped there). `NotAccepted` past `ACCEPT_TIMEOUT`."""
        task_id_of(message)
        data = dataclasses.asdict(message)
        data["id"] = None
        started = self.client.start_workflow(
            WORKFLOW,
            {"options": workflow_options(self.config), "state": {}},
            id=workflow_id(message.conversation),
            task_queue=self.config.task_queue,
            start_signal=SIGNAL,
            start_signal_args=[data],
            task_timeout=timedelta(seconds=WORKFLOW_TASK_TIMEOUT),
            rpc_timeout=timedelta(seconds=ACCEPT_TIMEOUT),
        )
        try:
            # rpc_timeout bounds one attempt only: with the server down the SDK keeps retrying the
            # connection for seconds, past the platform's deadline; the caller gets its 503 in time
            await asyncio.wait_for(started, ACCEPT_TIMEOUT)
        except asyncio.TimeoutError:
            raise NotAccepted(
                f"Temporal at {self.config.address} did not take the message within {ACCEPT_TIMEOUT} s"
            ) from None

    async def delivered(self, conversation: str) -> None:
        """The workflow sends a conversation's replies in order, and no turn streams from a node of
        this engine (`Inbox`): nothing to wait for."""
        return None

    async def decide(
        self, pending_id: str, user_id: str, channel: str, approve: bool
    ) -> tuple[Pending, int | None]:
        """The decision as the conversation's workflow takes it: the decider's role is the one the
        workers' permissions give it (activities.py `decider_role`), never one sent along."""
        from temporalio.client import WorkflowUpdateFailedError
        from temporalio.service import RPCError

        from ...kernel.approvals import DecisionRefused, Pending

        conversation = conversation_of(pending_id)
        if conversation is None:
            raise DecisionRefused("approval_unknown")
        asked = {"id": pending_id, "user_id": user_id, "channel": channel, "approve": approve}
        handle = self.client.get_workflow_handle(workflow_id(conversation))
        try:
            result = await handle.execute_update(DECIDE, asked)
        except WorkflowUpdateFailedError as exc:
            reason = str(getattr(exc.cause, "message", "") or "")
            raise DecisionRefused(reason if reason in REFUSALS else "approval_unknown") from None
        except RPCError:  # no such workflow (any more)
            raise DecisionRefused("approval_unknown") from None
        pending = Pending(**result["pending"])
        local = self._next_id()
        self._watch(local, "webhook", conversation, str(result["message_id"]), int(result["replies"]))
        return pending, local

    async def resend(self, reply: OutboundMessage) -> None:
        """Hand a dead letter back to its conversation's workflow, which sends it again."""
        data = dataclasses.asdict(reply)
        await self.client.get_workflow_handle(workflow_id(reply.conversation)).signal(RESEND, data)

    async def replies_of(self, channel: str, message_id: str) -> Earlier | None:
        return None  # `accept` never reports a duplicate: the workflow drops it (module docstring)

    async def claim_nonce(self, channel: str, nonce: str, keep_seconds: float) -> bool:
        now = time.time()
        if len(self._nonces) > 10_000:
            self._nonces = {key: until for key, until in self._nonces.items() if until > now}
        if self._nonces.get(f"{channel}:{nonce}", 0.0) > now:
            return False
        self._nonces[f"{channel}:{nonce}"] = now + keep_seconds
        return True

    async def withdraw(self, channel: str, message_id: str, conversation: str) -> bool:
        """A recall (docs/feishu.md) is not honoured on this engine: the conversation's workflow
        has the message already, and answers it."""
        log.info(
            "%s message %s recalled; on engine temporal it is answered all the same", channel, message_id
        )
        return False

    async def set_chat_left(self, channel: str, chat_id: str, left: bool, at: float) -> None:
        """Not kept on this engine: the workers send through the platform's API, which refuses a
        chat the bot left for good (Feishu 230002: the reply is dead-lettered)."""

    async def chat_left(self, channel: str, chat_id: str) -> bool:
        return False

    async def conversation_status(self, conversation: str) -> dict[str, Any]:
        """The workflow's own account (queued, turns, duplicates dropped, history length)."""
        status: dict[str, Any] = await self.client.get_workflow_handle(workflow_id(conversation)).query(
            STATUS_QUERY
        )
        return status

    def _next_id(self) -> int:
        self._last_id += 1
        return self._last_id

    def _watch(self, local: int, name: str, conversation: str, message_id: str, first: int) -> None:
        """Hand the first reply (index ≥ `first`) of `message_id` to this node's waiter on the
        channel `name` (the webhook's synchronous answer, the console's chat)."""
        channel = self.channels.get(name)
        if channel is None:
            return
        task = asyncio.create_task(self._read_reply(channel, local, conversation, message_id, first))
        self._watchers.add(task)
        task.add_done_callback(self._watchers.discard)

    async def _read_reply(
        self, channel: Channel, local: int, conversation: str, message_id: str, first: int
    ) -> None:
        loop = asyncio.get_running_loop()
        handle = self.client.get_workflow_handle(workflow_id(conversation))
        deadline, delay = loop.time() + self.reply_timeout, 0.05
        while loop.time() < deadline:
            try:
                replies = await handle.query(REPLIES_QUERY, message_id)
            except Exception as exc:  # not started yet, no worker right now: ask again
                log.debug("replies of %s not readable yet: %s", message_id, exc)
                replies = []
            fresh = [reply for reply in replies if reply["index"] >= first]
            text = await self._text_of(conversation, fresh[0]) if fresh else None
            if fresh and text is not None:
                reply = fresh[0]
                outbound = OutboundMessage(
                    channel=channel.name,
                    conversation=conversation,
                    text=text,
                    uuid=reply["uuid"],
                    inbound_id=local,
                    index=reply["index"],
                    approval=reply["approval"],
                    message_id=message_id,
                    error=reply["error"],
                )
                await channel.send(outbound)
                return
            await asyncio.sleep(delay)
            delay = min(delay * 1.5, 0.5)

    async def _text_of(self, conversation: str, reply: dict[str, Any]) -> str | None:
        """A reply's text: as the workflow has it, else read from its stored turn (None: not yet)."""
        if reply.get("text") is not None:
            return str(reply["text"])
        if self.stored_reply is None or not reply.get("stored"):
            return None
        try:
            return await self.stored_reply(conversation, str(reply["stored"]))
        except Exception as exc:  # PostgreSQL unavailable just now: asked again
            log.debug("the stored reply of %s not readable yet: %s", reply["stored"], exc)
            return None


def credentials(config: TemporalConfig) -> tuple[bool | TLSConfig, str | None]:
    """TLS (and the client's certificate) from `temporal.tls`'s files; the API key from the
    variable `temporal.api_key_env` names. An API key goes only over TLS."""
    from temporalio.service import TLSConfig

    api_key = None
    if config.api_key_env is not None:
        api_key = os.environ.get(config.api_key_env) or None
        if api_key is None:
            raise Unreachable(f"temporal.api_key_env names {config.api_key_env}, which is not set")
    tls = config.tls
    if tls is None:
        return api_key is not None, api_key

    def read(path: str | None) -> bytes | None:
        return Path(path).expanduser().read_bytes() if path else None

    return TLSConfig(
        server_root_ca_cert=read(tls.server_ca), domain=tls.server_name,
        client_cert=read(tls.client_cert), client_private_key=read(tls.client_key),
    ), api_key  # fmt: skip


def workflow_id(conversation: str) -> str:
    """A conversation's workflow: its key (one workflow per conversation, on every node)."""
    return conversation


__all__ = ["TemporalInbox", "connect", "credentials", "workflow_id", "workflow_options"]
