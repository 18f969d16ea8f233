"""`hermes-core doctor`: is this installation ready to serve? One line per check, in plain words.

    OK    configuration: deploy/config/prod.yaml and the environment; model qwen2.5, 2 tools
    FAIL  model endpoint: cannot get an answer from http://127.0.0.1:8000/v1 (…) — check HERMES_BASE_URL …
    SKIP  feishu credentials: not configured — set FEISHU_APP_ID and FEISHU_APP_SECRET to enable it
    OK    database: /var/lib/hermes-core/gateway.db is writable (41.2 GiB free)

The checks, in order (each returns a `Check`, none raises):

- configuration: the YAML file and the environment load, the tools import, the log level is valid;
- model endpoint: one tiny chat completion (max_tokens 1, no retry, at most 10 s) through the client
  `serve` uses, so the endpoint answers, accepts the API key and knows the model;
- feishu credentials: a tenant token and the bot's profile are fetched with the app's credentials,
  and a `serve` running on `gateway.host`/`gateway.port` is asked (/healthz) whether its Feishu
  channel is degraded (started while the platform was unreachable and still retrying);
- feishu events: webhook callbacks can be verified (a verification token or an Encrypt Key is set);
- webhook: /webhook is not open to anyone: signed (HERMES_WEBHOOK_SECRET), or on a loopback
  `gateway.host`, or unsigned by the configuration's explicit `webhook.allow_unsigned: true`;
- database: the data folder can be created and written, and SQLite can start a write transaction;
- shell sandbox (only when `agent.shell_allow` names programs): run_command's programs run inside
  bubblewrap, or else a FAIL says they have no filesystem or /proc isolation.

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
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit, urlunsplit

from .config import ConfigError, Settings, build_agent, load_settings
from .redaction import Redactor

PROBE_TIMEOUT = 10.0  # seconds: a doctor should answer quickly even when a host does not
MODEL_UNAVAILABLE_PREFIX = "every model failed after retries: "


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
        diagnose(args.config, model=args.model, base_url=args.base_url, log_level=args.log_level)
    )
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
) -> list[Check]:
    """Every check, in order; the others are skipped when the configuration does not load."""
    settings, configuration = check_configuration(config, model=model, base_url=base_url, log_level=log_level)
    if settings is None:
        names = ("model endpoint", "feishu credentials", "feishu events", "webhook", "database")
        return [configuration, *(Check("SKIP", name, "the configuration did not load") for name in names)]
    checks = [
        configuration,
        await check_model(settings),
        await check_feishu_credentials(settings),
        check_feishu_events(settings),
        check_webhook(settings),
        check_database(settings),
    ]
    if settings.agent.shell_allow and settings.agent.workspace:
        checks.append(check_shell_sandbox(settings))
    return checks


def check_configuration(
    config: str | None, *, model: str | None, base_url: str | None, log_level: str | None
) -> tuple[Settings | None, Check]:
    """Load the settings the way `serve` does; the command-line overrides apply."""
    from .cli import configure_logging

    source = f"{config} and the environment" if config else "defaults and the environment (no --config)"
    try:
        settings = load_settings(config)  # reads `.env` first
        configure_logging(log_level or os.environ.get("HERMES_LOG_LEVEL"), "doctor")
        settings.model.name = model or settings.model.name
        settings.model.base_url = base_url or settings.model.base_url
        agent = build_agent(settings)
    except (ConfigError, ValueError, TypeError) as exc:
        where = config or "the environment (HERMES_* variables, .env)"
        return None, Check("FAIL", "configuration", str(exc), f"correct it in {where} and run doctor again")
    if not logging.getLogger().handlers:  # no log level asked for: library warnings would repeat the lines
        logging.getLogger("hermes_core").addHandler(logging.NullHandler())
    tools = len(agent.registry.names)
    model_text = f"model {settings.model.name}" if settings.model.base_url else "offline demo model"
    return settings, Check("OK", "configuration", f"{source}; {model_text}, {tools} tools")


async def check_model(settings: Settings) -> Check:
    """One chat completion of at most one token, without retries or fallback models."""
    from .models.base import ModelRequestRejected, ModelUnavailable
    from .models.openai_compat import OpenAICompatClient
    from .models.settings import ModelSettings

    name, url, model = "model endpoint", settings.model.base_url, settings.model.name
    if not url:
        fix = "set HERMES_BASE_URL and HERMES_MODEL (or model.base_url and model.name) to use a real model"
        return Check("SKIP", name, "no endpoint configured: the offline demo model answers", fix)
    shown = _without_credentials(url)
    if not model:
        return Check("FAIL", name, f"{shown} is set but no model name", "set HERMES_MODEL or model.name")
    probe = ModelSettings(
        model=model, base_url=url, api_key=os.environ.get("HERMES_API_KEY") or None, max_tokens=1,
        timeout=min(settings.model.timeout, PROBE_TIMEOUT), max_retries=0,
    )  # fmt: skip
    client = OpenAICompatClient(probe)
    started = time.monotonic()
    try:
        await client.complete([{"role": "user", "content": "ping"}])
    except ModelRequestRejected as exc:
        detail = f"{shown} refused the request for {model} (HTTP {exc.status}: {exc})"
        return Check("FAIL", name, detail, _rejection_fix(exc.status))
    except ModelUnavailable as exc:
        reason = str(exc).removeprefix(MODEL_UNAVAILABLE_PREFIX).removeprefix(f"{model}: ")
        fix = "check HERMES_BASE_URL (or model.base_url) and that the server runs and is reachable from here"
        return Check("FAIL", name, f"cannot get an answer from {shown} ({reason})", fix)
    finally:
        await client.aclose()
    elapsed = (time.monotonic() - started) * 1000
    return Check("OK", name, f"{model} at {shown} answered in {elapsed:.0f} ms")


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
        return Check("FAIL", name, detail, 'pip install "hermes-core[feishu]"')
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
            f"create {folder} and give the user running hermes-core write access to it, "
            "or point gateway.data_dir somewhere writable"
        )
        return Check("FAIL", "database", f"{database} is not writable ({reason})", fix)
    free = shutil.disk_usage(folder).free / 2**30
    return Check("OK", "database", f"{database} is writable ({free:.1f} GiB free)")


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


def _rejection_fix(status: int) -> str:
    if status in (401, 403):
        return "set HERMES_API_KEY to a key this endpoint accepts"
    if status == 404:
        return "check HERMES_MODEL (the endpoint does not know it), and the /v1 part of HERMES_BASE_URL"
    return "check model.name, model.base_url and the endpoint's documentation"


def _feishu_fix(exc: Exception, base_url: str) -> str:
    if not getattr(exc, "permanent", False):
        return (
            f"check FEISHU_BASE_URL ({base_url}) and that this machine can reach it; serve keeps running "
            "meanwhile, retries in the background and lists it under `degraded` in GET /healthz"
        )
    if "credentials" in str(exc):
        return "set FEISHU_APP_ID and FEISHU_APP_SECRET to the values on the app's Credentials page"
    return "enable the bot capability of the app in the developer console, then publish a version"


def _without_credentials(url: str) -> str:
    """`url` without any `user:password@` part."""
    parts = urlsplit(url)
    if parts.username is None and parts.password is None:
        return url
    host = parts.hostname or ""
    netloc = f"{host}:{parts.port}" if parts.port else host
    return urlunsplit(parts._replace(netloc=netloc))
