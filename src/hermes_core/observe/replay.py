"""Replay (O3): run a recorded task again — the recorded model outputs, the current code and tools.

`replay(record, agent)` feeds the loop the model outputs a trace recorded (observe/traces.py),
one per model call, and runs each tool call through the agent's *current* registry, then says
where the run now differs from the recording: a different tool or different arguments, a call
that validation or permissions now refuse, another result, a missing or extra call, another
reply or stop reason. A run that matches the recording call for call, byte for byte, is
`reproduced`. With `live=True` the configured model answers instead of the recording, so the
comparison shows what the model does today with the same conversation.

What runs for real during a replay:

- read-only tools (level 0) run: their current behaviour is the point;
- tools that write (level 1) are *not* run unless `run_writes=True`: the call is still checked
  against the current permissions and argument schema, and the recorded result stands in for it
  when the call is the recorded one (same tool, same arguments at the same place);
- irreversible tools (level 2), tools that need a person's approval, and `clarify` never run:
  checked the same way, the recorded outcome stands in.
- a tool whose result varies from run to run (declared `varies`: `current_time`) is not run either
  when the call is the recorded one: the recorded result stands in, since today's clock differing
  from the recording's is no divergence.

The conversation is replayed as it was sent (the recorded system message included), under the
recorded task id, caller and conversation.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from typing import TYPE_CHECKING

from ..kernel.loop import Limits, RunResult, run_loop
from ..kernel.messages import JSON, Message, ModelResponse, ToolCall
from ..kernel.model import ModelClient, ModelRequestRejected, ModelUnavailable, TextCallback
from ..kernel.records import canonical, outcome_from, response_from
from ..kernel.replies import detect_language
from ..kernel.tools import Tool, ToolContext, ToolRegistry
from ..kernel.tools.arguments import ArgumentError, parse_arguments
from ..kernel.tools.permissions import Caller
from ..kernel.tools.registry import DEFAULT_TOOL_TIMEOUT, RegistryWrapper, ToolOutcome
from ..kernel.tools.results import DEFAULT_MAX_CHARS, error_result

if TYPE_CHECKING:
    from ..agent import Agent

Position = tuple[int, int]  # (turn, place of the call in that turn's response), both from 1


@dataclass
class Divergence:
    """One way the replay differs from the recording."""

    kind: str  # tool_name | arguments | validation | status | result | missing_call | extra_call |
    #            model_calls | model_exhausted | reply | stop_reason
    message: str
    turn: int | None = None
    index: int | None = None
    recorded: JSON = None
    replayed: JSON = None


@dataclass
class ReplayedCall:
    """One tool call of the replay, and whether it ran or its recorded outcome stood in."""

    turn: int
    index: int
    id: str
    name: str
    arguments: str
    result: str
    ok: bool
    error: str | None
    ran: bool
    note: str = ""


@dataclass
class ReplayReport:
    task_id: str
    live: bool
    result: RunResult
    calls: list[ReplayedCall]
    divergences: list[Divergence] = field(default_factory=list)

    @property
    def reproduced(self) -> bool:
        return not self.divergences

    def to_dict(self) -> dict[str, JSON]:
        return {
            "task_id": self.task_id,
            "live": self.live,
            "reproduced": self.reproduced,
            "reply": self.result.reply,
            "stop_reason": self.result.stop_reason,
            "tool_calls": [asdict(call) for call in self.calls],
            "divergences": [asdict(divergence) for divergence in self.divergences],
        }


async def replay(
    record: dict[str, JSON], agent: Agent, *, live: bool = False, run_writes: bool = False
) -> ReplayReport:
    """Run `record` (a trace or an X-ray) again with `agent`'s current tools and settings."""
    history, text = conversation_of(record)
    model = ReplayModel(
        record.get("model_calls") or [],
        live=agent.client if live else None,
        name=agent.client.name if live else str(record.get("model") or "replay"),
    )
    recorded = recorded_positions(record)
    tools = ReplayTools(agent.registry, model, recorded, run_writes=run_writes)
    fast = agent.is_greeting(text)
    result = await run_loop(
        model,
        tools,
        [*history, {"role": "user", "content": text}],
        Limits(max_turns=1) if fast else agent.limits,
        agent.language or detect_language(text),
        offer_tools=not fast,
        task_id=str(record.get("task_id") or ""),
        session_id=record.get("conversation"),
        caller=caller_of(record),
    )
    calls = [
        ReplayedCall(turn, index, o.call.id, o.call.name, o.call.arguments, o.content, o.ok, o.error,
                     *tools.notes.get(o.call.id, (False, "refused by the loop's guards")))
        for (turn, index), o in positioned(model.responses, result.tool_calls)
    ]  # fmt: skip
    report = ReplayReport(str(record.get("task_id") or ""), live, result, calls)
    report.divergences = compare(record, recorded, report, model)
    return report


def caller_of(record: dict[str, JSON]) -> Caller | None:
    """The recorded caller: the run is checked against the same role and channel."""
    data = record.get("caller")
    if not isinstance(data, dict):
        return None
    return Caller(**{f.name: data[f.name] for f in fields(Caller) if f.name in data})


def conversation_of(record: dict[str, JSON]) -> tuple[list[Message], str]:
    """(messages sent before the input, the input): from `history` and `input`, or from `messages`."""
    text = record.get("input")
    if isinstance(text, str) and isinstance(record.get("history"), list):
        return copy.deepcopy(record["history"]), text
    messages = list(record.get("messages") or [])
    users = [
        i for i, m in enumerate(messages) if m.get("role") == "user" and isinstance(m.get("content"), str)
    ]
    if not users:
        raise ValueError("the trace has no input and no user message to replay")
    last = (
        users[-1]
        if not isinstance(text, str)
        else max((i for i in users if messages[i]["content"] == text), default=users[-1])
    )
    return copy.deepcopy(messages[:last]), str(messages[last]["content"])


# --- the recorded model ----------------------------------------------------------------------------


class ReplayModel(ModelClient):
    """Answers with the recorded model outputs in order (or asks `live`), and remembers what it said."""

    def __init__(
        self, recorded: list[dict[str, JSON]], *, live: ModelClient | None = None, name: str
    ) -> None:
        self._recorded = list(recorded)
        self.live = live
        self.name = name
        self.turn = 0
        self.responses: list[ModelResponse] = []
        self.exhausted = False

    async def complete(
        self,
        messages: list[Message],
        tools: list[dict[str, JSON]] | None = None,
        *,
        on_text: TextCallback | None = None,
    ) -> ModelResponse:
        self.turn += 1
        if self.live is not None:
            response = await self.live.complete(messages, tools, on_text=on_text)
        elif not self._recorded:
            self.exhausted = True
            raise ModelUnavailable("the recording holds no more model outputs")
        else:
            entry = self._recorded.pop(0)
            if entry.get("response") is None:  # the recorded call failed: fail the same way
                error = str(entry.get("error") or "")
                failure = (
                    ModelRequestRejected if error.startswith("ModelRequestRejected") else ModelUnavailable
                )
                raise failure(error)
            response = response_from(entry["response"])
        self.responses.append(response)
        return response

    def position(self, call_id: str) -> Position:
        calls = [call.id for call in self.responses[-1].tool_calls] if self.responses else []
        return self.turn, (calls.index(call_id) + 1 if call_id in calls else 0)

    async def aclose(self) -> None:
        if self.live is not None:
            await self.live.aclose()


# --- the current tools, with writes held back ------------------------------------------------------


class ReplayTools(RegistryWrapper):
    """The agent's current tools; only read-only ones run (and level-1 ones with `run_writes`).

    A call that does not run is still checked with the current code — permissions, argument
    parsing and validation — and, when it is the recorded call, gets the recorded outcome.
    """

    def __init__(
        self,
        registry: ToolRegistry,
        model: ReplayModel,
        recorded: dict[Position, dict[str, JSON]],
        *,
        run_writes: bool = False,
    ) -> None:
        super().__init__(registry)
        self.interactions = None  # nobody is asked during a replay
        self.model, self.recorded, self.run_writes = model, recorded, run_writes
        self.notes: dict[str, tuple[bool, str]] = {}  # call id → (ran, why not)

    def schemas(
        self, exclude: Iterable[str] = (), caller: Caller | None = None, model: str | Sequence[str] = ""
    ) -> list[dict[str, JSON]]:
        """The tools as offered where someone can approve and answer (the gateway)."""
        skipped = set(exclude)
        return [
            t.schema()
            for t in self._tools.values()
            if t.name not in skipped and self.permitted(t, caller, model)
        ]

    async def execute(
        self,
        call: ToolCall,
        *,
        timeout: float = DEFAULT_TOOL_TIMEOUT,
        max_chars: int = DEFAULT_MAX_CHARS,
        context: ToolContext | None = None,
    ) -> ToolOutcome:
        declared = self.get(call.name)
        held = None if declared is None else self.held_back(declared)
        if held is None:  # unknown tools too: the registry answers those without running anything
            self.notes[call.id] = (True, "")
            return await super().execute(call, timeout=timeout, max_chars=max_chars, context=context)
        assert declared is not None
        checked = self.check(declared, call, context or ToolContext(call.id, call.name))
        if isinstance(checked, ToolOutcome):
            self.notes[call.id] = (False, f"not run ({held}); the current code refuses the call")
            return checked
        recorded = self.recorded.get(self.model.position(call.id))
        if recorded and recorded.get("name") == call.name and same_arguments(recorded.get("arguments"), call):
            self.notes[call.id] = (False, f"not run ({held}); the recorded result is used")
            stood_in = outcome_from({**recorded, "id": call.id, "name": call.name})
            return replace(stood_in, call=call, arguments=checked)
        self.notes[call.id] = (False, f"not run ({held}); no recorded result for these arguments")
        message = f"{call.name} was not run during the replay ({held})"
        return ToolOutcome(call, error_result(message), False, checked, error="not_replayed")

    def held_back(self, declared: Tool) -> str | None:
        """Why this tool does not run during the replay, or None if it runs."""
        if declared.asks_user:
            return "it asks the user"
        if declared.needs_person:
            return f"level {declared.level}, needs a person's approval"
        if declared.level >= 1 and not self.run_writes:
            return f"level {declared.level}: it writes; --run-writes runs it"
        return "its result varies from run to run" if declared.varies else None

    def check(self, declared: Tool, call: ToolCall, context: ToolContext) -> ToolOutcome | dict[str, JSON]:
        """The refusal the registry would give this call now, or its parsed arguments."""
        refusal = self.policy.refusal(declared, context.caller, context.model)
        if refusal is not None:
            return ToolOutcome(call, error_result(refusal), ok=False, error="permission_denied")
        try:
            arguments = parse_arguments(call.arguments)
            self._bind(declared, arguments)
        except ArgumentError as exc:
            message = f"invalid arguments for {call.name}: {exc}. Fix the arguments and call again."
            return ToolOutcome(call, error_result(message), ok=False, error="bad_arguments")
        return arguments


# --- the comparison --------------------------------------------------------------------------------


def recorded_positions(record: dict[str, JSON]) -> dict[Position, dict[str, JSON]]:
    """The recorded tool calls by (turn, place in the turn), in the order they were asked."""
    places: dict[Position, dict[str, JSON]] = {}
    counts: dict[int, int] = {}
    for call in record.get("tool_calls") or []:
        turn = int(call.get("turn") or 0)
        counts[turn] = counts.get(turn, 0) + 1
        places[(turn, counts[turn])] = call
    return places


def positioned(
    responses: list[ModelResponse], outcomes: list[ToolOutcome]
) -> list[tuple[Position, ToolOutcome]]:
    """Each outcome with its (turn, place): the loop keeps them in the order the responses asked."""
    asked = [(turn, index) for turn, r in enumerate(responses, 1) for index, _ in enumerate(r.tool_calls, 1)]
    return list(zip(asked, outcomes, strict=False))


def compare(
    record: dict[str, JSON],
    recorded: dict[Position, dict[str, JSON]],
    report: ReplayReport,
    model: ReplayModel,
) -> list[Divergence]:
    """Every difference between the recording and the replay, in the order of the run."""
    found: list[Divergence] = []
    replayed = {(call.turn, call.index): call for call in report.calls}
    for turn, index in sorted(set(recorded) | set(replayed)):
        before, now = recorded.get((turn, index)), replayed.get((turn, index))
        where = f"turn {turn}, call {index}"
        if before is None and now is not None:
            message = f"{where}: {now.name} is called now, not in the recording"
            found.append(Divergence("extra_call", message, turn, index, replayed=now.name))
        elif now is None and before is not None:
            message = f"{where}: the recorded call to {before.get('name')} is not made"
            found.append(Divergence("missing_call", message, turn, index, recorded=before.get("name")))
        elif before is not None and now is not None:
            found.extend(_call_divergences(before, now, where, turn, index))
    asked, recorded_calls = model.turn, len(record.get("model_calls") or [])
    if model.exhausted:
        message = f"the run asks the model more often than the {recorded_calls} times recorded"
        found.append(Divergence("model_exhausted", message, recorded=recorded_calls, replayed=asked))
    elif not report.live and asked != recorded_calls:
        message = f"the model is asked {asked} times, recorded {recorded_calls}"
        found.append(Divergence("model_calls", message, recorded=recorded_calls, replayed=asked))
    result = report.result
    if result.stop_reason != record.get("stop_reason"):
        message = f"stop reason {result.stop_reason}, recorded {record.get('stop_reason')}"
        found.append(
            Divergence(
                "stop_reason", message, recorded=record.get("stop_reason"), replayed=result.stop_reason
            )
        )
    if result.reply != record.get("reply"):
        found.append(
            Divergence("reply", "the reply differs", recorded=record.get("reply"), replayed=result.reply)
        )
    return found


def _call_divergences(
    before: dict[str, JSON], now: ReplayedCall, where: str, turn: int, index: int
) -> list[Divergence]:
    if before.get("name") != now.name:
        message = f"{where}: {now.name} is called, recorded {before.get('name')}"
        return [Divergence("tool_name", message, turn, index, before.get("name"), now.name)]
    if not same_arguments(before.get("arguments"), ToolCall(now.id, now.name, now.arguments)):
        message = f"{where}: {now.name} is called with other arguments"
        return [Divergence("arguments", message, turn, index, before.get("arguments"), now.arguments)]
    if (bool(before.get("ok")), before.get("error")) != (now.ok, now.error):
        kind = "validation" if now.error == "bad_arguments" else "status"
        was = "ok" if before.get("ok") else f"failed ({before.get('error')})"
        is_now = "ok" if now.ok else f"fails ({now.error})"
        message = f"{where}: {now.name} {is_now}, recorded {was}: {now.result}"
        return [Divergence(kind, message, turn, index, was, is_now)]
    if before.get("result") != now.result:
        message = f"{where}: {now.name} returns another result"
        return [Divergence("result", message, turn, index, before.get("result"), now.result)]
    return []


def same_arguments(recorded: JSON, call: ToolCall) -> bool:
    """The same arguments, however they were spaced or ordered (dicts are compared as JSON)."""
    return canonical(recorded) == canonical(call.arguments)


__all__ = [
    "Divergence",
    "ReplayModel",
    "ReplayReport",
    "ReplayTools",
    "ReplayedCall",
    "conversation_of",
    "replay",
]
