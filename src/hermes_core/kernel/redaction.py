"""Secrets stay out of what the process writes: logs, traces, stored data, replies and prompts.

A `Redactor` knows the secret values to hide: the secret environment variables (HERMES_API_KEY,
FEISHU_APP_SECRET, FEISHU_VERIFICATION_TOKEN, FEISHU_ENCRYPT_KEY, HERMES_WEBHOOK_SECRET, PGPASSWORD, any
`*_API_KEY`, `*_SECRET`, `*_TOKEN`, `*_PASSWORD`, `*_ENCRYPT_KEY` of at least 8 characters), plus
values added at run time (`redactor.add(token)`, e.g. a freshly fetched Feishu tenant token). It
replaces:

- each known value, as is and in its URL-encoded and JSON-escaped forms, with `[REDACTED]`;
- the start of a known value that a cut left behind (more than 4 characters of it at the end of
  the text, or just before a cut marker: `…`, `[truncated`, `[output truncated`), with `[REDACTED]`;
- credentials nobody registered, recognised by their shape (`CREDENTIAL_RULES`: API keys, access
  tokens, private key blocks, JWTs, `Authorization:` and `Bearer` credentials, `password=…`), with
  `[REDACTED:<kind>]`. What a user pastes becomes a handle before this runs (`[secret:1:<kind>]`,
  tools/secret_handles.py), which a tool declared to accept it gets back as the value.

Text is redacted before it is cut, never after: `cut(text, limit)` redacts the whole text, cuts it
and redacts the cut edge, so a secret straddling a limit cannot leave its first characters behind.

Where it is installed:
- `install_log_redaction()` (observe/log_redaction.py): every log record, before any handler sees it;
- `RedactingModelClient`: the prompt and the answer; a tool call's arguments only of known values;
- the gateway's inbox and the session store: what a user pasted is redacted before it is stored;
- `redact_text` / `redact_data` / `cut_text`: anything else shown or stored (replies, traces).

One compiled regular expression does the work. Every branch starts with a literal, so the engine
skips in C to where a match could start: a 200-character line costs a few µs.
"""

from __future__ import annotations

import functools
import json
import os
import re
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from typing import Any, TypeVar
from urllib.parse import quote, quote_plus

from .messages import Message, ModelResponse, ToolCall
from .model import ModelClient, ModelWrapper, TextCallback

REDACTED = "[REDACTED]"
SECRET_VARIABLES = ("HERMES_API_KEY", "FEISHU_APP_SECRET", "FEISHU_VERIFICATION_TOKEN", "FEISHU_ENCRYPT_KEY",
                    "HERMES_WEBHOOK_SECRET", "PGPASSWORD")  # fmt: skip
SECRET_SUFFIXES = ("_API_KEY", "_SECRET", "_TOKEN", "_PASSWORD", "_ENCRYPT_KEY")
MIN_SECRET_CHARS = 8  # a shorter value of a `*_TOKEN`-like variable is rarely a secret (`TRUE`, `0`)
MIN_NAMED_SECRET_CHARS = 4  # the named variables always hold secrets; shorter would mangle any text
PARTIAL_CHARS = 5  # this many first characters of a known value, left at a cut, are redacted too
# Texts of CACHED_CHARS (e.g. a capped tool result resent with every prompt) are remembered with their
# redaction, the last CACHED_TEXTS of them: at most ~8 M characters held. Shorter texts (roles, ids,
# tool names, short messages: most strings of a prompt, each resent with every call) are remembered
# apart, the last SHORT_CACHED_TEXTS of them (at most ~0.8 M characters), so they never push a long one out.
CACHED_TEXTS, CACHED_CHARS = 1024, range(201, 8001)
SHORT_CACHED_TEXTS = 4096
_NESTED_MAX = 96  # a value's start is matched char by char up to here; beyond, its first 48 suffice

# What follows a cut: the marker a cut appends (`…`, kernel/tools/results.py's `[truncated: …]`,
# tools/shell.py's `[output truncated: …]`, raw or JSON-escaped) — or, where `cut` knows it has just
# cut the text, its end (`_EDGE`; not everywhere: a short string may well be the start of a secret).
_MARKERS = r"…|\\u2026|(?:\n|\\n)\[(?:output )?truncated"
_CUT, _EDGE = rf"(?={_MARKERS})", rf"(?=\Z|{_MARKERS})"

# --- credentials recognised by their shape -------------------------------------------------------
#
# (kind, regex). The whole match is replaced by `[REDACTED:<kind>]`, or, when the regex has a group
# `(?P<v>…)`, only that group (the `Authorization: ` or `password=` before it stays readable).
# Each regex starts with a literal (the engine's fast skip depends on it) and uses no other
# capturing group. Written here, after the rules of gitleaks (config/gitleaks.toml, rule ids in
# brackets) and Yelp's detect-secrets (plugins); lengths are loosened to the lower bound, since a
# provider may lengthen its keys, and a cut edge catches the start of one (`_CUT`).
_TOKEN_CHARS = r"[\w.~+/=-]"  # RFC 6750 token chars and base64
_VALUE = rf"(?!\[REDACTED)(?={_TOKEN_CHARS}*\d){_TOKEN_CHARS}"  # a credential has a digit, prose rarely
_QUOTE = r"(?:\\?[\"'])?"  # 'key', "key" or \"key\" (JSON inside JSON)
_HEADER = rf"{_QUOTE}\s*[:=]\s*{_QUOTE}(?:(?i:bearer|basic|token|digest)\s+)?"  # `: Bearer `, `": "`
_PEM = r"-----BEGIN[ A-Z0-9_-]{0,100}PRIVATE KEY(?: BLOCK)?-----"


def _spellings(*words: str) -> list[str]:
    """`api_key` → api_key, API_KEY, api-key, apiKey, ApiKey…: literals, not `(?i)`, for the fast skip."""
    forms: set[str] = set()
    for word in words:
        parts = re.split(r"[_-]", word)
        joined = ["".join(parts), parts[0] + "".join(p.title() for p in parts[1:])]
        for base in {word, word.replace("_", "-"), *joined}:
            forms |= {base, base.lower(), base.upper(), base[:1].upper() + base[1:]}
    return sorted(forms, key=len, reverse=True)


# `client_secret`, `access_token`… end with a keyword: matched from there, the prefix stays.
_KEYWORDS = _spellings(
    "api_key", "access_key", "secret_key", "private_key", "secret", "password", "passwd", "token",
    "credential", "credentials",
)  # fmt: skip
CREDENTIAL_RULES: tuple[tuple[str, str], ...] = (
    # [private-key]; a block cut before its END line is redacted to the end of its base64 run
    (
        "private-key",
        rf"{_PEM}(?:[\s\S]{{0,16384}}?-----END[ A-Z0-9_-]{{0,100}}PRIVATE KEY(?: BLOCK)?-----"
        r"|(?:[A-Za-z0-9+/=\s:,.-]|\\[nrt])*)",
    ),
    ("anthropic-key", r"sk-ant-[\w-]{20,}"),  # [anthropic-api-key]
    # [openai-api-key], loosened: OpenAI, DeepSeek, Moonshot, DashScope… keys all start with sk-
    ("openai-key", r"sk-(?<![\w-]sk-)(?=[\w-]*\d)[\w-]{20,}"),
    ("stripe-key", r"sk_(?:test|live|prod)_[A-Za-z0-9]{10,99}"),  # [stripe-access-token]
    ("stripe-key", r"rk_(?:test|live|prod)_[A-Za-z0-9]{10,99}"),
    ("github-token", r"gh[pousr]_[0-9A-Za-z]{36,}"),  # [github-pat], [github-oauth], [github-app-token]
    ("github-token", r"github_pat_\w{22,}"),  # [github-fine-grained-pat]
    ("gitlab-token", r"glpat-[\w-]{20,}"),  # [gitlab-pat]
    ("slack-token", r"xox[abeoprs]-(?=[0-9A-Za-z-]*\d)[0-9A-Za-z-]{10,}"),  # [slack-*-token]
    ("slack-token", r"xapp-\d-[0-9A-Za-z-]{10,}"),  # [slack-app-token]
    ("slack-webhook", r"hooks\.slack\.com/(?:services|workflows|triggers)/[A-Za-z0-9+/]{20,}"),
    # [aws-access-token]: AKIA…, 16 more of base32, not inside a longer word
    ("aws-access-key", r"A(?:KIA|SIA|BIA|CCA|3T[A-Z0-9])(?<![A-Za-z0-9]....)[A-Z2-7]{16}(?![A-Za-z0-9])"),
    ("google-api-key", r"AIza[\w-]{35}"),  # [gcp-api-key]
    ("huggingface-token", r"hf_(?<![A-Za-z0-9]hf_)[A-Za-z]{34}(?![A-Za-z0-9])"),  # [huggingface-access-token]
    ("jwt", r"eyJ[A-Za-z0-9_-]{10,}\.eyJ[A-Za-z0-9_-]{10,}\.[A-Za-z0-9_-]*"),  # [jwt]
    ("feishu-token", r"t-(?<![\w-]t-)(?=[A-Za-z0-9]*\d)[A-Za-z0-9]{20,}\b"),  # tenant_access_token
    ("feishu-token", r"u-(?<![\w-]u-)(?=[A-Za-z0-9]*\d)[A-Za-z0-9]{20,}\b"),  # user_access_token
    *(
        ("credential", rf"{word}{_HEADER}(?P<v>{_VALUE}{{8,}})")
        for word in ("authorization", "Authorization", "AUTHORIZATION")
    ),
    ("bearer-token", rf"Bearer\s+(?P<v>{_VALUE}{{12,}})"),
    # detect-secrets BasicAuthDetector: the password of https://user:password@host
    ("url-password", r"://[^\s:/?#@'\"]+:(?P<v>(?!\[REDACTED)[^\s:/?#@'\"]{3,})@"),
    # [generic-api-key], narrowed: `password = x`, `"api_key": "x"`, `TOKEN=x`, the value with a digit
    # (one branch per spelling, each starting with a literal)
    *(("credential", rf"{word}{_QUOTE}\s*[:=]\s*{_QUOTE}(?P<v>{_VALUE}{{8,}})") for word in _KEYWORDS),
    *(
        ("password", rf"{word}\s*(?:[:：=]|是|为)\s*(?P<v>(?!\[REDACTED)[!-~]{{6,}})")
        for word in ("密码", "口令", "密钥", "秘钥", "令牌")
    ),
)


def _cut_rules(cut: str) -> tuple[tuple[str, str], ...]:
    """The start of a credential left at a cut (`ghp_Ab3…`, `password=hun…`): too short for its
    rule, redacted all the same when `cut` (a lookahead) follows."""
    shapes = (("anthropic-key", "sk-ant-"), ("openai-key", r"sk-(?<![\w-]sk-)(?=[\w-]*\d)"),
              ("github-token", "gh[pousr]_"), ("github-token", "github_pat_"), ("gitlab-token", "glpat-"),
              ("slack-token", "xox[abeoprs]-"), ("slack-token", "xapp-"), ("aws-access-key", "A(?:KIA|SIA)"),
              ("google-api-key", "AIza"), ("jwt", r"eyJ(?=[\w-]*\d)"))  # fmt: skip
    partial = rf"(?!\[REDACTED){_TOKEN_CHARS}+{cut}"
    return (
        *((kind, f"{start}{partial}") for kind, start in shapes),
        ("bearer-token", rf"Bearer\s+(?P<v>(?={_TOKEN_CHARS}*\d){partial})"),
        *(("credential", rf"{word}{_QUOTE}\s*[:=]\s*{_QUOTE}(?P<v>{partial})") for word in _KEYWORDS),
    )


Branch = tuple[str, str]  # (the first character, the regex of the rest)


def _shape_branches(rules: tuple[tuple[str, str], ...]) -> tuple[list[Branch], dict[str, str]]:
    """The rules as branches of one pattern, each with one group naming its rule: `p<n>`, the part
    to replace, or `w<n>`, an empty group at the end (the whole match goes)."""
    branches, kinds = [], {}
    for n, (kind, rule) in enumerate(rules):
        assert rule[0] not in "\\([.^$", f"rule {n} must start with a literal"
        if "(?P<v>" in rule:
            name, rest = f"p{n}", rule[1:].replace("(?P<v>", f"(?P<p{n}>")
        else:
            name, rest = f"w{n}", f"{rule[1:]}(?P<w{n}>)"
        branches.append((rule[0], rest))
        kinds[name] = kind
    return branches, kinds


_RULES = (CREDENTIAL_RULES, _cut_rules(_CUT), _cut_rules(_EDGE))
_ALL_BRANCHES, _KINDS = _shape_branches(tuple(rule for rules in _RULES for rule in rules))
_SHAPE_BRANCHES = _ALL_BRANCHES[: len(_RULES[0]) + len(_RULES[1])]  # for `redact`
_EDGE_BRANCHES = _ALL_BRANCHES[len(_SHAPE_BRANCHES) :]  # for the end of a text `cut` has cut

_LABEL = re.compile(r"\[REDACTED(?::[a-z-]+)?\]")

T = TypeVar("T")


class Redactor:
    """Replaces known secret values, and things shaped like credentials, with `[REDACTED…]`.

    Thread-safe: `add` may run while other threads redact.
    """

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        self._secrets: set[str] = set()
        self._lock = threading.Lock()
        self._set_pattern()
        self.add(*secrets)

    @classmethod
    def from_environment(cls, environ: Mapping[str, str] | None = None) -> Redactor:
        """A redactor for the secret variables of `environ` (default: `os.environ`)."""
        redactor = cls()
        redactor.add_environment(environ)
        return redactor

    def add_environment(self, environ: Mapping[str, str] | None = None) -> None:
        """Add the values of the secret variables (see the module docstring)."""
        environ = os.environ if environ is None else environ
        self.add(*(value for name, value in environ.items() if _is_secret_variable(name, value)))

    def add(self, *secrets: str) -> None:
        """Hide these values too from now on (e.g. a token fetched at run time). Empty values and
        values shorter than 4 characters are ignored."""
        new = {secret for secret in secrets if len(secret) >= MIN_NAMED_SECRET_CHARS} - self._secrets
        if new:
            with self._lock:
                self._secrets |= new
                self._set_pattern()

    def _set_pattern(self) -> None:
        """Compile the pattern for the present secrets. Results are cached: a prompt resends the whole
        history, and each of its messages is redacted once, not at every model call. The pattern for
        a cut edge is compiled when a text is first cut (most texts are shorter than their limit)."""
        forms = {form for secret in self._secrets for form in _encodings(secret)}
        main = _compile(forms, _CUT, _SHAPE_BRANCHES)
        replacement = functools.partial(_replacement, frozenset(forms), main)
        self._sub = functools.partial(main.sub, replacement)
        self._edge = _on_first_use(
            lambda: functools.partial(_compile(forms, _EDGE, _EDGE_BRANCHES).sub, replacement)
        )
        self._cached = functools.lru_cache(maxsize=CACHED_TEXTS)(self._sub)
        self._cached_short = functools.lru_cache(maxsize=SHORT_CACHED_TEXTS)(self._sub)
        self._cached_changes = functools.lru_cache(maxsize=CACHED_TEXTS)(self._changes)
        known = _on_first_use(lambda: functools.partial(_compile(forms, _CUT, []).sub, REDACTED))
        self._known = known if forms else str  # (no value: an empty pattern would match everywhere)

    def __len__(self) -> int:
        return len(self._secrets)

    def __repr__(self) -> str:  # never the values themselves
        return f"Redactor({len(self._secrets)} secret(s))"

    def redact(self, text: str) -> str:
        """`text` with every known secret, every start of one left at a cut, and every credential shape
        replaced (see the module docstring)."""
        size = len(text)
        if size < CACHED_CHARS.start:
            return self._cached_short(text)
        return self._cached(text) if size < CACHED_CHARS.stop else self._sub(text)

    def redact_known(self, text: str) -> str:
        """`text` with the known values (and their starts at a cut) replaced, and no shape rule: what
        a model writes as a tool's arguments reaches the tool as written, but for a known secret."""
        return self._known(text)

    def cut(self, text: str, limit: int) -> tuple[str, int]:
        """`text` redacted, then cut to its first `limit` characters with nothing of a secret left at
        the cut; and the length of the whole redacted text (more than `limit`: it was cut)."""
        redacted = self.redact(text)
        return self.cut_redacted(redacted, limit), len(redacted)

    def cut_redacted(self, redacted: str, limit: int) -> str:
        """`cut` of a text `redact` returned: a stream's text, redacted once per piece (channels/)."""
        return redacted if len(redacted) <= limit else self._edge(redacted[: max(limit, 0)])

    def redact_data(self, value: T) -> T:
        """Every string inside `value` (JSON-like: dicts, lists, tuples, strings) redacted.
        Whatever contains no secret is returned as is, not copied."""
        if isinstance(value, str):
            return self.redact(value)  # type: ignore[return-value]
        if isinstance(value, dict):
            return self._redact_dict(value)  # type: ignore[return-value]
        if not isinstance(value, (list, tuple)):
            return value
        changed = None
        for i, item in enumerate(value):  # a prompt: its messages, each looked up whole
            new = self._redact_dict(item) if type(item) is dict else self.redact_data(item)
            if _changed(new, item):
                changed = changed or list(value)
                changed[i] = new
        return value if changed is None else tuple(changed) if isinstance(value, tuple) else changed  # type: ignore[return-value]

    def _redact_dict(self, value: dict[Any, Any]) -> dict[Any, Any]:
        """A copy only once an item changed; a flat dict (most messages) is looked up by its values."""
        values = tuple(value.values())
        try:
            changes = self._cached_changes(values)
        except (TypeError, OverflowError):  # a nested list or dict (no hash), or a long message: walked
            changes = None
        if changes is None:  # nested values: walked
            changes = self._changes(values, flat=False)
        if not changes:
            return value
        keys, redacted = list(value), dict(value)
        for i, new in changes:
            redacted[keys[i]] = new
        return redacted

    def _changes(self, values: tuple[Any, ...], flat: bool = True) -> tuple[tuple[int, Any], ...] | None:
        """(position, redacted value) of each of `values` redaction changes; None: nested, and `flat`.
        Flat (the cache's call), a message longer than the long texts cached raises: `lru_cache` keeps
        no exception, so the cache of messages holds what the cache of texts does (~8 M characters)."""
        if flat and sum(len(item) for item in values if type(item) is str) >= CACHED_CHARS.stop:
            raise OverflowError("too long to be kept whole")
        changes = []
        for i, item in enumerate(values):
            if type(item) is str:
                new = self.redact(item)
                if new != item:
                    changes.append((i, new))
            elif not (item is None or type(item) in _SCALARS):
                if flat:
                    return None
                new = self.redact_data(item)
                if new is not item:
                    changes.append((i, new))
        return tuple(changes)


def _changed(new: object, old: object) -> bool:  # (a text from the cache is an equal copy, not `old`)
    return new is not old and (type(new) is not str or new != old)


_SCALARS = frozenset({str, int, float, bool})


def _on_first_use(build: Callable[[], Callable[[str], str]]) -> Callable[[str], str]:
    """The function `build()` returns, built when it is first called (two threads may both build it)."""
    built: list[Callable[[str], str]] = []

    def call(text: str) -> str:
        if not built:
            built.append(build())
        return built[0](text)

    return call


def _is_secret_variable(name: str, value: str) -> bool:
    if name in SECRET_VARIABLES:
        return len(value) >= MIN_NAMED_SECRET_CHARS
    secret_name = name.endswith(SECRET_SUFFIXES) or f"_{name}" in SECRET_SUFFIXES
    return secret_name and len(value) >= MIN_SECRET_CHARS


def _encodings(secret: str) -> set[str]:
    """The forms a value takes in a URL (path or query), in JSON and in a Python repr."""
    return {
        secret,
        quote(secret),
        quote(secret, safe=""),
        quote_plus(secret, safe=""),
        json.dumps(secret)[1:-1],
        json.dumps(secret, ensure_ascii=False)[1:-1],
        repr(secret)[1:-1],
    }


def _compile(forms: set[str], cut: str, shapes: list[Branch]) -> re.Pattern[str]:
    """Known values (with `cut`, the end of the pattern only: their starts before a cut), then shapes.
    Longest values first, so that a value containing another one is replaced whole."""
    ordered = sorted(forms, key=len, reverse=True)
    known = [] if cut == _EDGE else [(form[0], re.escape(form[1:])) for form in ordered]
    partial = [_partial(form, cut) for form in ordered if len(form) > PARTIAL_CHARS]
    return re.compile(_by_first_character([*known, *partial, *shapes]))


def _by_first_character(branches: list[Branch]) -> str:
    """`a(?:…|…)|b(?:…)…`: the engine skips in C to a position where one of the first characters
    stands, then tries only the branches starting with it. The order of branches sharing a first
    character is kept (the earlier wins), and branches with different ones never compete."""
    rests: dict[str, list[str]] = {}
    for first, rest in branches:
        rests.setdefault(first, []).append(rest)
    return "|".join(f"{re.escape(first)}(?:{'|'.join(group)})" for first, group in rests.items())


def _partial(form: str, cut: str) -> Branch:
    """The first `PARTIAL_CHARS` or more characters of `form`, followed by a cut (`cut`)."""
    nested = ""
    for char in reversed(form[PARTIAL_CHARS : min(len(form) - 1, _NESTED_MAX)]):
        nested = f"(?:{re.escape(char)}{nested})?"
    rest = re.escape(form[1:PARTIAL_CHARS]) + nested + cut
    if len(form) > _NESTED_MAX:  # so long a start is a secret wherever it stands
        rest += "|" + re.escape(form[1 : _NESTED_MAX // 2]) + r"[^\s\"'<>]*"
    return form[0], rest


def _replacement(known: frozenset[str], pattern: re.Pattern[str], match: re.Match[str]) -> str:
    """`[REDACTED]` for a known value; `[REDACTED:<kind>]` for a shape, in place of its group `p<n>`
    (what surrounds it stays: `Authorization: Bearer `, `password=`) or of the whole match. A value
    that is itself a known one or a more specific shape (`token: ghp_…`) gets that one's label."""
    group = match.lastgroup
    if group is None:
        return REDACTED
    whole = group[0] == "w"
    value = match[0 if whole else group]
    label = REDACTED if value in known else f"[REDACTED:{_KINDS[group]}]"
    if whole:
        return label
    inner = pattern.sub(functools.partial(_replacement, known, pattern), value)
    if _LABEL.fullmatch(inner):
        label = inner
    base, (start, end) = match.start(), match.span(group)
    return match[0][: start - base] + label + match[0][end - base :]


# --- one process-wide redactor --------------------------------------------------------------------

_default: Redactor | None = None
_default_lock = threading.Lock()


def default_redactor() -> Redactor:
    """The process's redactor, built from `os.environ` on first use.

    Build it after `.env` is loaded (`config.load_settings` loads it); code that learns a secret
    at run time adds it here: `default_redactor().add(token)`.
    """
    global _default
    if _default is not None:  # built: no lock on every call
        return _default
    with _default_lock:
        if _default is None:
            _default = Redactor.from_environment()
        return _default


def redact_text(text: str) -> str:
    """`text` redacted by the process's redactor: for error replies, trace dumps, printed output."""
    return default_redactor().redact(text)


def redact_data(value: T) -> T:
    """`value` (JSON-like) redacted by the process's redactor."""
    return default_redactor().redact_data(value)


def cut_text(text: str, limit: int) -> tuple[str, int]:
    """`Redactor.cut` by the process's redactor: for every place that shortens text it shows or stores."""
    return default_redactor().cut(text, limit)


# --- the model seam --------------------------------------------------------------------------------


class RedactingModelClient(ModelWrapper):
    """A model client whose prompts carry no secret and whose answers cannot leak one.

    The messages are redacted before they are sent (a tool result or a user message may contain a
    secret); the answer before anything stores or shows it (a prompt-injected model may echo one); a
    tool call's arguments of known values only: no shape rule rewrites what a tool receives. Streamed
    pieces are redacted one by one: a secret split across two reaches `on_text` unrecognised.
    """

    def __init__(self, inner: ModelClient, redactor: Redactor | None = None) -> None:
        super().__init__(inner)
        self.redactor = redactor or default_redactor()

    async def complete(
        self,
        messages: list[Message],
        tools: list[dict[str, Any]] | None = None,
        *,
        on_text: TextCallback | None = None,
    ) -> ModelResponse:
        redact = self.redactor.redact
        shown = None if on_text is None else (lambda piece: on_text(redact(piece)))
        response = await self.inner.complete(self.redactor.redact_data(messages), tools, on_text=shown)
        content, refusal, reasoning = response.content, response.refusal, response.reasoning
        new_content = content if content is None else redact(content)
        new_refusal = refusal if refusal is None else redact(refusal)
        new_reasoning = reasoning if reasoning is None else redact(reasoning)
        calls = response.tool_calls
        arguments = [self.redactor.redact_known(call.arguments) for call in calls] if calls else []
        if new_content == content and new_refusal == refusal and new_reasoning == reasoning:
            if arguments == [call.arguments for call in calls]:
                return response  # nothing to hide: the response as it came (no call rebuilt to compare)
        calls = [ToolCall(c.id, c.name, text) for c, text in zip(calls, arguments, strict=True)]
        return replace(
            response, content=new_content, tool_calls=calls, refusal=new_refusal, reasoning=new_reasoning
        )

    async def aclose(self) -> None:
        await self.inner.aclose()
