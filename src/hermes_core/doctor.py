"""`hermes-kernel doctor`: is this installation ready to serve? One line per check, in plain words.

    OK    configuration: deploy/config/prod.yaml and the environment; model qwen2.5, 2 tools
    FAIL  model endpoint: cannot get an answer from http://127.0.0.1:8000/v1 (…) — check HERMES_BASE_URL …
    SKIP  model tools: the model endpoint did not answer
    SKIP  feishu credentials: not configured — set FEISHU_APP_ID and FEISHU_APP_SECRET to enable it
    OK    database: /var/lib/hermes-kernel/gateway.db is writable (41.2 GiB free)

The checks, in order (each returns a `Check`, none raises):

- configuration: the YAML file and the environment load, the tools import, the log level is valid;
- model endpoint: one tiny chat completion (max_tokens 1, no retry, at most 10 s) through the client
  `serve` uses, so the endpoint answers, accepts the API key (401/403: a FAIL naming the key's
  variable) and knows the model (404 or "model not found": a FAIL naming the model and, when the
  endpoint lists its models at GET /models, the closest names);
- model tools: one request offering one tool (the calculator): does the model answer with native
  tool calls, refuse `tools`, write the call as text (textcalls/ parsers), or not call it? And so
  which `model.tool_mode` to use;
- feishu credentials: a tenant token and the bot's profile are fetched with the app's credentials,
  and a `serve` running on `gateway.host`/`gateway.port` is asked (/healthz) whether its Feishu
  channel is degraded (started while the platform was unreachable and still retrying);
- feishu events: webhook callbacks can be verified (a verification token or an Encrypt Key is set);
- webhook: /webhook is not open to anyone: signed (HERMES_WEBHOOK_SECRET), or on a loopback
  `gateway.host`, or unsigned by the configuration's explicit `webhook.allow_unsigned: true`;
- database: the data folder can be created and written, and SQLite can start a write transaction;
  with `database.url` set, PostgreSQL instead: reachable (the password from the URL or PGPASSWORD,
  never shown), version 14 or later, not a read-only standby, and its schema no newer than this
  release (older: the migrations run at the next start, said so; with `engine: temporal`, of the
  components its nodes apply: no journal); `engine: temporal` without
  `database.url` is a FAIL (the engine keeps its state in PostgreSQL: serve and worker refuse);
- temporal (only with `engine: temporal`): the frontend at `temporal.address` answers within 5 s
  (with the nodes' `temporal.tls` and API key),
  `temporal.namespace` exists there, and the server's version (GetSystemInfo); without the
  `temporal` extra a FAIL naming it;
- shell sandbox (only when `agent.shell_allow` names programs): run_command's programs run inside
  bubblewrap, or else a FAIL says they have no filesystem or /proc isolation;
- web fetch (only when `web.fetch` is not off): the `web` extra's libraries are installed;
- web search (only with a `web.search.provider`): the key's variable is set and one query answers.

A failed configuration skips the rest. The exit code is 1 when any check failed. Secrets never
appear: no check puts one in its text, and every line passes through a `Redactor` that knows them.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import logging
import os
import shutil
import sqlite3
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from .config import ConfigError, Settings, build_agent, load_settings, model_endpoint
from .kernel.redaction import Redactor
from .models.probe import PROBE_TIMEOUT
from .models.providers import Endpoint, names

TEMPORAL_TIMEOUT = 5.0  # seconds for the Temporal frontend to accept a connection and answer


@dataclass(frozen=True)
class Check:
    """The outcome of one check: what was found and, when something is wrong, what to do."""

    status: Literal["OK", "FAIL", "SKIP"]
    name: str
    detail: str
    fix: str = ""

    def line(self) -> str:
        text = f"{self.status:<4}  {self.name}: {self.detail}"
        return f"{text} — {self.fix}" if self.fix else text


def run_doctor(args: argparse.Namespace) -> int:
    """Run every check, print one line each and a summary; 1 if any check failed."""
    checks = asyncio.run(
        diagnose(
            args.config, model=args.model, base_url=args.base_url, log_level=args.log_level,
            provider=getattr(args, "provider", None),
        )
    )  # fmt: skip
    redactor = Redactor.from_environment()  # built after load_settings has read `.env`
    for check in checks:
        print(redactor.redact(check.line()))
    failed = [check.name for check in checks if check.status == "FAIL"]
    if failed:
        print(f"{len(failed)} check(s) failed: {', '.join(failed)}.")
        return 1
    print("Everything checked is ready.")
    return 0


async def diagnose(
    config: str | None,
    *,
    model: str | None = None,
    base_url: str | None = None,
    log_level: str | None = None,
    provider: str | None = None,
) -> list[Check]:
    """Every check, in order; the others are skipped when the configuration does not load."""
    settings, configuration = check_configuration(
        config, model=model, base_url=base_url, log_level=log_level, provider=provider
    )
    if settings is None:
        names = (
            "model endpoint",
            "model tools",
            "feishu credentials",
            "feishu events",
            "webhook",
            "database",
        )
        return [configuration, *(Check("SKIP", name, "the configuration did not load") for name in names)]
    endpoint = await check_model(settings)
    checks = [
        configuration,
        endpoint,
        await check_model_tools(settings) if endpoint.status == "OK" else _tools_skipped(endpoint),
        await check_feishu_credentials(settings),
        check_feishu_events(settings),
        check_webhook(settings),
        await check_postgres(settings)
        if settings.database.url
        else check_database(settings)
        if settings.engine != "temporal"
        else _temporal_without_database(),
    ]
    if settings.engine == "temporal":
        checks.append(await check_temporal(settings))
    if settings.agent.shell_allow and settings.agent.workspace:
        checks.append(check_shell_sandbox(settings))
    if settings.web.fetch != "off":
        checks.append(check_web_fetch(settings))
    if settings.web.search.provider != "off":
        checks.append(await check_web_search(settings))
    return checks


def check_configuration(
    config: str | None,
    *,
    model: str | None,
    base_url: str | None,
    log_level: str | None,
    provider: str | None = None,
) -> tuple[Settings | None, Check]:
    """Load the settings the way `serve` does; the command-line overrides apply."""
    from .cli import configure_logging, offered_tools

    source = f"{config} and the environment" if config else "defaults and the environment (no --config)"
    try:
        settings = load_settings(config)  # reads `.env` first
        configure_logging(log_level or os.environ.get("HERMES_LOG_LEVEL"), "doctor")
        settings.model.provider = provider or settings.model.provider
        settings.model.name = model or settings.model.name
        settings.model.base_url = base_url or settings.model.base_url
        agent = build_agent(settings)
        endpoint = model_endpoint(settings)
    except (ConfigError, ValueError, TypeError) as exc:
        where = config or "the environment (HERMES_* variables, .env)"
        return None, Check("FAIL", "configuration", str(exc), f"correct it in {where} and run doctor again")
    if not logging.getLogger().handlers:  # no log level asked for: library warnings would repeat the lines
        logging.getLogger("hermes_core").addHandler(logging.NullHandler())
    tools = len(offered_tools(agent, settings).names)  # as serve offers them
    model_text = f"model {endpoint.model}" if endpoint else "offline demo model"
    if endpoint and endpoint.provider:
        model_text += f" (provider {endpoint.provider})"
    return settings, Check("OK", "configuration", f"{source}; {model_text}, {tools} tools")


async def check_model(settings: Settings) -> Check:
    """One chat completion of at most one token, without retries or fallback models (models/probe.py)."""
    from .models.probe import probe_model

    name, endpoint = "model endpoint", model_endpoint(settings)  # the configuration check resolved it
    if endpoint is None:
        fix = (
            f"set HERMES_PROVIDER ({', '.join(names())}) and its API key, or HERMES_BASE_URL and "
            "HERMES_MODEL, to use a real model"
        )
        return Check("SKIP", name, "no model configured: the offline demo model answers", fix)
    found = await probe_model(endpoint, timeout=min(settings.model.timeout, PROBE_TIMEOUT))
    return Check("OK" if found.verdict == "ok" else "FAIL", name, found.detail, found.fix)


async def check_model_tools(settings: Settings) -> Check:
    """Offer one tool and see how the model calls it; say which `model.tool_mode` fits."""
    from .kernel.model import ModelError, ModelRequestRejected
    from .models.families import family_of_model, family_title
    from .textcalls import parse_text_calls
    from .textcalls.wrapper import TextToolCalls, _refuses_tools
    from .tools.examples import calculator_tool

    name, endpoint, mode = "model tools", model_endpoint(settings), settings.model.tool_mode
    pinned = settings.model.tool_format
    assert endpoint is not None  # only run after the endpoint answered
    inner = _probe_client(settings, endpoint, max_tokens=256)
    client = TextToolCalls(inner, mode="text", family=pinned) if mode == "text" else inner
    messages = [
        {"role": "system", "content": "You are a helpful assistant. Use the tools you are given."},
        {"role": "user", "content": "What is 6 times 7? Use the calculator tool to compute it."},
    ]
    try:
        response = await client.complete(messages, [calculator_tool.schema()])
    except ModelRequestRejected as exc:
        if not _refuses_tools(exc):
            return Check("FAIL", name, f"the tool request was refused (HTTP {exc.status}: {exc})")
        detail = (f"tool mode text: the endpoint refuses the `tools` parameter (HTTP {exc.status}: {exc}); "
                  "decided from the server's own words (docs/providers.md)")  # fmt: skip
        status: Literal["OK", "FAIL"] = "FAIL" if mode == "native" else "OK"
        return Check(status, name, detail, "use model.tool_mode: text (tools described in the prompt)")
    except ModelError as exc:
        return Check("FAIL", name, f"no answer to the tool request ({exc})", "run doctor again")
    finally:
        await client.aclose()
    if mode == "text":
        family = client.families.get(inner.name) if isinstance(client, TextToolCalls) else None
        if response.tool_calls:
            written = f"as text, {family_title(family)}," if family else "natively"
            return Check("OK", name, f"text mode: the call came back {written} and was read; "
                         "model.tool_mode: text is right")  # fmt: skip
        return Check("FAIL", name, "text mode: the model answered without calling the tool",
                     "try model.tool_mode: native, or a model that follows tool instructions")  # fmt: skip
    if response.tool_calls:
        expected = family_of_model(endpoint.model)
        hint = f"; left in the text, its calls would be {family_title(expected)}" if expected else ""
        return Check("OK", name, f"native tool calls ({response.tool_calls[0].name}); model.tool_mode: "
                     f"{mode} works (native or auto){hint}")  # fmt: skip
    parsed = parse_text_calls(response.content or "")
    if parsed.calls:
        family = parsed.calls[0].format
        detail = f"the model writes tool calls as text, {family_title(family)}, not native tool_calls"
        if pinned and family not in (pinned, "hermes"):
            return Check("FAIL", name, f"{detail}; model.tool_format says {pinned}, so they would be shown "
                         "as text", f"set model.tool_format: {family}")  # fmt: skip
        fix = f"set model.tool_mode: text and model.tool_format: {family}" + (
            "" if mode == "auto" else " (native still reads them, but text fits)"
        )
        auto = "; auto switches to text on the first one and reads only this family from then on"
        return Check("OK", name, detail + (auto if mode == "auto" else ""), fix)
    return Check("FAIL", name, "the model answered without calling the offered tool",
                 "set model.tool_mode: text and run doctor again, or use a tool-calling model")  # fmt: skip


def _tools_skipped(endpoint: Check) -> Check:
    reason = "no model configured" if endpoint.status == "SKIP" else "the model endpoint did not answer"
    return Check("SKIP", "model tools", reason)


def _probe_client(settings: Settings, endpoint: Endpoint, *, max_tokens: int) -> Any:
    """The client serve would use for this endpoint, without retries or fallbacks, at most 10 s."""
    from .models.probe import probe_client

    return probe_client(endpoint, timeout=min(settings.model.timeout, PROBE_TIMEOUT), max_tokens=max_tokens)


async def check_feishu_credentials(settings: Settings) -> Check:
    """Fetch a tenant token and the bot's profile (`FeishuAPI.bot_info`), without retries."""
    name, app_id, secret = "feishu credentials", settings.feishu.app_id, os.environ.get("FEISHU_APP_SECRET")
    if not app_id and not secret:
        return Check("SKIP", name, "not configured", "set FEISHU_APP_ID and FEISHU_APP_SECRET to enable it")
    if not app_id or not secret:
        missing = "FEISHU_APP_SECRET" if app_id else "FEISHU_APP_ID (or feishu.app_id)"
        return Check("FAIL", name, f"{missing} is not set, so the bot stays off", "set both, or neither")
    from .channels.feishu.api import FeishuAPI, FeishuError

    api = FeishuAPI(app_id, secret, base_url=settings.feishu.base_url, timeout=PROBE_TIMEOUT, max_retries=0)
    served = await served_degradation(settings, "feishu")
    try:
        bot = await api.bot_info()
    except FeishuError as exc:
        return Check("FAIL", name, str(exc) + served, _feishu_fix(exc, settings.feishu.base_url))
    finally:
        await api.aclose()
    who = f"bot {bot.get('app_name') or '(no name)'} ({bot.get('open_id') or 'no open_id'})"
    if served:  # reachable from here now, but the running gateway has not recovered (yet)
        detail, fix = f"app {app_id} works from here{served}", "it retries by itself; else restart it"
        return Check("FAIL", name, detail, fix)
    return Check("OK", name, f"app {app_id} got a tenant token from {settings.feishu.base_url}; {who}")


async def served_degradation(settings: Settings, prefix: str) -> str:
    """`; the running gateway is degraded: …` from the local `serve`'s /healthz, or '' when it is
    not running, not degraded there, or does not answer within 2 s."""
    import aiohttp

    host = settings.gateway.host
    host = "127.0.0.1" if host in ("0.0.0.0", "", "::") else host
    url = f"http://{'[' + host + ']' if ':' in host else host}:{settings.gateway.port}/healthz"
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2)) as session:
            async with session.get(url) as response:
                health = await response.json(content_type=None)
    except (aiohttp.ClientError, asyncio.TimeoutError, ValueError):
        return ""
    parts = [p for p in health.get("degraded") or [] if str(p.get("component", "")).startswith(prefix)]
    described = [
        f"{p.get('component')}: {p.get('detail')} ({p.get('attempts', 0)} attempts, "
        f"{p.get('held_events', 0)} event(s) held)"
        for p in parts
    ]
    return f"; the running gateway at {url} is degraded: {'; '.join(described)}" if described else ""


def check_feishu_events(settings: Settings) -> Check:
    """Can events reach the bot? In webhook mode every callback is refused without a way to verify it."""
    name = "feishu events"
    if not (settings.feishu.app_id and os.environ.get("FEISHU_APP_SECRET")):
        return Check("SKIP", name, "the Feishu bot is not configured")
    if settings.feishu.mode == "longconn":
        return Check("OK", name, "long connection: events arrive over an outgoing WebSocket, no public URL")
    token, key = os.environ.get("FEISHU_VERIFICATION_TOKEN"), os.environ.get("FEISHU_ENCRYPT_KEY")
    if not token and not key:
        detail = "neither FEISHU_VERIFICATION_TOKEN nor FEISHU_ENCRYPT_KEY is set: every callback is refused"
        fix = "copy the Verification Token (and Encrypt Key, if any) from the app's event subscription page"
        return Check("FAIL", name, detail, fix)
    if key and importlib.util.find_spec("cryptography") is None:
        detail = "FEISHU_ENCRYPT_KEY is set but the cryptography package is missing"
        return Check("FAIL", name, detail, 'pip install "hermes-kernel[feishu]"')
    verified = "signature and verification token" if key and token else "signature" if key else "token"
    detail = f"webhook mode, callbacks verified by {verified}; request URL: https://<your host>/feishu/events"
    return Check("OK", name, detail)


def check_webhook(settings: Settings) -> Check:
    """Would `serve` start with this webhook, and who could call it? (`--host` overrides gateway.host.)"""
    from .channels.webhook import SECRET_ENV, exposure_problem

    name, host, config = "webhook", settings.gateway.host, settings.webhook
    if not config.enabled:
        return Check("SKIP", name, "off (webhook.enabled: false)")
    hosts = config.callback_hosts
    callbacks = f"callbacks to {', '.join(hosts)}" if hosts else "no callbacks"
    if os.environ.get(SECRET_ENV):
        return Check("OK", name, f"every request must be signed with {SECRET_ENV}; {callbacks}")
    if exposure_problem(host, None, False) is None:
        detail = f"unsigned, answered only from this machine (gateway.host {host}); {callbacks}"
        return Check("OK", name, detail)
    if config.allow_unsigned:
        detail = f"unsigned on {host} (webhook.allow_unsigned: true): whoever reaches it may act as any user"
        return Check("OK", name, detail, f"set {SECRET_ENV} and sign the requests")
    detail = f"gateway.host is {host} and {SECRET_ENV} is not set: serve refuses to start"
    fix = f"set {SECRET_ENV} (or serve on 127.0.0.1, or set webhook.allow_unsigned: true)"
    return Check("FAIL", name, detail, fix)


def check_database(settings: Settings) -> Check:
    """The data folder can be written, and SQLite can start a write transaction on gateway.db."""
    folder = Path(settings.gateway.data_dir).absolute()
    database = folder / "gateway.db"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder):
            pass
        _start_write(database)
    except (OSError, sqlite3.Error) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        fix = (
            f"create {folder} and give the user running hermes-kernel write access to it, "
            "or point gateway.data_dir somewhere writable"
        )
        return Check("FAIL", "database", f"{database} is not writable ({reason})", fix)
    free = shutil.disk_usage(folder).free / 2**30
    return Check("OK", "database", f"{database} is writable ({free:.1f} GiB free)")


async def check_postgres(settings: Settings) -> Check:
    """The PostgreSQL of `database.url`: reachable, recent enough, writable, schema not newer than ours."""
    from .postgres.database import MIN_SERVER_VERSION, redacted_url, server_check
    from .postgres.migrations import expected_versions

    url = settings.database.url or ""
    shown_url = redacted_url(url)
    try:
        version, standby, found = await server_check(url, timeout=PROBE_TIMEOUT)
    except ImportError as exc:
        return Check("FAIL", "database", str(exc), "pip install 'hermes-kernel[postgres]'")
    except ConnectionError as exc:
        fix = ("start the server, or correct database.url (HERMES_DATABASE_URL); the password comes "
               "from PGPASSWORD or HERMES_DATABASE_URL")  # fmt: skip
        return Check("FAIL", "database", str(exc), fix)
    if int(version.split(".")[0]) < MIN_SERVER_VERSION:
        return Check("FAIL", "database", f"PostgreSQL {version} at {shown_url} is too old",
                     f"use PostgreSQL {MIN_SERVER_VERSION} or later")  # fmt: skip
    if standby:
        return Check("FAIL", "database", f"PostgreSQL at {shown_url} is a read-only standby",
                     "point database.url at the primary")  # fmt: skip
    expected = expected_versions()
    if settings.engine == "temporal":  # its nodes apply only the components of their stores
        from .engine.temporal.state import schema_components

        applied = await schema_components(settings)
        expected = {name: level for name, level in expected.items() if name in applied}
    newer = {name: level for name, level in found.items() if level > expected.get(name, level)}
    if newer:
        levels = ", ".join(f"{name} {level} > {expected[name]}" for name, level in sorted(newer.items()))
        return Check("FAIL", "database", f"the schema at {shown_url} is newer than this release ({levels})",
                     "upgrade hermes-kernel on this node to the release the others run")  # fmt: skip
    behind = {name: found.get(name, 0) for name, level in expected.items() if found.get(name, 0) < level}
    levels = ", ".join(f"{name} {level}" for name, level in sorted(expected.items()))
    state = f"schema at the latest migration ({levels})"
    if behind:
        pending = ", ".join(f"{name} {found.get(name, 0)} → {expected[name]}" for name in sorted(behind))
        state = f"migrations to apply at the next start: {pending}"
    return Check("OK", "database", f"PostgreSQL {version} at {shown_url}: reachable; {state}")


def _temporal_without_database() -> Check:
    said = "engine: temporal keeps its state in PostgreSQL, and database.url is not set"
    return Check("FAIL", "database", said, "set database.url (HERMES_DATABASE_URL; docs/scale-out.md)")


async def check_temporal(settings: Settings) -> Check:
    """`engine: temporal`: the frontend answers, the namespace exists, and which server it is.

    The client runs on a runtime of its own, dropped before this returns: the SDK's default
    runtime keeps native threads that may still call into Python while the interpreter exits,
    which aborts it (SIGABRT, or SIGSEGV) after the lines are printed (temporalio/sdk-python
    issue 300); `serve` and `worker` skip the teardown instead (engine/temporal/client.py `leave`)."""
    try:
        from temporalio.runtime import Runtime, TelemetryConfig
    except ImportError as exc:
        detail = f"engine: temporal, but the Temporal SDK is not installed ({exc})"
        return Check("FAIL", "temporal", detail, 'pip install "hermes-kernel[temporal]"')
    import gc

    runtime = Runtime(telemetry=TelemetryConfig())
    try:
        return await _temporal_check(settings, runtime)
    finally:
        del runtime
        gc.collect()  # the client's cycles: the runtime is dropped here, its threads stopped


async def _temporal_check(settings: Settings, runtime: Any) -> Check:
    name, address, namespace = "temporal", settings.temporal.address, settings.temporal.namespace
    from datetime import timedelta

    from temporalio.api.enums.v1 import NamespaceState
    from temporalio.api.workflowservice.v1 import DescribeNamespaceRequest, GetSystemInfoRequest
    from temporalio.client import Client
    from temporalio.service import RPCError, RPCStatusCode

    from .engine.temporal.client import Unreachable, credentials

    try:  # the nodes' own TLS, client certificate and API key (temporal.tls, temporal.api_key_env)
        tls, api_key = credentials(settings.temporal)
    except (OSError, Unreachable) as exc:
        said = (
            f"cannot read temporal.tls's {exc.filename}: {exc.strerror}"
            if isinstance(exc, OSError)
            else str(exc)
        )
        return Check(
            "FAIL", name, said, "correct temporal.tls, or set the variable temporal.api_key_env names"
        )
    timeout = timedelta(seconds=TEMPORAL_TIMEOUT)
    fix = "start the Temporal server, or correct temporal.address (HERMES_TEMPORAL_ADDRESS)"
    try:
        client = await asyncio.wait_for(
            Client.connect(
                address,
                namespace=namespace,
                connect_timeout=timeout,
                runtime=runtime,
                tls=tls,
                api_key=api_key,
            ),
            TEMPORAL_TIMEOUT,
        )
        info = await client.workflow_service.get_system_info(GetSystemInfoRequest(), timeout=timeout)
        asked = DescribeNamespaceRequest(namespace=namespace)
        described = await client.workflow_service.describe_namespace(asked, timeout=timeout)
    except asyncio.TimeoutError:
        return Check("FAIL", name, f"no answer from {address} within {TEMPORAL_TIMEOUT:.0f} s", fix)
    except RPCError as exc:
        if exc.status == RPCStatusCode.NOT_FOUND:
            detail = f"{address} answers, but has no namespace {namespace!r} ({exc.message})"
            create = f"temporal operator namespace create --namespace {namespace} --address {address}"
            return Check("FAIL", name, detail, f"create it ({create}) or correct temporal.namespace")
        return Check("FAIL", name, f"{address} refused the request ({exc.status.name}: {exc.message})", fix)
    except RuntimeError as exc:  # the SDK's "Failed client connect: …"
        reason = " ".join(str(exc).split())[:300]
        return Check("FAIL", name, f"cannot reach {address} ({reason})", fix)
    version = info.server_version or "of an unknown version"
    state = described.namespace_info.state
    if state != NamespaceState.NAMESPACE_STATE_REGISTERED:  # deprecated or deleted: no new workflows
        detail = f"the namespace {namespace!r} at {address} is not registered (state {state})"
        return Check("FAIL", name, detail, "use a registered namespace (temporal.namespace)")
    return Check(
        "OK", name, f"Temporal {version} at {address}: reachable; namespace {namespace!r} registered"
    )


def check_shell_sandbox(settings: Settings) -> Check:
    """Does run_command confine its programs (bubblewrap, tools/sandbox.py), or only check arguments?"""
    from .tools.sandbox import bwrap_status

    name, mode = "shell sandbox", settings.agent.shell_sandbox
    if mode == "none":
        detail = "agent.shell_sandbox is none: run_command has NO filesystem or /proc isolation"
        return Check("OK", name, detail, "set it to auto with bubblewrap installed to confine the programs")
    found, problem = bwrap_status(str(Path(settings.agent.workspace or ".").resolve()))
    if found is None:
        detail = f"{problem}: run_command has NO filesystem or /proc isolation"
        fix = "install bubblewrap (package bubblewrap), or set agent.shell_sandbox: none to accept this"
        return Check("FAIL", name, detail, fix)
    return Check(
        "OK", name, f"bubblewrap ({found}): own pid and network namespaces, only the workspace writable"
    )


WEB_LIBRARIES = ("readability", "markdownify", "bs4", "feedparser", "pypdf")


def check_web_fetch(settings: Settings) -> Check:
    """Are the libraries web_fetch and read_feed read pages and feeds with installed?"""
    missing = [name for name in WEB_LIBRARIES if importlib.util.find_spec(name) is None]
    if missing:
        fix = 'pip install "hermes-kernel[web]"'
        return Check(
            "FAIL", "web fetch", f"web.fetch is {settings.web.fetch} but {', '.join(missing)} is missing", fix
        )
    hosts = ", ".join(settings.web.allow_hosts) or "none"
    return Check("OK", "web fetch", f"web.fetch {settings.web.fetch}; internal hosts allowed: {hosts}")


async def check_web_search(settings: Settings) -> Check:
    """One query through the configured provider, as web_search makes it."""
    from .config import search_provider
    from .tools.web_search import SearchError, search

    provider = search_provider(settings.web.search)
    name = f"web search ({provider.name})"
    try:
        results = await asyncio.wait_for(search(provider, "hermes-kernel doctor", 1), PROBE_TIMEOUT)
    except SearchError as exc:
        return Check("FAIL", name, str(exc), "check web.search in the configuration and the key's variable")
    except asyncio.TimeoutError:
        return Check("FAIL", name, f"{provider.base_url} did not answer within {PROBE_TIMEOUT:g} s")
    return Check("OK", name, f"{provider.base_url} answered a query ({len(results)} result(s))")


def _start_write(database: Path) -> None:
    """Open the database as the gateway does, then begin and roll back a write: nothing changes."""
    db = sqlite3.connect(database, timeout=5, isolation_level=None)
    try:
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("BEGIN IMMEDIATE")
        db.execute("CREATE TABLE doctor_probe (x)")
        db.execute("ROLLBACK")
    finally:
        db.close()


def _feishu_fix(exc: Exception, base_url: str) -> str:
    if not getattr(exc, "permanent", False):
        return (
            f"check FEISHU_BASE_URL ({base_url}) and that this machine can reach it; serve keeps running "
            "meanwhile, retries in the background and lists it under `degraded` in GET /healthz"
        )
    if "credentials" in str(exc):
        return "set FEISHU_APP_ID and FEISHU_APP_SECRET to the values on the app's Credentials page"
    return "enable the bot capability of the app in the developer console, then publish a version"
