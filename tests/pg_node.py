"""One gateway node as its own process, for tests/test_postgres_stores.py: `python pg_node.py URL MODE …`.

- `complete INBOX_ID`: complete the message with a turn's history and one reply (the test holds the
  session lock, so this stops inside the transaction, where the test kills it);
- `run NAME`: print `ready`, wait for a line on stdin, then run every pending message of the
  database under the store's turn claim, each run written to the `runs` table with its times;
- `hold`: claim the first pending message's conversation (a 1 s lease), print `claimed`, hang.
"""

from __future__ import annotations

import asyncio
import sys
import time

from hermes_core.channels.seam import OutboundMessage
from hermes_core.postgres.gateway import PostgresGatewayStore
from hermes_core.postgres.sessions import PostgresSessionStore
from hermes_core.sessions.store import TurnAppend


async def complete(store: PostgresGatewayStore, inbound_id: int) -> None:
    sessions = PostgresSessionStore(store.db.url, database=store.db)
    history = TurnAppend(sessions, "webhook:u1", "task-1", [{"role": "user", "content": "hi"}])
    reply = OutboundMessage(channel="webhook", conversation="webhook:u1", text="hello", uuid="u-1")
    await store.complete(inbound_id, [reply], history)


async def run(store: PostgresGatewayStore, name: str) -> None:
    store.poll_seconds = 0.02
    print("ready", flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    for pending in await store.pending_inbound():
        while True:
            async with store.turn_claim(pending) as turn:
                if turn is None:
                    break
                started = time.time()
                await asyncio.sleep(0.02)  # a turn that takes a moment: another node could overlap it
                await store._count(
                    "INSERT INTO runs VALUES (%s, %s, %s, %s)", (turn.id, name, started, time.time())
                )
                await store.complete(turn.id, [])  # type: ignore[arg-type]
            if turn.id == pending.id:
                break


async def hold(store: PostgresGatewayStore) -> None:
    store.lease_seconds = 1.0
    [pending, *_] = await store.pending_inbound()
    async with store.turn_claim(pending):
        print("claimed", flush=True)
        await asyncio.sleep(3600)  # holds the claim until the test kills this process


async def main(url: str, mode: str, *args: str) -> None:
    store = PostgresGatewayStore(url)
    try:
        if mode == "complete":
            await complete(store, int(args[0]))
        elif mode == "run":
            await run(store, args[0])
        else:
            await hold(store)
    finally:
        await store.close()


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:]))
