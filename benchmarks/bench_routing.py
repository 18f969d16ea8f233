"""Prompt bytes per request with 50 tools registered: tool routing (T8) on vs off.

Fifty tools in ten groups (weather, email, calendar, files, database, git, payments, translation,
maps, music), with English descriptions and parameter descriptions and Chinese keywords, are
registered on one agent. For each sample message (English and Chinese, one per topic, one with
two topics, one matching no topic) the agent runs once with `route_tools_above=16` and once without
routing, against a scripted model that records what it was sent. "Bytes" are the UTF-8 size of the
JSON of the tools array plus the system prompt of that request: the part routing changes (the
messages are the same either way). Also timed: the routing decision itself, per request.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import time
from typing import Any

from _common import format_table, row

from hermes_core import Agent
from hermes_core.testing import ScriptedModel, reply

ROUTE_ABOVE = 16
TARGET_RATIO = 0.5  # routed bytes / unrouted bytes, averaged over the messages
TARGET_ROUTING_US = 500.0  # time of one routing decision

# group → (Chinese keywords, one tool a line: "name | description | parameter: description; …")
CATALOG: dict[str, tuple[str, str]] = {
    "weather": (
        "天气 气温 下雨 预报",
        """
    weather_now | Current weather for a city: temperature, sky, wind, humidity. | city: City, e.g. 北京
    weather_forecast | Forecast for the next 1-7 days, with rain probability. | city: City; days: 1-7
    weather_alerts | Active severe-weather alerts (storms, heat, typhoons). | region: Province or city
    air_quality | Air quality index and main pollutant for a city. | city: City name
    weather_history | Past weather of a city on a given date. | city: City; date: ISO date, e.g. 2024-05-01
    """,
    ),
    "email": (
        "邮件 邮箱 发邮件",
        """
    email_send | Send an email to one or more recipients. | to: Addresses; subject: Subject; body: Text
    email_search | Search the mailbox by sender, subject or words. | query: Words; folder: Default inbox
    email_read | Read one email message by its id. | message_id: The id from email_search
    email_reply | Reply to an email message. | message_id: The message to answer; body: Plain-text reply
    email_draft | Save an email draft without sending it. | to: Addresses; subject: Subject; body: Text
    """,
    ),
    "calendar": (
        "日程 会议 日历 开会",
        """
    calendar_list | List calendar events between two dates. | start: ISO date; end: ISO date
    calendar_create | Create a meeting and invite people. | title: Title; start: ISO time; attendees: Emails
    calendar_update | Move or rename an existing calendar event. | event_id: Event id; start: New ISO time
    calendar_cancel | Cancel a calendar event and notify the attendees. | event_id: The event id
    calendar_free_slots | Free slots shared by several people. | attendees: Emails; duration_minutes: Length
    """,
    ),
    "files": (
        "文件 文件夹 文档",
        """
    files_list | List the files in a folder of the shared drive. | folder: Folder path, e.g. /contracts
    files_search | Search the shared drive for files by name or content. | query: Words in name or content
    files_read | Read a text, PDF or Word document from the shared drive. | path: File path
    files_upload | Upload text as a new file to the shared drive. | path: File path; content: File content
    files_share | Share a file with a colleague. | path: File path; user: Colleague email; editable: yes/no
    """,
    ),
    "database": (
        "数据库 数据表 订单 查询",
        """
    db_query | Run a read-only SQL query on the analytics database. | sql: A SELECT statement
    db_tables | List the tables of the analytics database. |
    db_describe | Describe the columns of a database table. | table: Table name
    db_count_orders | Count orders in a date range, by status. | start: ISO date; end: ISO date; status: paid…
    db_export_csv | Export a SQL query result as a CSV file. | sql: A SELECT statement; filename: CSV name
    """,
    ),
    "git": (
        "代码 仓库 分支 合并请求",
        """
    git_log | Recent commits of a repository branch. | repo: owner/name; branch: Branch name
    git_diff | The diff between two branches or commits. | repo: owner/name; base: Base ref; head: Head ref
    git_create_branch | Create a branch from another one. | repo: owner/name; name: New branch; from_ref: Base
    git_open_pull_request | Open a pull request from a feature branch. | repo: owner/name; head: Branch
    git_ci_status | Continuous-integration status of a commit or pull request. | repo: owner/name; ref: Ref
    """,
    ),
    "payments": (
        "付款 支付 发票 退款",
        """
    payment_status | Status of a customer's payment by order number. | order_id: Order number
    payment_refund | Refund an order, fully or partly. | order_id: Order number; amount: Empty for all
    invoice_create | Issue an invoice for an order. | order_id: Order number; title: Company name
    invoice_send | Email an issued invoice to the customer. | invoice_id: Invoice id
    payment_link | Create a payment link for an amount. | amount: Amount; currency: CNY, USD…
    """,
    ),
    "translation": (
        "翻译 译成 语言",
        """
    translate_text | Translate text into another language. | text: Text; target: Language, e.g. en, ja
    detect_language | Detect the language of a text. | text: Text
    translate_document | Translate a document from the shared drive. | path: File path; target: Language
    glossary_lookup | Look a term up in the company's translation glossary. | term: Term
    transliterate | Write a name in Latin letters (pinyin, romaji). | text: Name or text
    """,
    ),
    "maps": (
        "地图 路线 距离 怎么走 导航",
        """
    maps_route | Route between two places, with time. | origin: Start; destination: End; mode: driving…
    maps_distance | Distance between two places. | origin: Start address; destination: End address
    maps_geocode | Coordinates of an address. | address: Address
    maps_nearby | Places of a kind near an address (restaurants, hotels…). | address: Address; kind: Kind
    maps_traffic | Current traffic on a road or around an address. | address: Road or address
    """,
    ),
    "music": (
        "音乐 歌曲 播放 歌单",
        """
    music_play | Play a song, album or playlist. | query: Song, album or playlist name
    music_pause | Pause the music. |
    music_search | Search songs by title, artist or lyrics. | query: Words
    playlist_create | Create a playlist from songs. | name: Playlist name; songs: Song titles
    music_queue | Add a song to the play queue. | query: Song name
    """,
    ),
}

MESSAGES = [
    "What's the weather in Shanghai this weekend? Will it rain?",
    "明天北京的气温多少度？",
    "Email the Q3 report to finance@example.com",
    "下周二下午三点和产品团队开个会，加到日历里",
    "Find the contract PDF in the shared drive and list the folder",
    "查一下数据库里上个月的订单数量",
    "Open a pull request from the feature branch",
    "给这笔订单退款，再开一张发票",
    "Translate this paragraph into Japanese",
    "从公司到机场怎么走，路线多远？",
    "Play my running playlist",
    "Schedule a meeting for Friday and email the agenda to the team",
    "Tell me a joke",
]


def handler(**arguments: Any) -> dict[str, Any]:
    return arguments


def catalog() -> list[dict[str, Any]]:
    """The 50 tools as dict-style entries (the schema the model sees is written out here)."""
    entries = []
    for group, (keywords, lines) in CATALOG.items():
        for line in lines.strip().splitlines():
            name, description, parameters = (part.strip() for part in line.split("|"))
            pairs = [item.split(":", 1) for item in parameters.split(";") if item.strip()]
            properties = {p.strip(): {"type": "string", "description": d.strip()} for p, d in pairs}
            entries.append(
                {
                    "name": name,
                    "description": f"{description} ({', '.join(keywords.split())})",
                    "parameters": {"type": "object", "properties": properties, "required": list(properties)},
                    "handler": handler,
                    "groups": [group],
                    "level": 0,
                }
            )
    return entries


def request_bytes(recorded: Any) -> int:
    system = recorded.messages[0]["content"]
    tools = json.dumps(recorded.tools or [], ensure_ascii=False)
    return len(tools.encode("utf-8")) + len(system.encode("utf-8"))


async def measure(message: str, route_above: int | None) -> tuple[int, int]:
    """(bytes, tools sent) of the one request the agent makes for `message`."""
    model = ScriptedModel([reply("ok")])
    agent = Agent(model=model, tools=catalog(), route_tools_above=route_above)
    await agent.run(message)
    return request_bytes(model.calls[0]), len(model.calls[0].tools or [])


# A team's day in one conversation: topics come back (weather, mail, the calendar, the database),
# with follow-ups that name no topic; and one conversation that stays on one topic.
MIXED = [MESSAGES[i] for i in (0, 2, 1, 3, 2, 5, 0, 12, 3, 5, 11, 2, 1, 5, 3, 0, 12, 2, 5, 3)]
ONE_TOPIC = [MESSAGES[0], MESSAGES[1], "And on Sunday?", "下周一呢？"] * 5
PRICES = {"DeepSeek": (0.27, 0.07), "OpenAI gpt-4o-mini": (0.15, 0.075)}  # $ per 1M miss / hit
SIZES = (10, 15, 20, 30, 50)  # tools offered (the first groups of the catalogue)


def rendered(call: Any) -> str:
    """A request as a provider renders its prompt: system, tools, then the other messages."""
    parts = [json.dumps(call.messages[0], sort_keys=True, ensure_ascii=False)]
    parts.append(json.dumps(call.tools or [], sort_keys=True, ensure_ascii=False))
    parts += [json.dumps(m, sort_keys=True, ensure_ascii=False) for m in call.messages[1:]]
    return "\n".join(parts)


async def conversation(messages: list[str], route_above: int | None, size: int = 50) -> dict[str, float]:
    """One conversation through `Agent.run(session=Session())` with the first `size` tools: what a
    prefix cache cannot serve, and the input cost at the published miss/hit prices (tokens =
    characters / 4). Each answer is about 300 characters, like a short reply."""
    from hermes_core import Session

    model = ScriptedModel(
        [reply(f"ok {k}: " + "the answer, in a few sentences. " * 9) for k in range(len(messages))]
    )
    agent = Agent(model=model, tools=catalog()[:size], route_tools_above=route_above)
    session = Session()
    for message in messages:
        await agent.run(message, session=session)
    prompts = [rendered(call) for call in model.calls]
    uncached = 0
    for k, prompt in enumerate(prompts):
        kept = max((len(os.path.commonprefix([prompt, p])) for p in prompts[:k]), default=0)
        uncached += len(prompt) - kept
    total = sum(map(len, prompts))
    figures = {"uncached": float(uncached), "total": float(total)}
    for name, (miss, hit) in PRICES.items():
        figures[name] = (uncached * miss + (total - uncached) * hit) / 4 / 1e6
    return figures


def routing_time_us(repeats: int) -> float:
    """Median time of one routing decision over the sample messages (index cached, as in a run)."""
    from hermes_core.tools.routing import ToolRouter

    agent = Agent(tools=catalog())
    schemas = agent.registry.schemas()
    router = ToolRouter(agent.registry.get, above=ROUTE_ABOVE)
    router.select(schemas, MESSAGES[0])  # the index is built once per set of offered tools
    times = []
    for _ in range(repeats):
        for message in MESSAGES:
            started = time.perf_counter()
            router.select(schemas, message)
            times.append(time.perf_counter() - started)
    return statistics.median(times) * 1e6


def run(repeats: int = 200) -> dict:
    per_message: list[dict[str, str]] = []
    routed_total = unrouted_total = 0
    for message in MESSAGES:
        unrouted, all_tools = asyncio.run(measure(message, None))
        routed, sent = asyncio.run(measure(message, ROUTE_ABOVE))
        routed_total, unrouted_total = routed_total + routed, unrouted_total + unrouted
        per_message.append(
            {
                "message": message,
                "tools sent": f"{sent}/{all_tools}",
                "routed bytes": f"{routed:,}",
                "unrouted bytes": f"{unrouted:,}",
                "routed/unrouted": f"{routed / unrouted:.2f}",
            }
        )
    conversations = []
    for size in SIZES:
        for name, messages in (("mixed topics", MIXED), ("one topic", ONE_TOPIC)):
            every, routed = (asyncio.run(conversation(messages, above, size)) for above in (None, 0))
            conversations.append({
                "tools": str(size), "conversation (20 turns)": name,
                "uncached chars, all / routed": f"{every['uncached']:,.0f} / {routed['uncached']:,.0f}",
                **{f"{price} $, all / routed": f"{every[price]:.5f} / {routed[price]:.5f} "
                   f"({routed[price] / every[price] - 1:+.0%})" for price in PRICES},
            })  # fmt: skip
    count = len(MESSAGES)
    ratio = routed_total / unrouted_total
    routing_us = routing_time_us(repeats)
    return {
        "messages": count,
        "mean routed bytes": routed_total / count,
        "mean unrouted bytes": unrouted_total / count,
        "ratio": ratio,
        "routing µs": routing_us,
        "per_message": per_message,
        "conversations": conversations,
        "rows": [
            row(
                "prompt bytes per request, 50 tools: routed vs all (tools JSON + system)",
                f"{routed_total / count:,.0f} B",
                f"{unrouted_total / count:,.0f} B",
                ratio,
                TARGET_RATIO,
            ),
            row(
                "routing decision per request, 50 tools",
                f"{routing_us:.0f} µs",
                "",
                routing_us,
                TARGET_ROUTING_US,
                " µs",
            ),
        ],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=200, help="timed passes over the messages")
    args = parser.parse_args()
    figures = run(args.repeats)
    columns = ("tools sent", "routed bytes", "unrouted bytes", "routed/unrouted", "message")
    print(
        f"Prompt bytes per request (tools JSON + system prompt), 50 tools, route_tools_above={ROUTE_ABOVE}:"
    )
    print(format_table(figures["per_message"], columns))
    print(
        f"mean over {figures['messages']} messages: {figures['mean routed bytes']:,.0f} B routed, "
        f"{figures['mean unrouted bytes']:,.0f} B unrouted ({figures['ratio']:.0%}); "
        f"routing decision {figures['routing µs']:.0f} µs (median)"
    )
    print()
    print("One conversation, every tool sent vs routed by the window's messages (route_tools_above=0), "
          "every request as a provider's prompt cache sees it:")  # fmt: skip
    print(format_table(figures["conversations"], list(figures["conversations"][0])))
    print()
    print(format_table(figures["rows"]))


if __name__ == "__main__":
    main()
