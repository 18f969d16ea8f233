"""The developer console checklist (docs/feishu.md, English and Chinese) asks for exactly the scopes
and events the code needs, as `channels/feishu/scopes.py` lists them; and that table covers every
Open API path the channel's code names and every call the bot makes against the fake platform.

An app set up from a checklist that lacks a scope fails in production only (a picture answered
"attachment unavailable", a reply never sent); one that asks for too much is refused by a careful
tenant admin. Sources: each API's and event's page, as cited in scopes.py.
"""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

from gateway_harness import feishu_gateway
from hermes_core import Agent
from hermes_core.channels.feishu import scopes
from hermes_core.channels.feishu.api import FeishuAPI
from hermes_core.channels.feishu.resources import download_resource
from hermes_core.gateway.runner import AgentRunner
from hermes_core.kernel.tools.permissions import Policy
from hermes_core.tasks import SQLiteTaskJournal
from hermes_core.tasks.pending import SQLiteInteractions
from hermes_core.testing import ScriptedModel, call, reply
from hermes_core.testing.fake_feishu import FakeFeishu
from hermes_core.testing.fake_feishu.cards import buttons
from invoicing import send_invoice
from waiting import eventually

ROOT = Path(__file__).resolve().parents[1]
FEISHU = ROOT / "src" / "hermes_core" / "channels" / "feishu"
DOC = (ROOT / "docs" / "feishu.md").read_text(encoding="utf-8")
EVENT_NAME = re.compile(r"^(im|card|contact|application|drive|approval)\.[a-z0-9_.]+$")


def pattern(path: str) -> re.Pattern[str]:
    """A table path (`/…/:message_id/reply`) as a regex over concrete paths."""
    return re.compile("^" + re.sub(r":\w+", "[^/]+", re.escape(path).replace(r"\:", ":")) + "$")


def listed(method: str | None, path: str) -> bool:
    for need in scopes.API_CALLS:
        want_method, want_path = scopes.api_pattern(need)
        if (method is None or method == want_method) and pattern(want_path).match(path):
            return True
    return False


def paths_in_code() -> dict[str, str]:
    """Every string in channels/feishu/*.py that is an Open API path (f-string parts and `{name}`
    placeholders become one path segment), with where it is."""
    found: dict[str, str] = {}
    for source in sorted(FEISHU.glob("*.py")):
        if source.name == "scopes.py":
            continue
        tree = ast.parse(source.read_text(encoding="utf-8"))
        parts = {
            id(part) for node in ast.walk(tree) if isinstance(node, ast.JoinedStr) for part in node.values
        }
        for node in ast.walk(tree):
            if id(node) in parts:  # a piece of an f-string, read with the whole of it
                continue
            if isinstance(node, ast.JoinedStr):
                text = "".join(part.value if isinstance(part, ast.Constant) else "X" for part in node.values)
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                text = node.value
            else:
                continue
            if text.startswith("/open-apis/"):
                found[re.sub(r"\{[^}]*\}", "X", text)] = f"{source.name}:{node.lineno}"
    return found


def checklist(language: str) -> str:
    start = DOC.index("**English**") if language == "en" else DOC.index("**中文**")
    end = DOC.index("**中文**") if language == "en" else DOC.index("Sources:", start)
    return DOC[start:end]


def scopes_table(section: str) -> list[str]:
    return re.findall(r"^\s*\|\s*`([a-z][\w.:]*)`\s*\|", section, flags=re.M)


def event_names(section: str) -> set[str]:
    return {name for name in re.findall(r"`([^`]+)`", section) if EVENT_NAME.match(name)}


def test_every_open_api_path_in_the_channels_code_is_in_the_table() -> None:
    found = paths_in_code()
    assert "/open-apis/im/v1/messages/X/reply" in found and "/open-apis/contact/v3/users/X" in found
    missing = {path: where for path, where in found.items() if not listed(None, path)}
    assert not missing, f"Open API paths the code calls but scopes.py does not list: {missing}"


def test_the_scan_sees_an_unlisted_path() -> None:
    assert not listed(None, "/open-apis/im/v1/chats/X/members")
    assert listed("GET", "/open-apis/im/v1/messages/om_1/resources/img_1")
    assert not listed("POST", "/open-apis/im/v1/messages/om_1/resources/img_1")


async def test_every_call_the_bot_makes_against_the_platform_is_in_the_table(tmp_path: Path) -> None:
    """A streamed turn that asks for approval, the click, the resumed reply, and a download: each
    request the fake platform recorded is a listed (method, path)."""
    model = ScriptedModel([call("send_invoice", {"customer": "ACME", "amount": 1}), reply("Sent.")])
    database = tmp_path / "agent.db"
    agent = Agent(model=model, tools=[send_invoice], journal=SQLiteTaskJournal(database),
                  interactions=SQLiteInteractions(database), permissions=Policy.from_lists())  # fmt: skip
    async with FakeFeishu(time_scale=0.001) as feishu:
        async with feishu_gateway(tmp_path, feishu, AgentRunner(agent), stream=True) as (_, url):
            assert (await feishu.push(feishu.user_message("invoice ACME", chat_id="oc_1"), url)).ok
            await eventually(lambda: any(buttons(m.content) for m in feishu.sent))
            card = next(m for m in feishu.sent if buttons(m.content))
            value = buttons(card.content)[0]
            assert (await feishu.push(feishu.card_action("ou_user1", card.message_id, value), url)).ok
            await eventually(lambda: any("Sent." in m.text for m in feishu.sent))
        picture = feishu.image_message(b"\x89PNG", chat_id="oc_1")["event"]["message"]
        async with FeishuAPI(feishu.app_id, feishu.app_secret, base_url=feishu.base_url) as api:
            key = json.loads(picture["content"])["image_key"]
            await download_resource(api, picture["message_id"], key, "image", limit=1 << 20, timeout=5)
    calls = {(c.method, c.path) for c in feishu.requests if c.path.startswith("/open-apis/")}
    assert {path for _, path in calls} >= {"/open-apis/bot/v3/info", "/open-apis/contact/v3/users/ou_user1"}
    assert any(method == "PATCH" for method, _ in calls)  # the streamed card
    unlisted = sorted(c for c in calls if not listed(*c))
    assert not unlisted, f"calls the bot made that scopes.py does not list: {unlisted}"


def test_both_checklists_ask_for_exactly_the_scopes_the_code_needs() -> None:
    needed = scopes.checklist_scopes()
    for language in ("en", "zh"):
        table = scopes_table(checklist(language))
        assert len(table) == len(set(table)), f"{language}: a scope listed twice: {table}"
        assert set(table) == needed, (
            f"{language} checklist: {sorted(set(table) ^ needed)} differ from scopes.py"
        )


def test_both_checklists_name_exactly_the_events_and_callbacks_the_code_handles() -> None:
    handled = {need.what for need in (*scopes.EVENTS, *scopes.CALLBACKS)}
    for language in ("en", "zh"):
        named = event_names(checklist(language))
        assert named == handled, f"{language} checklist: {sorted(named ^ handled)} differ from scopes.py"


def test_the_checklist_reading_sees_a_missing_scope() -> None:
    section = checklist("en").replace("| `cardkit:card:write` |", "| cardkit |")
    assert "cardkit:card:write" not in scopes_table(section)
    assert event_names("add **`im.message.receive_v1`** and `card.action.trigger`") == {
        "im.message.receive_v1",
        "card.action.trigger",
    }
