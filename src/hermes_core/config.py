"""Configuration is data: a YAML file, then environment variables (and `.env`), in that order.

    model:
      provider: deepseek    # a preset (models/providers.py): base URL, key variable, default model
      name: deepseek-v4-flash
      temperature: 0.2
    agent:
      max_turns: 8
      mode: loop            # loop | plan | team: how serve, run and chat run a task (docs/modes.md)
    tools: [mypkg.tools]

The `model:` section is `ModelSettings` (models/settings.py), the limits of `agent:` are `Limits`
(kernel/loop.py) and the `team:` section is `TeamSettings` (team/settings.py): each option is
declared once, there, with its default and its bounds.
Secrets (the API key) come only from the environment: a YAML file that holds one is refused.
A model is a provider preset, or a name and a base URL; a half-configured one is a ConfigError
(nothing configured at all: the offline demo model).
A bad value is reported with its key and what is allowed.
"""

from __future__ import annotations

import importlib
import os
import re
from collections.abc import Mapping
from dataclasses import field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, model_validator
from pydantic.dataclasses import dataclass

from .channels.media import MediaLimits
from .kernel.approvals import APPROVAL_TTL
from .kernel.loop import Limits
from .kernel.messages import JSON
from .kernel.replies import Language
from .kernel.tools.permissions import Policy, unqualified
from .models.settings import ModelRoute, ModelSettings
from .modes import ModeName
from .plans.executor import DEFAULT_MAX_REPLANS
from .team.settings import TeamSettings
from .tools.files import DEFAULT_CONVERSATION_QUOTA_BYTES, DEFAULT_QUOTA_BYTES, MIB
from .tools.sandbox import DEFAULT_SANDBOX, SandboxMode

if TYPE_CHECKING:
    from .agent import Agent
    from .kernel.model import ModelClient
    from .models.providers import Endpoint
    from .modes import TaskMode
    from .skills import SkillSet
    from .tools.mcp import MCPToolset

SECRET_KEYS = frozenset({"api_key", "app_secret", "encrypt_key", "verification_token", "token", "password"})
# headers of `model.extra_headers` that carry a credential: from the environment only, like api_key
CREDENTIAL_HEADERS = frozenset({"authorization", "proxy-authorization", "api-key", "x-api-key"})
ENDPOINT_KEYS = ("model", "base_url", "api_key", "provider")  # of ModelSettings: from the preset or env
ENV_KEYS = {
    "HERMES_BASE_URL": ("model", "base_url"),
    "HERMES_MODEL": ("model", "name"),
    "HERMES_PROVIDER": ("model", "provider"),
    "HERMES_TEMPERATURE": ("model", "temperature"),
    "HERMES_TIMEOUT": ("model", "timeout"),
    "HERMES_AGENT_MODE": ("agent", "mode"),
    "FEISHU_APP_ID": ("feishu", "app_id"),
    "FEISHU_MODE": ("feishu", "mode"),
    "FEISHU_BASE_URL": ("feishu", "base_url"),
    "HERMES_DATABASE_URL": ("database", "url"),  # may carry the password (the file may not)
    "HERMES_TEMPORAL_ADDRESS": ("temporal", "address"),
    "HERMES_TEMPORAL_NAMESPACE": ("temporal", "namespace"),
    "HERMES_TEMPORAL_TASK_QUEUE": ("temporal", "task_queue"),
}
EXAMPLE_TOOLS = "hermes_core.tools.examples"


class ConfigError(ValueError):
    """A configuration problem, worded for the person who wrote the configuration."""


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


@dataclass(config=ConfigDict(extra="forbid"))
class AgentConfig(Limits):
    """The `agent:` section: its `Limits` (kernel/loop.py) and how the agent is built."""

    system_prompt: str | None = None  # null: kernel/prompts.py's DEFAULT_SYSTEM_PROMPT
    # messages answered in one model call, without tools; null: agent.py's DEFAULT_GREETINGS
    greeting_patterns: list[str] | None = None
    language: Language | None = None  # of the fixed replies; null: the language of each message
    workspace: str | None = None  # mounts read_file / write_file / list_directory confined to this folder
    shell_allow: list[str] = field(default_factory=list)  # programs run_command may run (level 2: allow it)
    shell_sandbox: SandboxMode = DEFAULT_SANDBOX  # auto: bubblewrap if it works here
    # write_file refused past it; null: none
    workspace_quota_mb: Annotated[float | None, Field(gt=0)] = DEFAULT_QUOTA_BYTES / MIB
    # one conversation's files (media.folder/<conversation>): uploads and writes there; null: none
    workspace_conversation_quota_mb: Annotated[float | None, Field(gt=0)] = (
        DEFAULT_CONVERSATION_QUOTA_BYTES / MIB
    )
    # more tools: the conversation's groups only (T8; why 16: docs/skills.md)
    route_tools_above: Annotated[int | None, Field(ge=0)] = 16
    mode: ModeName = "loop"  # how serve, run and chat run a task (modes.py)
    # plan mode: revised plans after a failed/invalid one
    max_replans: Annotated[int, Field(ge=0, le=10)] = DEFAULT_MAX_REPLANS

    @property
    def limits(self) -> Limits:
        return Limits(**{declared.name: getattr(self, declared.name) for declared in fields(Limits)})


class GatewayConfig(_Section):
    host: str = "127.0.0.1"
    port: int = Field(8080, ge=0, le=65535)
    data_dir: str = ".hermes"
    # turns at once (older name: max_concurrent_turns); fewer while the event loop lags (acks first)
    max_turns_in_flight: int = Field(
        256, ge=1, validation_alias=AliasChoices("max_turns_in_flight", "max_concurrent_turns")
    )
    min_turns_in_flight: int = Field(4, ge=1)  # the adaptive limit never goes below this
    loop_lag_target: float = Field(0.005, ge=0)  # seconds of event-loop lag that shrink the limit; 0: off
    metrics: bool = True  # GET /metrics (Prometheus); beyond loopback only with a token (observability.md)
    shutdown_grace: float = Field(10.0, ge=0)
    retention_days: float = Field(30.0, gt=0)  # task journals and traces older than this are deleted
    header_timeout: float = Field(10.0, gt=0)  # seconds a client has to send a request's headers
    body_timeout: float = Field(30.0, gt=0)  # seconds, once the headers are in, to send the whole body
    # per sender (gateway/flood.py): messages a minute, and messages waiting in one conversation,
    # beyond which a message is answered with a fixed reply instead of a turn; null: no limit
    user_messages_per_minute: int | None = Field(20, ge=1)
    conversation_queue: int | None = Field(20, ge=1)


class TemporalTLSConfig(_Section):
    """TLS to the Temporal frontend (engine/temporal/client.py `connect`): the server's CA, and for
    mutual TLS the client's certificate and key, each a PEM file path (the key stays in its file,
    readable by the service's user only). Anyone who reaches the frontend unauthenticated can
    signal and update every conversation's workflow (docs/security.md)."""

    server_ca: str | None = None  # PEM file of the CA that signed the frontend's certificate
    client_cert: str | None = None  # PEM file: the client certificate (mutual TLS)
    client_key: str | None = None  # PEM file: its private key
    server_name: str | None = None  # the name the frontend's certificate carries, when not the address's

    @model_validator(mode="after")
    def _pair(self) -> TemporalTLSConfig:
        if (self.client_cert is None) != (self.client_key is None):
            raise ValueError("give both temporal.tls.client_cert and temporal.tls.client_key, or neither")
        return self


class TemporalConfig(_Section):
    """`engine: temporal` (engine/temporal/, docs/scale-out.md): conversations run as durable
    workflows on a Temporal cluster, so `serve` and `worker` may each run on several nodes. The
    model, tool and send steps are activities; a step whose worker stops heartbeating for
    `heartbeat_timeout` seconds is retried on another worker (the rule for interrupted level ≥ 1
    calls is the journal's: tasks/journal.py)."""

    address: str = "127.0.0.1:7233"  # host:port of the Temporal frontend
    namespace: str = "default"
    task_queue: str = "hermes-turns"  # workflows, model and tool steps; sends use `<task_queue>-sends`
    # queues workers also poll after `task_queue` changed: their conversations move to `task_queue`
    previous_task_queues: list[str] = Field(default_factory=list)
    heartbeat_timeout: float = Field(5.0, gt=0, le=60)  # seconds without a heartbeat: the step moves on
    sticky_timeout: float = Field(2.0, gt=0, le=60)  # seconds a workflow waits for its cached worker
    model_timeout: float = Field(300.0, gt=0)  # seconds one model step may take, retries included
    send_attempts: int = Field(8, ge=1, le=100)  # tries of one reply before it is kept as a dead letter
    turns_per_run: int = Field(100, ge=1, le=10_000)  # turns before the workflow continues as new
    # bytes at most carried across continue-as-new (older reply texts are read back from PostgreSQL);
    # Temporal refuses a payload over 2 MB
    carry_bytes: int = Field(512 * 1024, ge=16 * 1024, le=1536 * 1024)
    dedup_ids: int = Field(2000, ge=10, le=100_000)  # message and event ids remembered per conversation
    # not read any more: the window is `memory.window_turns` of the stored conversation (kept so
    # that configurations setting it still load)
    window_turns: int = Field(20, ge=1, le=1000)
    idle_days: float = Field(2.0, gt=0)  # a conversation idle this long continues as new, ids pruned
    tls: TemporalTLSConfig | None = None  # TLS or mutual TLS to the frontend (below)
    # the environment variable holding an API key for the frontend (Temporal Cloud), when it takes one
    api_key_env: str | None = Field(None, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")


class FeishuConfig(_Section):
    """Feishu/Lark bot. Secrets (FEISHU_APP_SECRET, FEISHU_VERIFICATION_TOKEN, FEISHU_ENCRYPT_KEY) come
    from the environment only; the bot is on when an app id and secret are both present.

    Sending is paced (channels/feishu/ratelimit.py, docs/feishu.md): each chat (or user) at
    `chat_send_rate` messages/s, the whole app at `app_send_rate` per second and
    `app_send_per_minute` per minute — Feishu's own limits by default (5/s per chat, 50/s and
    1,000/min per app). `send_rate`, when set, is an extra steady cap on the whole app (messages/s),
    e.g. when another service shares the app's quota.

    `stream` (on by default): each reply appears at once as a card that fills in as the model
    writes; off: one ordinary message once the reply is complete. `card_streaming`: `cardkit` (the
    default: the text is typed out, channels/feishu/cardkit.py; needs the `cardkit:card:write`
    scope, and falls back by itself when the platform refuses it) or `patch` (the card message is
    patched, 4 times a second at most: channels/feishu/stream.py).

    Groups (docs/feishu.md): `group_session` is how many histories a group has — one for the whole
    chat (`chat`), one per topic with messages outside topics sharing the chat's (`topic`, the
    default), or one per member (`user`). `greeting` is what the bot says when added to a group
    (unset: a short default in Chinese and English; empty: nothing)."""

    app_id: str | None = None
    mode: Literal["webhook", "longconn"] = "webhook"
    base_url: str = "https://open.feishu.cn"
    chat_send_rate: float = Field(5.0, gt=0)
    app_send_rate: float = Field(50.0, gt=0)
    app_send_per_minute: float = Field(1000.0, gt=0)
    send_rate: float | None = Field(None, gt=0)
    stream: bool = True
    card_streaming: Literal["cardkit", "patch"] = "cardkit"
    group_session: Literal["chat", "topic", "user"] = "topic"
    greeting: str | None = None


class WebhookConfig(_Section):
    """The generic webhook (channels/webhook.py, docs/security.md). With HERMES_WEBHOOK_SECRET in the
    environment every request must be signed; without it only requests from this machine (no proxy,
    no browser) are answered, and serve refuses a non-loopback address unless `allow_unsigned: true`
    says that anyone who reaches the port may act as any user. A request's `callback_url` must name a
    host of `callback_hosts` ("host" or "host:port"; none by default: no callbacks)."""

    enabled: bool = True
    allow_unsigned: bool = False
    callback_hosts: list[str] = Field(default_factory=list)

    @model_validator(mode="after")
    def _hosts_are_hosts(self) -> WebhookConfig:
        for entry in self.callback_hosts:
            if not _HOST_ENTRY.fullmatch(entry):
                raise ValueError(f"callback_hosts: {entry!r} is not a host or host:port (no scheme or path)")
        return self


_HOST_ENTRY = re.compile(r"(?:[A-Za-z0-9.-]+|\[[0-9A-Fa-f:.]+\])(?::[0-9]{1,5})?")


class DatabaseConfig(_Section):
    """Where the state lives (stores.py, docs/scale-out.md). `url` unset: the embedded SQLite file
    under `gateway.data_dir`, as always. A PostgreSQL URL (`postgresql://user@host:5432/hermes`):
    inbox, outbox, dead letters, sessions, long-term memory, journals, approvals and traces live
    there, shared by every node (the `postgres` extra). Its password comes from the environment
    only: `PGPASSWORD`, or the whole URL in `HERMES_DATABASE_URL`. `lease_seconds`: how long a
    node's claim on a conversation lasts unless renewed (every third of it, while the turn runs);
    a node killed mid-turn has its turn taken up by another node within about 1.4 times that (every
    node sweeps every third of it, postgres/gateway.py)."""

    url: str | None = None
    lease_seconds: float = Field(30.0, ge=1.0, le=3600.0)

    @model_validator(mode="after")
    def _is_postgres(self) -> DatabaseConfig:
        if self.url is not None and not re.match(r"postgres(ql)?://", self.url):  # never echoed: a password
            raise ValueError("url: a PostgreSQL URL is postgresql://user@host:port/database")
        return self


class MemoryConfig(_Section):
    """What each model call gets of a conversation (memory/conversation.py): the last `window_turns` turns
    within `budget_tokens` of history + state, older turns folded into a summary (`fold`), and up to
    `examples` past outcomes from long-term memory (`long_term`)."""

    window_turns: int = Field(24, ge=1, le=1000)
    budget_tokens: int = Field(8000, ge=200)
    fold: bool = True
    long_term: bool = True
    examples: int = Field(3, ge=0, le=20)
    # history (messages, notes of conversations idle since) and long-term outcomes older than this
    # are deleted, hourly in serve and by `hermes-kernel prune` (retention.py); null: kept forever
    retention_days: float | None = Field(365.0, gt=0)


class PermissionsConfig(_Section):
    """Roles by identity, qualified by channel: `feishu:<open_id>`, `webhook:<user_id>`,
    `terminal:<login name>`, `web:console`; everyone else is a member. An entry without a channel is
    an error (kernel/tools/permissions.py): `ou_abc` alone would also match a webhook caller claiming it."""

    admins: list[str] = Field(default_factory=list)  # e.g. ["feishu:ou_abc"]
    roles: dict[str, str] = Field(default_factory=dict)  # e.g. {"feishu:ou_hr": "hr"}
    allow_irreversible: list[str] = Field(default_factory=list)  # level-2 tools the operator allows
    # the highest tool level a non-interactive run (a scheduled job) may call
    batch_max_level: int = Field(Policy.batch_max_level, ge=0, le=2)
    confirm: list[str] = Field(default_factory=list)  # tools whose every call a person approves first
    approval_ttl: float = Field(APPROVAL_TTL, gt=0)  # seconds an approval waits before it expires


class MCPServerConfig(_Section):
    """One MCP server (tools/mcp.py, `pip install "hermes-kernel[mcp]"`): a `command` started as a
    subprocess (stdio) or a `url` (streamable HTTP). `env` lists the environment variables passed on to
    the server and `headers` maps each HTTP header to the variable holding its value: by name only, so
    secrets stay out of the file. `levels` maps tool names to 0, 1 or 2; `tools` offers only those;
    `confirm` makes them wait for approval. A tool is named as the server names it (`pay.out`) or as
    `hermes-kernel tools` shows it (`pay_out`); a `levels` or `confirm` name that is neither stops the
    start. `prefix` goes before every tool name, and `permissions.allow_irreversible` uses that name."""

    name: str = Field(pattern=r"^[a-zA-Z0-9_-]+$")
    command: str | None = None
    args: list[str] = Field(default_factory=list)
    env: list[str] = Field(default_factory=list)
    cwd: str | None = None
    url: str | None = None
    headers: dict[str, str] = Field(default_factory=dict)
    level: Literal[0, 1, 2] = 1
    levels: dict[str, Literal[0, 1, 2]] = Field(default_factory=dict)
    tools: list[str] | None = None
    confirm: list[str] = Field(default_factory=list)  # the server's tools that wait for a person's approval
    prefix: str = ""
    timeout: float | None = Field(None, gt=0)  # per call, progress restarts it (≤4×); None: tool_timeout
    connect_timeout: float = Field(30.0, gt=0, le=600)  # to start it or reach it and list its tools
    transport: Literal["stdio", "http", "sse"] | None = None  # None: stdio with command, http with url
    confirm_destructive: bool = True  # destructive-marked tools wait for approval unless `levels` names them

    @model_validator(mode="after")
    def _one_transport(self) -> MCPServerConfig:
        if (self.command is None) == (self.url is None):
            raise ValueError("give either command (a stdio server) or url (a streamable-HTTP server)")
        if self.transport is not None and (self.transport == "stdio") != (self.command is not None):
            needed = "command" if self.transport == "stdio" else "url"
            raise ValueError(f"transport {self.transport} needs {needed}")
        return self


class APIAuthConfig(_Section):
    """Where an API's credential goes: a `header` (with `prefix`, e.g. "Bearer ") or a `query`
    parameter; its value is read from the environment variable `env`, never from the file."""

    env: str = Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    header: str | None = None
    query: str | None = None
    prefix: str = ""

    @model_validator(mode="after")
    def _one_place(self) -> APIAuthConfig:
        if (self.header is None) == (self.query is None):
            raise ValueError("give either header (e.g. Authorization) or query (e.g. api_key)")
        return self


class APIOperationConfig(_Section):
    """One hand-written operation: `parameters` maps each name to its JSON Schema (plus `required`);
    a name written `{name}` in `path` is a path parameter, the others go in the query; `body` is the
    JSON Schema of a JSON request body."""

    name: str = Field(pattern=r"^[a-zA-Z0-9_-]{1,64}$")
    method: Literal["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE"]
    path: str = Field(pattern=r"^/")
    description: str = Field(min_length=1)
    parameters: dict[str, dict[str, Any]] = Field(default_factory=dict)
    body: dict[str, Any] | None = None


class APIConfig(_Section):
    """A team's HTTP API whose operations become tools (tools/http_api.py, docs/tools.md): an OpenAPI
    3 document (`openapi`, relative to the configuration file's folder) or hand-written `operations`.
    `levels` overrides the level a method gives (GET 0, POST/PUT/PATCH 1, DELETE 2); `tools` offers
    only the operations it names; `prefix` goes before every tool name."""

    name: str = Field(pattern=r"^[a-zA-Z0-9_-]+$")
    base_url: str
    description: str = ""
    openapi: str | None = None
    operations: list[APIOperationConfig] = Field(default_factory=list)
    auth: APIAuthConfig | None = None
    levels: dict[str, Literal[0, 1, 2]] = Field(default_factory=dict)
    tools: list[str] | None = None
    prefix: str = ""
    timeout: float = Field(30.0, gt=0, le=600)
    max_chars: int | None = Field(None, ge=100)  # None: the agent's max_result_chars

    @model_validator(mode="after")
    def _one_source(self) -> APIConfig:
        if (self.openapi is None) == (not self.operations):
            raise ValueError(f"api {self.name}: give either openapi (a document's path) or operations")
        if not re.match(r"^https?://[^/?#\s]+", self.base_url):
            raise ValueError(f"api {self.name}: base_url must be an http:// or https:// URL with a host")
        return self


class ConsoleConfig(_Section):
    """The web console under /console/ (console/, docs/console.md). On by default when serving on a
    loopback address; on any other address only with a token in the environment variable `token_env`
    (with `enabled: true` and no token, serve refuses to start)."""

    enabled: bool | None = None  # None: on for loopback, or when a token is set
    token_env: str = Field("HERMES_CONSOLE_TOKEN", pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")


class SkillsConfig(_Section):
    """Skill folders (skills.py, docs/skills.md): each holds one folder per skill with a SKILL.md. Each
    environment's configuration names its own folder (deploy/skills/<environment>); relative paths are
    relative to where hermes-kernel is started. A skill needing a tool the agent lacks is a warning and
    the skill is unavailable, or, with `strict`, an error."""

    dirs: list[str] = Field(default_factory=list)
    strict: bool = False


class ObserveConfig(_Section):
    """Logs, traces and X-rays (observe/, docs/observability.md). `log_format` is standard error's
    (`console`: one readable line per event; `json`: the JSON lines of docs/log-schema.json); with
    `log_dir`, JSON lines also go to `<log_dir>/hermes-kernel.log`, rotated at midnight, `retention_days`
    old files kept. `traces` (on by default, for serve, run and chat) stores each task's record in the
    gateway's database; failed tasks are written to `xray_dir` (default `<data_dir>/xray`; "" turns
    them off). `otel`: OpenTelemetry spans (`pip install "hermes-kernel[otel]"`)."""

    level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] | None = None  # None: INFO for serve, else quiet
    log_format: Literal["console", "json"] = "console"
    log_dir: str | None = None
    retention_days: int = Field(7, ge=1, le=3650)
    traces: bool = True
    xray_dir: str | None = None
    otel: bool = False


class ScheduledJobConfig(_Section):
    """One job declared by the operator (docs/scheduling.md): its prompt runs as a task in
    `conversation` on `channel` (a Feishu chat: `chat_id`; a webhook: its `callback_url`), as `sender`
    (the identity its role is checked for), at `cron` (repeating) or `at` (once, ISO date and time)."""

    id: str = Field(pattern=r"^[A-Za-z0-9_.-]{1,64}$")
    prompt: str = Field(min_length=1)
    cron: str | None = None
    at: str | None = None
    timezone: str | None = None  # default: schedule.timezone
    channel: Literal["feishu", "webhook", "web"] = "feishu"
    chat_id: str | None = None  # Feishu: the chat it posts into
    callback_url: str | None = None  # webhook: where the reply is POSTed
    conversation: str | None = None  # default: feishu:<chat_id>, webhook:<sender>, web:console
    sender: str = "scheduler"  # user id on `channel`; name it in permissions.admins for admin tools

    @model_validator(mode="after")
    def _one_time(self) -> ScheduledJobConfig:
        if (self.cron is None) == (self.at is None):
            raise ValueError(f"job {self.id}: give either cron or at")
        if self.channel == "feishu" and not self.chat_id:
            raise ValueError(f"job {self.id}: a feishu job needs chat_id (the chat it posts into)")
        if self.channel == "webhook" and not self.callback_url:
            raise ValueError(f"job {self.id}: a webhook job needs callback_url (where its reply goes)")
        return self


class ScheduleConfig(_Section):
    """Scheduled and proactive tasks (schedule/, gateway/schedules.py, docs/scheduling.md): times
    without an offset and cron fields are read in `timezone` (`local`: the machine's own zone, from
    TZ or /etc/localtime); a fire missed while the service was down runs once at start-up if at most
    `misfire_grace` seconds late, else it is recorded skipped. Jobs asked for in chat: each person
    holds at most `max_jobs_per_user` active ones, each conversation `max_jobs_per_chat`; a one-time
    job is at least `min_delay_minutes` ahead (and any job at most ten years)."""

    enabled: bool = True
    timezone: str = "local"
    misfire_grace: float = Field(300.0, ge=0)
    tick: float = Field(1.0, gt=0, le=60)  # seconds between looks when nothing is due sooner
    max_jobs_per_user: int = Field(20, ge=1)
    max_jobs_per_chat: int = Field(50, ge=1)
    min_delay_minutes: float = Field(1.0, ge=0)
    jobs: list[ScheduledJobConfig] = Field(default_factory=list)

    @model_validator(mode="after")
    def _zones_exist(self) -> ScheduleConfig:
        import time

        from .schedule.jobs import MACHINE_ZONE, ScheduleError, check_cron, machine_zone, parse_at, zone

        try:
            if self.timezone == MACHINE_ZONE:  # an IANA name from here on: jobs store their zone by name
                self.timezone = machine_zone()
            zone(self.timezone)
            for job in self.jobs:
                zone(job.timezone or self.timezone)
                if job.cron is not None:
                    check_cron(job.cron)
                if job.at is not None:
                    parse_at(job.at, job.timezone or self.timezone, time.time(), past_ok=True)
        except ScheduleError as exc:
            raise ValueError(str(exc)) from None
        ids = [job.id for job in self.jobs]
        if len(set(ids)) != len(ids):
            raise ValueError("schedule.jobs: two jobs have the same id")
        return self


class WebSearchConfig(_Section):
    """`web.search` (tools/web_search.py): off until a provider is named. `searxng` needs `base_url`
    (the instance, e.g. http://searxng:8080); `brave` and `tavily` read their key from the environment
    variable `api_key_env` (default BRAVE_SEARCH_API_KEY, TAVILY_API_KEY); `base_url` overrides
    their API's address (tests, proxies)."""

    provider: Literal["off", "searxng", "brave", "tavily"] = "off"
    base_url: str | None = Field(None, pattern=r"^https?://")
    api_key_env: str | None = Field(None, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    max_results: int = Field(5, ge=1, le=20)

    @model_validator(mode="after")
    def _searxng_has_base(self) -> WebSearchConfig:
        if self.provider == "searxng" and not self.base_url:
            raise ValueError(
                "provider searxng needs base_url, the instance's address (e.g. http://searxng:8080)"
            )
        return self


class WebConfig(_Section):
    """The web tools (tools/web.py, docs/tools.md, `pip install "hermes-kernel[web]"`). `fetch`: `off`
    (the default: no web_fetch or read_feed), `public` (any public address, plus `allow_hosts`) or
    `allow_list` (only `allow_hosts`); private, loopback and metadata addresses are refused unless
    `allow_hosts` names them (host names, addresses or networks such as 10.0.0.0/8)."""

    fetch: Literal["off", "allow_list", "public"] = "off"
    allow_hosts: list[str] = Field(default_factory=list)
    max_chars: int = Field(12_000, ge=500, le=200_000)  # page text the model reads
    max_bytes: int = Field(5_000_000, ge=10_000, le=100_000_000)  # bytes downloaded (decoded)
    timeout: float = Field(20.0, gt=0, le=300)  # seconds for one fetch, redirects included
    search: WebSearchConfig = WebSearchConfig()

    @model_validator(mode="after")
    def _allow_list_names_hosts(self) -> WebConfig:
        if self.fetch == "allow_list" and not self.allow_hosts:
            raise ValueError("fetch is allow_list, but allow_hosts names no host: list them, or use public")
        return self


class Settings(_Section):
    model: ModelSettings = Field(default_factory=ModelSettings)  # models/settings.py: every model option
    agent: AgentConfig = Field(default_factory=AgentConfig)
    gateway: GatewayConfig = GatewayConfig()
    feishu: FeishuConfig = FeishuConfig()
    webhook: WebhookConfig = WebhookConfig()
    media: MediaLimits = Field(default_factory=MediaLimits)  # channels/media.py: pictures and files
    permissions: PermissionsConfig = PermissionsConfig()
    memory: MemoryConfig = MemoryConfig()
    database: DatabaseConfig = DatabaseConfig()
    console: ConsoleConfig = ConsoleConfig()
    skills: SkillsConfig = SkillsConfig()
    observe: ObserveConfig = ObserveConfig()
    # embedded: one process, SQLite (gateway/); temporal: durable workflows on a Temporal cluster
    engine: Literal["embedded", "temporal"] = "embedded"
    temporal: TemporalConfig = TemporalConfig()
    team: TeamSettings = Field(default_factory=TeamSettings)
    schedule: ScheduleConfig = Field(default_factory=ScheduleConfig)  # its zone: the machine's when loaded
    tools: list[str] = Field(default_factory=lambda: [EXAMPLE_TOOLS])
    mcp: list[MCPServerConfig] = Field(default_factory=list)
    web: WebConfig = WebConfig()
    apis: list[APIConfig] = Field(default_factory=list)  # HTTP APIs as tools (tools/http_api.py)
    _source: str | None = PrivateAttr(None)  # the configuration file, kept out of the workspace

    @property
    def source(self) -> str | None:
        return self._source

    @model_validator(mode="after")
    def _team_has_experts(self) -> Settings:
        if self.agent.mode == "team" and not self.team.experts:
            raise ValueError("agent.mode is team, but team.experts declares no expert")
        return self


def load_settings(
    path: str | Path | None = None,
    *,
    env: Mapping[str, str] | None = None,
    dotenv: str | Path | None = ".env",
) -> Settings:
    """Read the YAML file (if any), apply HERMES_* environment variables, validate."""
    if dotenv is not None and env is None:
        load_dotenv(dotenv)
    environ = os.environ if env is None else env
    data: dict[str, JSON] = _read_yaml(Path(path)) if path else {}
    _refuse_secrets(data)
    for variable, (section, key) in ENV_KEYS.items():
        if environ.get(variable):
            data.setdefault(section, {})[key] = environ[variable]
    try:
        settings = Settings.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(_describe(exc, path)) from None
    settings._source = str(path) if path else None
    return settings


def build_agent(settings: Settings, *, model_required: bool = True, **overrides: Any) -> Agent:
    """An `Agent` from settings, its model from `model_endpoint` (a half configuration is a
    ConfigError, unless `model_required` is False: commands that never ask the model) unless
    `model=` passes a client."""
    import dataclasses

    from .agent import Agent
    from .tools.clarify import clarify

    m, a = settings.model, settings.agent
    given = overrides.get("model")
    endpoint = None
    if given is None or isinstance(given, str):
        try:
            endpoint = model_endpoint(settings)
        except ConfigError:
            if model_required:
                raise
    # where the model is, from the endpoint (the preset, the environment); all None without one
    found: dict[str, Any] = {key: getattr(endpoint, key, None) for key in ENDPOINT_KEYS}
    options: dict[str, Any] = dict(
        model=found["model"], settings=dataclasses.replace(m, **found), limits=a.limits, language=a.language,
        tools=with_confirmation(
            with_api_tools(
                [*load_tools(settings.tools), *workspace_tools(settings), *web_tools(settings), clarify],
                settings,
            ),
            settings.permissions.confirm,
        ),
        permissions=policy(settings.permissions),
    )  # fmt: skip
    options["route_tools_above"] = a.route_tools_above
    # the prompt and the greetings the file sets; unset (or an empty prompt): the agent's own (agent.py)
    own = {"system_prompt": a.system_prompt or None, "greeting_patterns": a.greeting_patterns}
    options.update({key: value for key, value in own.items() if value is not None})
    options["mcp"] = mcp_toolset(settings.mcp)  # connected on the agent's first run
    options.update({key: value for key, value in overrides.items() if value is not None})
    if "skills" not in options:
        options["skills"] = skill_set(settings.skills, options["tools"])
    agent = Agent(**options)
    if m.routes and given is None:
        agent.model = routed_model(agent, m.routes)
    agent.mode = task_mode(settings, agent, options)
    return agent


def routed_model(agent: Agent, routes: list[ModelRoute]) -> ModelClient:
    """The agent's model client with `model.routes` (models/routing.py): one client per route, on
    the main model's endpoint and settings."""
    import dataclasses

    from .models.openai_compat import OpenAICompatClient
    from .models.routing import Route, RoutedModel

    main = agent._build_client()
    if not isinstance(main, OpenAICompatClient):
        raise ConfigError("model.routes: needs a model endpoint (the offline demo model has no other models)")
    clients = []
    for route in routes:
        own = dataclasses.replace(main.settings, model=route.model, fallback_models=(), routes=[])
        clients.append((Route(route.when, route.model, route.max_chars), type(main)(own)))
    return RoutedModel(main, clients, agent.is_greeting)


def task_mode(settings: Settings, agent: Agent, options: dict[str, Any]) -> TaskMode:
    """The `TaskMode` of `agent.mode` (modes.py); for a team, its experts as agents of their own."""
    from .agent import Agent
    from .modes import TaskMode

    a, team = settings.agent, settings.team
    if a.mode != "team":
        return TaskMode(a.mode, max_replans=a.max_replans)
    experts = []
    for index, declared in enumerate(team.experts):
        where = f"team.experts.{index}"
        missing = [name for name in declared.tools if agent.registry.get(name) is None]
        if missing:
            known = ", ".join(t.name for t in agent.registry)
            raise ConfigError(f"{where}.tools: no tool named {', '.join(missing)} (tools: {known})")
        own = {key: value for key, value in options.items() if key not in ("skills", "mcp", "model")}
        own.update(
            system_prompt=declared.system_prompt, tools=[agent.registry.get(n) for n in declared.tools]
        )
        own["model"] = declared.model or options.get("model")
        if not isinstance(own["model"], str) and own["model"] is not None:  # a client object: shared
            own["model"] = options["model"]
        experts.append(declared.expert(Agent(**own)))
    return TaskMode("team", max_replans=a.max_replans, experts=experts, team_limits=team)


def require_database(settings: Settings) -> str:
    """The PostgreSQL URL `engine: temporal` keeps its state in (engine/temporal/state.py: sessions,
    long-term memory, traces, approvals, dead letters, shared by every node); a ConfigError naming
    `database.url` when there is none."""
    url = settings.database.url
    if not url:
        raise ConfigError(
            "engine: temporal keeps conversations, traces, approvals and dead letters in PostgreSQL: "
            "set database.url (HERMES_DATABASE_URL, e.g. postgresql://hermes@db:5432/hermes; "
            "docs/scale-out.md)"
        )
    return url


def model_endpoint(settings: Settings, environ: Mapping[str, str] | None = None) -> Endpoint | None:
    """The `Endpoint` the model section names (models/providers.py), None for the offline demo
    model; a ConfigError in one sentence for a half configuration."""
    from .models.providers import EndpointError, resolve_endpoint

    m = settings.model
    try:
        return resolve_endpoint(m.name, m.base_url, m.provider, environ)
    except EndpointError as exc:
        raise ConfigError(str(exc)) from None


IDENTITY_CHANNELS = ("feishu", "webhook", "web", "terminal")  # the channels whose users can be listed


def policy(config: PermissionsConfig) -> Policy:
    """The `Policy` of `permissions:`; an identity without a known channel is a ConfigError naming it."""
    for key, entries in (("admins", config.admins), ("roles", list(config.roles))):
        known = ", ".join(IDENTITY_CHANNELS)
        for entry in entries:
            channel = entry.partition(":")[0]
            if unqualified([entry]):
                raise ConfigError(
                    f"permissions.{key}: {entry!r} does not say which channel the id is on; write "
                    f"<channel>:<id>, e.g. 'feishu:{entry}' for a Feishu open_id or 'webhook:{entry}' "
                    f"for a webhook user_id (channels: {known})"
                )
            if channel not in IDENTITY_CHANNELS:
                raise ConfigError(f"permissions.{key}: {entry!r}: no channel is named {channel!r} ({known})")
    return Policy.from_lists(config.admins, config.roles, config.allow_irreversible, config.batch_max_level)


def skill_set(config: SkillsConfig, tools: list[Any]) -> SkillSet | None:
    """The skills of `skills.dirs`, checked against these tools (skills.py); None without a folder."""
    if not config.dirs:
        return None
    from .kernel.tools import ToolRegistry
    from .skills import SkillError, SkillSet

    try:
        return SkillSet.load(config.dirs, ToolRegistry(tools).names, strict=config.strict)
    except SkillError as exc:
        raise ConfigError(f"skills: {exc}") from None


def with_confirmation(tools: list[Any], names: list[str]) -> list[Any]:
    """The tools, those named in `permissions.confirm` as copies that wait for a person's approval."""
    import dataclasses

    unknown = set(names) - {t.name for t in tools}
    if unknown:
        raise ConfigError(f"permissions.confirm: no tool named {', '.join(sorted(unknown))}")
    return [dataclasses.replace(t, confirm=True) if t.name in names else t for t in tools]


def mcp_toolset(servers: list[MCPServerConfig]) -> MCPToolset | None:
    """The MCP servers as a `tools.mcp.MCPToolset` (connected on first use), or None without any."""
    if not servers:
        return None
    try:
        from .tools.mcp import MCPToolset
    except ImportError as exc:
        raise ConfigError(f"mcp: {exc}") from None
    return MCPToolset.from_config(servers)


def with_api_tools(tools: list[Any], settings: Settings) -> list[Any]:
    """`tools` and those of the `apis:` entries (tools/http_api.py); a bad declaration, or a name two
    tools would have, is a ConfigError."""
    if not settings.apis:
        return tools
    from .tools.http_api import APIDeclarationError, api_tools

    folder = Path(settings.source).parent if settings.source else Path(".")
    declared: list[Any] = []
    try:
        for api in settings.apis:
            declared += api_tools(api, folder)
    except APIDeclarationError as exc:
        raise ConfigError(str(exc)) from None
    names = [t.name for t in tools + declared]
    twice = sorted({name for name in names if names.count(name) > 1})
    if twice:
        raise ConfigError(f"apis: more than one tool is named {', '.join(twice)}; give the API a prefix")
    return tools + declared


def workspace_tools(settings: Settings) -> list[Any]:
    """The file tools (and the allow-listed shell) when a workspace folder is configured.

    The folder may not hold, or lie inside, what the service trusts: the configuration file, the
    `.env` file and the data folder (the database, logs, X-rays). A clear ConfigError otherwise.
    """
    a = settings.agent
    if a.workspace is None:
        if a.shell_allow:
            raise ConfigError("agent.shell_allow: needs agent.workspace (the folder commands run in)")
        return []
    from .tools.files import WorkspaceError, file_tools
    from .tools.sandbox import SandboxUnavailable
    from .tools.shell import run_command_tool

    try:
        space = workspace_of(settings)
        tools: list[Any] = file_tools(space)
        if a.shell_allow:
            tools.append(
                run_command_tool(space.root, a.shell_allow, sandbox=a.shell_sandbox, private=space.private)
            )
    except (WorkspaceError, SandboxUnavailable) as exc:
        raise ConfigError(f"agent.workspace: {exc}") from None
    except ValueError as exc:  # a program run_command may not run
        raise ConfigError(str(exc)) from None
    return tools


def web_tools(settings: Settings) -> list[Any]:
    """web_fetch and read_feed (unless `web.fetch` is off) and web_search (with a provider)."""
    w = settings.web
    tools: list[Any] = []
    if w.fetch != "off":
        from .tools.safe_fetch import AddressGuard, FetchLimits
        from .tools.web import WebOptions
        from .tools.web import web_tools as page_tools

        guard = AddressGuard(mode=w.fetch, allow_hosts=tuple(w.allow_hosts))
        limits = FetchLimits(max_bytes=w.max_bytes, timeout=w.timeout)
        tools += page_tools(WebOptions(guard, limits, max_chars=w.max_chars))
    if w.search.provider != "off":
        from .tools.web_search import web_search_tool

        tools.append(web_search_tool(search_provider(w.search)))
    return tools


def search_provider(config: WebSearchConfig) -> Any:
    """The `SearchProvider` of `web.search` (tools/web_search.py); its defaults per provider."""
    from .tools.web_search import DEFAULT_BASE_URLS, DEFAULT_KEY_ENV, SearchProvider

    name = config.provider
    base = config.base_url or DEFAULT_BASE_URLS[name]
    key_env = config.api_key_env or DEFAULT_KEY_ENV.get(name)
    return SearchProvider(name, base, key_env, config.max_results)


def workspace_of(settings: Settings) -> Any:
    """The `Workspace` of `agent.workspace` (tools/files.py), None without one; the file tools and
    the files users send (gateway/media.py) share its rules. Raises WorkspaceError or ConfigError."""
    a = settings.agent
    if a.workspace is None:
        return None
    from .tools.files import Workspace

    root = Path(a.workspace)
    if not root.is_dir():
        raise ConfigError(f"agent.workspace: {a.workspace!r} is not an existing folder")
    quota, per_conversation = (
        None if mb is None else int(mb * MIB)
        for mb in (a.workspace_quota_mb, a.workspace_conversation_quota_mb)
    )
    return Workspace(
        root, quota_bytes=quota, conversation_quota_bytes=per_conversation, private=settings.media.folder,
        protect=trusted_paths(settings),
    )  # fmt: skip


def trusted_paths(settings: Settings) -> list[Path]:
    """Files and folders the model must not reach: configuration, `.env`, data, logs, X-rays, skills."""
    paths = [Path(".env"), Path(settings.gateway.data_dir), *(Path(d) for d in settings.skills.dirs)]
    paths += [Path(p) for p in (settings.source, settings.observe.log_dir, settings.observe.xray_dir) if p]
    return paths


def load_tools(modules: list[str]) -> list[Any]:
    """Every `Tool` defined at the top level of each named module (or listed in its `TOOLS`)."""
    from .kernel.tools import Tool

    found: list[Any] = []
    for name in modules:
        try:
            module = importlib.import_module(name)
        except ImportError as exc:
            raise ConfigError(f"tools: cannot import module {name!r}: {exc}") from exc
        declared = getattr(module, "TOOLS", None)
        items = list(declared) if declared is not None else list(vars(module).values())
        found.extend(item for item in items if isinstance(item, Tool) or declared is not None)
    return found


def load_dotenv(path: str | Path) -> None:
    """Minimal `.env` reader: KEY=VALUE lines; never overrides a variable already set."""
    file = Path(path)
    if not file.is_file():
        return
    for line in file.read_text(encoding="utf-8").splitlines():
        line = line.strip()
        if not line or line.startswith("#") or "=" not in line:
            continue
        key, _, value = line.removeprefix("export ").partition("=")
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        os.environ.setdefault(key.strip(), value)


def _read_yaml(path: Path) -> dict[str, JSON]:
    import yaml

    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"cannot read configuration file {path}: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path} is not valid YAML: {exc}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of sections (model, agent, tools)")
    return data


def _refuse_secrets(data: JSON, where: str = "") -> None:
    from .postgres.database import url_passwords  # the standard library only, as this module

    if isinstance(data, dict):
        for key, value in data.items():
            here = f"{where}.{key}" if where else str(key)
            refused = CREDENTIAL_HEADERS if where == "model.extra_headers" else SECRET_KEYS
            secret = str(key).lower() in refused
            if str(key).upper() == "PGPASSWORD":
                raise ConfigError(
                    f"{here}: the database password is read only from the environment variable "
                    "PGPASSWORD, never from the configuration file; remove it from the file"
                )
            if secret and value not in (None, ""):
                raise ConfigError(
                    f"{here}: secrets are read only from the environment (e.g. HERMES_API_KEY or a .env "
                    "file), never from the configuration file; remove it from the file"
                )
            if here == "database.url" and isinstance(value, str) and url_passwords(value):
                raise ConfigError(
                    "database.url: the password is read only from the environment (PGPASSWORD, or the "
                    "whole URL in HERMES_DATABASE_URL), never from the configuration file; remove it"
                )
            _refuse_secrets(value, here)


def _describe(exc: ValidationError, path: str | Path | None) -> str:
    source = f" in {path}" if path else ""
    lines = []
    for error in exc.errors(include_url=False):
        key = ".".join(str(part) for part in error["loc"])
        if error["type"] in ("extra_forbidden", "unexpected_keyword_argument"):  # a model, a dataclass
            lines.append(f"{key}: unknown key")
        elif error["type"] == "value_error":  # a validator's own sentence, which names its keys
            message = error["msg"].removeprefix("Value error, ")
            subkey = re.match(r"[a-z_]+: ", message) is not None
            lines.append(f"{key}{'.' if subkey else ': '}{message}" if key else message)
        else:
            lines.append(f"{key}: {error['msg'].lower()} (got {error.get('input')!r})")
    return f"invalid configuration{source}: " + "; ".join(lines)
