"""Secret handles instead of mangled arguments (tools/secret_handles.py, kernel/redaction.py).

Cases from the issue: gold calls of public function-calling datasets whose parameter names are
`password`, `token` or `api_key` (BFCL's `add_postgres_server(host, username, password)`, a reminders
API's `token`, a monitoring call's `api_key`) must reach the tool as the model wrote them; a credential
a user pastes (shapes after gitleaks' rules, as tests/test_security_secrets.py builds them) must reach
neither the model nor any file in clear, and a tool declared to accept it gets the value. The model
is the fake OpenAI-compatible server (its recorded requests are what the model saw); the gateway
and its SQLite files are real.
"""

from __future__ import annotations

import json
import random
import string
from pathlib import Path

import pytest

from gateway_harness import post, serving
from hermes_core import Agent, tool
from hermes_core.config import GatewayConfig, Settings
from hermes_core.gateway.server import build_gateway
from hermes_core.kernel.redaction import default_redactor
from hermes_core.observe.replay import replay
from hermes_core.observe.traces import SQLiteTraceStore, Tracer
from hermes_core.testing import ScriptedModel, call, reply
from hermes_core.testing.fake_openai import FakeOpenAIServer, FakeReply, RecordedRequest
from hermes_core.tools.secret_handles import HANDLE, SecretHandles, accepts_secrets, credential_spans

RECEIVED: list[tuple[str, dict[str, str]]] = []
_random = random.Random(28)
PASTED_PASSWORD = (
    "Qv" + "".join(_random.choice(string.ascii_letters + string.digits) for _ in range(14)) + "9"
)
PASTED_TOKEN = "ghp_" + "".join(_random.choice(string.ascii_letters + string.digits) for _ in range(36))
PROCESS_SECRET = "Pk7" + "".join(_random.choice(string.ascii_letters) for _ in range(29))


@tool
@accepts_secrets("password")
def add_postgres_server(host: str, username: str, password: str) -> str:
    """Register a PostgreSQL server with its credentials."""
    RECEIVED.append(("add_postgres_server", {"host": host, "username": username, "password": password}))
    return f"added {host}"


@tool
def create_reminder(text: str, token: str) -> str:
    """Create a reminder through the reminders API, which takes the user's API token."""
    RECEIVED.append(("create_reminder", {"text": text, "token": token}))
    return "reminder created"


@accepts_secrets("api_key")
@tool
def query_monitoring(metric: str, api_key: str) -> str:
    """Read a metric from the monitoring service with an API key."""
    RECEIVED.append(("query_monitoring", {"metric": metric, "api_key": api_key}))
    return "42"


TOOLS = [add_postgres_server, create_reminder, query_monitoring]


@pytest.fixture(autouse=True)
def _clear() -> None:
    RECEIVED.clear()


async def test_arguments_named_like_credentials_reach_the_tool_as_written() -> None:
    """The issue's 9 failing gold calls had this shape: a `password`, `token` or `api_key` argument
    rewritten to `[REDACTED:credential]` before the tool ran. Each now gets what the model wrote."""
    calls = [
        ("add_postgres_server", {"host": "db1.internal", "username": "admin", "password": "Secur3Pass!2024"}),
        ("create_reminder", {"text": "stand-up", "token": "tok_8f7e6d5c4b3a2910"}),
        ("query_monitoring", {"metric": "cpu", "api_key": "mon-key-12345678"}),
    ]
    async with FakeOpenAIServer() as fake:
        fake.script(FakeReply.parallel_tool_calls(calls), FakeReply.text("done"))
        agent = Agent(model="m", base_url=fake.base_url, tools=TOOLS)
        result = await agent.run("set them up")
        await agent.aclose()
    assert result.reply == "done"
    assert RECEIVED == [(name, arguments) for name, arguments in calls]


def test_pasted_credentials_become_stable_handles_per_conversation() -> None:
    """Shapes after gitleaks' rules; the same value keeps its handle; another conversation does not
    share it; a known process secret is `[REDACTED]`, never a handle."""
    default_redactor().add(PROCESS_SECRET)
    handles = SecretHandles()
    text = f"db password={PASTED_PASSWORD}, token {PASTED_TOKEN}, again password={PASTED_PASSWORD}"
    hidden = handles.hide("feishu:oc_1", text)
    assert hidden == (
        "db password=[secret:1:credential], token [secret:2:github-token], "
        "again password=[secret:1:credential]"
    )
    assert handles.hide("feishu:oc_2", f"token {PASTED_TOKEN}") == "token [secret:1:github-token]"
    assert handles.reveal("feishu:oc_1", "[secret:2:github-token]") == PASTED_TOKEN
    assert handles.hide("feishu:oc_1", f"api_key={PROCESS_SECRET}1") == "api_key=[secret:3:credential]"
    assert (
        handles.hide("feishu:oc_1", f"Authorization: Bearer {PROCESS_SECRET}")
        == "Authorization: Bearer [REDACTED]"
    )
    assert handles.hide(
        "feishu:oc_1", "ids ou_1a2b3c4d, commit 9fceb02d0ae598e95dc970b74767f19372d61af8"
    ) == ("ids ou_1a2b3c4d, commit 9fceb02d0ae598e95dc970b74767f19372d61af8")
    assert credential_spans("nothing here") == []
    with pytest.raises(Exception, match="no longer held"):
        handles.reveal("feishu:oc_2", "[secret:2:github-token]")
    assert PASTED_TOKEN not in repr(handles)


def model_using_handles(request: RecordedRequest) -> FakeReply:
    """Reads the handles it was given and passes them on: to a tool that accepts secrets and to one
    that does not; then reports what the tools said."""
    last = request.messages[-1]
    if last.get("role") == "tool":
        return FakeReply.text("done: " + " / ".join(str(m.get("content")) for m in request.messages[-2:]))
    found = [handle.group(0) for handle in HANDLE.finditer(str(last.get("content")))]
    assert found, last
    return FakeReply.parallel_tool_calls([
        ("add_postgres_server", {"host": "db1", "username": "admin", "password": found[0]}),
        ("create_reminder", {"text": "rotate", "token": found[0]}),
    ])  # fmt: skip


async def test_a_pasted_secret_reaches_the_accepting_tool_only_and_is_stored_nowhere(tmp_path: Path) -> None:
    """Through `serve`'s gateway (webhook): the model's requests and every file of the data folder
    (inbox, outbox, session history, journal, traces, approvals; the WAL) hold the handle, never the
    value; the tool that accepts secrets gets the value, the other the handle as written."""
    settings = Settings(gateway=GatewayConfig(data_dir=str(tmp_path / "data")))
    async with FakeOpenAIServer(handler=model_using_handles) as fake:
        agent = Agent(model="m", base_url=fake.base_url, tools=TOOLS)
        gateway, routes = build_gateway(settings, agent)
        async with serving(gateway, routes) as url:
            message = f"add db1 as admin, password={PASTED_PASSWORD} please"
            status, answer = await post(f"{url}/webhook", {"message": message, "user_id": "alice"})
        await gateway.runner.aclose()  # type: ignore[attr-defined]
        await agent.aclose()
        prompts = b"".join(request.raw for request in fake.requests)
    assert status == 200 and answer["reply"].startswith("done: ")
    received = dict(RECEIVED)
    assert received["add_postgres_server"]["password"] == PASTED_PASSWORD
    assert received["create_reminder"]["token"] == "[secret:1:credential]"
    assert PASTED_PASSWORD.encode() not in prompts and b"password=[secret:1:credential]" in prompts
    stored = b"".join(path.read_bytes() for path in (tmp_path / "data").rglob("*") if path.is_file())
    assert stored and PASTED_PASSWORD.encode() not in stored
    assert PASTED_PASSWORD[2:10].encode() not in stored and b"[secret:1:credential]" in stored


def test_accepts_secrets_names_real_parameters() -> None:
    """A misspelt parameter is a declaration error, not a silently unsubstituted secret."""
    from hermes_core.kernel.tools.declare import ToolDefinitionError

    def login(user: str, pasword: str) -> str:
        """Log in."""
        return user

    with pytest.raises(ToolDefinitionError, match="no parameter"):
        accepts_secrets("password")(login)


async def test_traces_and_replays_keep_the_handle(tmp_path: Path) -> None:
    """The trace records the handle (never the value) and a replay of it is reproduced call for call,
    the write's recorded result standing in (observe/replay.py)."""
    store = SQLiteTraceStore(tmp_path / "traces.db")
    handle = "[secret:1:credential]"
    steps = [
        call("add_postgres_server", {"host": "db1", "username": "admin", "password": handle}),
        reply("ok"),
    ]
    agent = Agent(model=ScriptedModel(steps), tools=TOOLS, tracer=Tracer(store))
    await agent.run(f"add db1, password={PASTED_PASSWORD}", task_id="t-secret")
    recorded = await store.get("t-secret")
    await store.close()
    assert recorded is not None and RECEIVED[0][1]["password"] == PASTED_PASSWORD
    assert PASTED_PASSWORD not in json.dumps(recorded) and handle in json.dumps(recorded)
    report = await replay(recorded, Agent(model=ScriptedModel([]), tools=TOOLS))
    assert report.reproduced, report.divergences
