"""What a task runs with, assembled in this one place: the model client, the tool registry, and
the hooks told of each step.

A model call passes these layers, outermost first:

1. `JournaledModel` (tasks/journal.py), with a journal, per task: it returns the recorded
   responses of a task run again, so nothing below it is called for those;
2. `RedactingModelClient` (kernel/redaction.py): no secret in a prompt, none echoed back (O1);
3. `RoutedTools` (tools/routing.py), with `route_tools_above`: the conversation's tool groups only,
   chosen before text mode renders the tools into the prompt;
4. `TextToolCalls` (textcalls/wrapper.py): native, text or auto tool calls;
5. the back-end: `OpenAICompatClient`, `OfflineModel`, or the `ModelClient` the agent was given.

Layers 2–5 are built once per agent (`model_client`, `Agent.client`). A tool call passes
`JournaledTools` (with a journal: recorded results, calls that must not run twice) and then the
agent's `ToolRegistry`, the one place that executes a call.

Observers are not layers: the agent's own `hooks` (the terminal's display of tool calls) and the
tracer's `TaskTrace` (the trace record, log events, metrics, OpenTelemetry spans) are the task's
`hooks` (kernel/hooks.py), which the loop and plan mode call before and after each model call and tool
call. The trace is started after the journal's `resume`, so a resumed task's record shows its
replayed steps too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from .kernel.hooks import NO_HOOKS, TaskHooks, all_hooks
from .kernel.messages import Message
from .kernel.model import ModelClient
from .kernel.redaction import RedactingModelClient
from .kernel.tools import ToolRegistry
from .kernel.tools.permissions import Caller
from .textcalls.wrapper import TextToolCalls

if TYPE_CHECKING:
    from .agent import Agent, Session
    from .observe.traces import TaskTrace


@dataclass
class TaskStack:
    """One task's model client and tools, its hooks (the agent's, then the trace), and its trace
    (None without a tracer)."""

    model: ModelClient
    registry: ToolRegistry
    hooks: TaskHooks = NO_HOOKS
    trace: TaskTrace | None = None


def model_client(agent: Agent) -> ModelClient:
    """Layers 2–5 for `agent`: what every task of the agent shares."""
    inner = agent.model if isinstance(agent.model, ModelClient) else agent._build_client()
    client: ModelClient = TextToolCalls(
        inner, mode=agent.tool_mode, think_open=agent.think_open, family=agent.tool_format
    )
    if agent.route_tools_above is not None:
        from .tools.routing import RoutedTools, ToolRouter

        router = ToolRouter(agent.registry.get, above=agent.route_tools_above)
        client = RoutedTools(client, router, agent.skills.tools_in_use if agent.skills else None)
    return RedactingModelClient(client)


async def task_stack(
    agent: Agent,
    task_id: str,
    message: str,
    messages: list[Message],
    session: Session | None = None,
    caller: Caller | None = None,
) -> TaskStack:
    """The stack one task runs with: MCP tools attached, the journal replaying what it holds
    (layer 1), the agent's hooks and the tracer's observing each step."""
    if agent.mcp is not None:  # cheap once connected; a server that is down is retried later
        await agent.mcp.attach(agent.registry)
    model, registry = agent.client, agent.registry
    if agent.journal is not None:
        from .tasks.journal import resume

        model, registry = await resume(agent.journal, task_id, model, registry)
    if agent.tracer is None:
        return TaskStack(model, registry, all_hooks(agent.hooks))
    conversation = session.id if session is not None else None
    trace = agent.tracer.start(task_id, message, messages, conversation=conversation, caller=caller)
    return TaskStack(model, registry, all_hooks([*agent.hooks, trace.attach(model, registry)]), trace)


def layers(client: object) -> list[str]:
    """The classes a call passes, outermost first (each layer's `inner`): for debugging."""
    names = []
    while client is not None:
        names.append(type(client).__name__)
        client = getattr(client, "inner", None)
    return names


__all__ = ["TaskStack", "layers", "model_client", "task_stack"]
