"""The fake's cards: JSON 2.0 validation, CardKit card entities, and what a card shows a user.

Modelled on the platform's pages (FEISHU.md §6 option B and §11):

- **JSON 2.0 structure** ("卡片 JSON 2.0 结构", open.feishu.cn/document/uAjLw4CM/ukzMukzMukzM/
  feishu-cards/card-json-v2-structure): ``schema: "2.0"``, ``config``, ``body.elements``; a 2.0 card
  is always shared (``update_multi: false`` is refused); at most 200 components; an
  ``element_id`` is unique in the card, starts with a letter and holds at most 20 letters, digits
  or underscores; at most 5 tables, markdown tables included (230099, sub-code 11310: FEISHU.md
  §11); components of JSON 1.0 only (``action``, ``note``) are refused. Sent through the IM API a
  refused card answers HTTP 400 code 230099 (with the sub-code in ``msg``); through CardKit the
  create page's codes: 200860 over 30 KB, 300301 a repeated element_id, 300305 over 200
  components, 300307 an empty card.
- **CardKit entities** (create, "流式更新文本" element content, "更新卡片配置" settings, "全量更新卡片
  实体", id_convert; open.feishu.cn/document/cardkit-v1/…): ``card_id``; an entity may be sent once
  (``{"type": "card", "data": {"card_id"}}`` as an interactive message's content; a second send
  with a new uuid → 230099, **UNCONFIRMED** code; a repeated uuid returns the first message, as
  for every send); every operation carries a ``sequence`` that must exceed the entity's last one
  (300317) and be a positive 32-bit integer, and an optional ``uuid`` that makes a repeat a no-op
  (**UNCONFIRMED**: what a repeat answers — success here); at most 10 operations per second per
  entity (over it: HTTP 400 code 230020, **UNCONFIRMED** code); an unknown entity → 200740, one
  older than 14 days → 200750; the text of an element needs streaming mode on; streaming closes
  itself 10 minutes after it was (re)opened: the first operation after that answers 200850, later
  ones 300309, until settings open it again. The APIs' budgets (50/s, 1,000/min) are each API's own,
  like every other route of the fake (``_app_limit``).
- **What a user sees** (``rendered``): the rich-text component page ("富文本（Markdown）组件"):
  in JSON 1.0 headings, quotes, tables, inline code and footnotes are not rendered (the raw
  ``##``, ``>``, ``| --- |`` and backticks show); in JSON 2.0 they are. ``rendered`` turns a card
  into the text a reader sees under those rules, so a test reads what the user reads.
"""

from __future__ import annotations

import json
import re
import time
import uuid as uuid_module
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from .api import Answer, error, plain_text

CARD_LIMIT = 30 * 1024
MAX_COMPONENTS = 200
MAX_TABLES = 5
ENTITY_OPS_PER_S = 10
STREAMING_WINDOW = 600.0  # streaming closes itself this long after it was (re)opened
ENTITY_LIFETIME = 14 * 86400.0
SEQUENCE_MAX = 2**31 - 1
_ELEMENT_ID = re.compile(r"^[A-Za-z][A-Za-z0-9_]{0,19}$")
V1_ONLY_TAGS = frozenset({"action", "note"})  # JSON 1.0 containers that 2.0 replaced
_TABLE_RULE = re.compile(r"^\s*\|?\s*:?-{3,}:?\s*(\|\s*:?-{3,}:?\s*)*\|?\s*$")
_CODES = {
    200740: "card entity not found",
    200750: "card entity expired",
    200850: "card streaming timeout",
    200860: "card content exceeds the limit",
    230099: "Failed to create card content",
    300301: "element_id duplicated",
    300302: "element not found",
    300305: "the number of components exceeds 200",
    300307: "card content is empty",
    300309: "streaming mode is closed",
    300317: "sequence number compare failed",
}


@dataclass
class CardEntity:
    """One card entity: its current card, its streaming state, and the message that shows it."""

    card_id: str
    card: dict[str, Any]
    created_at: float  # the fake's API clock (``_now``)
    streaming: bool
    opened_at: float
    sequence: int = 0
    message_id: str | None = None
    timed_out: bool = False  # 200850 already answered since streaming closed itself
    uuids: set[str] = field(default_factory=set)
    ops: deque[float] = field(default_factory=deque)
    operations: list[tuple[str, int, float]] = field(default_factory=list)  # (what, sequence, monotonic)


def card_problem(card: Any, *, cardkit: bool = False) -> tuple[int, str] | None:
    """Why the platform refuses this card, as (code, msg); None when it is accepted. JSON 1.0 cards
    are only checked for being objects; 2.0 ones per the structure page (module docstring)."""
    if not isinstance(card, dict) or not card:
        return (300307, _CODES[300307]) if cardkit else (230099, "the card is empty")
    if card.get("schema") != "2.0":
        return (230099, "CardKit takes JSON 2.0 cards only") if cardkit else None
    if len(json.dumps(card, ensure_ascii=False).encode()) > CARD_LIMIT:
        return (200860, _CODES[200860]) if cardkit else (230025, "The message content reaches its limit.")
    config = card.get("config") or {}
    if not isinstance(config, dict) or config.get("update_multi") is False:
        return 230099, f"{_CODES[230099]}: JSON 2.0 cards are shared cards (update_multi cannot be false)"
    body = card.get("body")
    elements = body.get("elements") if isinstance(body, dict) else None
    if not isinstance(elements, list):
        return 230099, f"{_CODES[230099]}: body.elements must be an array"
    components = list(_components(elements))
    if len(components) > MAX_COMPONENTS:
        return 300305, _CODES[300305]
    ids: set[str] = set()
    tables = 0
    for component in components:
        tag, element_id = component.get("tag"), component.get("element_id")
        if not isinstance(tag, str) or tag in V1_ONLY_TAGS:
            return 230099, f"{_CODES[230099]}: tag {tag!r} is not a JSON 2.0 component"
        if element_id is not None:
            if not isinstance(element_id, str) or not _ELEMENT_ID.match(element_id):
                return 230099, f"{_CODES[230099]}: invalid element_id {element_id!r}"
            if element_id in ids:
                return 300301, _CODES[300301]
            ids.add(element_id)
        tables += 1 if tag == "table" else markdown_tables(str(component.get("content", "")))
    if tables > MAX_TABLES:
        return 230099, f"{_CODES[230099]}, ErrCode: 11310; ErrMsg: card table number over limit"
    return None


def _components(elements: list[Any]) -> Any:
    """Every component, containers' children included (columns, panels, forms)."""
    for element in elements:
        if not isinstance(element, dict):
            yield {"tag": None}
            continue
        yield element
        for key in ("elements", "columns"):
            children = element.get(key)
            if isinstance(children, list):
                yield from _components(children)


def markdown_tables(markdown: str) -> int:
    lines, count, fenced = markdown.splitlines(), 0, False
    for index, line in enumerate(lines):
        if line.lstrip().startswith(("```", "~~~")):
            fenced = not fenced
        elif not fenced and index and "|" in lines[index - 1] and _TABLE_RULE.match(line):
            count += 1
    return count


def card_reference(content: dict[str, Any]) -> str | None:
    """The card_id when an interactive message's content shows a card entity."""
    data = content.get("data")
    if content.get("type") == "card" and isinstance(data, dict) and isinstance(data.get("card_id"), str):
        return str(data["card_id"])
    return None


# -- what a user sees --------------------------------------------------------------------------


def buttons(card: dict[str, Any]) -> list[dict[str, Any]]:
    """The callback value of each button on a card, in order: JSON 2.0 buttons carry it in their
    `behaviors` (type `callback`), JSON 1.0 ones as `value` inside an `action` element."""
    version2 = card.get("schema") == "2.0"
    elements = (card.get("body") or {}).get("elements") if version2 else card.get("elements")
    found = []
    for component in _components(elements if isinstance(elements, list) else []):
        for button in component.get("actions") or [component]:
            if isinstance(button, dict) and button.get("tag") == "button":
                behaviors = [b for b in button.get("behaviors") or [] if b.get("type") == "callback"]
                value = behaviors[0].get("value") if behaviors else button.get("value")
                if isinstance(value, dict):
                    found.append(value)
    return found


def rendered(card: dict[str, Any]) -> str:
    """The text a reader sees on the card: each markdown (and plain-text) component as the client
    renders it under the card's JSON version (module docstring), one component per line."""
    version2 = card.get("schema") == "2.0"
    elements = (card.get("body") or {}).get("elements") if version2 else card.get("elements")
    shown = []
    for component in _components(elements if isinstance(elements, list) else []):
        text = component.get("content") if component.get("tag") == "markdown" else None
        if component.get("tag") == "button":
            text = "[" + str((component.get("text") or {}).get("content", "")) + "]"
        if isinstance(text, str):
            shown.append(render_markdown(text, version2))
    return "\n".join(shown)


def render_markdown(markdown: str, version2: bool) -> str:
    """Markdown as the rich-text component shows it: emphasis and links in both versions; headings,
    quotes, tables and inline code only in JSON 2.0 (code blocks lose their fences in both)."""
    out, fenced = [], False
    for line in markdown.splitlines():
        if line.lstrip().startswith(("```", "~~~")):
            fenced = not fenced
            continue
        if not fenced:
            line = _inline(line, version2)
            if version2:
                line = re.sub(r"^\s{0,3}#{1,6}\s+", "", line)
                line = re.sub(r"^\s{0,3}>\s?", "", line)
                if _TABLE_RULE.match(line):
                    continue
                if line.strip().startswith("|"):
                    line = "  ".join(cell.strip() for cell in line.strip().strip("|").split("|"))
        out.append(line)
    return "\n".join(out)


def _inline(line: str, version2: bool) -> str:
    line = re.sub(r"\*\*(.+?)\*\*", r"\1", line)
    line = re.sub(r"~~(.+?)~~", r"\1", line)
    line = re.sub(r"\[([^\]]+)\]\([^)\s]+\)", r"\1", line)
    if version2:
        line = re.sub(r"`([^`]+)`", r"\1", line)
    return line


# -- the CardKit routes ------------------------------------------------------------------------


class CardKit:
    """CardKit state and handlers; mixed into ``FakeFeishu`` (its ``OpenApi`` answers and clock)."""

    def _init_cards(self) -> None:
        self.cards: dict[str, CardEntity] = {}

    def _cardkit_error(self, code: int, msg: str | None = None) -> Answer:
        return error(400, code, msg or _CODES.get(code, "error"))

    def _card_create(self, request: web.Request, body: Any) -> Answer:
        """``POST /open-apis/cardkit/v1/cards`` {type: card_json, data: "<card JSON>"} → card_id."""
        data = body.get("data") if isinstance(body, dict) else None
        if not (isinstance(data, str) and body.get("type") == "card_json"):
            return self._cardkit_error(230099, "type must be card_json and data the card JSON as a string")
        try:
            card = json.loads(body["data"])
        except ValueError:
            return self._cardkit_error(230099, "data is not JSON")
        problem = card_problem(card, cardkit=True)
        if problem:
            return self._cardkit_error(*problem)
        now = self._now()  # type: ignore[attr-defined]
        card_id = str(7_000_000_000_000_000_000 + uuid_module.uuid4().int % 10**18)
        streaming = (card.get("config") or {}).get("streaming_mode") is True
        self.cards[card_id] = CardEntity(card_id, card, now, streaming, now)
        return self._answer({"card_id": card_id})

    def _card_content(self, request: web.Request, body: Any) -> Answer:
        """``PUT …/cards/:card_id/elements/:element_id/content`` {content, sequence, uuid}."""
        checked = self._operation(request, body)
        if not isinstance(checked, CardEntity):
            return checked
        entity, element_id = checked, request.match_info["element_id"]
        if not isinstance(body.get("content"), str):
            return self._cardkit_error(230099, "content must be a string")
        element = next((e for e in _components(entity.card["body"]["elements"])
                        if e.get("element_id") == element_id), None)  # fmt: skip
        if element is None or element.get("tag") not in ("markdown", "plain_text"):
            return self._cardkit_error(300302)
        closed = self._streaming_closed(entity)
        if closed:
            return closed
        element["content"] = body["content"]
        return self._applied(entity, body, "content")

    def _card_settings(self, request: web.Request, body: Any) -> Answer:
        """``PATCH …/cards/:card_id/settings`` {settings: "{\\"config\\": {…}}", sequence, uuid}."""
        checked = self._operation(request, body)
        if not isinstance(checked, CardEntity):
            return checked
        try:
            settings = json.loads(body.get("settings") or "")
        except (TypeError, ValueError):
            return self._cardkit_error(230099, "settings must be a JSON string")
        config = settings.get("config") if isinstance(settings, dict) else None
        if not isinstance(config, dict):
            return self._cardkit_error(230099, "settings must hold a config object")
        checked.card.setdefault("config", {}).update(config)
        if "streaming_mode" in config:
            checked.streaming = config["streaming_mode"] is True
            checked.opened_at, checked.timed_out = self._now(), False  # type: ignore[attr-defined]
        return self._applied(checked, body, "settings")

    def _card_update(self, request: web.Request, body: Any) -> Answer:
        """``PUT /open-apis/cardkit/v1/cards/:card_id`` {card: {type, data}, sequence, uuid}."""
        checked = self._operation(request, body)
        if not isinstance(checked, CardEntity):
            return checked
        new = body.get("card")
        card = None
        if isinstance(new, dict) and new.get("type") == "card_json":
            try:
                card = json.loads(new.get("data") or "")
            except (TypeError, ValueError):
                card = None
        problem = card_problem(card, cardkit=True)
        if problem:
            return self._cardkit_error(*problem)
        assert isinstance(card, dict)
        checked.card = card
        checked.streaming = (card.get("config") or {}).get("streaming_mode") is True
        return self._applied(checked, body, "update")

    def _card_id_convert(self, request: web.Request, body: Any) -> Answer:
        """``POST …/cards/id_convert`` {message_id} → the card_id of the card that message shows."""
        message_id = body.get("message_id") if isinstance(body, dict) else None
        message = self._messages.get(message_id) if isinstance(message_id, str) else None  # type: ignore[attr-defined]
        if message is None or message.msg_type != "interactive" or message.sender != "app":
            return self._cardkit_error(230099, "message_id is not a card message of this app")
        found = next((e for e in self.cards.values() if e.message_id == message.message_id), None)
        if found is None:
            now = self._now()  # type: ignore[attr-defined]
            card_id = str(7_100_000_000_000_000_000 + uuid_module.uuid4().int % 10**18)
            found = CardEntity(card_id, dict(message.content), now, False, now, message_id=message.message_id)
            self.cards[found.card_id] = found
        return self._answer({"card_id": found.card_id})

    # -- inside --------------------------------------------------------------------------------

    def _operation(self, request: web.Request, body: Any) -> CardEntity | Any:
        """The entity an operation addresses, after the checks every operation passes."""
        entity = self.cards.get(request.match_info["card_id"])
        if entity is None:
            return self._cardkit_error(200740)
        if self._now() - entity.created_at > ENTITY_LIFETIME:  # type: ignore[attr-defined]
            return self._cardkit_error(200750)
        if not isinstance(body, dict):
            return self._cardkit_error(230099, "the body must be a JSON object")
        if isinstance(body.get("uuid"), str) and body["uuid"] in entity.uuids:
            return self._answer({})  # a repeat of an operation already done: nothing changes
        sequence = body.get("sequence")
        if not isinstance(sequence, int) or isinstance(sequence, bool) or not 0 < sequence <= SEQUENCE_MAX:
            return self._cardkit_error(230099, "sequence must be an integer from 1 to 2147483647")
        if sequence <= entity.sequence:
            return self._cardkit_error(300317)
        now = time.monotonic()
        while entity.ops and entity.ops[0] <= now - 1.0:
            entity.ops.popleft()
        if len(entity.ops) >= ENTITY_OPS_PER_S:
            return self._cardkit_error(230020, "This operation triggers the frequency limit.")
        entity.ops.append(now)
        return entity

    def _streaming_closed(self, entity: CardEntity) -> Any:
        if entity.streaming and self._now() - entity.opened_at > STREAMING_WINDOW:  # type: ignore[attr-defined]
            entity.streaming = False
            entity.timed_out = True
            return self._cardkit_error(200850)
        if not entity.streaming:
            return self._cardkit_error(300309)
        return None

    def _applied(self, entity: CardEntity, body: dict[str, Any], what: str) -> Any:
        entity.sequence = body["sequence"]
        if isinstance(body.get("uuid"), str):
            entity.uuids.add(body["uuid"])
        entity.operations.append((what, body["sequence"], time.monotonic()))
        self._show_entity(entity, what)
        return self._answer({})

    def _show_entity(self, entity: CardEntity, method: str) -> None:
        """The message that shows the entity now shows its current card."""
        message = self._messages.get(entity.message_id) if entity.message_id else None  # type: ignore[attr-defined]
        if message is not None:
            raw = json.dumps(entity.card, ensure_ascii=False)
            self._update(message, f"CARDKIT {method}", "interactive", entity.card, raw)  # type: ignore[attr-defined]

    def _card_check(self, msg_type: str, content: dict[str, Any], *, patch: bool = False) -> Answer | None:
        """A card about to be sent (or patched in): the JSON 2.0 rules, or the entity it shows,
        which must exist and not have been sent before (a patch cannot put an entity in)."""
        if msg_type != "interactive":
            return None
        card_id = card_reference(content)
        if card_id is None:
            problem = card_problem(content)
            return self._cardkit_error(*problem) if problem else None
        entity = self.cards.get(card_id)
        if entity is None:
            return self._cardkit_error(200740)
        if patch or entity.message_id is not None:
            return self._cardkit_error(230099, "the card entity has been sent already")
        return None

    def _card_shown(self, message: Any) -> None:
        card_id = card_reference(message.content) if message.msg_type == "interactive" else None
        if card_id is not None:
            entity = self.cards[card_id]
            entity.message_id = message.message_id
            message.content = entity.card
            message.text = message.versions[0] = plain_text("interactive", entity.card)

    def _answer(self, data: dict[str, Any]) -> Answer:
        return Answer(200, {"code": 0, "msg": "success", "data": data})


__all__ = [
    "CardEntity", "CardKit", "buttons", "card_problem", "card_reference", "render_markdown", "rendered",
]  # fmt: skip
