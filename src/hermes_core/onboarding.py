"""`hermes-kernel init`: four questions, then a commented `hermes.yaml`, a `.env.example` and a doctor run.

    hermes-kernel init --provider deepseek --channel feishu-longconn --timezone Asia/Shanghai --yes

asks (or takes as flags) the model provider (a preset of models/providers.py), the channels
(`CHANNELS`), the time zone of scheduled jobs and the data folder. The YAML file holds only what
was chosen, each line commented; the secrets the choice needs are named in `.env.example` (names,
never values: config.py refuses secrets in the file). Existing files are kept unless `--force`.
The YAML text is validated with `Settings` before anything is written, so what is written loads.
`doctor` runs last: its findings are shown, and secrets not yet filled in (the API key, the Feishu
app) are expected, not a failure of init. Shorter than nanobot's `onboard` and hermes-agent's
setup wizard on purpose: everything else keeps its default (docs/configuration.md lists them).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from .models.providers import PROVIDERS, Provider, find_provider

if TYPE_CHECKING:
    from .doctor import Check

CHANNELS = {
    "terminal": "chat in this terminal (hermes-kernel chat)",
    "webhook": "HTTP POST /webhook, answered from this machine unless signed",
    "feishu-webhook": "Feishu bot, events by HTTP callback to a public HTTPS URL",
    "feishu-longconn": "Feishu bot, events over an outgoing long connection (no public URL)",
}
DEFAULT_PROVIDER = "deepseek"
DEFAULT_CHANNELS = ("terminal", "webhook")
DEFAULT_DATA_DIR = ".hermes"
CONFIG_NAME, ENV_EXAMPLE_NAME = "hermes.yaml", ".env.example"
FEISHU_APP = (("FEISHU_APP_ID", "the app id (cli_…), from Credentials & Basic Info"),
              ("FEISHU_APP_SECRET", "the app secret, from the same page"))  # fmt: skip
MODEL_CHECKS = ("model endpoint", "model tools")  # a model server not started yet is not init's failure


class InitError(ValueError):
    """An answer init cannot use, or a file it will not overwrite, in one sentence."""


@dataclass(frozen=True)
class Answers:
    provider: str
    model: str | None  # None: the preset's default model
    channels: tuple[str, ...]
    timezone: str
    data_dir: str


def add_init_command(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    init = commands.add_parser("init", help="write a commented hermes.yaml and .env.example, then run doctor")
    names = ", ".join(p.name for p in PROVIDERS)
    init.add_argument("--provider", dest="init_provider", metavar="NAME", help=f"model provider: {names}")
    init.add_argument("--model", dest="init_model", help="model name (default: the provider's)")
    init.add_argument(
        "--channel", action="append", metavar="NAME",
        help=f"a channel, repeatable or comma-separated: {', '.join(CHANNELS)} (default: terminal,webhook)",
    )  # fmt: skip
    init.add_argument("--timezone", help="time zone of scheduled jobs (default: this machine's)")
    init.add_argument(
        "--data-dir", help=f"where the database, traces and X-rays go (default {DEFAULT_DATA_DIR})"
    )
    init.add_argument("--dir", default=".", help="the folder to write the files into (default: here)")
    init.add_argument("--yes", "-y", action="store_true", help="ask nothing: flags, else the defaults")
    init.add_argument(
        "--force", action="store_true", help="overwrite hermes.yaml (or --config) and .env.example"
    )


def run_init(args: argparse.Namespace) -> int:
    """Ask, write, check; 2 for an unusable answer or a file in the way."""
    folder = Path(args.dir)
    try:
        answers = gather(args, ask=None if args.yes else ask_stdin)
        written = write_setup(answers, folder, force=args.force, name=args.config or CONFIG_NAME)
    except InitError as exc:
        print(f"hermes-kernel init: {exc}", file=sys.stderr)
        return 2
    for path in written:
        print(f"wrote {path}")
    return report_doctor(answers, folder, args.config or CONFIG_NAME)


def gather(args: argparse.Namespace, ask: Callable[[str, str], str] | None) -> Answers:
    """The answers from the flags; what a flag leaves open is asked (`ask`), or its default."""

    def answer(question: str, given: str | None, default: str) -> str:
        if given is not None or ask is None:
            return given if given is not None else default
        return ask(question, default) or default

    provider = answer("Model provider (" + ", ".join(p.name for p in PROVIDERS) + ")",
                      getattr(args, "init_provider", None) or args.provider, DEFAULT_PROVIDER)  # fmt: skip
    preset = _preset(provider)
    model = answer("Model name", getattr(args, "init_model", None) or args.model, preset.model or "") or None
    if model is None:
        raise InitError(f"provider {preset.name} serves whatever model it loaded: give its name with --model")
    wanted = ",".join(args.channel) if args.channel else None
    listed = "".join(f"  {name}: {what}\n" for name, what in CHANNELS.items())
    channels = answer(f"{listed}Channels, comma-separated", wanted, ",".join(DEFAULT_CHANNELS))
    timezone = answer("Time zone of scheduled jobs", args.timezone, local_zone())
    data_dir = answer("Data folder", args.data_dir, DEFAULT_DATA_DIR)
    return Answers(
        preset.name, None if model == preset.model else model, _channels(channels), timezone, data_dir
    )


def ask_stdin(question: str, default: str) -> str:
    """One question on standard output, its answer from standard input (empty: the default)."""
    try:
        return input(f"{question} [{default}]: ").strip()
    except EOFError:
        raise InitError("no answer on standard input (give the flags and --yes to ask nothing)") from None


def _preset(name: str) -> Provider:
    from .models.providers import EndpointError

    try:
        return find_provider(name)
    except EndpointError as exc:
        raise InitError(str(exc).removeprefix("model.provider: ")) from None


def _channels(text: str) -> tuple[str, ...]:
    chosen = tuple(dict.fromkeys(part.strip() for part in text.split(",") if part.strip()))
    unknown = [name for name in chosen if name not in CHANNELS]
    if unknown or not chosen:
        raise InitError(
            f"no channel is named {', '.join(unknown) or '(none)'}; choose from {', '.join(CHANNELS)}"
        )
    if {"feishu-webhook", "feishu-longconn"} <= set(chosen):
        raise InitError("the Feishu bot receives events one way: feishu-webhook or feishu-longconn, not both")
    return chosen


def local_zone() -> str:
    """This machine's IANA time zone (TZ, /etc/localtime, /etc/timezone), else UTC."""
    from zoneinfo import available_timezones

    known = available_timezones()
    candidates = [os.environ.get("TZ", "").lstrip(":")]
    localtime = os.path.realpath("/etc/localtime")
    candidates.append(localtime.partition("zoneinfo/")[2])
    try:
        candidates.append(Path("/etc/timezone").read_text(encoding="utf-8").strip())
    except OSError:
        pass
    return next((name for name in candidates if name in known), "UTC")


# --- what is written --------------------------------------------------------------------------------


def render_config(answers: Answers) -> str:
    """The commented `hermes.yaml` of these answers."""
    preset = find_provider(answers.provider)
    key = f"key from {preset.key_env} (.env)" if preset.key_env else "no key needed"
    lines = [
        "# hermes-kernel configuration, written by `hermes-kernel init`. Every key, its default and its",
        "# environment variable: docs/configuration.md. Secrets never go here: see .env.example.",
        "model:",
        f"  provider: {_scalar(preset.name)}  # {preset.title}: {preset.base_url}, {key}",
    ]
    if answers.model:
        lines.append(f"  name: {_scalar(answers.model)}  # the model to use (the preset's: {preset.model})")
    lines += ["gateway:", f"  data_dir: {_scalar(answers.data_dir)}  # the database, traces and X-rays"]
    webhook = "webhook" in answers.channels
    lines += [
        "webhook:",
        f"  enabled: {str(webhook).lower()}  # POST /webhook; unsigned requests only from this machine "
        "(HERMES_WEBHOOK_SECRET signs them)",
    ]
    feishu = next((name for name in answers.channels if name.startswith("feishu-")), None)
    if feishu:
        mode = feishu.removeprefix("feishu-")
        how = (
            "events over an outgoing WebSocket"
            if mode == "longconn"
            else "events at https://<host>/feishu/events"
        )
        lines += ["feishu:  # on when FEISHU_APP_ID and FEISHU_APP_SECRET are set (docs/feishu.md)",
                  f"  mode: {mode}  # {how}"]  # fmt: skip
    lines += [
        "schedule:",
        f"  timezone: {_scalar(answers.timezone)}  # cron fields and times without an offset",
    ]
    return "\n".join(lines) + "\n"


def env_keys(answers: Answers) -> list[tuple[str, str]]:
    """The environment variables this set-up needs, each with what it holds."""
    preset = find_provider(answers.provider)
    keys = [(preset.key_env, f"API key of {preset.title} ({preset.doc})")] if preset.key_env else []
    feishu = next((name for name in answers.channels if name.startswith("feishu-")), None)
    if feishu:
        keys += FEISHU_APP
    if feishu == "feishu-webhook":
        keys.append(("FEISHU_VERIFICATION_TOKEN", "Verification Token, from the event subscription page"))
    return keys


def render_env_example(answers: Answers) -> str:
    lines = ["# Copy to .env and fill in; .env stays out of version control. Names only here, never values."]
    for name, what in env_keys(answers):
        lines += [f"# {what}", f"{name}="]
    if "webhook" in answers.channels:
        lines += ["# optional: requests to /webhook must then be signed (needed beyond this machine)",
                  "# HERMES_WEBHOOK_SECRET="]  # fmt: skip
    if "feishu-webhook" in answers.channels:
        lines += [
            '# optional: the Encrypt Key, if the app sets one (pip install ".[feishu]")',
            "# FEISHU_ENCRYPT_KEY=",
        ]
    return "\n".join(lines) + "\n"


def write_setup(
    answers: Answers, folder: Path, *, force: bool = False, name: str = CONFIG_NAME
) -> list[Path]:
    """Write the configuration (`name`) and `.env.example` into `folder` (created); InitError for a
    bad answer or a file in the way."""
    config = render_config(answers)
    check_config(config)
    targets = {folder / name: config, folder / ENV_EXAMPLE_NAME: render_env_example(answers)}
    present = [str(path) for path in targets if path.exists()]
    if present and not force:
        verb = "exist" if len(present) > 1 else "exists"
        raise InitError(f"{' and '.join(present)} already {verb}; keep them, or run again with --force")
    folder.mkdir(parents=True, exist_ok=True)
    for path, text in targets.items():
        path.write_text(text, encoding="utf-8")
    return list(targets)


def check_config(text: str) -> None:
    """The configuration text loads as `Settings` (a bad time zone, say, is an InitError)."""
    import yaml
    from pydantic import ValidationError

    from .config import Settings, _describe

    try:
        Settings.model_validate(yaml.safe_load(text))
    except ValidationError as exc:
        raise InitError(_describe(exc, None).removeprefix("invalid configuration: ")) from None


def _scalar(value: str) -> str:
    """`value` as a YAML scalar: bare when YAML reads it back as that string, else quoted."""
    import yaml

    try:
        bare = yaml.safe_load(value) == value and "#" not in value
    except yaml.YAMLError:
        bare = False
    return value if bare else json.dumps(value, ensure_ascii=False)


# --- the check at the end ---------------------------------------------------------------------------


def report_doctor(answers: Answers, folder: Path, name: str = CONFIG_NAME) -> int:
    """Run doctor in `folder` (where serve will run); 1 only for a problem filling in .env will not fix."""
    import asyncio

    from .doctor import diagnose
    from .kernel.redaction import Redactor

    missing = [name for name, _ in env_keys(answers) if not os.environ.get(name)]
    here = Path.cwd()
    os.chdir(folder)
    try:
        print("\nhermes-kernel doctor:")
        checks = asyncio.run(diagnose(name))
    finally:
        os.chdir(here)
    redactor = Redactor.from_environment()
    for check in checks:
        print("  " + redactor.redact(check.line()))
    serious = [c for c in checks if c.status == "FAIL" and not expected(c, missing)]
    if missing:
        print(f"\nNext: cp .env.example .env, fill in {', '.join(missing)}, then run `hermes-kernel doctor`.")
    print(next_steps(answers))
    return 1 if serious else 0


def expected(check: Check, missing: list[str]) -> bool:
    """A failure that filling in `.env` (or starting the model's server) resolves."""
    return check.name in MODEL_CHECKS or any(name in check.detail + check.fix for name in missing)


def next_steps(answers: Answers) -> str:
    steps = ["hermes-kernel chat"] if "terminal" in answers.channels else []
    if set(answers.channels) - {"terminal"}:
        steps.append("hermes-kernel serve")
    return "Then: " + " or ".join(f"`{step}`" for step in steps) + "."
