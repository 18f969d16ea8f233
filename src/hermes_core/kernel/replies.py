"""Fixed replies the user may see, in Chinese and English, and how the language is chosen.

The model answers in the user's language by itself (the system prompt asks it to); these are the
few texts the code writes when the model cannot: limits hit, the model unreachable, a message
set aside because handling it kept stopping the service.
"""

from __future__ import annotations

import re
from typing import Literal

Language = Literal["zh", "en"]

_CJK = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]")

REPLIES: dict[str, dict[Language, str]] = {
    "max_turns": {
        "zh": "这个任务需要的步骤超出了单次处理的上限，我先停在这里。请把请求拆小一些或换个说法再试。",
        "en": "This task needed more steps than I can take in one go, so I stopped here. "
        "Please simplify or split the request and try again.",
    },
    "max_tool_calls": {
        "zh": "这个任务调用工具的次数已达上限，我先停在这里。请把请求拆小一些再试。",
        "en": "This task reached the limit on tool calls, so I stopped here. "
        "Please split the request into smaller parts and try again.",
    },
    "model_unavailable": {
        "zh": "抱歉，模型服务暂时不可用，请稍后再试。",
        "en": "Sorry, the model service is temporarily unavailable. Please try again in a moment.",
    },
    "model_rejected": {
        "zh": "抱歉，模型服务拒绝了这次请求，问题已记录。请换个说法或联系管理员。",
        "en": "Sorry, the model service rejected this request; the problem has been logged. "
        "Please rephrase or contact the administrator.",
    },
    "throttled": {  # over a per-sender limit (gateway/flood.py): the message gets no turn
        "zh": "消息发得太快了，这条我先跳过了。请稍等一会儿再发。",
        "en": "You're sending messages faster than I can answer, so I skipped this one. "
        "Please wait a moment and send it again.",
    },
    "internal_error": {
        "zh": "抱歉，处理这条消息时出了问题，已记录下来。请稍后再试。",
        "en": "Sorry, something went wrong while handling this message; it has been logged. "
        "Please try again later.",
    },
    "set_aside": {
        "zh": "抱歉，处理这条消息时服务多次中断，我已把它搁置，不再重试，并记录下来通知了管理员。"
        "请换个说法再发一次，或联系管理员。",
        "en": "Sorry, handling this message interrupted the service more than once, so I have set it "
        "aside instead of trying again, and logged it for the administrator. "
        "Please rephrase it or contact the administrator.",
    },
    "non_text": {  # what nothing can read: stickers, message types not known
        "zh": "抱歉，我读不了这种消息，请用文字描述你的需求。",
        "en": "Sorry, I cannot read this kind of message. Please describe what you need in text.",
    },
    "how_can_i_help": {"zh": "你好，有什么可以帮你？", "en": "Hi, how can I help?"},
    "repeated_call": {  # to the model: an identical call refused (kernel/guards.py); {tool} is filled in
        "zh": "{tool} 已用相同参数调用过且此后无变化，结果见上。请勿重复：直接用已有结果回答或换个做法。",
        "en": "{tool} was already called with these arguments and nothing has changed since; its result is "
        "above. Do not call it again: answer from what you have, or change your strategy.",
    },
    "empty_reply": {
        "zh": "抱歉，模型没有给出有效的回答，请再试一次。",
        "en": "Sorry, the model did not give a usable answer. Please try again.",
    },
    "command_admins_only": {  # /new, /reset, /forget in a group's shared conversation (gateway/commands.py)
        "zh": "这个群的对话记录和笔记是大家共用的，只有管理员可以清除。如需清除，请联系管理员。",
        "en": "This group's history and notes are shared: only an admin can clear them. Please ask one.",
    },
    # approvals (tasks/pending.py); {tool}, {arguments} and {id} are filled in
    "approval_request": {
        "zh": "需要你的确认才能继续：调用 {tool}，参数 {arguments}。审批编号 {id}，10 分钟内有效。",
        "en": "I need your approval to continue: call {tool} with {arguments}. "
        "Approval id {id}, valid for 10 minutes.",
    },
    "approval_approved": {"zh": "已批准：{tool}（{by}）", "en": "Approved: {tool} (by {by})"},
    "approval_rejected": {"zh": "已拒绝：{tool}（{by}）", "en": "Rejected: {tool} (by {by})"},
    "approval_expired": {
        "zh": "这个审批已过期，未执行。",
        "en": "This approval has expired; nothing was run.",
    },
    "approval_not_allowed": {
        "zh": "只有发起这个任务的人或管理员可以审批。",
        "en": "Only the person who started this task, or an admin, can decide.",
    },
    "approval_already_decided": {"zh": "这个审批已经处理过了。", "en": "This approval was already decided."},
    "approval_unknown": {"zh": "找不到这个审批。", "en": "There is no such approval."},
    # a reply streamed as it is written (channels/streaming.py); {tool} is filled in
    "stream_thinking": {"zh": "思考中…", "en": "Thinking…"},
    "stream_tool_running": {"zh": "⏳ 正在运行 {tool}…", "en": "⏳ running {tool}…"},
    "stream_tool_done": {"zh": "✓ {tool}", "en": "✓ {tool}"},
    "stream_tool_failed": {"zh": "✗ {tool}", "en": "✗ {tool}"},
    "stream_interrupted": {
        "zh": "⚠️ 回复中断，上面写到一半的内容已撤下。",
        "en": "⚠️ The reply stopped part-way; the unfinished text was taken down.",
    },
    # /memory and /forget (memory/conversation.py); {n}, {text} and {count} are filled in
    "memory_empty": {
        "zh": "这次对话我还没有记下任何要点。",
        "en": "I have not noted anything for this conversation yet.",
    },
    "memory_header": {"zh": "这次对话我记下的内容：", "en": "What I remember of this conversation:"},
    "memory_facts": {"zh": "事实与约束：", "en": "Facts and constraints:"},
    "memory_pending": {"zh": "待办步骤：", "en": "Pending steps:"},
    "memory_done": {"zh": "已完成步骤：", "en": "Completed steps:"},
    "memory_summary": {"zh": "早前对话摘要：", "en": "Summary of earlier messages: "},
    "memory_usage": {
        "zh": "发送 /forget N 删除第 N 条，发送 /forget 全部清除。",
        "en": "Send /forget N to remove item N, or /forget to clear everything.",
    },
    "memory_forgot_one": {"zh": "已删除第 {n} 条：{text}", "en": "Removed item {n}: {text}"},
    "memory_no_item": {
        "zh": "没有第 {n} 条。发送 /memory 查看列表。",
        "en": "There is no item {n}. Send /memory to see the list.",
    },
    "memory_forgot_all": {
        "zh": "已清除这次对话中记下的 {count} 项内容（要点和摘要），聊天记录本身保留。",
        "en": "Cleared {count} item(s) I had noted for this conversation (notes and summary); "
        "the chat history itself is kept.",
    },
    # pictures and files (gateway/media.py); {why}, {name}, {size} and {limit} are filled in
    "attachment_no_vision": {
        "zh": "抱歉，我现在使用的模型看不了图片。请用文字描述图片里的内容，或请管理员换一个支持图片的模型。",
        "en": "Sorry, the model I use cannot look at pictures. Please describe the picture in words, "
        "or ask the administrator for a model that takes images.",
    },
    "attachment_no_workspace": {
        "zh": "抱歉，这里没有配置保存文件的工作区，我收不了文件。请把内容直接以文字发给我。",
        "en": "Sorry, no workspace is set up here for saving files, so I cannot take files. "
        "Please paste the content as text.",
    },
    "attachment_type": {
        "zh": "抱歉，我读不了这个附件（{name}）。"
        "我能读 PDF、Word、Excel、PowerPoint、TXT、Markdown 和 CSV 文件，以及 PNG、JPEG、GIF、WebP 图片。",
        "en": "Sorry, I cannot read this attachment ({name}). I can read PDF, Word, Excel, PowerPoint, TXT, "
        "Markdown and CSV files, and PNG, JPEG, GIF and WebP pictures.",
    },
    "attachment_media": {  # voice and video; {why}: no transcription endpoint, or a format it does not take
        "zh": "抱歉，这段语音或视频我转不了文字（{why}）。请把内容用文字发给我。",
        "en": "Sorry, I cannot turn this voice message or video into text ({why}). Please send it as text.",
    },
    "attachment_too_large": {
        "zh": "抱歉，这个附件太大了（{size}，上限 {limit}）。请发一个小一些的。",
        "en": "Sorry, this attachment is too large ({size}; the limit is {limit}). "
        "Please send a smaller one.",
    },
    "attachment_timeout": {
        "zh": "抱歉，附件下载超时了。请稍后再发一次。",
        "en": "Sorry, downloading the attachment timed out. Please send it again in a moment.",
    },
    "attachment_unavailable": {
        "zh": "抱歉，我取不到这个附件（{why}）。请重新发送。",
        "en": "Sorry, I could not get this attachment ({why}). Please send it again.",
    },
    "attachment_unusable": {
        "zh": "抱歉，这个附件无法使用：{why}。",
        "en": "Sorry, this attachment cannot be used: {why}.",
    },
    "attachment_unsaved": {
        "zh": "抱歉，文件 {name} 没能保存到工作区（空间不足或名称不可用）。",
        "en": "Sorry, the file {name} could not be saved in the workspace "
        "(no room, or the name cannot be used).",
    },
    # conversation commands (gateway/commands.py); {commands}, {tools}, {jobs} are filled in
    "conversation_new": {
        "zh": "已开始新对话：之前的聊天记录和记下的要点不再带入。",
        "en": "Started a new conversation: earlier messages and notes are no longer carried over.",
    },
    "help_header": {"zh": "可用命令：", "en": "Commands:"},
    "help_commands": {
        "zh": "/新对话 或 /重置（/new、/reset）开始新对话\n/停止（/stop）停止本对话正在运行的任务\n"
        "/任务（/jobs）列出本对话的定时任务\n/记忆（/memory）查看记下的要点，/忘记 [N]（/forget）删除"
        "（聊天记录保留）\n/帮助（/help）显示本帮助",
        "en": "/new or /reset (/新对话, /重置) start a new conversation\n/stop (/停止) stop the task "
        "running in this conversation\n/jobs (/任务) list this conversation's scheduled tasks\n"
        "/memory (/记忆) what I noted, /forget [N] (/忘记) remove it (the chat history is kept)\n"
        "/help (/帮助) this list",
    },
    "help_tools": {"zh": "你可以使用的工具：{tools}", "en": "Tools you may use: {tools}"},
    "help_no_tools": {"zh": "你目前没有可用的工具。", "en": "There are no tools you may use."},
    "task_stopped": {"zh": "这个任务已按要求停止。", "en": "This task was stopped as asked."},
    "stop_done": {"zh": "已停止正在运行的任务。", "en": "Stopped the running task."},
    "stop_nothing": {
        "zh": "这个对话现在没有你发起的、正在运行的任务。",
        "en": "No task of yours is running in this conversation.",
    },
    "jobs_none": {"zh": "这个对话没有定时任务。", "en": "This conversation has no scheduled tasks."},
    "jobs_header": {"zh": "这个对话的定时任务：", "en": "Scheduled tasks of this conversation:"},
    "jobs_unavailable": {
        "zh": "这里没有定时任务（定时任务由网关 hermes-kernel serve 运行）。",
        "en": "There are no scheduled tasks here (scheduled tasks run in the gateway, hermes-kernel serve).",
    },
    # plan-and-execute mode (plans/executor.py)
    "plan_invalid": {
        "zh": "抱歉，我没能为这个请求制定出可以执行的计划。请换个说法或把请求拆小一些再试。",
        "en": "Sorry, I could not work out a plan I can run for this request. "
        "Please rephrase or split the request and try again.",
    },
    "plan_failed": {
        "zh": "抱歉，计划中的步骤多次执行失败，我先停在这里。请稍后再试，或换个说法。",
        "en": "Sorry, steps of the plan kept failing, so I stopped here. "
        "Please try again later or rephrase the request.",
    },
}


def detect_language(text: str) -> Language:
    """Chinese when the text contains CJK ideographs, English otherwise."""
    return "zh" if _CJK.search(text or "") else "en"


def fixed_reply(key: str, language: Language) -> str:
    return REPLIES[key][language]
