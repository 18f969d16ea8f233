"""The built-in offline demo model: what runs when no model endpoint is configured.

It is not a language model and never pretends to be one: every text reply starts with
"[offline demo model]" (or "【离线演示模型】") and the fallback reply explains how to configure a real
model. What it can do is enough to show the loop working end to end without a network:

1. After a tool result, it reports that result plainly, in the user's language.
2. The obvious questions go to the right example tool (`route`), in Chinese and English:
   arithmetic in digits and operators or words ("3 plus 4", "3加4", "6 乘以 7") → calculator;
   today's date, the time now, today's weekday → current_time; the weekday of a date, the days
   between two dates → date_diff. A date (2025-01-01, 2025/1/1, 2025年1月1日) is read as a date
   first, so it never reaches the calculator as `2025-01-01`.
3. Otherwise, when the message clearly asks for one of the offered tools, it calls that tool,
   filling the arguments from the message by the tool's JSON schema.
4. Otherwise it says plainly what it can and cannot do, and how to configure a real model.

"Clearly asks" is keyword overlap between the message and the tool's name and description,
scored as follows; a tool is called when its score reaches `CALL_THRESHOLD` (2):

- an English word (3+ letters, not a stop word) that appears in the tool's name: 2;
- an English word that appears only in the description: 1;
- a Chinese character bigram shared with the description: 1 each;
- an arithmetic expression such as `(12+34)*2` in the message, for a tool whose description or
  parameters mention calculating or math: 3.

So "what time is it" calls `current_time` (name word "time"), "现在几点" does too (现在, 几点),
"what is (12+34)*2" calls the calculator (the expression), and "hello" calls nothing. A single
description word is deliberately not enough: the demo should rather explain itself than guess.
"""

from __future__ import annotations

import inspect
import json
import re
from collections.abc import Iterator
from datetime import date

from ..kernel.messages import JSON, Message, ModelResponse, ToolCall, Usage
from ..kernel.model import ModelClient, TextCallback
from ..tools.clock import WEEKDAYS

CALL_THRESHOLD = 2
NAME_WORD_SCORE = 2
EXPRESSION_SCORE = 3

EN_PREFIX = "[offline demo model] "
ZH_PREFIX = "【离线演示模型】"

_STOP_WORDS = frozenset(
    "what the is it please how much and for you can are this that with use all get tell give show "
    "want need does did was were will would could should any some about from into than then there "
    "here when where which who why its not but may one".split()
)
_CJK = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]+")
_MATH_HINT = re.compile(r"calculat|arithmetic|expression|math|formula|计算|算式|表达式")
_OPERATORS = "+\\-*/×÷^%＋－＊／％＾"
_FUNCTION_NAMES = "sqrt|abs|round|min|max|log10|log2|log|exp|sin|cos|tan|floor|ceil|factorial"
_EXPRESSION_RUN = re.compile(
    rf"(?:(?<![A-Za-z])(?:{_FUNCTION_NAMES})(?![A-Za-z])|[\d０-９.,()（）\s{_OPERATORS}])+"
)
_BINARY_OPERATOR = re.compile(rf"[\d０-９)）]\s*[{_OPERATORS}]")
_QUOTED = re.compile(r'"([^"]+)"|\'([^\']+)\'|“([^”]+)”|「([^」]+)」|‘([^’]+)’')
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


class OfflineModel(ModelClient):
    """A deterministic, network-free stand-in for a model: calls example tools or explains itself."""

    name = "offline"

    async def complete(
        self,
        messages: list[Message],
        tools: list[dict[str, JSON]] | None = None,
        *,
        on_text: TextCallback | None = None,
    ) -> ModelResponse:
        user_text = _last_user_text(messages)
        chinese = bool(_CJK.search(user_text))
        if messages and messages[-1].get("role") == "tool":
            return await self._reply(messages, _describe_tool_results(messages, chinese), on_text)
        call_id = f"offline_{_count_calls(messages) + 1}"
        call = route(user_text, tools or [], call_id) or choose_tool_call(
            _without_dates(user_text), tools or [], call_id
        )
        if call is None:
            return await self._reply(messages, _explain_offline(tools or [], chinese), on_text)
        usage = _estimate_usage(messages, call.arguments)
        return ModelResponse(tool_calls=[call], usage=usage, model=self.name, finish_reason="tool_calls")

    async def _reply(self, messages: list[Message], text: str, on_text: TextCallback | None) -> ModelResponse:
        """A text reply, handed whole to the streaming listener (a plain or async function) if any."""
        if on_text is not None:
            result = on_text(text)
            if inspect.isawaitable(result):
                await result
        usage = _estimate_usage(messages, text)
        return ModelResponse(content=text, usage=usage, model=self.name, finish_reason="stop")


# --- the obvious questions ---------------------------------------------------------------------

_ISO_DATE = re.compile(r"(?<!\d)(\d{4})[-/.](\d{1,2})[-/.](\d{1,2})(?!\d)")
_ZH_DATE = re.compile(r"(\d{4})\s*年\s*(\d{1,2})\s*月\s*(\d{1,2})\s*[日号號]")
_WEEKDAY = re.compile(
    r"day of (?:the )?week|weekday|what day|which day|星期几|星期幾|周几|週幾|礼拜几|禮拜幾"
)
_BETWEEN = re.compile(
    r"between|how many days|how long|days? (?:from|until|till|to)|"
    r"相差|之间|之間|多少天|几天|幾天|间隔|間隔|相隔|距离|距離"
)  # noqa: E501
_TIME_NOW = re.compile(r"\btime\b|几点|幾點|时间|時間|几时|幾時")
_TODAY = re.compile(
    r"\btoday\b|\btoday's\b|今天|今日|几号|幾號|几月几|"
    r"what(?:'s| is) the date|current date|date is it|what day is it"
)  # noqa: E501
_ZONE = re.compile(r"\b(?:[A-Z][A-Za-z_-]+/[A-Za-z_+-]+(?:/[A-Za-z_-]+)?|UTC)\b")  # Asia/Shanghai, UTC
_NUMBER_TEXT = r"\d+(?:\.\d+)?"
_WORD_OPERATORS = {
    "plus": "+", "add": "+", "minus": "-", "less": "-", "times": "*", "multiplied by": "*",
    "divided by": "/", "over": "/", "加上": "+", "加": "+", "减去": "-", "减": "-", "減去": "-", "減": "-",
    "乘以": "*", "乘": "*", "除以": "/", "除": "/",
}  # fmt: skip
_OPERATOR_WORDS = "|".join(sorted(map(re.escape, _WORD_OPERATORS), key=len, reverse=True))
_WORD_EXPRESSION = re.compile(rf"{_NUMBER_TEXT}(?:\s*(?:{_OPERATOR_WORDS}|[-+*/×÷])\s*{_NUMBER_TEXT})+", re.I)
_EN_NUMBERS = dict(
    zip("zero one two three four five six seven eight nine ten eleven twelve".split(), range(13), strict=True)
)
_ZH_DIGITS = dict(zip("零一二两三四五六七八九", (0, 1, 2, 2, 3, 4, 5, 6, 7, 8, 9), strict=True))
_ZH_NUMBER = re.compile(r"[零一二两三四五六七八九十]+")
ZH_WEEKDAYS = ("星期一", "星期二", "星期三", "星期四", "星期五", "星期六", "星期日")


def route(text: str, tools: list[dict[str, JSON]], call_id: str = "offline_1") -> ToolCall | None:
    """The call an obvious question needs (see the module docstring), or None; only offered tools."""
    offered = {str((t.get("function") or t).get("name", "")): t.get("function") or t for t in tools}
    dates = find_dates(text)
    lower = text.lower()
    arguments: dict[str, JSON] | None = None
    name = ""
    if "date_diff" in offered and len(dates) >= 2:
        name, arguments = "date_diff", {"start": dates[0], "end": dates[1]}
    elif "date_diff" in offered and len(dates) == 1 and _WEEKDAY.search(lower):
        name, arguments = "date_diff", {"start": dates[0], "end": dates[0]}
    elif "current_time" in offered and not dates and (_TIME_NOW.search(lower) or _TODAY.search(lower)):
        zone = _ZONE.search(text)
        name, arguments = "current_time", {"timezone": zone.group()} if zone else {}
    elif "calculator" in offered and not dates:
        expression = extract_expression(text) or word_expression(text)
        if expression is not None:
            name, arguments = "calculator", {"expression": expression}
    if arguments is None:
        return None
    return ToolCall(id=call_id, name=name, arguments=json.dumps(arguments, ensure_ascii=False))


def find_dates(text: str) -> list[str]:
    """The calendar dates in the text, in order, as ISO `YYYY-MM-DD` (invalid ones skipped)."""
    found = sorted(
        [(m.start(), m.groups()) for m in _ISO_DATE.finditer(text)]
        + [(m.start(), m.groups()) for m in _ZH_DATE.finditer(text)]
    )
    dates = []
    for _, (year, month, day) in found:
        try:
            dates.append(date(int(year), int(month), int(day)).isoformat())
        except ValueError:
            continue
    return dates


def word_expression(text: str) -> str | None:
    """Arithmetic written with words ("3 plus 4", "三加四", "6 乘以 7") as a calculator expression."""
    text = _ZH_NUMBER.sub(
        lambda m: str(_zh_number(m.group())) if _zh_number(m.group()) is not None else m.group(), text
    )
    text = re.sub(r"[a-z]+", lambda m: str(_EN_NUMBERS.get(m.group().lower(), m.group())), text, flags=re.I)
    found = max((m.group() for m in _WORD_EXPRESSION.finditer(text)), key=len, default=None)
    if found is None:
        return None
    operators = re.compile(rf"\s*({_OPERATOR_WORDS})\s*", re.I)
    return operators.sub(lambda m: f" {_WORD_OPERATORS[m.group(1).lower()]} ", found).strip()


def _zh_number(text: str) -> int | None:
    """一 … 九十九 (and 两) as an int; None for anything longer or malformed."""
    if all(char in _ZH_DIGITS for char in text) and len(text) == 1:
        return _ZH_DIGITS[text]
    tens, ten, ones = text.partition("十")
    if not ten or len(tens) > 1 or len(ones) > 1:
        return None
    if (tens and tens not in _ZH_DIGITS) or (ones and ones not in _ZH_DIGITS):
        return None
    return (_ZH_DIGITS[tens] if tens else 1) * 10 + (_ZH_DIGITS[ones] if ones else 0)


def _without_dates(text: str) -> str:
    """The text with its dates blanked, so that `2025-01-01` is never taken for a subtraction."""
    return _ZH_DATE.sub(" ", _ISO_DATE.sub(" ", text))


# --- choosing a tool -------------------------------------------------------------------------


def choose_tool_call(text: str, tools: list[dict[str, JSON]], call_id: str = "offline_1") -> ToolCall | None:
    """The tool call this message clearly asks for, or None. Ties go to the first tool offered."""
    expression = extract_expression(text)
    best: dict[str, JSON] | None = None
    best_score = 0
    for schema in tools:
        function = schema.get("function") or schema  # also accept the flat {"name", ...} form
        score = _score(text, function, expression)
        if score >= CALL_THRESHOLD and score > best_score:
            best_score, best = score, function
    if best is None:
        return None
    arguments = _fill_arguments(text, best.get("parameters") or {}, expression)
    if arguments is None:
        return None
    arguments_json = json.dumps(arguments, ensure_ascii=False)
    return ToolCall(id=call_id, name=str(best.get("name", "")), arguments=arguments_json)


def extract_expression(text: str) -> str | None:
    """The longest arithmetic expression in `text` (digits with a binary operator), or None."""
    candidates = []
    for match in _EXPRESSION_RUN.finditer(text):
        candidate = match.group().strip().strip(",.").strip()
        candidate = candidate.lstrip(")）*/×÷^%＊／％＾").rstrip("(（+-*/×÷^%＋－＊／％＾").strip()
        has_two_operands = re.search(r"\d.*\d|\d.*\(", candidate)  # so "-5" or "5%" alone is not maths
        if _BINARY_OPERATOR.search(candidate) and has_two_operands:
            candidates.append(candidate)
    return max(candidates, key=len, default=None)


def _score(text: str, function: dict[str, JSON], expression: str | None) -> int:
    name = str(function.get("name", ""))
    description = str(function.get("description", ""))
    name_words = _english_words(re.sub(r"([a-z])([A-Z])", r"\1 \2", name).replace("_", " "))
    description_words = _english_words(description)
    score = sum(
        NAME_WORD_SCORE if word in name_words else 1 if word in description_words else 0
        for word in _english_words(text)
    )
    score += len(_bigrams(text) & _bigrams(description))
    schema_text = f"{name} {description} {json.dumps(function.get('parameters') or {}, ensure_ascii=False)}"
    if expression and _MATH_HINT.search(schema_text.lower()):
        score += EXPRESSION_SCORE
    return score


def _english_words(text: str) -> set[str]:
    return {word for word in re.findall(r"[a-z]+", text.lower()) if len(word) >= 3} - _STOP_WORDS


def _bigrams(text: str) -> set[str]:
    return {run[i : i + 2] for run in _CJK.findall(text) for i in range(len(run) - 1)}


# --- filling arguments from the message ------------------------------------------------------


def _fill_arguments(text: str, parameters: dict[str, JSON], expression: str | None) -> dict[str, JSON] | None:
    """Arguments for the schema's properties from the message; None if a required one is missing."""
    required = set(parameters.get("required") or [])
    quoted = iter(next(group for group in match.groups() if group) for match in _QUOTED.finditer(text))
    numbers = iter(_NUMBER.findall(text))
    arguments: dict[str, JSON] = {}
    for name, spec in (parameters.get("properties") or {}).items():
        spec = spec if isinstance(spec, dict) else {}
        value = _value_for(name, spec, text, expression, quoted, numbers)
        if value is not None:
            arguments[name] = value
        elif name in required and "default" not in spec:
            return None
    return arguments


def _value_for(
    name: str,
    spec: dict[str, JSON],
    text: str,
    expression: str | None,
    quoted: Iterator[str],
    numbers: Iterator[str],
) -> JSON:
    types = _schema_types(spec)
    if "enum" in spec:
        return next((value for value in spec["enum"] if str(value).lower() in text.lower()), None)
    if "string" in types:
        hint = f"{name} {spec.get('description', '')} {spec.get('title', '')}".lower()
        if expression and _MATH_HINT.search(hint):
            return expression
        return next(quoted, None)
    if "integer" in types:
        return next((int(number) for number in numbers if "." not in number), None)
    if "number" in types:
        return next((float(number) if "." in number else int(number) for number in numbers), None)
    if "boolean" in types:
        return _boolean_in(text)
    return None


def _schema_types(spec: dict[str, JSON]) -> set[str]:
    """The JSON types a property accepts, looking through `anyOf`/`oneOf` (how pydantic writes Optional)."""
    declared = spec.get("type", [])
    types = {declared} if isinstance(declared, str) else {str(kind) for kind in declared}
    for option in [*spec.get("anyOf", []), *spec.get("oneOf", [])]:
        if isinstance(option, dict):
            types |= _schema_types(option)
    return types


def _boolean_in(text: str) -> bool | None:
    words = set(re.findall(r"[a-z]+", text.lower()))
    yes, no = bool(words & {"yes", "true"}), bool(words & {"no", "false"})
    return yes if yes != no else None


# --- text replies ----------------------------------------------------------------------------


def _describe_tool_results(messages: list[Message], chinese: bool) -> str:
    """One line per trailing tool result: "The calculator tool returned: 92"."""
    names = {
        call.get("id"): (call.get("function") or {}).get("name")
        for message in messages
        if message.get("role") == "assistant"
        for call in message.get("tool_calls") or []
        if isinstance(call, dict)
    }
    trailing: list[Message] = []
    for message in reversed(messages):
        if message.get("role") != "tool":
            break
        trailing.insert(0, message)
    lines = []
    question = _last_user_text(messages)
    for message in trailing:
        tool = names.get(message.get("tool_call_id")) or message.get("name")
        content = _content_text(message.get("content"))
        value, failed = _tool_value(content)
        if not failed:
            value = _sentence(str(tool), content, question, chinese) or value
        if chinese:
            label = f"{tool} 工具" if tool else "工具"
            lines.append(f"{label}报告了错误：{value}" if failed else f"{label}返回：{value}")
        else:
            label = f"The {tool} tool" if tool else "The tool"
            lines.append(f"{label} reported an error: {value}" if failed else f"{label} returned: {value}")
    return (ZH_PREFIX if chinese else EN_PREFIX) + "\n".join(lines)


def _sentence(tool: str, content: str, question: str, chinese: bool) -> str | None:
    """A readable sentence for a current_time or date_diff result, or None (the plain value)."""
    try:
        data = json.loads(content)
    except ValueError:
        return None
    if not isinstance(data, dict):
        return None
    if tool == "current_time" and {"date", "time", "weekday", "timezone"} <= data.keys():
        day = _weekday(str(data["weekday"]), chinese)
        zone = f"{data['timezone']}, UTC{data.get('utc_offset', '')}"
        if _TIME_NOW.search(question.lower()):
            if chinese:
                return f"现在是 {data['time']}（{data['date']}，{day}，{zone}）"
            return f"it is {data['time']} on {day}, {data['date']} ({zone})"
        return (
            f"今天是 {data['date']}，{day}（{zone}）"
            if chinese
            else f"today is {day}, {data['date']} ({zone})"
        )
    if tool == "date_diff" and "days" in data and "start_weekday" in data:
        dates = find_dates(question) or ["?", "?"]
        start, end = dates[0], dates[-1]
        first, last = (
            _weekday(str(data["start_weekday"]), chinese),
            _weekday(str(data["end_weekday"]), chinese),
        )
        if data["days"] == 0 and data.get("seconds") == 0:
            return f"{start} 是{first}" if chinese else f"{start} is a {first}"
        if chinese:
            return f"从 {start}（{first}）到 {end}（{last}）相差 {data['days']} 天"
        return f"from {start} ({first}) to {end} ({last}) is {data['days']} days"
    return None


def _weekday(english: str, chinese: bool) -> str:
    return ZH_WEEKDAYS[WEEKDAYS.index(english)] if chinese and english in WEEKDAYS else english


def _tool_value(content: str) -> tuple[str, bool]:
    """The value worth showing from a tool's output, and whether the tool reported an error."""
    try:
        data = json.loads(content)
    except ValueError:
        return _shorten(content.strip()), False
    if isinstance(data, dict):
        if "error" in data:
            return _shorten(_plain(data["error"])), True
        if "result" in data:
            return _shorten(_plain(data["result"])), False
        if len(data) == 1:
            return _shorten(_plain(next(iter(data.values())))), False
        return _shorten(", ".join(f"{key}: {_plain(value)}" for key, value in data.items())), False
    return _shorten(_plain(data)), False


def _plain(value: JSON) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def _shorten(text: str, limit: int = 1000) -> str:
    return text if len(text) <= limit else text[:limit] + "…"


def _explain_offline(tools: list[dict[str, JSON]], chinese: bool) -> str:
    """The fixed reply for what the demo cannot answer: what it can do, and how to get a real model."""
    names = ", ".join(str((tool.get("function") or {}).get("name", "")) for tool in tools) or None
    if chinese:
        offered = f"本次可用的工具：{names}。" if names else "本次没有提供任何工具。"
        return (
            f"{ZH_PREFIX}我是内置的离线演示模型，不是真正的大语言模型，无法回答一般问题。"
            "我能做的只有：算术（例如“3加4”“(12+34)*2”）、今天的日期和现在的时间、某个日期是星期几、"
            f"两个日期之间相差几天。{offered}"
            "要使用真实模型，请设置 HERMES_PROVIDER（例如 deepseek、qwen、moonshot、zhipu、ollama）"
            "和它的 API 密钥，或者设置环境变量 HERMES_BASE_URL、HERMES_MODEL 和 HERMES_API_KEY"
            "（或使用 --base-url 和 --model 参数），"
            "然后运行 hermes-kernel doctor 检查。"
        )
    offered = f"Tools offered: {names}." if names else "No tools were offered."
    return (
        f"{EN_PREFIX}I am the built-in offline demo model, not a real language model, so I cannot answer "
        'general questions. All I can do: arithmetic (e.g. "3 plus 4" or "(12+34)*2"), today\'s date and '
        "the time now, the weekday of a date, and the days between two dates. "
        f"{offered} To use a real model, set HERMES_PROVIDER (e.g. openai, deepseek, qwen, ollama) and its "
        "API key, or HERMES_BASE_URL, HERMES_MODEL and HERMES_API_KEY (or pass --base-url and --model), "
        "then run hermes-kernel doctor to check it."
    )


# --- small helpers ---------------------------------------------------------------------------


def _content_text(content: JSON) -> str:
    """Text of a wire `content`: a string, or a list of parts like {"type": "text", "text": ...}."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return "" if content is None else str(content)


def _last_user_text(messages: list[Message]) -> str:
    for message in reversed(messages):
        if message.get("role") == "user":
            return _content_text(message.get("content"))
    return ""


def _count_calls(messages: list[Message]) -> int:
    """Tool calls already in the history, so ids stay unique without keeping state in the model."""
    assistant_messages = (message for message in messages if message.get("role") == "assistant")
    return sum(len(message.get("tool_calls") or []) for message in assistant_messages)


def _estimate_usage(messages: list[Message], output: str) -> Usage:
    """A rough count (about four characters per token), labelled as such by being round numbers."""
    prompt = len(json.dumps(messages, ensure_ascii=False, default=str)) // 4
    completion = len(output) // 4
    return Usage(prompt, completion, prompt + completion)
