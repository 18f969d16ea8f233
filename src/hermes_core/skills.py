"""Skills (P5): written procedures the model reads only when a task needs them.

A skill is a folder holding a `SKILL.md` file, in the format other agent tools use (Agent Skills):
YAML front matter between `---` lines, then a Markdown body with the steps, notes and examples.

    ---
    name: weather-trip-advice
    description: Weather for a city and what to take on a trip there.
    triggers: [weather, umbrella, 天气, 带伞]     # optional: words that bring the body in
    tools: [get_weather]                         # optional: tools the steps call
    ---
    1. Call get_weather for the city the user named; never guess the city.
    ...

`name` and `description` are required; other keys are allowed and ignored. Loading is progressive:
the system prompt lists every skill's name and one-line description; a skill's body enters the
turn's context (after the history, beside the message) when one of its triggers appears in the
message, or the conversation when the model calls `load_skill`.

Files bundled beside the SKILL.md (the usual layout: `references/`, `scripts/`, `assets/`) are
named, with their sizes, under the body; the model reads one with `read_skill_file(skill, path)`,
confined to that skill's folder (no `..`, no absolute path, no symlink leading out), text only,
`MAX_SKILL_CHARS` characters at a time from `offset`. A body is returned whole up to
`MAX_SKILL_CHARS`; beyond that it is cut with a note saying so (docs/skills.md).

At load time (`SkillSet.load`):
- a malformed SKILL.md (no front matter, bad YAML, missing name or description, wrong types) or a
  skills folder that does not exist raises `SkillError` naming the file: fix it before serving;
- a skill whose `tools` include one the agent does not have is logged as a warning naming the
  skill and the tools, and marked unavailable (not listed, never triggered, `load_skill` says
  why). With `strict=True` that is a `SkillError` instead.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

from pydantic import Field

from .kernel.messages import Message

if TYPE_CHECKING:
    from .kernel.tools import Tool

log = logging.getLogger("hermes_core.skills")

SKILL_FILE = "SKILL.md"
LOAD_SKILL = "load_skill"
READ_SKILL_FILE = "read_skill_file"
MAX_SKILL_CHARS = 40_000  # of a skill body or one read of a bundled file (about 10,000 tokens)
MAX_LISTED_FILES = 50  # bundled files named under a body; the rest are counted
_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]{0,63}$", re.IGNORECASE)
_FRONT_MATTER = re.compile(r"\A\ufeff?---[ \t]*\r?\n(.*?)^---[ \t]*\r?$\n?", re.DOTALL | re.MULTILINE)
_ENGLISH_SUFFIXES = r"(?:s|es|ed|ing|ment|ments)?"

LISTING_HEADER = """\
## Skills

Skills are written procedures for particular tasks. Before doing a task one of these is for, call \
load_skill with its name and follow its steps (a skill whose steps are already below needs no call):"""


class SkillError(ValueError):
    """A skill cannot be loaded as written; the message names the file and what is wrong."""


@dataclass(frozen=True)
class Skill:
    name: str
    description: str
    body: str
    path: Path
    triggers: tuple[str, ...] = ()
    tools: tuple[str, ...] = ()
    missing_tools: tuple[str, ...] = ()  # tools it needs that the agent does not have
    files: tuple[tuple[str, int], ...] = ()  # bundled files: (path relative to the folder, bytes)

    @property
    def available(self) -> bool:
        return not self.missing_tools

    @cached_property
    def _trigger(self) -> re.Pattern[str] | None:
        if not self.triggers:
            return None
        return re.compile("|".join(_trigger_pattern(t.lower()) for t in self.triggers))

    def triggered_by(self, message: str) -> bool:
        """Whether one of its triggers appears in the message (case-insensitive; English triggers
        match whole words with common endings: `deploy` matches "deployed", not "redeploy")."""
        return self._trigger is not None and self._trigger.search(message.lower()) is not None

    @property
    def folder(self) -> Path:
        return self.path.parent

    def instructions(self) -> str:
        """The body as the model reads it, in the prompt or as `load_skill`'s result: whole up to
        `MAX_SKILL_CHARS` (then cut, with a note), followed by the names of its bundled files."""
        from .kernel.tools.results import cap

        text = f"## Skill: {self.name}\n\n{cap(self.body, MAX_SKILL_CHARS)}"
        if not self.files:
            return text
        lines = [f"- {name} ({_size(size)})" for name, size in self.files[:MAX_LISTED_FILES]]
        if len(self.files) > MAX_LISTED_FILES:
            lines.append(f"- … and {len(self.files) - MAX_LISTED_FILES} more")
        intro = f"Files of this skill (read one with {READ_SKILL_FILE}, skill {self.name!r} and the path):"
        return "\n\n".join([text, intro + "\n" + "\n".join(lines)])

    def read(self, path: str, offset: int = 0) -> str:
        """A bundled file's text from character `offset`, at most `MAX_SKILL_CHARS` of it. Raises
        `ToolError` for a path outside the folder (`..`, absolute, a symlink leading out), a
        missing or binary file."""
        from .kernel.tools.results import cap
        from .tools import ToolError

        folder = self.folder.resolve()
        relative = Path(path.strip())
        if not path.strip() or relative.is_absolute() or ".." in relative.parts:
            raise ToolError(
                f"{path!r} is not a path inside skill {self.name!r}; its files are listed with it"
            )
        target = (folder / relative).resolve()
        if not target.is_relative_to(folder) or not target.is_file():
            raise ToolError(f"skill {self.name!r} has no file {path!r}; its files: {self._names()}")
        if target.stat().st_size > 8 * MAX_SKILL_CHARS:  # never read a huge asset whole
            raise ToolError(f"{path!r} is {_size(target.stat().st_size)}: too large to read as text")
        try:
            text = target.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            raise ToolError(f"{path!r} is not a text file (UTF-8); it cannot be read here") from None
        if offset < 0 or (offset and offset >= len(text)):
            raise ToolError(f"offset {offset} is outside {path!r} ({len(text)} characters)")
        shown = cap(text[offset:], MAX_SKILL_CHARS)
        left = len(text) - offset - MAX_SKILL_CHARS
        return shown + (f"\n[read on with offset={offset + MAX_SKILL_CHARS}]" if left > 0 else "")

    def _names(self) -> str:
        return ", ".join(name for name, _ in self.files[:MAX_LISTED_FILES]) or "none"


def bundled_files(folder: Path) -> tuple[tuple[str, int], ...]:
    """The files under a skill's folder other than its SKILL.md (hidden ones and symlinks that
    lead out of the folder left out), with their sizes, sorted by path."""
    root = folder.resolve()
    found: list[tuple[str, int]] = []
    for file in sorted(folder.rglob("*")):
        relative = file.relative_to(folder)
        if relative.as_posix() == SKILL_FILE or any(part.startswith(".") for part in relative.parts):
            continue
        try:
            resolved = file.resolve()
            if file.is_file() and resolved.is_relative_to(root):
                found.append((relative.as_posix(), resolved.stat().st_size))
        except OSError:  # a broken link, a file gone meanwhile: not bundled
            continue
    return tuple(found)


def _size(size: int) -> str:
    return f"{size} bytes" if size < 1024 else f"{size / 1024:.1f} KB"


def _trigger_pattern(trigger: str) -> str:
    """A trigger starting with a Latin letter or digit must start a word; CJK has no word gaps."""
    escaped = re.escape(trigger)
    if trigger[:1].isascii() and trigger[:1].isalnum():
        return rf"(?<![a-z0-9]){escaped}{_ENGLISH_SUFFIXES}(?![a-z0-9])"
    return escaped


def parse_skill(path: Path) -> Skill:
    """Read one SKILL.md. Raises `SkillError` naming the file when it is malformed."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise SkillError(f"{path}: cannot read the skill file: {exc}") from None
    match = _FRONT_MATTER.match(text)
    if match is None:
        raise SkillError(
            f"{path}: no front matter: a {SKILL_FILE} starts with a '---' line, then YAML with at least "
            "name and description, then a closing '---' line"
        )
    import yaml

    try:
        meta = yaml.safe_load(match.group(1))
    except yaml.YAMLError as exc:
        raise SkillError(f"{path}: the front matter is not valid YAML: {exc}") from None
    if not isinstance(meta, dict):
        raise SkillError(f"{path}: the front matter must be a mapping (name: …, description: …)")
    name, description = meta.get("name"), meta.get("description")
    if not isinstance(name, str) or not _NAME.match(name):
        raise SkillError(f"{path}: 'name' must be letters, digits, '-' or '_' (at most 64), got {name!r}")
    if not isinstance(description, str) or not description.strip():
        raise SkillError(f"{path}: 'description' is required: one line saying what the skill is for")
    return Skill(
        name=name,
        description=" ".join(description.split()),
        body=text[match.end() :].strip(),
        path=path,
        triggers=_words(meta, "triggers", path),
        tools=_words(meta, "tools", path),
        files=bundled_files(path.parent),
    )


def _words(meta: dict[str, Any], key: str, path: Path) -> tuple[str, ...]:
    """An optional list of non-empty strings (a single string counts as a list of one)."""
    value = meta.get(key)
    if value is None:
        return ()
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not all(isinstance(item, str) and item.strip() for item in items):
        raise SkillError(f"{path}: '{key}' must be a list of words, got {value!r}")
    return tuple(item.strip() for item in items)


class SkillSet:
    """The skills of an agent: the prompt listing, the bodies a message triggers, `load_skill`."""

    def __init__(self, skills: Iterable[Skill] = ()) -> None:
        self.skills: dict[str, Skill] = {}
        for skill in skills:
            if skill.name in self.skills:
                other = self.skills[skill.name].path
                raise SkillError(f"{skill.path}: a skill named {skill.name!r} is already loaded from {other}")
            self.skills[skill.name] = skill

    @classmethod
    def load(
        cls,
        dirs: Sequence[str | Path],
        available_tools: Iterable[str] | None = None,
        *,
        strict: bool = False,
    ) -> SkillSet:
        """Every `<dir>/<skill>/SKILL.md` of these folders (other files are not skills).

        With `available_tools`, a skill needing any other tool is unavailable and reported (a
        warning, or a `SkillError` when `strict`); the name `load_skill` is always available.
        """
        found: list[Skill] = []
        for folder in map(Path, dirs):
            if not folder.is_dir():
                raise SkillError(f"{folder}: the skills folder does not exist")
            found += [parse_skill(file) for file in sorted(folder.glob(f"*/{SKILL_FILE}"))]
        if available_tools is not None:
            found = _check_tools(found, {*available_tools, LOAD_SKILL, READ_SKILL_FILE}, strict)
        return cls(found)

    @property
    def available(self) -> list[Skill]:
        return [skill for skill in self.skills.values() if skill.available]

    def triggered(self, message: str) -> list[Skill]:
        """The available skills whose triggers appear in the message."""
        return [skill for skill in self.available if skill.triggered_by(message)]

    def listing(self) -> str:
        """Names and one-line descriptions of the available skills ("" without any)."""
        if not self.available:
            return ""
        lines = [f"- {skill.name}: {skill.description}" for skill in self.available]
        return "\n".join([LISTING_HEADER, *lines])

    def system_prompt(self, base: str) -> str:
        """`base` with the listing: the same on every call, so a provider's prompt cache reuses it."""
        return "\n\n".join(part for part in (base, self.listing()) if part)

    def steps_for(self, message: str) -> str:
        """The bodies of the skills this message triggers ("" for none): they change from message to
        message, so they travel with the turn's context, after the history (agent.py `turn_messages`)."""
        return "\n\n".join(skill.instructions() for skill in self.triggered(message))

    def instructions(self, name: str) -> str:
        """What `load_skill(name)` returns. Raises `ToolError` (shown to the model) when it cannot."""
        return self._usable(name).instructions()

    def _usable(self, name: str) -> Skill:
        """The available skill of this name; `ToolError` saying why not (unknown, unavailable)."""
        from .tools import ToolError

        skill = self.skills.get(name.strip())
        if skill is None:
            known = ", ".join(s.name for s in self.available) or "none"
            raise ToolError(f"no skill named {name!r}; the skills are: {known}")
        if not skill.available:
            missing = ", ".join(skill.missing_tools)
            raise ToolError(f"skill {name!r} is unavailable here: it needs tool(s) {missing}")
        return skill

    def read_file(self, name: str, path: str, offset: int = 0) -> str:
        """What `read_skill_file(name, path)` returns; `ToolError` (shown to the model) when it cannot."""
        return self._usable(name).read(path, offset)

    @property
    def has_files(self) -> bool:
        return any(skill.files for skill in self.available)

    def tools_in_use(self, messages: list[Message]) -> set[str]:
        """The tools of the skills this task uses: triggered by its message, or loaded with
        `load_skill` since. Tool routing keeps these offered (tools/routing.py)."""
        from .tools.routing import current_task

        message, _ = current_task(messages)
        names = {skill.name for skill in self.triggered(message)} | _loaded(messages)
        chosen = [self.skills[name] for name in names if name in self.skills]
        return {tool for skill in chosen if skill.available for tool in skill.tools}

    @cached_property
    def load_skill(self) -> Tool:
        """The `load_skill` tool over these skills (read-only; offered whatever routing decides)."""
        from .kernel.tools import tool
        from .tools.routing import ALWAYS

        skills = self

        @tool(name=LOAD_SKILL, level=0, idempotent=True, groups=(ALWAYS,))
        def load_skill(
            name: Annotated[str, Field(description="the skill's name, as listed under Skills")],
        ) -> str:
            """Read a skill's steps, notes and examples before doing the task it is for."""
            return skills.instructions(name)

        load_skill.max_chars = MAX_SKILL_CHARS + 4_000  # the body whole, and the list of its files
        return load_skill

    @cached_property
    def read_skill_file(self) -> Tool:
        """The `read_skill_file` tool: a file bundled with a skill (read-only, always offered)."""
        from .tools import tool
        from .tools.routing import ALWAYS

        skills = self

        @tool(name=READ_SKILL_FILE, level=0, idempotent=True, groups=(ALWAYS,))
        def read_skill_file(
            skill: Annotated[str, Field(description="the skill's name")],
            path: Annotated[str, Field(description="the file's path as listed, e.g. references/units.md")],
            offset: Annotated[int, Field(ge=0, description="character to start from, for long files")] = 0,
        ) -> str:
            """Read a file bundled with a skill (a reference, script or template its steps mention)."""
            return skills.read_file(skill, path, offset)

        read_skill_file.max_chars = MAX_SKILL_CHARS + 200
        return read_skill_file


def _check_tools(skills: list[Skill], available: set[str], strict: bool) -> list[Skill]:
    """The skills, those needing a tool outside `available` marked unavailable and reported."""
    checked: list[Skill] = []
    problems: list[str] = []
    for skill in skills:
        missing = tuple(name for name in skill.tools if name not in available)
        if missing:
            problems.append(f"skill {skill.name!r} ({skill.path}) needs tool(s) {', '.join(missing)}")
            skill = dataclasses.replace(skill, missing_tools=missing)
        checked.append(skill)
    if problems and strict:
        raise SkillError("; ".join(problems) + ": the agent has no such tool")
    for problem in problems:
        log.warning("%s, which this agent does not have: the skill is unavailable", problem)
    return checked


def _loaded(messages: list[Message]) -> set[str]:
    """Names of the skills loaded with `load_skill` in the current task."""
    from .tools.routing import current_task

    names: set[str] = set()
    for call in current_task(messages)[1]:
        if call.get("name") == LOAD_SKILL:
            try:
                names.add(str(json.loads(call.get("arguments") or "{}").get("name", "")).strip())
            except (ValueError, AttributeError):  # unparseable: the call failed, nothing was loaded
                continue
    return names


__all__ = [
    "LOAD_SKILL",
    "MAX_SKILL_CHARS",
    "READ_SKILL_FILE",
    "SKILL_FILE",
    "Skill",
    "SkillError",
    "SkillSet",
    "parse_skill",
]
