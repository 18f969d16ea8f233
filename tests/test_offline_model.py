"""The offline demo model: calls the example tools when asked clearly, and says what it is."""

from __future__ import annotations

import json
from typing import Any

import pytest

from hermes_core.kernel.messages import ModelResponse
from hermes_core.kernel.model import ModelClient
from hermes_core.models.offline import EN_PREFIX, ZH_PREFIX, OfflineModel, extract_expression
from hermes_core.tools.calculator import evaluate

CALCULATOR = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": (
            "Evaluate an arithmetic expression exactly (use for all math). 计算数学表达式，例如 (12+34)*2。"
        ),
        "parameters": {
            "type": "object",
            "properties": {
                "expression": {"type": "string", "description": "Arithmetic expression, e.g. (12+34)*2"},
            },
            "required": ["expression"],
        },
    },
}
CURRENT_TIME = {
    "type": "function",
    "function": {
        "name": "current_time",
        "description": (
            "Get the current date and time, optionally in a timezone. 查询现在的时间、日期、几点、星期几。"
        ),
        "parameters": {
            "type": "object",
            "properties": {
                "timezone": {
                    "anyOf": [{"type": "string"}, {"type": "null"}],
                    "default": None,
                    "description": "IANA timezone such as Asia/Shanghai; omit for local",
                },
            },
        },
    },
}
TOOLS = [CALCULATOR, CURRENT_TIME]


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


async def ask(text: str, tools: list[dict[str, Any]] | None = TOOLS) -> ModelResponse:
    messages = [{"role": "system", "content": "You are helpful."}, user(text)]
    return await OfflineModel().complete(messages, tools)


def test_is_a_model_client() -> None:
    assert isinstance(OfflineModel(), ModelClient)


@pytest.mark.parametrize(
    ("message", "tool", "arguments"),
    [
        ("计算 (12+34)*2", "calculator", {"expression": "(12+34)*2"}),
        ("what is (12+34)*2", "calculator", {"expression": "(12+34)*2"}),
        ("What is (12+34)*2?", "calculator", {"expression": "(12+34)*2"}),
        ("帮我算一下 3^2。", "calculator", {"expression": "3^2"}),
        ("7 ÷ 2", "calculator", {"expression": "7 ÷ 2"}),
        ("what is sqrt(16) + 1", "calculator", {"expression": "sqrt(16) + 1"}),
        ("现在几点", "current_time", {}),
        ("what time is it", "current_time", {}),
        ("今天星期几？", "current_time", {}),
        ('what time is it in "Asia/Tokyo"', "current_time", {"timezone": "Asia/Tokyo"}),
    ],
)
async def test_calls_the_tool_the_message_clearly_asks_for(
    message: str, tool: str, arguments: dict[str, Any]
) -> None:
    response = await ask(message)
    assert response.content is None
    assert len(response.tool_calls) == 1
    call = response.tool_calls[0]
    assert (call.id, call.name, json.loads(call.arguments)) == ("offline_1", tool, arguments)
    assert response.finish_reason == "tool_calls"


async def test_arguments_are_json_text_that_the_calculator_accepts() -> None:
    call = (await ask("计算 （１２＋３４）×２")).tool_calls[0]
    assert "（１２＋３４）×２" in call.arguments  # ensure_ascii=False keeps the text readable
    assert evaluate(json.loads(call.arguments)["expression"]) == 92


@pytest.mark.parametrize(
    "message",
    ["hello", "tell me a joke", "你好", "what is the meaning of life", "12", "the date of the moon landing"],
)
async def test_no_tool_call_without_a_clear_request(message: str) -> None:
    """One shared description word ("date") is not a clear request; the model explains itself instead."""
    response = await ask(message)
    assert response.tool_calls == []
    assert response.content


async def test_explains_itself_in_english() -> None:
    text = (await ask("hello")).text
    assert text.startswith(EN_PREFIX)
    assert "offline demo model" in text
    for setting in ("HERMES_BASE_URL", "HERMES_MODEL", "HERMES_API_KEY", "--base-url", "--model"):
        assert setting in text
    assert "calculator, current_time" in text


async def test_explains_itself_in_chinese() -> None:
    text = (await ask("讲个笑话")).text
    assert text.startswith(ZH_PREFIX)
    assert "离线演示模型" in text
    for setting in ("HERMES_BASE_URL", "HERMES_MODEL", "HERMES_API_KEY"):
        assert setting in text


async def test_without_tools_it_never_calls_one() -> None:
    for tools in (None, []):
        response = await ask("计算 (12+34)*2", tools)
        assert response.tool_calls == []
        assert response.text.startswith(ZH_PREFIX)


async def test_a_required_argument_it_cannot_fill_means_no_call() -> None:
    response = await ask("please use the calculator")  # names the tool, but gives no expression
    assert response.tool_calls == []
    assert response.text.startswith(EN_PREFIX)


def conversation(question: str, tool_output: str, name: str = "calculator") -> list[dict[str, Any]]:
    call = {"id": "offline_1", "type": "function", "function": {"name": name, "arguments": "{}"}}
    return [
        user(question),
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "offline_1", "content": tool_output},
    ]


ERROR = '{"error": "division by zero"}'
RESULT = '{"expression": "(12+34)*2", "result": 92}'


@pytest.mark.parametrize(
    ("question", "output", "expected"),
    [
        ("what is (12+34)*2", "92", "The calculator tool returned: 92"),
        ("what is (12+34)*2", RESULT, "The calculator tool returned: 92"),
        ("计算 (12+34)*2", '{"result": 92}', "calculator 工具返回：92"),
        ("计算 (12+34)*2", "92", "calculator 工具返回：92"),
        ("what is 1/0", ERROR, "The calculator tool reported an error: division by zero"),
        ("计算 1/0", ERROR, "calculator 工具报告了错误：division by zero"),
    ],
)
async def test_reports_a_tool_result_in_the_users_language(question: str, output: str, expected: str) -> None:
    response = await OfflineModel().complete(conversation(question, output), TOOLS)
    prefix = ZH_PREFIX if "计算" in question else EN_PREFIX
    assert response.tool_calls == []
    assert response.text == prefix + expected
    assert response.finish_reason == "stop"


async def test_reports_a_structured_result_readably() -> None:
    output = json.dumps({"date": "2024-05-07", "time": "07:30:15", "timezone": "Asia/Shanghai"})
    text = (await OfflineModel().complete(conversation("现在几点", output, "current_time"), TOOLS)).text
    assert text.startswith(f"{ZH_PREFIX}current_time 工具返回：")
    assert "07:30:15" in text and "Asia/Shanghai" in text


async def test_call_ids_stay_unique_across_a_conversation() -> None:
    history = [*conversation("计算 1+1", "2"), {"role": "assistant", "content": "2"}, user("计算 2*3")]
    response = await OfflineModel().complete(history, TOOLS)
    assert response.tool_calls[0].id == "offline_2"
    assert json.loads(response.tool_calls[0].arguments) == {"expression": "2*3"}


async def test_on_text_gets_the_whole_reply_once_sync_or_async() -> None:
    received: list[str] = []
    response = await OfflineModel().complete([user("hello")], TOOLS, on_text=received.append)
    assert received == [response.text]

    async def collect(text: str) -> None:
        received.append(text)

    received.clear()
    response = await OfflineModel().complete([user("hello")], TOOLS, on_text=collect)
    assert received == [response.text]


async def test_on_text_is_not_called_for_a_tool_call() -> None:
    received: list[str] = []
    await OfflineModel().complete([user("what time is it")], TOOLS, on_text=received.append)
    assert received == []


async def test_usage_is_a_rough_positive_estimate() -> None:
    usage = (await ask("hello")).usage
    assert usage.completion_tokens > 0 and usage.total_tokens == usage.prompt_tokens + usage.completion_tokens


async def test_user_content_as_parts() -> None:
    message = {"role": "user", "content": [{"type": "text", "text": "what is (12+34)*2"}]}
    response = await OfflineModel().complete([message], TOOLS)
    assert json.loads(response.tool_calls[0].arguments) == {"expression": "(12+34)*2"}


async def test_fills_numbers_enums_and_booleans_from_the_schema() -> None:
    convert = {
        "type": "function",
        "function": {
            "name": "convert_units",
            "description": "Convert a length between units.",
            "parameters": {
                "type": "object",
                "properties": {
                    "value": {"type": "number"},
                    "places": {"type": "integer"},
                    "unit": {"type": "string", "enum": ["meters", "feet"]},
                    "exact": {"type": "boolean"},
                    "note": {"type": "string", "default": ""},
                },
                "required": ["value", "places", "unit", "exact"],
            },
        },
    }
    response = await ask("convert units: 2.5 feet, 3 places, exact yes", [convert])
    expected = {"value": 2.5, "places": 3, "unit": "feet", "exact": True}  # "note" has a default
    assert json.loads(response.tool_calls[0].arguments) == expected


@pytest.mark.parametrize(
    ("text", "expression"),
    [
        ("计算 (12+34)*2。", "(12+34)*2"),
        ("what is 3^2?", "3^2"),
        ("7 ÷ 2 please", "7 ÷ 2"),
        ("max(3, 4) + 1, thanks", "max(3, 4) + 1"),
        ("no maths here", None),
        ("just -5", None),
        ("room 101", None),
    ],
)
def test_extract_expression(text: str, expression: str | None) -> None:
    assert extract_expression(text) == expression
