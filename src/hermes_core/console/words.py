"""The console's own words in English and Chinese, in one table, and which language a request gets.

The language: `?lang=zh|en` (kept in a cookie, so the next page keeps it), else the cookie, else
the first of the browser's `Accept-Language` ranges that is Chinese or English, by its q value
(RFC 9110 §12.5.4), else English. Only the console's words change: what the agent and users wrote
is shown as it is. The few words the script needs (buttons it makes, its errors) reach it in the
page's `data-words` attribute.
"""

from __future__ import annotations

from typing import Literal

from aiohttp import web
from aiohttp.typedefs import Handler

Lang = Literal["en", "zh"]
COOKIE = "hermes_console_lang"
LANGUAGES: tuple[Lang, ...] = ("en", "zh")

WORDS: dict[str, tuple[str, str]] = {  # key: (English, 中文)
    # navigation and headings
    "chat": ("Chat", "对话"),
    "tasks": ("Tasks", "任务"),
    "task_title": ("Task", "任务"),
    "approvals": ("Approvals", "审批"),
    "deadletters": ("Dead letters", "投递失败"),
    "schedule": ("Schedule", "定时任务"),
    "status": ("Status", "状态"),
    "login": ("Console login", "登录控制台"),
    "refused": ("Console not available here", "此处无法打开控制台"),
    "task_missing": ("Task not found", "找不到该任务"),
    "input": ("Input", "输入"),
    "timeline": ("Timeline", "时间线"),
    "error": ("Error", "错误"),
    "reply": ("Reply", "回复"),
    "recently_decided": ("Recently decided", "最近的决定"),
    "conversations": ("Conversations", "会话"),
    "model": ("Model", "模型"),
    # buttons and forms
    "send": ("Send", "发送"),
    "new_conversation": ("New conversation", "新对话"),
    "picture": ("Picture", "图片"),
    "message_placeholder": ("Message the agent (Enter to send)", "给助手发消息（回车发送）"),
    "approve": ("Approve", "批准"),
    "reject": ("Reject", "拒绝"),
    "resend": ("Resend", "重新发送"),
    "cancel": ("Cancel", "取消"),
    "filter": ("Filter", "筛选"),
    "clear": ("clear", "清除"),
    "failed_only": ("failed only", "只看失败"),
    "open": ("Open", "打开"),
    "token": ("Console token", "控制台令牌"),
    "wrong_token": ("Wrong token.", "令牌不对。"),
    "conversation_hint": (
        "Conversation {id}: the same gateway path as every channel; each reply links to its trace.",
        "会话 {id}：与其他渠道走同一条网关路径；每条回复都链接到它的执行记录。",
    ),
    # table heads
    "started": ("started", "开始"),
    "task": ("task", "任务"),
    "state": ("status", "状态"),
    "conversation": ("conversation", "会话"),
    "outcome": ("outcome", "结果"),
    "model_calls": ("model calls", "模型调用"),
    "tools": ("tools", "工具"),
    "tokens": ("tokens", "令牌数"),
    "time": ("time", "用时"),
    "step": ("step", "步骤"),
    "what": ("what", "内容"),
    "detail": ("detail", "详情"),
    "id": ("id", "编号"),
    "tool": ("tool", "工具"),
    "arguments": ("arguments", "参数"),
    "asked_by": ("asked by", "发起人"),
    "expires": ("expires", "过期"),
    "decided": ("decided", "决定时间"),
    "died": ("died", "失败时间"),
    "attempts": ("attempts", "尝试次数"),
    "text": ("text", "文本"),
    "when": ("when", "时间"),
    "next_fire": ("next fire", "下次执行"),
    "created_by": ("created by", "创建人"),
    "last_fire": ("last fire", "上次执行"),
    "prompt": ("prompt", "指令"),
    "turn_in_flight": ("turn in flight", "进行中"),
    "messages_waiting": ("messages waiting", "等待的消息"),
    "replies_to_send": ("replies to send", "待发送回复"),
    "provider": ("provider", "提供方"),
    "model_name": ("model", "模型"),
    "endpoint": ("endpoint", "接口地址"),
    "degraded": ("degraded", "降级"),
    # the status page
    "accepting": ("accepting messages", "接收消息"),
    "yes": ("yes", "是"),
    "no": ("no", "否"),
    "turns_in_flight": ("turns in flight", "进行中的轮次"),
    "replies_waiting": ("replies waiting", "等待发送的回复"),
    "inbox_pending": ("inbox pending", "收件箱待处理"),
    "outbox_pending": ("outbox pending", "发件箱待发送"),
    "dead_letters": ("dead letters", "投递失败"),
    "set_aside": ("set aside", "已搁置"),
    "approvals_waiting": ("approvals waiting", "等待审批"),
    "turns_done": ("turns done", "已完成轮次"),
    "replies_sent": ("replies sent", "已发送回复"),
    "turns_per_minute": ("turns / min", "轮次 / 分钟"),
    "sends_per_minute": ("sends / min", "发送 / 分钟"),
    "status_hint": (
        "Rates: in the last minute. This page refreshes every 5 s.",
        "速率：最近一分钟。本页每 5 秒刷新。",
    ),
    "tasks_last_hour": ("tasks (last hour)", "任务（最近一小时）"),
    "failed_tasks": ("failed tasks", "失败的任务"),
    "failed_model_calls": ("failed model calls", "失败的模型调用"),
    "model_error_rate": ("model error rate", "模型错误率"),
    "outcomes": ("outcomes", "结束方式"),
    "failed_tasks_link": ("Failed tasks", "查看失败的任务"),
    # empty states
    "no_tasks": ("No tasks.", "还没有任务。"),
    "no_traces": (
        "No trace store is configured: tasks are not recorded.",
        "未配置执行记录：任务不会被记录。",
    ),
    "nothing_waits": ("Nothing waits for a decision.", "没有等待审批的调用。"),
    "no_approvals": ("Approvals are not configured.", "未配置审批。"),
    "no_dead_letters": ("No reply was given up on.", "没有投递失败的回复。"),
    "no_jobs": ("No job is scheduled.", "没有定时任务。"),
    "scheduling_off": ("Scheduling is off in this gateway.", "此网关未开启定时任务。"),
    "no_busy_conversation": ("No conversation is busy.", "没有正在处理的会话。"),
    "no_model": ("No model configured: the offline demo model answers.", "未配置模型：由离线演示模型回答。"),
    # words the script uses (console.js, through data-words)
    "approval_needed": ("Approval needed:", "需要审批："),
    "resent": ("resent", "已重新发送"),
    "cancelled": ("cancelled", "已取消"),
    "proactive": ("sent on its own", "主动发送"),
    "too_large": ("The picture is larger than {limit}.", "图片超过 {limit}。"),
}
SCRIPT_WORDS = (
    "approve", "reject", "approval_needed", "error", "resent", "cancelled", "proactive", "too_large",
)  # fmt: skip


def word(key: str, lang: Lang) -> str:
    return WORDS[key][LANGUAGES.index(lang)]


def language(request: web.Request) -> Lang:
    """The language of this request's pages (see the module's docstring)."""
    for chosen in (request.query.get("lang"), request.cookies.get(COOKIE)):
        if chosen in LANGUAGES:
            return chosen
    return accepted(request.headers.get("Accept-Language", ""))


def accepted(header: str) -> Lang:
    """The preferred of zh and en in an Accept-Language header (`zh-CN,zh;q=0.9,en;q=0.8`): the
    highest q value, the first listed on a tie; q=0 means "not this one"."""
    best: tuple[float, Lang] = (0.0, "en")
    for item in header.split(",")[:20]:
        tag, _, params = item.strip().partition(";")
        primary = tag.strip().lower().split("-")[0]
        try:
            quality = float(params.strip()[2:]) if params.strip().startswith("q=") else 1.0
        except ValueError:
            continue
        if primary in LANGUAGES and quality > best[0]:
            best = (quality, primary)
    return best[1]


@web.middleware
async def remember_language(request: web.Request, handler: Handler) -> web.StreamResponse:
    """A page asked for with `?lang=` keeps that language in a cookie, for the pages after it."""
    response = await handler(request)
    chosen = request.query.get("lang")
    if chosen in LANGUAGES and not response.prepared:
        response.set_cookie(COOKIE, chosen, path="/console", samesite="Strict", max_age=365 * 86400)
    return response
