"""`Agent`: the configuration of an agent, and the two calls that run it.

The agent is data (model settings, system prompt, tools, limits); the behaviour is `run_loop`.
The model client is built on first use, so constructing an Agent imports no HTTP library.
"""

from __future__ import annotations

import asyncio
import os
import re
import secrets
import uuid
from collections.abc import Sequence
from dataclasses import MISSING, Field, dataclass, field, fields, replace
from typing import TYPE_CHECKING, Any, TypeVar

from .kernel.approvals import Interactions
from .kernel.hooks import TaskHooks, all_hooks
from .kernel.loop import PAUSES, Limits, RunResult, run_loop
from .kernel.messages import Message, user_message, without_images
from .kernel.model import ModelClient, TextCallback
from .kernel.prompts import CONTEXT_HEADING, DEFAULT_SYSTEM_PROMPT
from .kernel.replies import Language, detect_language
from .kernel.tools import Tool, ToolRegistry
from .kernel.tools.declare import ToolLike
from .kernel.tools.permissions import Caller, Policy
from .models.settings import ModelSettings
from .stack import TaskStack, model_client, task_stack
from .tools.secret_handles import hide, secrets_of

if TYPE_CHECKING:
    from .modes import TaskMode
    from .observe.traces import TaskTrace, Tracer
    from .skills import SkillSet
    from .tasks.journal import TaskJournal
    from .tools.mcp import MCPToolset

_Part = TypeVar("_Part", ModelSettings, Limits)

DEFAULT_GREETINGS: tuple[str, ...] = (
    r"(hi|hello|hey|yo|good (morning|afternoon|evening)|thanks?( you)?|thx|bye|ok(ay)?)",
    r"(你好|您好|嗨|哈喽|在吗|在不在|早上好|晚上好|下午好|谢谢|多谢|好的|再见|拜拜)",
)
_TRAILING = r"[\s!！.。~～?？,，]*"


@dataclass
class Session:
    """One conversation as a run sees it: the history to send, and what the model is told besides.

    `notes` are the conversation's state (a snapshot, a summary, a pinned goal: see
    `memory/conversation.py`): the model must read their current version. `hints` are reference
    material for this turn (long-term examples): each line once is enough. With the steps of
    triggered skills they go into context messages after the history (`turn_messages`), never
    into `messages`, so no cut can drop them. The run appends its new messages to `messages`.

    `contexts` are the context messages already given, each with the index in `messages` it
    stands before. They stay there, so every request continues the previous one byte for byte
    (what a provider's prompt cache serves); a turn adds one only for what they lack
    (`context_update`): the notes again when they changed, the hint lines not given yet.
    """

    id: str = field(default_factory=lambda: uuid.uuid4().hex)
    messages: list[Message] = field(default_factory=list)
    notes: str = ""
    hints: str = ""
    contexts: list[tuple[int, str, str]] = field(default_factory=list)  # (index, notes, hints) given


@dataclass(init=False)
class Agent:
    """Everything that defines an agent. `await agent.run("…")` runs one task.

    The model's options are one `ModelSettings` (`settings`, models/settings.py) and a task's limits
    one `Limits` (`limits`, kernel/loop.py): the same types as the YAML `model:` and `agent:` sections.
    For convenience each of their options is also a keyword and an attribute of the agent:
    `Agent(model="m", temperature=0, max_turns=4)` sets them in copies of `settings` and `limits`
    (a keyword wins over the same option in `settings=`), `agent.max_turns` reads `limits.max_turns`
    and `agent.tool_mode = "text"` replaces `settings` with a copy that says so.
    """

    model: str | ModelClient | None = None  # a model name, a ModelClient, or None for HERMES_MODEL
    system_prompt: str = DEFAULT_SYSTEM_PROMPT
    tools: Sequence[ToolLike] = ()
    settings: ModelSettings = field(default_factory=ModelSettings)  # endpoint, sampling, retries, tool mode
    limits: Limits = field(default_factory=Limits)  # turns, tool calls, tool timeout, result size
    permissions: Policy = field(
        default_factory=Policy
    )  # roles, levels, allowed models (kernel/tools/permissions.py)
    journal: TaskJournal | None = None  # durable task state: resume instead of starting over (tasks/)
    tracer: Tracer | None = None  # log events, each task's record, X-rays of failures (observe/)
    interactions: Interactions | None = None  # who approves calls and answers questions (kernel/approvals.py)
    greeting_patterns: Sequence[str] = DEFAULT_GREETINGS
    language: Language | None = None  # fixed replies; None: the language of each message
    skills: SkillSet | None = None  # listed in the prompt, steps loaded when needed (skills.py)
    route_tools_above: int | None = None  # more tools: offer the message's groups only (tools/routing.py)
    mcp: MCPToolset | None = None  # tools of MCP servers, connected on the first run (tools/mcp.py)
    mode: TaskMode | None = None  # how serve, run and chat run a task (modes.py); None: the loop
    hooks: Sequence[TaskHooks] = ()  # observers of every task's steps (kernel/hooks.py), before the tracer's

    def __init__(self, model: str | ModelClient | None = None, **options: Any) -> None:
        """The fields above by keyword; any other keyword is an option of `settings` or `limits`."""
        options["settings"] = _apply(options.get("settings") or ModelSettings(), "settings", options)
        options["limits"] = _apply(options.get("limits") or Limits(), "limits", options)
        options["model"] = model
        for declared in fields(self):
            setattr(self, declared.name, options.pop(declared.name, _default(declared)))
        if options:
            raise TypeError(f"Agent() got an unexpected keyword argument {next(iter(options))!r}")
        self.registry = ToolRegistry(policy=self.permissions, interactions=self.interactions)
        for item in self.tools:
            self.registry.add(item)
        if self.skills is not None:  # the model reads a listed skill's steps on demand (P5)
            self.registry.add(self.skills.load_skill)
            if self.skills.has_files:  # and the files bundled with them
                self.registry.add(self.skills.read_skill_file)
        self._greeting = _compile_greetings(self.greeting_patterns)
        self._client: ModelClient | None = None

    def __getattr__(self, name: str) -> Any:
        """`agent.temperature`, `agent.max_turns`: an option of `settings` or `limits` (see the class doc)."""
        part = _OPTION_OF.get(name)
        if part is None or part not in self.__dict__:
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        return getattr(self.__dict__[part], name)

    def __setattr__(self, name: str, value: object) -> None:
        part = _OPTION_OF.get(name)
        if part is not None:  # a copy: `settings` may be shared with the configuration or another agent
            name, value = part, replace(getattr(self, part), **{name: value})
        object.__setattr__(self, name, value)

    def use_interactions(self, interactions: Interactions | None) -> None:
        """Set where approvals and questions wait (the gateway's store, a terminal prompt…)."""
        self.interactions = self.registry.interactions = interactions

    def register_tool(self, item: ToolLike, name: str | None = None) -> Tool:
        """Add a tool after construction: a `@tool`, a documented function, or a dict entry."""
        return self.registry.add(item, name=name)

    @property
    def client(self) -> ModelClient:
        """The model client every task of this agent shares (its layers: stack.py)."""
        if self._client is None:
            self._client = model_client(self)
        return self._client

    def is_greeting(self, message: str) -> bool:
        return bool(self._greeting and self._greeting.fullmatch(message.strip().lower()))

    async def run(
        self,
        message: str,
        *,
        session: Session | None = None,
        on_text: TextCallback | None = None,
        task_id: str | None = None,
        caller: Caller | None = None,
        images: Sequence[str] = (),
        hooks: TaskHooks | None = None,
    ) -> RunResult:
        """Run one task: the message, the model's decisions, the tools it calls, the reply.

        `images` (`data:` URLs) go with the message as OpenAI image parts, for a model that takes
        pictures; `session` then keeps a text placeholder for them (kernel/messages.py `without_images`).

        With a `journal`, pass a `task_id` that stays the same if the task is run again after a
        crash (the gateway uses the message's id): the task then resumes from its journal.
        `caller` is who the task runs for; tools are offered and run only as its role permits.
        A task that stops for a person (stop_reason `awaiting_approval` or `awaiting_answer`)
        leaves `session` as it was: run the same message again under the same task id once the
        person has decided or answered, and it continues from its journal.
        `hooks` observe the run besides the tracer's (kernel/hooks.py): a channel streaming the reply.
        """
        task_id = task_id or secrets.token_hex(16)  # as uuid4().hex reads, at a third of its cost
        conversation = session.id if session is not None else task_id
        message = hide(conversation, message)  # a pasted credential: a handle (tools/secret_handles.py)
        history = session.messages if session is not None else []
        system, steps = self.turn_prompt(message)
        given: Given = []
        update = ("", "")
        if session is not None:  # what earlier turns gave stays where it stands; only what it lacks goes
            hints = "\n\n".join(part for part in (session.hints, steps) if part)
            given, update = context_update(session.contexts, len(history), session.notes, hints)
        elif steps:
            update = ("", steps)
        if any(update):
            given.append((len(history), *update))
        placed = [(at, _context_text(notes, hints)) for at, notes, hints in given]
        messages = turn_messages(system, history, placed, user_message(message, images))
        first = len(messages) - 1  # the user's message: what the history keeps starts there
        fast = self.is_greeting(message)
        stack = await task_stack(self, task_id, message, messages, session, caller)
        with secrets_of(conversation):  # tools that accept secrets get this conversation's values
            result = await run_loop(
                stack.model,
                stack.registry,
                messages,
                self.limits if not fast else Limits(max_turns=1),
                self.language or detect_language(message),
                offer_tools=not fast,
                task_id=task_id,
                session_id=session.id if session is not None else None,
                on_text=on_text,
                caller=caller,
                hooks=stack.hooks if hooks is None else all_hooks([stack.hooks, hooks]),
            )
        if not await self.task_finished(task_id, result, stack.trace):  # paused: run again once answered
            return result
        if session is not None:
            session.contexts = given
            # the pictures were for this turn only: the history keeps a placeholder for them
            session.messages.extend(without_images(messages[first:]))
            if not result.ok:  # keep the history answerable: close the turn with what the user saw
                session.messages.append({"role": "assistant", "content": result.reply})
        return result

    def turn_prompt(self, message: str) -> tuple[str, str]:
        """The system prompt of a turn on `message`, and the steps of the skills the message
        triggers ("" for none): the system prompt with the skills' names (skills.py), the same on
        every call so a provider's prompt cache reuses it; the steps change from message to message,
        so they go into the turn's context message (`turn_messages`). The one place a turn's prompt
        is assembled: the loop (`run`), plan mode (plans/executor.py) and the Temporal engine's
        `prepare_task` (engine/temporal/activities.py) all take it from here."""
        if self.skills is None:
            return self.system_prompt, ""
        return self.skills.system_prompt(self.system_prompt), self.skills.steps_for(message)

    async def task_tools(
        self,
        task_id: str,
        message: str,
        messages: list[Message],
        session: Session | None = None,
        caller: Caller | None = None,
    ) -> TaskStack:
        """The model, tools, hooks and trace of a task run without the loop (plan mode): the
        stack of stack.py. Its caller tells the hooks of each call as the loop does (kernel/hooks.py
        `call_model`, `call_tool`) and ends the run with `task_finished`."""
        return await task_stack(self, task_id, message, messages, session, caller)

    async def task_finished(self, task_id: str, result: RunResult, trace: TaskTrace | None) -> bool:
        """End a run begun with `task_tools`: its trace is recorded whatever the outcome (never
        raises); unless the task paused for a person, the journal marks it finished. False when
        it paused: it is run again under this task id once the person has answered."""
        if trace is not None:
            await trace.finish(result)
        if result.stop_reason in PAUSES:
            return False
        if self.journal is not None:
            await self.journal.append(
                task_id, "finished", {"reply": result.reply, "stop_reason": result.stop_reason}
            )
        return True

    def run_sync(self, message: str, *, session: Session | None = None) -> RunResult:
        """`run` for synchronous code (any thread without a running event loop)."""

        async def run_and_close() -> RunResult:
            try:
                return await self.run(message, session=session)
            finally:
                await self.aclose()

        return asyncio.run(run_and_close())

    async def aclose(self) -> None:
        if self.mcp is not None:
            await self.mcp.aclose()
        if self._client is not None:
            await self._client.aclose()

    def _build_client(self) -> ModelClient:
        settings = self.settings
        base_url = settings.base_url or os.environ.get("HERMES_BASE_URL")
        if not base_url:
            from .models.offline import OfflineModel

            return OfflineModel()
        from .models.openai_compat import OpenAICompatClient

        named = self.model if isinstance(self.model, str) else settings.model
        model_name = named or os.environ.get("HERMES_MODEL", "")
        if not model_name:
            raise ValueError("a base URL is set but no model name: pass model=… or set HERMES_MODEL")
        api_key = settings.api_key or os.environ.get("HERMES_API_KEY") or None
        return OpenAICompatClient(replace(settings, model=model_name, base_url=base_url, api_key=api_key))


def turn_messages(
    system: str, history: Sequence[Message], context: str | Sequence[tuple[int, str]], request: Message
) -> list[Message]:
    """A turn's messages in the order provider prompt caches reward: the system prompt (the same on
    every call), the history (append-only between folds), the context messages — state, summary,
    pinned goal, long-term examples, triggered skills — then the newest user message `request`.
    `context` is one text that goes just before `request`, or `(index, text)` pairs, each standing
    before the history message at its index (`Session.contexts`): a context message given on an
    earlier turn stays where it stood, so the request continues the previous one byte for byte.

    Why this order: a provider caches a request's exact prefix and bills its cached input at a
    fraction of the price (platform.openai.com/docs/guides/prompt-caching: "cache hits are only
    possible for exact prefix matches … put variable content … at the end"; DeepSeek's disk cache,
    api-docs.deepseek.com/guides/kv_cache, counts only the repeated prefix as a hit). Changing text
    inside the system message would break the prefix at the top, so every later token is read again.

    Why a `user` message: every OpenAI-compatible endpoint takes one anywhere, while a second
    `system` message mid-conversation is refused by chat templates that accept a system message
    only first (docs.litellm.ai/docs/completion/developer_role: "Many open-weight chat templates
    (Qwen3.5 …) accept a system message only at the very beginning"). It comes before the user's
    message, so the last user message is still the user's own (tool routing, skills and traces
    read it). A chat template that demands strictly alternating roles refuses two user messages
    in a row (vLLM with Mistral's or Gemma's: "conversation roles must alternate …"; the old
    `deepseek-reasoner`: "does not support successive user or assistant messages"): the client
    then sends them as one, for that model from then on (models/openai_compat.py `ALTERNATING`).
    """
    placed = [(len(history), context)] if isinstance(context, str) else context
    messages: list[Message] = [{"role": "system", "content": system}]
    done = 0
    for at, text in sorted(placed, key=lambda pair: pair[0]):
        if text:
            at = min(max(at, done), len(history))
            messages += history[done:at]
            messages.append({"role": "user", "content": f"{CONTEXT_HEADING}\n{text}"})
            done = at
    messages += [*history[done:], request]
    return messages


Given = list[tuple[int, str, str]]  # context messages given: (index in the history, notes, hints)


def context_update(
    given: Sequence[tuple[int, str, str]], size: int, notes: str, hints: str
) -> tuple[Given, tuple[str, str]]:
    """The context messages of `given` that still stand within a history of `size` messages, and
    what a new one must add to them for the model to have read `notes` and `hints`: the notes when
    they differ from the last notes given (a state is read whole, the newest one counting), and
    the hint units not given yet. A hint unit is one `- ` line under its heading line, or a block
    (between blank lines) of other text. Notes that became empty (the state was forgotten) take
    back everything given, so the next message says it all again without the old state."""
    kept = [(at, n, h) for at, n, h in given if 0 <= at <= size]
    latest = next((n for _, n, _ in reversed(kept) if n), "")
    if latest and not notes:
        kept, latest = [], ""
    told = {unit for _, _, h in kept for unit in _hint_units(h)}
    new = [unit for unit in dict.fromkeys(_hint_units(hints)) if unit not in told]
    blocks: list[str] = []
    for index, (heading, line) in enumerate(new):
        if heading and index and new[index - 1][0] == heading:
            blocks[-1] += f"\n{line}"
        else:
            blocks.append(f"{heading}\n{line}" if heading else line)
    return kept, ("" if notes == latest else notes, "\n\n".join(blocks))


def _hint_units(text: str) -> list[tuple[str, str]]:
    units: list[tuple[str, str]] = []
    for block in text.split("\n\n"):
        lines = block.strip("\n").splitlines()
        if len(lines) > 1 and all(line.startswith("- ") for line in lines[1:]):
            units += [(lines[0], line) for line in lines[1:]]
        elif block.strip():
            units.append(("", block.strip("\n")))
    return units


def _context_text(notes: str, hints: str) -> str:
    return "\n\n".join(part for part in (notes, hints) if part)


def _default(declared: Field[Any]) -> object:
    factory = declared.default_factory
    return declared.default if factory is MISSING else factory()


def _apply(base: _Part, part: str, options: dict[str, Any]) -> _Part:
    """`base` (the agent's `settings` or `limits`) with the options of `options` it holds, taken out."""
    own = {name: options.pop(name) for name in list(options) if _OPTION_OF.get(name) == part}
    return replace(base, **own) if own else base


_OPTION_OF = {  # each option of the two by name, and which holds it ("model" is the agent's own field)
    **{declared.name: "settings" for declared in fields(ModelSettings) if declared.name != "model"},
    **{declared.name: "limits" for declared in fields(Limits)},
}


def _compile_greetings(patterns: Sequence[str]) -> re.Pattern[str] | None:
    if not patterns:
        return None
    return re.compile("(?:" + "|".join(f"(?:{p})" for p in patterns) + ")" + _TRAILING)
