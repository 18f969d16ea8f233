"""Tool routing (T8): with many tools, only the groups a message is about are offered."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hermes_core import Agent, Tool, tool
from hermes_core.kernel.tools.permissions import Caller
from hermes_core.skills import SkillSet
from hermes_core.testing import ScriptedModel, call, reply
from hermes_core.tools.routing import ToolRouter, terms

# 10 groups x 5 tools = 50 tools: English descriptions, Chinese keywords.
GROUPS = {
    "weather": ("weather forecast, temperature and rain for a city", ("天气", "气温", "下雨")),
    "email": ("email messages in the mailbox", ("邮件", "邮箱")),
    "calendar": ("calendar events and meetings", ("日程", "会议", "日历")),
    "files": ("files and folders in the shared drive", ("文件", "文件夹")),
    "database": ("database tables and SQL queries", ("数据库", "数据表")),
    "git": ("git repositories, branches and commits", ("代码仓库", "分支")),
    "payments": ("payments, invoices and refunds", ("付款", "发票", "退款")),
    "translation": ("translations of text between languages", ("翻译", "语言")),
    "maps": ("map routes, distances and addresses", ("地图", "路线", "距离")),
    "music": ("music songs and playlists", ("音乐", "歌曲", "播放列表")),
}
ACTIONS = ("get", "list", "create", "update", "delete")


def make_tool(group: str, action: str) -> Tool:
    topic, keywords = GROUPS[group]

    def handler(query: str) -> str:
        return f"{group}_{action}: {query}"

    handler.__doc__ = f"{action.title()} {topic}."
    return tool(name=f"{group}_{action}", groups=(group,), keywords=keywords, level=0)(handler)


CATALOG = [make_tool(group, action) for group in GROUPS for action in ACTIONS]


def group(name: str) -> set[str]:
    return {f"{name}_{action}" for action in ACTIONS}


def offered(model: ScriptedModel, i: int = 0) -> set[str]:
    return {schema["function"]["name"] for schema in model.calls[i].tools or []}


def routed_agent(script: list, above: int | None = 20, **options: object) -> tuple[Agent, ScriptedModel]:
    model = ScriptedModel(script)
    return Agent(model=model, tools=CATALOG, route_tools_above=above, **options), model  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("message", "expected"),
    [
        ("Will it rain in Paris tomorrow? What's the temperature forecast?", "weather"),
        ("明天北京会下雨吗？查一下天气", "weather"),
        ("Send an email to Bob about the mailbox quota", "email"),
        ("帮我把这段话翻译成英文", "translation"),
        ("Which commits landed on the release branch of the repository?", "git"),
        ("给客户开一张发票", "payments"),
    ],
)
async def test_a_message_about_a_topic_gets_that_group(message: str, expected: str) -> None:
    agent, model = routed_agent([reply("ok")])
    await agent.run(message)
    assert offered(model) == group(expected)


async def test_a_message_about_two_topics_gets_both_groups() -> None:
    agent, model = routed_agent([reply("ok")])
    await agent.run("Put a meeting in my calendar and email the invitation to the team")
    assert offered(model) == group("calendar") | group("email")


async def test_tools_used_in_the_task_stay_offered_in_later_turns() -> None:
    # the model calls a tool the router did not pick for this message: it stays for the rest of the task
    script = [
        call("music_create", {"query": "rainy day songs"}),
        call("weather_get", {"query": "Paris"}),
        "Done",
    ]
    agent, model = routed_agent(script)
    result = await agent.run("What's the weather forecast in Paris?")
    assert result.ok and [o.call.name for o in result.tool_calls] == ["music_create", "weather_get"]
    assert offered(model, 0) == group("weather")
    assert offered(model, 1) == offered(model, 2) == group("weather") | {"music_create"}


async def test_a_conversation_keeps_its_topics_so_the_tools_change_only_with_a_new_one() -> None:
    """Routing reads every user message of the window, not only the newest: a follow-up that names
    no topic keeps the tools it had (it no longer flips to every tool and back), earlier topics stay
    offered, so the tools array — the top of every request, where a provider's prompt cache begins —
    changes only when a new topic comes, and a window that has let the old turns go (a fold) routes
    by what it still holds. The measured cost: benchmarks/bench_routing.py, docs/benchmarks.md."""
    from hermes_core import Session

    script = [call("music_create", {"query": "jazz"}), "Made it.", "And?", "Sunny.", "Rain."]
    agent, model = routed_agent(script)
    session = Session()
    await agent.run("Create a jazz playlist of songs", session=session)
    await agent.run("and another one like it", session=session)  # names no topic
    await agent.run("What's the weather forecast in Paris?", session=session)
    assert offered(model, 0) == offered(model, 1) == offered(model, 2) == group("music")
    assert json.dumps(model.calls[2].tools) == json.dumps(model.calls[0].tools)  # byte for byte
    assert offered(model, 3) == group("music") | group("weather")
    session.messages = session.messages[-2:]  # the window now holds only the weather turn
    await agent.run("Will it rain there tomorrow?", session=session)
    assert offered(model, 4) == group("weather")


async def test_up_to_the_threshold_every_tool_is_sent() -> None:
    message = "Will it rain in Paris tomorrow?"
    agent, model = routed_agent([reply("ok")], above=50)
    await agent.run(message)
    assert offered(model) == {t.name for t in CATALOG}
    agent, model = routed_agent([reply("ok")], above=49)
    await agent.run(message)
    assert offered(model) == group("weather")
    agent, model = routed_agent([reply("ok")], above=None)  # the default: no routing
    await agent.run(message)
    assert len(offered(model)) == 50


async def test_a_message_matching_no_group_gets_every_tool() -> None:
    agent, model = routed_agent([reply("ok")])
    await agent.run("Tell me something nice")
    assert len(offered(model)) == 50


async def test_routing_never_adds_a_tool_the_policy_refuses() -> None:
    admin_only = tool(name="weather_admin", groups=("weather",), required_role="admin", level=0)(
        CATALOG[0].handler
    )
    admin_only.description = "Reset the weather station (weather forecast admin)."
    model = ScriptedModel([call("weather_admin", {"query": "x"}), "ok", "ok"])
    agent = Agent(model=model, tools=[*CATALOG, admin_only], route_tools_above=20)
    result = await agent.run("weather forecast for Paris", caller=Caller("u1"))
    assert offered(model, 0) == group("weather")  # the group, without the tool the member may not use
    assert result.tool_calls[0].error == "permission_denied"
    assert offered(model, 1) == group("weather")  # having called it does not bring it back either
    await agent.run("weather forecast for Paris", caller=Caller("root", role="admin"))
    assert offered(model, 2) == group("weather") | {"weather_admin"}


async def test_tools_routed_before_text_mode_renders_them() -> None:
    agent, model = routed_agent([reply("ok")], tool_mode="text")
    await agent.run("明天会下雨吗？天气怎么样")
    system = model.calls[0].messages[0]["content"]
    assert model.calls[0].tools is None
    assert '"name": "weather_get"' in system and '"name": "email_get"' not in system


async def test_skill_tools_and_load_skill_stay_offered(tmp_path: Path) -> None:
    skill = tmp_path / "weekly-report" / "SKILL.md"
    skill.parent.mkdir()
    skill.write_text(
        "---\nname: weekly-report\ndescription: The weekly report.\ntriggers: [周报]\n"
        "tools: [database_get, email_create]\n---\nQuery, then mail it.\n",
        encoding="utf-8",
    )
    skills = SkillSet.load([tmp_path], [t.name for t in CATALOG])
    script = [reply("ok"), call("load_skill", {"name": "weekly-report"}), reply("ok")]
    agent, model = routed_agent(script, skills=skills)
    await agent.run("帮我写本周的周报，然后翻译成英文")  # triggers the skill; 翻译 picks translation
    assert offered(model, 0) == group("translation") | {"database_get", "email_create", "load_skill"}
    await agent.run("翻译成英文")  # no trigger: the skill's tools come back once the model loads it
    assert offered(model, 1) == group("translation") | {"load_skill"}
    assert offered(model, 2) == group("translation") | {"database_get", "email_create", "load_skill"}


def test_router_selects_on_its_own() -> None:
    from hermes_core.tools import ToolRegistry

    registry = ToolRegistry(CATALOG)
    router = ToolRouter(registry.get, above=10)
    schemas = registry.schemas()
    chosen = router.select(schemas, "播放一首歌曲", used_names=["maps_get", "not_offered"])
    # the schemas' own order; a used name that is not offered is not added
    assert [s["function"]["name"] for s in chosen] == ["maps_get", *(f"music_{a}" for a in ACTIONS)]
    assert router.select(schemas[:10], "播放一首歌曲") == schemas[:10]


def test_groups_on_tools() -> None:
    assert tool(groups="weather")(CATALOG[0].handler).groups == ("weather",)
    assert CATALOG[0].groups == ("weather",)
    from hermes_core.kernel.tools.declare import tool_from_entry

    entry = {"description": "d", "parameters": {"type": "object"}, "handler": lambda: 1, "groups": ["a", "b"]}
    assert tool_from_entry("x", entry).groups == ("a", "b")


def test_terms_use_character_bigrams_for_chinese_and_stems_for_english() -> None:
    assert terms("查询天气") == ["查询", "询天", "天气"]
    assert terms("Deploying the files") == ["deploy", "fil"]
    assert terms("sendEmail send_emails") == ["send", "email", "send", "email"]
    assert terms("打开weather应用") == ["打开", "应用", "weather"]
