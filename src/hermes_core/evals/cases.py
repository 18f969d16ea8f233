"""The case format, loading a folder of cases, and the checks on a run.

A case is one YAML file: a conversation (earlier turns, then the user message that is the task)
and checks on what the agent did with it::

    name: sales-growth             # default: the file name without .yaml
    description: growth must come from the calculator, not from the model's head
    conversation:                  # or `input: "…"` for a one-message task
      - user: Keep every number exact, please.
      - assistant: Sure.
      - user: By how many percent did sales grow from 960 to 1200?
    files:                         # optional: a fresh workspace holding these (turns on the file tools)
      sales.csv: "region,q1,q2\\nNorth,960,1200\\n"
    tools: [hermes_core.tools.builtin]   # optional: these tool modules instead of the configured ones
    checks:
      must_call:                   # each must succeed at least once: a name, or a name and arguments
        - tool: calculator
          arguments: {expression: "(1200-960)/960*100"}    # exact values
          arguments_match: {expression: "1200"}             # regular expressions (re.search)
      must_not_call: [write_file]  # never called, not even attempted
      reply_contains: ["25"]
      reply_not_contains: ["Sorry"]
      reply_matches: ['25(\\.0+)?\\s*%']
      max_steps: 3                 # model calls
      stop_reason: completed       # the default; null accepts any
      file_contains: {report.md: ["North"]}   # workspace files after the run

A message of the conversation is `{user: text}` or `{assistant: text}`, or a full OpenAI-style
message (`role`, `content`, `tool_calls`, `tool_call_id`) as a trace records it. System messages
are not part of a case: the system prompt comes from the settings.

A recorded failure becomes a case with `hermes-kernel eval add TRACE` (`traces.py`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from ..kernel.messages import JSON, Message

if TYPE_CHECKING:
    from ..kernel.loop import RunResult
    from ..kernel.tools.registry import ToolOutcome

ROLES = ("user", "assistant", "tool")
WIRE_KEYS = ("role", "content", "tool_calls", "tool_call_id", "name")
CASE_SUFFIXES = (".yaml", ".yml")


class CaseError(ValueError):
    """A case file (or trace) that cannot be used; the message names the file and the key."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


def _as_list(value: JSON) -> JSON:
    """YAML convenience: a single string where a list of strings is expected."""
    return [value] if isinstance(value, str) else value


def _compiles(pattern: str) -> str:
    try:
        re.compile(pattern)
    except re.error as exc:
        raise ValueError(f"invalid regular expression {pattern!r}: {exc}") from None
    return pattern


class CallCheck(_Strict):
    """A tool that must have succeeded at least once, optionally with these argument values."""

    tool: str
    arguments: dict[str, JSON] = Field(default_factory=dict)
    arguments_match: dict[str, str] = Field(default_factory=dict)

    @model_validator(mode="before")
    @classmethod
    def _name_only(cls, value: JSON) -> JSON:
        return {"tool": value} if isinstance(value, str) else value

    @field_validator("arguments_match")
    @classmethod
    def _patterns(cls, value: dict[str, str]) -> dict[str, str]:
        return {key: _compiles(pattern) for key, pattern in value.items()}

    def describe(self) -> str:
        shown = [f"{key}={value!r}" for key, value in self.arguments.items()]
        shown += [f"{key}~/{pattern}/" for key, pattern in self.arguments_match.items()]
        return f"{self.tool}({', '.join(shown)})" if shown else self.tool

    def matches(self, outcome: ToolOutcome) -> bool:
        if outcome.call.name != self.tool or not outcome.ok:
            return False
        arguments = call_arguments(outcome)
        if any(key not in arguments or arguments[key] != value for key, value in self.arguments.items()):
            return False
        return all(
            key in arguments and re.search(pattern, _as_text(arguments[key]))
            for key, pattern in self.arguments_match.items()
        )


class Checks(_Strict):
    """What a run must (not) have done. Every check is optional except `stop_reason`'s default."""

    must_call: list[CallCheck] = Field(default_factory=list)
    must_not_call: list[str] = Field(default_factory=list)
    reply_contains: list[str] = Field(default_factory=list)
    reply_not_contains: list[str] = Field(default_factory=list)
    reply_matches: list[str] = Field(default_factory=list)
    max_steps: int | None = Field(None, ge=1)
    stop_reason: str | None = "completed"
    file_contains: dict[str, list[str]] = Field(default_factory=dict)

    _lists = field_validator(
        "must_call", "must_not_call", "reply_contains", "reply_not_contains", "reply_matches", mode="before"
    )(_as_list)

    @field_validator("reply_matches")
    @classmethod
    def _patterns(cls, value: list[str]) -> list[str]:
        return [_compiles(pattern) for pattern in value]

    @field_validator("file_contains", mode="before")
    @classmethod
    def _file_lists(cls, value: JSON) -> JSON:
        return {key: _as_list(texts) for key, texts in value.items()} if isinstance(value, dict) else value


class Case(_Strict):
    """One conversation to replay and the checks its run must pass (see the module docstring)."""

    name: str = ""
    description: str = ""
    source: str | None = None  # where the case came from, e.g. the trace's task id
    conversation: list[Message]
    files: dict[str, str] = Field(default_factory=dict)
    tools: list[str] | None = None
    checks: Checks = Field(default_factory=Checks)

    @model_validator(mode="before")
    @classmethod
    def _input_shorthand(cls, data: JSON) -> JSON:
        """`input: text` is the last user message, after any `conversation` given."""
        if isinstance(data, dict) and "input" in data:
            data = dict(data)
            text = data.pop("input")
            data["conversation"] = [*(data.get("conversation") or []), {"user": text}]
        return data

    @field_validator("conversation", mode="before")
    @classmethod
    def _messages(cls, value: JSON) -> JSON:
        if not isinstance(value, list):
            return value
        return [_wire_message(item, index) for index, item in enumerate(value)]

    @field_validator("conversation")
    @classmethod
    def _ends_with_the_task(cls, value: list[Message]) -> list[Message]:
        if not value:
            raise ValueError("needs at least one message: the user message that is the task")
        last = value[-1]
        if last["role"] != "user" or not isinstance(last.get("content"), str) or not last["content"]:
            raise ValueError("the last message must be a user message with text: it is the task")
        return value

    @field_validator("files")
    @classmethod
    def _relative_paths(cls, value: dict[str, str]) -> dict[str, str]:
        for path in value:
            parts = PurePosixPath(path).parts
            if not parts or PurePosixPath(path).is_absolute() or ".." in parts:
                raise ValueError(f"{path!r}: file paths must be relative and stay inside the workspace")
        return value

    @property
    def history(self) -> list[Message]:
        """The earlier turns, as the session history of the run."""
        return [dict(message) for message in self.conversation[:-1]]

    @property
    def task(self) -> str:
        """The last user message: what the agent is asked to do."""
        return str(self.conversation[-1]["content"])


def _wire_message(item: JSON, index: int) -> Message:
    """`{user: text}` / `{assistant: text}` or a full wire message → a wire message."""
    if not isinstance(item, Mapping):
        raise ValueError(f"message {index + 1}: expected a mapping such as {{user: text}}, got {item!r}")
    if "role" in item:
        message = {key: item[key] for key in WIRE_KEYS if key in item}
    elif len(item) == 1 and next(iter(item)) in ("user", "assistant"):
        role, content = next(iter(item.items()))
        message = {"role": role, "content": content}
    else:
        raise ValueError(f"message {index + 1}: write {{user: text}}, {{assistant: text}} or role/content")
    if message["role"] == "system":
        raise ValueError(f"message {index + 1}: system messages come from the settings, not from a case")
    if message["role"] not in ROLES:
        raise ValueError(f"message {index + 1}: role must be one of {', '.join(ROLES)}")
    if message.get("content") is not None and not isinstance(message["content"], str):
        raise ValueError(f"message {index + 1}: content must be text")
    return message


# -- loading ----------------------------------------------------------------------------------


def load_case(path: Path) -> Case:
    """One case file; its name defaults to the file name without the suffix."""
    import yaml

    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise CaseError(f"cannot read case {path}: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise CaseError(f"{path} is not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise CaseError(f"{path}: a case is a mapping (conversation or input, checks)")
    case = parse_case(data, str(path))
    return case if case.name else case.model_copy(update={"name": path.stem})


def parse_case(data: Mapping[str, JSON], where: str) -> Case:
    """Validate one case's data; errors name `where` and the key."""
    try:
        return Case.model_validate(data)
    except ValidationError as exc:
        raise CaseError(f"{where}: " + describe_errors(exc)) from None


def load_cases(path: str | Path) -> list[Case]:
    """Every case in a folder (its *.yaml / *.yml files, subfolders included, by path), or one file."""
    root = Path(path)
    if root.is_file():
        return [load_case(root)]
    if not root.is_dir():
        raise CaseError(f"no cases: {root} is neither a folder nor a case file")
    files = sorted(file for file in root.rglob("*") if file.suffix in CASE_SUFFIXES and file.is_file())
    cases = [load_case(file) for file in files]
    seen: dict[str, Path] = {}
    for case, file in zip(cases, files, strict=True):
        if case.name in seen:
            raise CaseError(f"{file}: case name {case.name!r} is also used by {seen[case.name]}")
        seen[case.name] = file
    return cases


def describe_errors(exc: ValidationError) -> str:
    lines = []
    for error in exc.errors(include_url=False):
        key = ".".join(str(part) for part in error["loc"]) or "(case)"
        if error["type"] == "extra_forbidden":
            lines.append(f"{key}: unknown key")
        else:
            message = error["msg"].removeprefix("Value error, ")
            lines.append(f"{key}: {message}")
    return "; ".join(lines)


# -- checks -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class CheckResult:
    """One check of one run: what was checked, whether it held, and if not, what was seen."""

    check: str
    passed: bool
    detail: str = ""


def evaluate(checks: Checks, result: RunResult, workspace: Path | None = None) -> list[CheckResult]:
    """Every check of `checks` against one run, in the order they are declared."""
    found: list[CheckResult] = []
    for expected in checks.must_call:
        passed = any(expected.matches(outcome) for outcome in result.tool_calls)
        found.append(
            CheckResult(f"must_call {expected.describe()}", passed, _calls_of(result, expected.tool))
        )
    for name in checks.must_not_call:
        times = sum(outcome.call.name == name for outcome in result.tool_calls)
        found.append(CheckResult(f"must_not_call {name}", times == 0, f"called {times} time(s)"))
    reply = result.reply
    seen = f"reply was {_preview(reply)}"
    for text in checks.reply_contains:
        found.append(CheckResult(f"reply_contains {text!r}", text in reply, seen))
    for text in checks.reply_not_contains:
        found.append(CheckResult(f"reply_not_contains {_preview(text)}", text not in reply, seen))
    for pattern in checks.reply_matches:
        found.append(CheckResult(f"reply_matches /{pattern}/", re.search(pattern, reply) is not None, seen))
    if checks.max_steps is not None:
        steps = result.model_calls
        found.append(CheckResult(f"max_steps {checks.max_steps}", steps <= checks.max_steps, f"took {steps}"))
    if checks.stop_reason is not None:
        passed = result.stop_reason == checks.stop_reason
        found.append(
            CheckResult(f"stop_reason {checks.stop_reason}", passed, f"stopped: {result.stop_reason}")
        )
    for path, texts in checks.file_contains.items():
        found.extend(_file_checks(path, texts, workspace))
    return [check if not check.passed else CheckResult(check.check, True) for check in found]


def _file_checks(path: str, texts: list[str], workspace: Path | None) -> list[CheckResult]:
    file = (workspace / path) if workspace is not None else None
    if file is None or not file.is_file():
        where = "no workspace" if workspace is None else "no such file"
        return [CheckResult(f"file_contains {path} {text!r}", False, where) for text in texts]
    content = file.read_text(encoding="utf-8", errors="replace")
    return [
        CheckResult(f"file_contains {path} {text!r}", text in content, f"file has {_preview(content)}")
        for text in texts
    ]


def call_arguments(outcome: ToolOutcome) -> dict[str, JSON]:
    """The arguments a call ran with (or, for a call that did not run, what the model wrote)."""
    if outcome.arguments is not None:
        return outcome.arguments
    try:
        value = json.loads(outcome.call.arguments)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def _calls_of(result: RunResult, name: str) -> str:
    calls = [outcome for outcome in result.tool_calls if outcome.call.name == name]
    if not calls:
        names = sorted({outcome.call.name for outcome in result.tool_calls})
        return f"not called (called: {', '.join(names) or 'no tools'})"
    shown = [
        f"{clip(outcome.call.arguments, 60)} → {'ok' if outcome.ok else outcome.error or 'failed'}"
        for outcome in calls
    ]
    return "calls: " + "; ".join(shown)


def _as_text(value: JSON) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def clip(text: str, limit: int = 160) -> str:
    """`text` on one line, at most `limit` characters."""
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _preview(text: str, limit: int = 80) -> str:
    return repr(clip(text, limit))
