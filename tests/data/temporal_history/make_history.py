"""How the histories of this folder were recorded: run with the release to record on the path (its
`src` on PYTHONPATH) and its `tests` folder as the second argument:

    PYTHONPATH=<release>/src python make_history.py OUT.json <release>/tests

A Temporal dev server (tests/temporal_dev.py), the fake model, one `worker` of that release in this
process (with a private PostgreSQL server, tests/pg_server.py, for a release whose worker keeps the
conversation there), and three webhook messages (synchronous: no send step) in the conversation `webhook:u1`:
a tool call, `/new` and a text. The workflow's history is written as JSON; the workers' identity
(pid@host) is replaced by `worker@host`, and its sticky queue's name by `worker@host-sticky`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import re
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, sys.argv[2])  # that release's tests/: temporal_dev
from hermes_core.testing.fake_openai import FakeOpenAIServer, FakeReply, RecordedRequest  # noqa: E402
from temporal_dev import DevServer, temporal_binary  # noqa: E402

# the replayer runs a history on the task queue "replay-<its build id>", and the workflow reads its
# queue (workflow.py `_moving`): the replay test passes build_id="recorded"
QUEUE = "replay-recorded"


def answer(request: RecordedRequest) -> FakeReply:
    user = next(m for m in reversed(request.messages) if m["role"] == "user")
    if str(user["content"]).startswith("calc") and request.messages[-1]["role"] != "tool":
        return FakeReply.tool_call("calculator", {"expression": "2+3"})
    return FakeReply.text(f"ok: {user['content']}")


def scrub(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: "worker@host" if k == "identity" and v else scrub(v) for k, v in value.items()}
    if isinstance(value, str) and re.fullmatch(r"\d+@.+-[0-9a-f]{32}", value):  # a sticky queue: pid@host-…
        return "worker@host-sticky"
    return [scrub(item) for item in value] if isinstance(value, list) else value


async def record(address: str, out: Path) -> None:
    from hermes_core.channels.seam import InboundMessage, task_id_of
    from hermes_core.config import load_settings
    from hermes_core.engine.temporal.client import connect, workflow_options
    from hermes_core.engine.temporal.worker import run_worker
    from hermes_core.engine.temporal.workflow import SIGNAL, WORKFLOW

    model = FakeOpenAIServer(handler=answer).start_in_thread()
    folder = Path(tempfile.mkdtemp())
    config = {"engine": "temporal", "temporal": {"address": address, "task_queue": QUEUE},
              "gateway": {"data_dir": str(folder / "data")}}  # fmt: skip
    (folder / "hermes.yaml").write_text(json.dumps(config))
    os.environ.update(HERMES_BASE_URL=model.base_url, HERMES_MODEL="m")
    if DATABASE is not None:
        os.environ["HERMES_DATABASE_URL"] = DATABASE.fresh_database()
    settings = load_settings(folder / "hermes.yaml", dotenv=None)
    stop = asyncio.Event()
    worker = asyncio.create_task(run_worker(settings, stop=stop))
    client = await connect(settings.temporal)
    start = {"options": workflow_options(settings.temporal), "state": {}}
    for i, text in enumerate(["calc 2+3", "/new", "tell me more"]):
        message = InboundMessage("webhook", "webhook:u1", "u1", text, f"m{i}")
        task_id_of(message)
        signal = {"start_signal": SIGNAL, "start_signal_args": [dataclasses.asdict(message)]}
        await client.start_workflow(WORKFLOW, start, id="webhook:u1", task_queue=QUEUE, **signal)
    handle = client.get_workflow_handle("webhook:u1")
    deadline = time.monotonic() + 60
    while (await handle.query("status"))["turns"] < 3:
        assert time.monotonic() < deadline, "the three turns did not finish"
        await asyncio.sleep(0.1)
    history = json.loads((await handle.fetch_history()).to_json())
    out.write_text(json.dumps(scrub(history), indent=1), encoding="utf-8")
    stop.set()
    await worker
    model.stop()


DATABASE: Any = None


if __name__ == "__main__":
    if (Path(sys.argv[2]) / "pg_server.py").exists():
        from pg_server import PostgresServer

        DATABASE = PostgresServer().start()
    binary, why = temporal_binary()
    assert binary, why
    server = DevServer(binary, Path(tempfile.mkdtemp()))
    server.wait_ready()
    try:
        asyncio.run(record(server.address, Path(sys.argv[1])))
    finally:
        server.stop()
        if DATABASE is not None:
            DATABASE.stop()
    os._exit(0)  # the SDK's threads (engine/temporal/client.py `leave`)
