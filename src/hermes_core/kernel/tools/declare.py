"""Declaring a tool is writing a Python function.

`@tool` reads the function's signature and docstring once, at decoration time, and builds two
things from them with pydantic's public API: the JSON Schema the model sees, and the pydantic
model that validates (and leniently coerces) the arguments the model sends back. The schema is
never written twice, and a tool that cannot be described fails here, not in production.
"""

from __future__ import annotations

import inspect
import re
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Union, cast, get_type_hints, overload

from pydantic import BaseModel, ConfigDict, Field, create_model
from pydantic.fields import FieldInfo

from ..messages import JSON, Usage
from .permissions import Caller

if TYPE_CHECKING:
    from ..approvals import Interactions
    from .schema import SchemaArguments

# A tool's function takes what its signature declares and returns anything serialisable: no
# narrower type exists for "any documented function". Declared once, with what may be registered.
ToolFunction = Callable[..., Any]
Extractor = Callable[[Any], object]  # a tool's result → what the model reads of it
ToolEntry = Mapping[str, Any]  # the dict-style entry: {"description", "parameters", "handler", …}
ToolLike = Union["Tool", ToolFunction, ToolEntry]  # what a registry (and `Agent(tools=…)`) accepts

_NAME_PATTERN = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
_SECTION = re.compile(
    r"^\s*(Args|Arguments|Parameters|Params|Returns?|Yields?|Raises|Examples?|Notes?)\s*:\s*$"
)
_GOOGLE_PARAM = re.compile(r"^\s*(\*{0,2}\w+)\s*(?:\([^)]*\))?\s*:\s*(.*)$")
_SPHINX_PARAM = re.compile(r"^\s*:param\s+(?:[^:]*\s)?(\w+)\s*:\s*(.*)$")


class ToolDefinitionError(TypeError):
    """A tool cannot be declared as written (no description, no type hint, bad name…)."""


class ToolError(Exception):
    """Raise from a tool to report a business error to the model (not a crash)."""


class TaskPaused(Exception):
    """Raise from a tool when a person must answer before the task can go on (tasks/pending.py).

    `reason` is one of loop.PAUSES; `message` is what the user is shown (e.g. the question).
    """

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


@dataclass
class ToolContext:
    """Per-call information a tool may ask for by annotating a parameter with `ToolContext`.

    `scratch` belongs to this one call: concurrent calls of one turn never share it.
    """

    call_id: str
    tool_name: str
    task_id: str = ""
    session_id: str | None = None
    scratch: dict[str, object] = field(default_factory=dict)
    caller: Caller | None = None  # who the task runs for (permissions)
    model: str = ""  # the model that asked for the call (permissions: allowed_models)
    interactions: Interactions | None = None  # where approvals and questions wait (kernel/approvals.py)
    spent: list[Usage] | None = None  # tokens a tool spent on the task's behalf (a sub-agent)

    def for_call(self, call_id: str, tool_name: str) -> ToolContext:
        """This task's context for one call, with a scratch of its own (`dataclasses.replace`,
        without its cost: this runs for every call)."""
        context = object.__new__(type(self))
        context.__dict__.update(self.__dict__)
        context.call_id, context.tool_name, context.scratch = call_id, tool_name, {}
        return context


@dataclass
class Tool:
    """A callable the model may ask for, with its schema and execution settings."""

    name: str
    description: str
    parameters: dict[str, JSON]
    handler: ToolFunction
    arguments_model: type[BaseModel] | None = None
    timeout: float | None = None
    extractor: Extractor | None = None
    max_chars: int | None = None  # its own cap on a result the model reads (the agent's otherwise)
    context_param: str | None = None
    keywords: tuple[str, ...] = ()
    level: int = 1  # 0 read-only, 1 reversible write, 2 irreversible; unknown side effects count as writes
    idempotent: bool = False  # running it twice with the same arguments has the effect of running it once
    varies: bool = False  # its result differs from run to run (the clock): a replay uses the recorded one
    required_role: str | None = None  # e.g. "admin": only callers with that role may run it
    allowed_models: tuple[str, ...] = ()  # empty: any model
    confirm: bool = False  # a person approves each call before it runs (level-2 tools always need it)
    asks_user: bool = False  # may pause the task to ask the user (clarify): needs someone to ask
    groups: tuple[str, ...] = ()  # routing tags (tools/routing.py): with many tools, only relevant groups go
    read_only_hint: bool | None = None  # an MCP server's `readOnlyHint`; None: not an MCP tool
    inline: bool = False  # a sync tool that returns at once: run on the event loop, not a worker thread
    # a tool declared by a JSON Schema (dict entry, MCP): its checks (kernel/tools/schema.py); built on first
    # use when a Tool is constructed directly. `declared_name` is the name it was declared with when
    # that is not a name the model may see (`pay.out` is offered as `pay_out`).
    schema_arguments: SchemaArguments | None = field(default=None, repr=False)
    declared_name: str | None = None

    @property
    def needs_person(self) -> bool:
        return self.confirm or self.level >= 2 or self.asks_user

    @property
    def is_async(self) -> bool:  # asked at every call: worked out once per handler
        handler, known = self.handler, self.__dict__.get("_async_of")
        if known is None or known[0] is not handler:
            known = self.__dict__["_async_of"] = (handler, inspect.iscoroutinefunction(handler))
        return bool(known[1])

    def schema(self) -> dict[str, JSON]:
        """The OpenAI `tools` entry for this tool."""
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": self.parameters},
        }

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """A decorated function stays callable as the plain function."""
        return self.handler(*args, **kwargs)


@overload
def tool(fn: ToolFunction, /) -> Tool: ...
@overload
def tool(
    *,
    name: str | None = None,
    description: str | None = None,
    timeout: float | None = None,
    extractor: Extractor | None = None,
    keywords: tuple[str, ...] | list[str] = (),
    level: int = 1,
    idempotent: bool = False,
    required_role: str | None = None,
    allowed_models: tuple[str, ...] | list[str] = (),
    confirm: bool = False,
    groups: tuple[str, ...] | list[str] = (),
    inline: bool = False,
    varies: bool = False,
) -> Callable[[ToolFunction], Tool]: ...


def tool(
    fn: ToolFunction | None = None,
    /,
    *,
    name: str | None = None,
    description: str | None = None,
    timeout: float | None = None,
    extractor: Extractor | None = None,
    keywords: tuple[str, ...] | list[str] = (),
    level: int = 1,
    idempotent: bool = False,
    required_role: str | None = None,
    allowed_models: tuple[str, ...] | list[str] = (),
    confirm: bool = False,
    groups: tuple[str, ...] | list[str] = (),
    inline: bool = False,
    varies: bool = False,
) -> Tool | Callable[[ToolFunction], Tool]:
    """Turn a typed, documented function (sync or async) into a `Tool`.

    `timeout` overrides the agent's per-tool timeout; `extractor` compresses the function's
    result before it is serialised for the model; `keywords` are extra words (any language)
    appended to the description so the model — and the offline demo model — know when to use it.
    `level` says what the tool may change (0 nothing, 1 reversible, 2 irreversible) and
    `idempotent` that a repeat is harmless: together they decide whether a call interrupted by a
    crash may simply be run again. `required_role` and `allowed_models` limit who and which
    models may run it (kernel/tools/permissions.py). `confirm` makes every call wait for a person's
    approval (tasks/pending.py), as level-2 tools always do. `groups` tags the tool for routing: with
    many tools, only the groups a message is about are offered (tools/routing.py). `inline` runs a
    sync tool on the event loop instead of a worker thread (tools/registry.py `_invoke`): for quick
    pure functions only, since nothing else runs meanwhile and its timeout cannot stop it. `varies`:
    its result differs from run to run (the time), so a replay uses the recorded one (observe/replay.py).
    """

    def decorate(func: ToolFunction) -> Tool:
        declared = tool_from_function(
            func, name=name, description=description, timeout=timeout, extractor=extractor, keywords=keywords
        )
        declared.level, declared.idempotent = _check_level(level, declared.name), idempotent
        declared.required_role, declared.allowed_models = required_role, tuple(allowed_models)
        declared.confirm, declared.groups, declared.varies = confirm, _groups(groups), varies
        if inline and declared.is_async:
            raise ToolDefinitionError(
                f"tool {declared.name!r}: inline is for sync functions; an async one runs on the loop"
            )
        declared.inline = inline
        return declared

    return decorate(fn) if fn is not None else decorate


def tool_from_function(
    func: ToolFunction,
    *,
    name: str | None = None,
    description: str | None = None,
    timeout: float | None = None,
    extractor: Extractor | None = None,
    keywords: tuple[str, ...] | list[str] = (),
) -> Tool:
    tool_name = name or func.__name__
    if not _NAME_PATTERN.match(tool_name):
        raise ToolDefinitionError(f"tool name {tool_name!r} must match {_NAME_PATTERN.pattern}")
    summary, param_docs = parse_docstring(inspect.getdoc(func) or "")
    text = (description or summary).strip()
    if not text:
        raise ToolDefinitionError(
            f"tool {tool_name!r} has no description: add a docstring or pass description=…"
        )
    if keywords:
        text = f"{text} ({', '.join(keywords)})"
    model, context_param = arguments_model_for(func, tool_name, param_docs)
    return Tool(
        name=tool_name,
        description=text,
        parameters=schema_of(model),
        handler=func,
        arguments_model=model,
        timeout=timeout,
        extractor=extractor,
        context_param=context_param,
        keywords=tuple(keywords),
    )


def _check_level(level: int, name: str) -> int:
    if level not in (0, 1, 2):
        raise ToolDefinitionError(f"tool {name!r}: level must be 0 (read-only), 1 or 2, got {level!r}")
    return level


def _groups(groups: str | tuple[str, ...] | list[str]) -> tuple[str, ...]:
    return (groups,) if isinstance(groups, str) else tuple(groups)  # "weather" is one group, not seven


def tool_from_entry(name: str, entry: ToolEntry) -> Tool:
    """Accept the dict-style registry entry of seed 000: {description, parameters, handler}.

    `parameters` is checked now (kernel/tools/schema.py: non-standard type names normalised, then the
    metaschema) and checks every call; a name the OpenAI API would refuse is offered as its
    `wire_name` (`pay.out` → `pay_out`). A typed handler's hints are applied after the schema.
    """
    missing = [key for key in ("description", "parameters", "handler") if key not in entry]
    if missing:
        raise ToolDefinitionError(f"tool entry {name!r} lacks {', '.join(missing)}")
    if not str(entry["description"]).strip():
        raise ToolDefinitionError(f"tool {name!r} has no description")
    handler = entry["handler"]
    parameters, checks = schema_checks(name, entry["parameters"])
    try:  # a typed handler still gets lax coercion; the declared schema is what the model sees
        model, context_param = arguments_model_for(handler, name, {})
    except ToolDefinitionError:
        model, context_param = None, None
    wire = _wire_name(name)
    checks.tool = wire  # call-time messages name the tool as the model knows it
    return Tool(
        name=wire,
        declared_name=None if wire == name else name,
        schema_arguments=checks,
        description=str(entry["description"]).strip(),
        parameters=parameters,
        handler=handler,
        arguments_model=model,
        timeout=entry.get("timeout"),
        extractor=entry.get("extractor"),
        context_param=context_param,
        level=_check_level(entry.get("level", 1), name),
        idempotent=bool(entry.get("idempotent", False)),
        required_role=entry.get("required_role"),
        allowed_models=tuple(entry.get("allowed_models", ())),
        confirm=bool(entry.get("confirm", False)),
        groups=_groups(entry.get("groups", ())),
    )


def schema_checks(name: str, parameters: JSON) -> tuple[dict[str, JSON], SchemaArguments]:
    """The normalised schema of a schema-declared tool and its `SchemaArguments`, or
    ToolDefinitionError naming the tool and the JSON pointer of the problem."""
    from .schema import SchemaArguments, SchemaDefinitionError, declared_schema

    try:
        schema = declared_schema(name, parameters)
    except SchemaDefinitionError as exc:
        raise ToolDefinitionError(str(exc)) from None
    return schema, SchemaArguments(name, schema)


def _wire_name(name: str) -> str:
    from .schema import SchemaDefinitionError, wire_name

    try:
        return wire_name(name)
    except SchemaDefinitionError as exc:
        raise ToolDefinitionError(str(exc)) from None


def arguments_model_for(
    func: ToolFunction, tool_name: str, param_docs: Mapping[str, str]
) -> tuple[type[BaseModel], str | None]:
    """Build the pydantic model of a function's parameters; find its ToolContext parameter."""
    try:
        hints = get_type_hints(func, include_extras=True)
    except Exception as exc:  # unresolvable forward references
        raise ToolDefinitionError(f"tool {tool_name!r}: cannot resolve type hints: {exc}") from exc
    fields: dict[str, Any] = {}
    context_param = None
    for param in inspect.signature(func).parameters.values():
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            raise ToolDefinitionError(f"tool {tool_name!r}: *args/**kwargs cannot be described to a model")
        if param.name not in hints:
            raise ToolDefinitionError(f"tool {tool_name!r}: parameter {param.name!r} has no type hint")
        annotation = hints[param.name]
        if annotation is ToolContext:
            context_param = param.name
            continue
        default = ... if param.default is inspect.Parameter.empty else param.default
        doc = param_docs.get(param.name)
        # pydantic refuses field names with a leading underscore: such a parameter gets a plain field
        # name and keeps its own name as the alias (what the schema shows and the model sends)
        alias = param.name if param.name.startswith("_") else None
        extra: dict[str, Any] = {"alias": alias} if alias else {}
        described = doc and not _has_description(annotation)
        info = Field(default, description=doc, **extra) if described else Field(default, **extra)
        internal = f"p{param.name}" if alias else param.name
        if internal in fields or (alias and internal in inspect.signature(func).parameters):
            raise ToolDefinitionError(f"tool {tool_name!r}: parameters {param.name!r} and {internal!r} clash")
        fields[internal] = (annotation, info)
    model_name = "".join(part.title() for part in re.split(r"[_-]", tool_name)) + "Arguments"
    model = create_model(model_name, __config__=ConfigDict(extra="ignore"), **fields)
    return cast("type[BaseModel]", model), context_param


def _has_description(annotation: object) -> bool:
    if typing.get_origin(annotation) is not typing.Annotated:
        return False
    metadata: tuple[object, ...] = getattr(annotation, "__metadata__", ())
    return any(isinstance(meta, FieldInfo) and meta.description for meta in metadata)


def schema_of(model: type[BaseModel]) -> dict[str, JSON]:
    """JSON Schema for the model, without pydantic's auto titles (noise that costs prompt bytes)."""
    schema = model.model_json_schema()
    return cast("dict[str, JSON]", _drop_titles(schema))


def _drop_titles(node: JSON, parent_key: str = "") -> JSON:
    if isinstance(node, dict):
        # "properties" and "$defs" map user names to schemas: a field may legitimately be named "title"
        keep_all = parent_key in ("properties", "$defs")
        return {
            key: _drop_titles(value, key)
            for key, value in node.items()
            if keep_all or not (key == "title" and isinstance(value, str))
        }
    if isinstance(node, list):
        return [_drop_titles(item) for item in node]
    return node


def parse_docstring(doc: str) -> tuple[str, dict[str, str]]:
    """Split a docstring into its summary and per-parameter descriptions.

    Understands Google style (`Args:` then `name (type): text`) and Sphinx style
    (`:param name: text`); continuation lines are joined.
    """
    summary: list[str] = []
    params: dict[str, str] = {}
    section: str | None = None
    current: str | None = None
    for line in doc.splitlines():
        sphinx = _SPHINX_PARAM.match(line)
        if sphinx:
            section, current = "sphinx", sphinx.group(1)
            params[current] = sphinx.group(2).strip()
            continue
        header = _SECTION.match(line)
        if header:
            section = "args" if header.group(1).startswith(("Arg", "Param")) else "other"
            current = None
            continue
        if line.lstrip().startswith(":"):
            section, current = "other", None
            continue
        if section is None:
            summary.append(line)
        elif section == "args":
            google = _GOOGLE_PARAM.match(line)
            if google and (len(line) - len(line.lstrip())) <= 4:
                current = google.group(1).lstrip("*")
                params[current] = google.group(2).strip()
            elif current and line.strip():
                params[current] = f"{params[current]} {line.strip()}".strip()
        elif section == "sphinx" and current and line.strip():
            params[current] = f"{params[current]} {line.strip()}".strip()
    return "\n".join(summary).strip(), params


__all__ = ["Tool", "ToolContext", "ToolDefinitionError", "ToolError", "parse_docstring", "schema_checks",
           "tool", "tool_from_entry", "tool_from_function"]  # fmt: skip
