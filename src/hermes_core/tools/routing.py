"""Tool routing (T8): with many tools, offer the model only the groups the conversation is about.

Every tool schema costs prompt bytes on every model call, and a long list of tools also makes the
model's choice harder. Tools carry group tags (`@tool(groups=("calendar",))`; a tool without one
is a group of its own). When more tools than `ToolRouter.above` would be offered, the router ranks
the groups against each user message of the conversation's window and offers:

- for each message, its best-scoring groups (at most `max_groups`, each scoring at least
  `min_share` of its best);
- every tool already called in the window, so a later turn never loses a tool it was using;
- tools tagged `ALWAYS` (e.g. `load_skill`).

When no message matches a group, every tool is sent: routing cannot tell, so it does not guess.
Why the window and not the newest message: the tools array is the top of every request, where a
provider's prompt cache begins, so it should change only when a new topic comes (a follow-up that
names no topic keeps the list it had); a fold, which rewrites the prompt anyway, lets old topics
go. The cost, measured: benchmarks/bench_routing.py.

The ranking is lexical and cheap: each group is a bag of terms taken from its tools' names,
descriptions, keywords and parameter descriptions (names, keywords and group tags weigh triple),
and a group scores the sum of the inverse document frequencies of the message's terms it holds.
English words are lowercased and lightly stemmed; Chinese, Japanese and Korean text, which has no
spaces, becomes overlapping character pairs (`查询天气` → 查询, 询天, 天气).

Routing only ever removes schemas from the list it is given, and that list is what the registry
already filtered for the caller's permissions: it cannot offer a tool the policy refuses.
`RoutedTools` applies it as a `ModelClient` wrapper, so the loop does not know it exists.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..kernel.messages import Message, ModelResponse
from ..kernel.model import ModelClient, ModelWrapper, TextCallback
from ..kernel.prompts import CONTEXT_HEADING
from ..kernel.tools.declare import Tool

ALWAYS = "always"  # the group tag of tools offered whatever the message says
Schema = dict[str, Any]

_WORD = re.compile(r"[^\W_]+")  # letters and digits of any script
_CJK_RUN = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uac00-\ud7af]+")
_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")
_STOP_WORDS = frozenset(
    "a an and any are as at be by can could do does for from give how i if in into is it its me my of on "
    "or our please show should tell that the this to us use want was we what when where which who why "
    "will with would you your".split()
)
_INDEXES_KEPT = 16  # distinct offered tool sets whose index is cached (callers, withdrawn tools)
_MESSAGES_KEPT = 4096  # messages whose groups an index remembers (a conversation's, routed again each call)


def terms(text: str) -> list[str]:
    """The lexical terms of a text: stemmed English-like words, and CJK character bigrams."""
    found: list[str] = []
    for word in _WORD.findall(_CAMEL.sub(" ", text)):
        for run in _CJK_RUN.findall(word):
            found.extend([run] if len(run) == 1 else [run[i : i + 2] for i in range(len(run) - 1)])
        for piece in _CJK_RUN.split(word.lower()):
            if len(piece) > 1 and not piece.isdigit() and piece not in _STOP_WORDS:
                found.append(stem(piece))
    return found


def stem(word: str) -> str:
    """A light suffix stripper: `files`/`file`, `meetings`/`meeting`/`meet`, `created`/`create` agree."""
    if len(word) <= 3:
        return word
    if word.endswith("ies") and len(word) > 4:
        word = word[:-3] + "y"
    elif word.endswith("s") and not word.endswith(("ss", "us", "is")):
        word = word[:-1]
    for suffix in ("ing", "ed"):
        if word.endswith(suffix) and len(word) - len(suffix) >= 3:
            word = word[: -len(suffix)]
            break
    if len(word) >= 4 and word[-1] == word[-2] and word[-1] not in "lsz":  # running → run
        word = word[:-1]
    return word[:-1] if word.endswith("e") and len(word) > 3 else word


@dataclass
class GroupIndex:
    """The groups of one set of offered tools, as weighted bags of terms."""

    members: dict[str, list[str]] = field(default_factory=dict)  # group → tool names
    weights: dict[str, dict[str, float]] = field(default_factory=dict)  # group → term → weight
    idf: dict[str, float] = field(default_factory=dict)
    always: set[str] = field(default_factory=set)  # tool names offered whatever the message
    chosen: dict[str, list[str]] = field(default_factory=dict)  # message → its groups, as ranked

    def scores(self, message: str) -> dict[str, float]:
        query = set(terms(message))
        scored = {
            group: sum(self.idf[t] * bag[t] for t in query if t in bag) for group, bag in self.weights.items()
        }
        return {group: score for group, score in scored.items() if score > 0}


def build_index(schemas: Sequence[Schema], tool_named: Callable[[str], Tool | None]) -> GroupIndex:
    """Group the offered tools by their tags and collect each group's terms."""
    index = GroupIndex()
    for schema in schemas:
        function = schema.get("function", {})
        name = str(function.get("name", ""))
        declared = tool_named(name)
        groups = declared.groups if declared is not None and declared.groups else (name,)
        if ALWAYS in groups:
            index.always.add(name)
            continue
        keywords = " ".join(declared.keywords) if declared is not None else ""
        strong = terms(f"{name} {keywords}")
        weak = terms(f"{function.get('description', '')} {_parameter_text(function.get('parameters'))}")
        for group in groups:
            index.members.setdefault(group, []).append(name)
            bag = index.weights.setdefault(group, {})
            for term in weak:
                bag[term] = max(bag.get(term, 0.0), 1.0)
            for term in [*strong, *terms(group)]:
                bag[term] = 3.0
    count = len(index.weights)
    frequency: dict[str, int] = {}
    for bag in index.weights.values():
        for term in bag:
            frequency[term] = frequency.get(term, 0) + 1
    index.idf = {term: math.log(1 + count / n) for term, n in frequency.items()}
    return index


def _parameter_text(parameters: Any) -> str:
    """Parameter names and descriptions (they often hold examples: "City name, e.g. 北京")."""
    if not isinstance(parameters, dict):
        return ""
    properties = parameters.get("properties", {})
    if not isinstance(properties, dict):
        return ""
    return " ".join(
        f"{name} {spec.get('description', '')}" if isinstance(spec, dict) else str(name)
        for name, spec in properties.items()
    )


class ToolRouter:
    """Chooses which of the offered tool schemas a message needs (see the module docstring).

    `tool_named` finds the `Tool` behind a schema (its groups and keywords): `registry.get`.
    """

    def __init__(
        self,
        tool_named: Callable[[str], Tool | None],
        *,
        above: int = 16,
        max_groups: int = 3,
        min_share: float = 0.5,
    ) -> None:
        if above < 0 or max_groups < 1 or not 0 < min_share <= 1:
            raise ValueError("ToolRouter needs above >= 0, max_groups >= 1 and 0 < min_share <= 1")
        self.tool_named = tool_named
        self.above = above
        self.max_groups = max_groups
        self.min_share = min_share
        self._indexes: dict[tuple[str, ...], GroupIndex] = {}

    def select(
        self, schemas: Sequence[Schema], message: str | Sequence[str], used_names: Iterable[str] = ()
    ) -> list[Schema]:
        """The schemas to send, in their original order (a stable prefix for prompt caches).
        `message` may be the conversation's user messages: the groups of any of them are kept."""
        if len(schemas) <= self.above:
            return list(schemas)
        index = self.index(schemas)
        chosen = {group for text in ([message] if isinstance(message, str) else message)
                  for group in self.groups_for(text, index)}  # fmt: skip
        if not chosen:
            return list(schemas)
        keep = index.always | set(used_names)
        for group in chosen:
            keep.update(index.members[group])
        return [schema for schema in schemas if _name(schema) in keep]

    def groups_for(self, message: str, index: GroupIndex) -> list[str]:
        """The groups the message is about, best first (empty when it matches none)."""
        known = index.chosen.get(message)
        if known is None:
            if len(index.chosen) >= _MESSAGES_KEPT:
                index.chosen.pop(next(iter(index.chosen)))
            known = index.chosen[message] = self._rank(message, index)
        return known

    def _rank(self, message: str, index: GroupIndex) -> list[str]:
        scores = index.scores(message)
        if not scores:
            return []
        ranked = sorted(scores, key=lambda group: (-scores[group], group))
        best = scores[ranked[0]]
        return [group for group in ranked if scores[group] >= self.min_share * best][: self.max_groups]

    def index(self, schemas: Sequence[Schema]) -> GroupIndex:
        """The group index of these schemas, built once per distinct set of offered tools."""
        key = tuple(_name(schema) for schema in schemas)
        index = self._indexes.get(key)
        if index is None:
            if len(self._indexes) >= _INDEXES_KEPT:
                self._indexes.pop(next(iter(self._indexes)))
            index = self._indexes[key] = build_index(schemas, self.tool_named)
        return index


def conversation_so_far(messages: Sequence[Message]) -> tuple[list[str], list[str]]:
    """The user messages of the conversation (context messages left out) and the names of every
    tool called in it."""
    asked = [
        _text(m.get("content"))
        for m in messages
        if m.get("role") == "user" and not _text(m.get("content")).startswith(CONTEXT_HEADING)
    ]
    called = [
        str((call.get("function") or {}).get("name", ""))
        for m in messages
        if m.get("role") == "assistant"
        for call in m.get("tool_calls") or ()
    ]
    return asked, called


def current_task(messages: Sequence[Message]) -> tuple[str, list[dict[str, Any]]]:
    """The task's message (the last user message) and the tool calls made since it (the `function`
    part of each: name and arguments)."""
    start = max((i for i, m in enumerate(messages) if m.get("role") == "user"), default=-1)
    text = _text(messages[start].get("content")) if start >= 0 else ""
    calls = [
        call.get("function") or {}
        for message in messages[start + 1 :]
        if message.get("role") == "assistant"
        for call in message.get("tool_calls") or ()
    ]
    return text, calls


def _text(content: Any) -> str:
    if isinstance(content, list):  # content parts: keep the text ones
        return " ".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return "" if content is None else str(content)


def _name(schema: Schema) -> str:
    return str(schema.get("function", {}).get("name", ""))


class RoutedTools(ModelWrapper):
    """A model client that offers the one it wraps only the tools the task's message needs.

    `keep(messages)` may name more tools to keep offered (the skills in use: skills.py).
    """

    def __init__(
        self,
        inner: ModelClient,
        router: ToolRouter,
        keep: Callable[[list[Message]], Iterable[str]] | None = None,
    ) -> None:
        super().__init__(inner)
        self.router = router
        self.keep = keep

    async def complete(
        self,
        messages: list[Message],
        tools: list[dict[str, Any]] | None = None,
        *,
        on_text: TextCallback | None = None,
    ) -> ModelResponse:
        if tools and len(tools) > self.router.above:  # the window's groups: the list changes with a new topic
            asked, kept = conversation_so_far(messages)
            kept += self.keep(messages) if self.keep is not None else ()
            tools = self.router.select(tools, asked, kept)
        return await self.inner.complete(messages, tools, on_text=on_text)


__all__ = [
    "ALWAYS",
    "GroupIndex",
    "RoutedTools",
    "ToolRouter",
    "build_index",
    "conversation_so_far",
    "current_task",
    "stem",
    "terms",
]
