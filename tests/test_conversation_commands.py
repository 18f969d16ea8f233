"""/new (/reset), /help, /stop and /jobs on every channel: answered before the model is called (the
fake model server records every request it gets, and gets none), with the same text on the webhook,
Feishu and the terminal chat, in Chinese or English after the command word or the message."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import aiohttp
import pytest

from gateway_harness import post, serving
from hermes_core.config import build_agent, load_settings
from hermes_core.gateway.dispatcher import Gateway
from hermes_core.gateway.server import build_gateway
from hermes_core.kernel.replies import fixed_reply
from hermes_core.testing.fake_feishu import FakeFeishu
from hermes_core.testing.fake_openai import FakeOpenAIServer, FakeReply, RecordedRequest
from serve_process import clean_environ
from waiting import eventually

ADMIN_TOOL = '''
from hermes_core import tool

@tool(required_role="admin", level=0)
def payroll_report(month: str) -> str:
    """The payroll report of a month (admins only)."""
    return month
'''


def config_file(tmp_path: Path, fake: FakeOpenAIServer, extra: str = "") -> Path:
    (tmp_path / "admin_tools.py").write_text(ADMIN_TOOL, encoding="utf-8")
    path = tmp_path / "hermes.yaml"
    path.write_text(
        f"model: {{name: m, base_url: '{fake.base_url}'}}\n"
        f"gateway: {{data_dir: '{tmp_path / 'data'}'}}\n"
        "observe: {traces: false}\n"
        "tools: [hermes_core.tools.examples, admin_tools]\n"
        "permissions: {admins: ['webhook:boss', 'feishu:ou_boss']}\n" + textwrap.dedent(extra),
        encoding="utf-8",
    )
    return path


@asynccontextmanager
async def gateway(
    tmp_path: Path, fake: FakeOpenAIServer, monkeypatch: pytest.MonkeyPatch, feishu: FakeFeishu | None = None
) -> AsyncIterator[tuple[Gateway, str]]:
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in ("FEISHU_APP_SECRET", "FEISHU_VERIFICATION_TOKEN", "FEISHU_ENCRYPT_KEY"):
        monkeypatch.delenv(name, raising=False)
    extra = ""
    if feishu is not None:
        monkeypatch.setenv("FEISHU_APP_SECRET", feishu.app_secret)
        monkeypatch.setenv("FEISHU_VERIFICATION_TOKEN", feishu.verification_token)
        extra = f"feishu: {{app_id: {feishu.app_id}, base_url: '{feishu.base_url}'}}\n"
    settings = load_settings(config_file(tmp_path, fake, extra), env={}, dotenv=None)
    agent = build_agent(settings)
    built, routes = build_gateway(settings, agent)
    try:
        async with serving(built, routes) as url:
            yield built, url
    finally:
        await built.runner.aclose()  # type: ignore[attr-defined]
        await agent.aclose()


async def say(url: str, text: str, user: str = "ann") -> str:
    status, answer = await post(f"{url}/webhook", {"message": text, "user_id": user})
    assert status == 200, answer
    return str(answer["reply"])


def help_for(tools: str, language: str = "en") -> str:
    lines = [fixed_reply("help_header", language), fixed_reply("help_commands", language),  # type: ignore[arg-type]
             fixed_reply("help_tools", language).format(tools=tools)]  # type: ignore[arg-type]  # fmt: skip
    return "\n".join(lines)


MEMBER_TOOLS = (
    "calculator, current_time, date_diff, remember, clarify, schedule_task, list_scheduled, cancel_scheduled"
)


async def test_webhook_commands_never_reach_the_model(
    tmp_path: Path, fake: FakeOpenAIServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with gateway(tmp_path, fake, monkeypatch) as (_, url):
        member_help = await say(url, "/help")
        admin_help = await say(url, "/help", user="boss")
        chinese_help = await say(url, "/帮助")
        jobs = await say(url, "/jobs")
        stop = await say(url, "/stop")
        new = await say(url, "/reset")
        chinese_new = await say(url, "/新对话")
    assert fake.requests == []
    assert set(member_help.splitlines()[-1].partition(": ")[2].split(", ")) == set(MEMBER_TOOLS.split(", "))
    assert "payroll_report" in admin_help and "payroll_report" not in member_help
    assert chinese_help.startswith("可用命令：") and "你可以使用的工具" in chinese_help
    assert jobs == "This conversation has no scheduled tasks."
    assert stop == "No task of yours is running in this conversation."
    assert new == fixed_reply("conversation_new", "en") and chinese_new == fixed_reply(
        "conversation_new", "zh"
    )
    for shown, language in ((member_help, "en"), (chinese_help, "zh")):
        assert_every_command_word_listed(shown, language)


def assert_every_command_word_listed(shown: str, language: str) -> None:
    """Every word the parser takes (gateway/commands.py `WORDS`, English and Chinese) is on the help
    of either language: a Chinese speaker typing /帮助 learns /新对话 and /停止, not only /new."""
    from hermes_core.gateway.commands import WORDS

    missing = [word for word in WORDS if f"/{word}" not in shown]
    assert not missing, f"{language} help lacks {missing}:\n{shown}"
    assert shown.startswith(fixed_reply("help_header", language))  # type: ignore[arg-type]


async def test_new_starts_a_fresh_history_where_forget_kept_it(
    tmp_path: Path, fake: FakeOpenAIServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake.handler = lambda request: FakeReply.text("noted")

    def history(request: RecordedRequest) -> list[str]:
        return [str(m.get("content")) for m in request.messages if m["role"] in ("user", "assistant")]

    async with gateway(tmp_path, fake, monkeypatch) as (_, url):
        await say(url, "my project is called Kestrel")
        await say(url, "/forget")
        await say(url, "what is my project called?")
        assert history(fake.requests[-1]) == [
            "my project is called Kestrel",
            "noted",
            "what is my project called?",
        ]
        calls = len(fake.requests)
        assert await say(url, "/new") == fixed_reply("conversation_new", "en")
        assert len(fake.requests) == calls
        await say(url, "hello again")
    assert history(fake.requests[-1]) == ["hello again"]
    assert "Kestrel" not in str(fake.requests[-1].messages)


async def test_stop_cancels_the_running_task_of_its_sender(
    tmp_path: Path, fake: FakeOpenAIServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake.handler = lambda request: FakeReply.slow(60, FakeReply.text("finally"))
    async with gateway(tmp_path, fake, monkeypatch) as (built, url):
        long_task = asyncio.ensure_future(say(url, "write a very long essay"))
        await eventually(lambda: len(fake.requests) == 1)
        assert await say(url, "/stop") == fixed_reply("stop_done", "en")
        stopped = await asyncio.wait_for(long_task, 10)
        assert await say(url, "/stop") == fixed_reply("stop_nothing", "en")
        status = built.status()
    assert stopped == fixed_reply("task_stopped", "en")
    assert len(fake.requests) == 1 and status["turns_in_flight"] == 0


async def test_feishu_commands_are_the_webhook_replies_and_never_reach_the_model(
    tmp_path: Path, fake: FakeOpenAIServer, feishu: FakeFeishu, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with gateway(tmp_path, fake, monkeypatch, feishu) as (_, url):
        for n, text in enumerate(("/help", "/jobs", "/stop", "/new", "/停止"), start=1):
            assert (await feishu.push(feishu.user_message(text, chat_id="oc_dm"), f"{url}/feishu/events")).ok
            await eventually(
                lambda n=n: len([m for m in feishu.messages_in("oc_dm") if m.sender == "app"]) == n
            )
        replies = [m.text for m in feishu.messages_in("oc_dm") if m.sender == "app"]
        webhook_help = await say(url, "/help")
    assert fake.requests == []
    assert replies[0] == webhook_help  # the same text on every channel for the same role
    keys = [("jobs_none", "en"), ("stop_nothing", "en"), ("conversation_new", "en"), ("stop_nothing", "zh")]
    assert replies[1:] == [fixed_reply(key, language) for key, language in keys]  # type: ignore[arg-type]


async def test_feishu_stop_from_someone_else_in_the_group_stops_nothing(
    tmp_path: Path, fake: FakeOpenAIServer, feishu: FakeFeishu, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake.handler = lambda request: FakeReply.slow(1.5, FakeReply.text("the essay"))
    async with gateway(tmp_path, fake, monkeypatch, feishu) as (_, url):
        events = f"{url}/feishu/events"
        ask = feishu.user_message(
            "essay please", chat_id="oc_g", chat_type="group", sender="ou_a", mention_bot=True
        )
        assert (await feishu.push(ask, events)).ok
        await eventually(lambda: len(fake.requests) == 1)
        other = feishu.user_message(
            "/stop", chat_id="oc_g", chat_type="group", sender="ou_b", mention_bot=True
        )
        assert (await feishu.push(other, events)).ok
        await eventually(lambda: len([m for m in feishu.messages_in("oc_g") if m.sender == "app"]) == 2)
    texts = [m.text for m in feishu.messages_in("oc_g") if m.sender == "app"]
    assert texts == ["the essay", fixed_reply("stop_nothing", "en")]


async def test_terminal_chat_gives_the_same_replies_without_a_model_call(
    tmp_path: Path, fake: FakeOpenAIServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = config_file(tmp_path, fake)
    env = clean_environ(PYTHONPATH=str(tmp_path))
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "hermes_core", "--config", str(config), "chat", "--quiet",
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=tmp_path,
    )  # fmt: skip
    out, err = await asyncio.wait_for(
        process.communicate("/help\n/jobs\n/stop\n/new\n/帮助\nexit\n".encode()), 60
    )
    assert process.returncode == 0, err.decode()
    shown = out.decode()
    assert fake.requests == []
    terminal_tools = "calculator, current_time, date_diff, clarify, remember"  # no scheduler in the terminal
    assert help_for(terminal_tools) in shown and help_for(terminal_tools, "zh") in shown
    for key in ("jobs_unavailable", "stop_nothing", "conversation_new"):
        assert fixed_reply(key, "en") in shown


async def test_console_chat_answers_help_without_the_model(
    tmp_path: Path, fake: FakeOpenAIServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    from hermes_core.server import serve

    monkeypatch.syspath_prepend(str(tmp_path))
    settings = load_settings(config_file(tmp_path, fake), env={}, dotenv=None)
    stop, address = asyncio.Event(), asyncio.get_running_loop().create_future()
    served = asyncio.ensure_future(serve(settings, port=0, ready=address.set_result, stop=stop))
    base = await asyncio.wait_for(address, 30)
    try:
        async with aiohttp.ClientSession() as http:
            headers = {"Origin": base, "Content-Type": "application/json"}
            async with http.post(
                f"{base}/console/api/chat", json={"message": "/jobs"}, headers=headers
            ) as answer:
                lines = (await answer.text()).splitlines()
    finally:
        stop.set()
        await served
    # at most serve's start-up probe of the model (gateway/model_health.py): `/jobs` never reached it
    assert [request.messages for request in fake.requests] in ([], [[{"role": "user", "content": "ping"}]])
    assert any(fixed_reply("jobs_none", "en") in line for line in lines), lines


def test_both_readmes_document_every_command_word() -> None:
    """The Chinese command words were documented nowhere (issue 29): both READMEs name each word the
    parser takes (gateway/commands.py `WORDS`)."""
    from hermes_core.gateway.commands import WORDS

    root = Path(__file__).resolve().parents[1]
    for readme in ("README.md", "README.zh-CN.md"):
        text = (root / readme).read_text(encoding="utf-8")
        missing = [word for word in WORDS if f"`/{word}`" not in text]
        assert not missing, f"{readme} does not name {missing}"


async def test_in_a_group_only_an_admin_clears_the_shared_history(
    tmp_path: Path, fake: FakeOpenAIServer, feishu: FakeFeishu, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 31, attack 10: any member's /reset or /forget erased the history and notes a whole group
    shares. Now a member gets a polite fixed reply and the history stays (the model still reads it);
    an admin (`permissions.admins`) may clear it, and in a one-to-one chat anyone clears their own."""
    fake.handler = lambda request: FakeReply.text("noted")
    async with gateway(tmp_path, fake, monkeypatch, feishu) as (_, url):
        events = f"{url}/feishu/events"

        def replies() -> list[str]:
            return [m.text for m in feishu.messages_in("oc_g") if m.sender == "app"]

        steps = [("项目代号是 Falcon", "ou_a"), ("/reset", "ou_m"), ("/忘记", "ou_m"),
                 ("still there?", "ou_a"), ("/reset", "ou_boss")]  # fmt: skip
        for count, (text, sender) in enumerate(steps, 1):
            message = feishu.user_message(
                text, chat_id="oc_g", chat_type="group", sender=sender, mention_bot=True
            )
            assert (await feishu.push(message, events)).ok
            await eventually(lambda count=count: len(replies()) == count)  # type: ignore[misc]
        own = feishu.user_message("/reset", chat_id="oc_dm", sender="ou_m")
        assert (await feishu.push(own, events)).ok
        await eventually(lambda: len(feishu.messages_in("oc_dm")) == 1)
    assert replies() == [
        "noted", fixed_reply("command_admins_only", "en"), fixed_reply("command_admins_only", "zh"), "noted",
        fixed_reply("conversation_new", "en"),
    ]  # fmt: skip
    assert "Falcon" in fake.requests[-1].raw.decode()  # the second turn still read the first
    assert feishu.messages_in("oc_dm")[0].text == fixed_reply("conversation_new", "en")
