"""Tool calls written as text, and the text-tool mode for endpoints that have no `tools` parameter.

Local models often answer a tool request with the call written in their content — Hermes/Qwen
`<tool_call>{…}</tool_call>`, Llama-3 JSON, Mistral `[TOOL_CALLS]`, pythonic lists — instead of
native `tool_calls`. `TextToolCalls` wraps any `ModelClient` and turns such text into ordinary
`ToolCall`s, so the loop runs them exactly like native ones. Its mode decides how the tools
reach the model:

- `native`: always as the `tools` parameter (text calls in the reply are still read);
- `text`: rendered into the system prompt in the Hermes convention; tool results go back as
  `<tool_response>` content and earlier calls as `<tool_call>` text;
- `auto`: native until the endpoint says it cannot take `tools` at all, or the model answers with
  a text call; then text, remembered for that model with the reason (`decisions`, logged, shown by
  doctor). What counts as "cannot take tools" is each server's own wording, recorded from real
  servers (models/providers.py `NO_TOOL_SUPPORT`, docs/providers.md): vLLM's and Ollama's 400,
  llama.cpp's 500 without --jinja, OpenRouter's 404. Any other error that merely mentions a tool
  (context length, an orphan tool message, missing tool results, Groq's `tool_use_failed`,
  DeepSeek's missing `reasoning_content`) is about something else and never leaves native mode;
  a refused tool schema is reported as that, naming the tool.

Every format is read until the model's family is known (models/families.py): given up front
(`family`, the `model.tool_format` setting) or, in `auto`, recognised from the first call a model
writes as text (`families`, logged, shown by doctor). From then on only that family and the Hermes
format the text-mode prompt asks for are read, as a server runs one tool parser per model: a
reply that explains JSON or writes `[name(…)]` as an example is no longer taken for a call.
"""

from __future__ import annotations

import json
import logging
import re
import uuid
from collections.abc import Collection, Sequence
from dataclasses import replace
from typing import Any, get_args

from ..kernel.messages import JSON, Message, ModelResponse, request_digest
from ..kernel.model import (
    ModelClient,
    ModelRequestRejected,
    ModelWrapper,
    TextCallback,
    ToolMode,
    emit_text,
    offered_to,
)
from ..models.families import family_title

TOOL_MODES: tuple[str, ...] = get_args(ToolMode)  # declared once, in kernel/model.py

log = logging.getLogger("hermes_core.model")

TOOLS_PROMPT = """\
# Tools

You may call one or more functions to help with the user's request.

The function signatures are given within <tools></tools> XML tags:
<tools>
{tools}
</tools>

To call a function, answer with a JSON object with the function name and arguments within \
<tool_call></tool_call> XML tags, one block per call:
<tool_call>
{{"name": <function-name>, "arguments": <args-json-object>}}
</tool_call>
Function results come back to you within <tool_response></tool_response> XML tags."""


class TextToolCalls(ModelWrapper):
    def __init__(
        self,
        inner: ModelClient,
        mode: ToolMode = "auto",
        formats: Sequence[str] | None = None,
        *,
        think_open: bool = False,
        family: str | None = None,
    ) -> None:
        """`think_open`: the model's chat template opens `<think>` in the prompt (DeepSeek-R1, QwQ,
        Qwen3 thinking), so its replies start inside reasoning. Streaming cannot take back text it
        has shown, so this must be known up front rather than guessed from the reply. `family`: the
        text-call format the model writes (see the module doc); `formats`, if given, wins."""
        if mode not in TOOL_MODES:
            raise ValueError(f"tool mode must be one of {', '.join(TOOL_MODES)}, got {mode!r}")
        super().__init__(inner)
        self.mode = mode
        self.formats = formats
        self.think_open = think_open
        self.family = family
        self.text_mode_models: set[str] = set()  # models `auto` has switched to text mode
        self.decisions: dict[str, str] = {}  # model → why `auto` chose text mode for it
        self.families: dict[str, str] = {}  # model → the family of its first call written as text

    def read_formats(self) -> Sequence[str] | None:
        """The formats read from this model's replies (None: all of them); see the module doc."""
        known = self.family or (self.families.get(self.inner.name) if self.mode == "auto" else None)
        if self.formats is not None or known is None:
            return self.formats
        return (known,) if known == "hermes" else (known, "hermes")

    def uses_text_mode(self) -> bool:
        return self.mode == "text" or (self.mode == "auto" and self.inner.name in self.text_mode_models)

    async def complete(
        self,
        messages: list[Message],
        tools: list[dict[str, Any]] | None = None,
        *,
        on_text: TextCallback | None = None,
    ) -> ModelResponse:
        text_mode = bool(tools) and self.uses_text_mode()
        try:
            response, family = await self._complete(messages, tools, text_mode, on_text)
        except ModelRequestRejected as exc:
            schema = schema_refusal(exc) if tools and not text_mode else None
            if schema is not None:
                raise schema from exc
            if not (self.mode == "auto" and tools and not text_mode and _refuses_tools(exc)):
                raise
            self._decide(f"the endpoint refuses the tools parameter (HTTP {exc.status}: {exc})")
            response, family = await self._complete(messages, tools, True, on_text)
        else:
            if self.mode == "auto" and tools and not text_mode and family:
                self._decide(f"the model writes tool calls as text, {family_title(family)}")
        if family and self.inner.name not in self.families:
            self.families[self.inner.name] = family
            if self.mode == "auto" and not self.family and self.formats is None:
                log.warning("model %s: its tool calls are read as %s from now on", self.inner.name,
                            family_title(family))  # fmt: skip
        return response

    def _decide(self, reason: str) -> None:
        """Switch the model to text mode for good, saying why (log, `decisions`, doctor)."""
        log.warning("model %s: tool mode text, because %s", self.inner.name, reason)
        self.text_mode_models.add(self.inner.name)
        self.decisions[self.inner.name] = reason

    async def _complete(
        self,
        messages: list[Message],
        tools: list[dict[str, Any]] | None,
        text_mode: bool,
        on_text: TextCallback | None,
    ) -> tuple[ModelResponse, str | None]:
        """One call in the chosen mode; also the family of the calls if they came from the text."""
        # Written into the prompt, the tools reach whichever model answers: only those every one may use.
        sent = render_text_mode(messages, offered_to_all(self.models, tools)) if text_mode else messages
        formats = self.read_formats()
        if on_text is None:
            response = await self.inner.complete(sent, None if text_mode else tools)
        else:
            response = await self._complete_streaming(sent, None if text_mode else tools, on_text, formats)
        return _with_text_calls(response, formats, self.think_open, messages, tools)

    async def _complete_streaming(
        self,
        messages: list[Message],
        tools: list[dict[str, Any]] | None,
        on_text: TextCallback,
        formats: Sequence[str] | None,
    ) -> ModelResponse:
        """Stream visible text only: partial tags, calls and reasoning are held back."""
        from .stream import StreamingTextCallParser

        parser = StreamingTextCallParser(formats, think_open=self.think_open)

        async def visible(piece: str) -> None:
            shown = parser.feed(piece).text
            if shown:
                await emit_text(on_text, shown)

        response = await self.inner.complete(messages, tools, on_text=visible)
        rest = parser.flush().text
        if rest:
            await emit_text(on_text, rest)
        return response


def extract_text_calls(
    response: ModelResponse,
    formats: Sequence[str] | None = None,
    *,
    think_open: bool = False,
    conversation: list[Message] | None = None,
    tools: list[dict[str, Any]] | None = None,
) -> ModelResponse:
    """The response with text calls turned into `ToolCall`s and `<think>` moved out of the content.

    The calls are named after `conversation` (the request), so their ids differ from turn to turn
    and stay the same when the same conversation is sent again; without it, at random. `tools`
    (the request's) type the values that XML-style formats write as text (textcalls/schema.py)."""
    return _with_text_calls(response, formats, think_open, conversation, tools)[0]


def _with_text_calls(
    response: ModelResponse,
    formats: Sequence[str] | None,
    think_open: bool,
    conversation: list[Message] | None,
    tools: list[dict[str, Any]] | None,
) -> tuple[ModelResponse, str | None]:
    """`extract_text_calls`, and the family of the first call read from the text (None: none was)."""
    if not response.content or not _may_hold_calls(response.content, think_open):
        return response, None
    from .parsers import parse_text_calls

    parsed = parse_text_calls(response.content, formats, think_open=think_open, tools=tools)
    if response.tool_calls:  # native calls win; the text only loses its reasoning block
        return replace(response, content=parsed.content if parsed.reasoning else response.content,
                       reasoning=parsed.reasoning or response.reasoning), None  # fmt: skip
    if not parsed.calls and parsed.reasoning is None:
        if parsed.content == response.content.strip():
            return response, None
        return replace(response, content=parsed.content), None  # markup holding no call: a bare [TOOL_CALLS]
    # ids unique across the whole history: some servers reject a conversation that reuses one, and
    # an approval or a journaled result is found by its call's id (tasks/)
    digest = request_digest(conversation) if conversation is not None else uuid.uuid4().hex[:12]
    calls = parsed.tool_calls(id_prefix=f"textcall_{digest}")
    return replace(
        response,
        content=parsed.content or (None if calls else ""),
        tool_calls=calls,
        reasoning=parsed.reasoning or response.reasoning,
        # a call written in text and cut by the token limit stays "length": none runs (kernel/guards.py)
        finish_reason="tool_calls" if calls and not response.cut_off else response.finish_reason,
    ), (parsed.calls[0].format if parsed.calls else None)


def offered_to_all(models: Collection[str], tools: list[dict[str, JSON]] | None) -> list[dict[str, JSON]]:
    """The tools that every one of `models` is offered (a prompt that any of them may answer)."""
    kept = list(tools or [])
    for model in models:
        kept = offered_to(model, kept) or []
    return kept


def render_text_mode(messages: list[Message], tools: list[dict[str, Any]]) -> list[Message]:
    """The conversation as a model without a `tools` parameter reads it (Hermes convention)."""
    block = TOOLS_PROMPT.format(tools="\n".join(json.dumps(t, ensure_ascii=False) for t in tools))
    rendered: list[Message] = []
    for message in messages:
        role = message.get("role")
        if role == "system":
            rendered.append(
                {"role": "system", "content": f"{message.get('content') or ''}\n\n{block}".strip()}
            )
        elif role == "assistant" and message.get("tool_calls"):
            rendered.append({"role": "assistant", "content": _calls_as_text(message)})
        elif role == "tool":
            response = f"<tool_response>\n{message.get('content') or ''}\n</tool_response>"
            previous = rendered[-1] if rendered else None
            if (
                previous
                and previous["role"] == "user"
                and str(previous["content"]).startswith("<tool_response>")
            ):
                previous["content"] = (
                    f"{previous['content']}\n{response}"  # one user turn per batch of results
                )
            else:
                rendered.append({"role": "user", "content": response})
        else:
            rendered.append(dict(message))
    if not rendered or rendered[0]["role"] != "system":
        rendered.insert(0, {"role": "system", "content": block})
    return rendered


def _calls_as_text(message: Message) -> str:
    blocks = [message["content"]] if message.get("content") else []
    for call in message["tool_calls"]:
        function = call["function"]
        try:
            arguments = json.loads(function.get("arguments") or "{}")
        except ValueError:
            arguments = function.get("arguments")
        payload = json.dumps({"name": function["name"], "arguments": arguments}, ensure_ascii=False)
        blocks.append(f"<tool_call>\n{payload}\n</tool_call>")
    return "\n".join(blocks)


def _may_hold_calls(text: str, think_open: bool) -> bool:
    """Cheap pre-check so that plain answers never load the parsers: every format and the think
    tags need one of these characters."""
    return think_open or "<" in text or "{" in text or "[" in text or "```" in text  # no generator per reply


def _refuses_tools(exc: ModelRequestRejected) -> bool:
    """The endpoint cannot take `tools` at all, in its own words (models/providers.py)."""
    from ..models.providers import refuses_tools

    return exc.status in (400, 404, 422, 500, 501) and refuses_tools(str(exc))


_SCHEMA = re.compile(
    r"invalid schema for function '([^']+)'|function '([^']+)'.{0,40}invalid.{0,20}schema", re.I
)


def schema_refusal(exc: ModelRequestRejected) -> ModelRequestRejected | None:
    """A 400 about one tool's schema, reworded to name the tool, or None for any other error."""
    found = _SCHEMA.search(str(exc)) if exc.status == 400 else None
    if found is None:
        return None
    tool = found.group(1) or found.group(2)
    return ModelRequestRejected(f"the endpoint refused tool {tool}'s schema: {exc}", exc.status)
