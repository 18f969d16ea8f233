"""Every command the documentation shows is run here, so that none of them is wrong.

The commands are taken from README.md, README.zh-CN.md, every docs/*.md and every
examples/*/README.md (a new page is picked up by itself): each line of a fenced shell block (after a
`$ ` prompt if the block has prompts; lines ending in `\\` joined) and each inline code span whose
first word is one of `PROGRAMS` (also as `<path>/bin/<program>`), or a `&&` chain holding one. Each
distinct command is then exercised:

- `hermes-kernel …` runs as written, through bash, in a fresh folder holding what a clone has
  (`examples/`, `deploy/`, `benchmarks/`) and a gateway database with recorded tasks, on the
  built-in offline model (what a fresh clone answers with); the documentation's placeholders are
  replaced by real values (`PLACEHOLDERS`), its example endpoint `http://127.0.0.1:8000/v1` by the
  fake OpenAI-compatible server, and `hermes.yaml` is the README's configuration example (with a
  `mypkg.tools` module for the package it names). `serve` runs until it says it is serving, then stops on
  SIGTERM (`--port 0`: never a port another test holds).
- `curl …` runs against a `hermes-kernel serve` started for it, its address put in.
- `pip install <local path>[extras]` is checked by `pip install --dry-run --no-deps` and the extras
  must exist in pyproject.toml; the README's test set-up line is what `.ci/run` runs.
- `python benchmarks/….py [flags]` must exist and parse its flags (`--help`): the benchmarks
  themselves take minutes of a whole machine and are run by `benchmarks/run_all.py`.
- `python -c …` runs; `python -m hermes_core.testing.<fake> …` takes its flags (`--help` after them).

Anything else fails with "this command is not exercised", except the few in `NOT_RUN_HERE`, each
with the reason it cannot run in a test.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from importlib.metadata import metadata
from pathlib import Path

import pytest

from hermes_core.testing.fake_openai import FakeOpenAIServer
from serve_process import CLEAN_ENV

ROOT = Path(__file__).resolve().parents[1]
DOCUMENTS = [
    ROOT / "README.md", ROOT / "README.zh-CN.md", *sorted((ROOT / "docs").glob("*.md")),
    *sorted((ROOT / "examples").glob("*/README.md")),
]  # fmt: skip
PROGRAMS = ("hermes-kernel", "python", "python3", "pip", "curl")
SHELL_BLOCKS = ("", "bash", "sh", "shell", "console", "text")
BIN = Path(sys.executable).parent
DISTRIBUTION = "hermes-kernel"  # pyproject.toml's name; the import stays hermes_core
CONSOLE_TOKEN = "doc-commands-console-token-0123456789"

# Task ids, files and messages the documentation writes as placeholders or examples, and what they
# stand for here (the recorded tasks of `workdir`).
TASK_ID = "webhook:m1~3f9a0c2b71de"
FAILED_TASK = "webhook:m2~77aa0b123f9a"
XRAY = ".hermes/xray/webhook_m2_77aa0b123f9a.json"
PLACEHOLDERS = {
    r"\bTASK_ID\b": TASK_ID,
    r"\bTRACE\b": TASK_ID,
    r"(?<=show )ID\b": TASK_ID,
    r"(?<=add )FILE\b": XRAY,
    r"(?<=resend )ID\b": "1",
    r'"…"': '"what is 2+3"',
}

EXAMPLE_ENDPOINT = "http://127.0.0.1:8000/v1"
MYPKG_TOOLS = '''
from hermes_core import tool


@tool
def shout(text: str) -> str:
    """Upper-case a text."""
    return text.upper()
'''

# Commands that cannot run in a test, and why. Keep it small: each one is a command a person runs
# on a server, as root, or inside the image, where other tests check what it relies on.
NOT_RUN_HERE = {
    "pip install 'litellm[proxy]'": (
        "installs the LiteLLM proxy (about 750 MB) to record its answers again; tests/test_litellm.py "
        "replays the recordings (docs/providers.md)"
    ),
    'python3 -m venv /opt/hermes-kernel && /opt/hermes-kernel/bin/pip install ".[feishu]"': (
        "installs into /opt as root on a server (docs/deploy.md); the install itself is the "
        'dry-run of `pip install ".[feishu]"`'
    ),
    "hermes-kernel --config /etc/hermes-kernel/config.yaml serve": (
        "the server's installed configuration under /etc (a copy of deploy/config/*.yaml, which "
        "tests/test_deploy.py loads)"
    ),
    "hermes-kernel --config /etc/hermes-kernel/config.yaml doctor": (
        "the server's installed configuration under /etc, with the server's secrets"
    ),
    "/opt/hermes-kernel/bin/hermes-kernel --config /etc/hermes-kernel/config.yaml serve": (
        "the systemd unit's ExecStart (tests/test_deploy.py verifies the unit)"
    ),
    "hermes-kernel --config /etc/hermes-kernel/prod.yaml serve --host 0.0.0.0": (
        "the container image's command (tests/test_deploy.py checks the Dockerfile)"
    ),
    "hermes-kernel --config examples/team-lookups/hermes.yaml serve": (
        "needs the on-call API's token (ONCALL_API_TOKEN); tests/test_example_team_lookups.py serves "
        "the example against a local on-call API and wiki"
    ),
}

# Pages whose examples another test runs as written, against a real serve it starts itself.
RUN_BY = {
    "webhook.md": "test_webhook_docs.py",
    "modes.md": "test_modes_serve.py",
    "scale-out.md": "test_temporal_engine.py",  # needs a Temporal server: two serve nodes, two workers
}

# Inline mentions that name a command rather than run it: `hermes-kernel <them> --help` must work.
NAMES_ONLY = {"hermes-kernel eval", "hermes-kernel eval add", "hermes-kernel schedule"}

# Exit codes a command may end with in the folder below, when not 0 (and why).
EXIT_CODES = {
    "hermes-kernel doctor": (0, 1),  # 1: the offline demo model is not a model endpoint
    "hermes-kernel replay webhook:m1~3f9a0c2b71de --live": (0, 1),  # 1: today's model diverges
    "hermes-kernel deadletters resend 1": (1,),  # the fresh folder has no dead letter 1: one line, exit 1
    "hermes-kernel worker": (2,),  # the embedded engine runs its turns in serve: one line, exit 2
}


@dataclass
class DocCommand:
    text: str
    places: list[str]


def is_command(text: str) -> bool:
    words = text.split()
    if not words:
        return False
    first = words[0]
    if "/" in first:
        parent, _, first = first.rpartition("/")
        if not parent.endswith("/bin"):
            return False
    return first in PROGRAMS


def is_command_line(text: str) -> bool:
    return any(is_command(part.strip()) for part in re.split(r"&&|\|\||;|\|", text))


def without_comment(line: str) -> str:
    """The command without its trailing `# …` comment (a `#` inside quotes stays)."""
    quote, cut = "", len(line)
    for index, char in enumerate(line):
        if quote:
            quote = "" if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char == "#" and (index == 0 or line[index - 1].isspace()):
            cut = index
            break
    return " ".join(line[:cut].split())


def fenced_commands(lines: list[str]) -> list[tuple[int, str]]:
    found: list[tuple[int, str]] = []
    fence, language = "", ""
    block: list[tuple[int, str]] = []
    for number, line in enumerate(lines, 1):
        opening = re.match(r"^\s*(```|~~~)\s*([\w+-]*)\s*$", line)
        if opening and not fence:
            fence, language, block = opening.group(1), opening.group(2), []
        elif fence and line.strip() == fence:
            if language in SHELL_BLOCKS:
                found += block_commands(block)
            fence = ""
        elif fence:
            block.append((number, line))
    return found


def block_commands(block: list[tuple[int, str]]) -> list[tuple[int, str]]:
    prompted = any(line.lstrip().startswith("$ ") for _, line in block)
    commands: list[tuple[int, str]] = []
    joined: tuple[int, str] | None = None
    for number, line in block:
        text = line.strip()
        if joined is None:
            if prompted and not text.startswith("$ "):
                continue  # output shown after a prompt
            text = text[2:] if prompted else text
            joined = (number, "")
        joined = (joined[0], f"{joined[1]} {text.removesuffix(chr(92))}")
        if not text.endswith("\\"):
            command = without_comment(joined[1])
            if is_command_line(command):
                commands.append((joined[0], command))
            joined = None
    return commands


def inline_commands(text: str) -> list[tuple[int, str]]:
    outside = re.sub(
        r"^\s*(```|~~~).*?^\s*\1\s*$", lambda m: "\n" * m.group(0).count("\n"), text, flags=re.M | re.S
    )
    found = []
    for match in re.finditer(r"(?<!`)`([^`\n]+(?:\n[^`\n]+)?)`(?!`)", outside):
        code = " ".join(match.group(1).split())
        if len(code.split()) >= 2 and is_command_line(code):
            found.append((outside.count("\n", 0, match.start()) + 1, code))
    return found


def doc_commands() -> list[DocCommand]:
    distinct: dict[str, DocCommand] = {}
    for path in DOCUMENTS:
        text = path.read_text(encoding="utf-8")
        found = fenced_commands(text.splitlines()) + inline_commands(text)
        for number, command in sorted(found):
            place = f"{path.relative_to(ROOT)}:{number}"
            distinct.setdefault(command, DocCommand(command, [])).places.append(place)
    return list(distinct.values())


COMMANDS = doc_commands()


# --- the folder the commands run in ----------------------------------------------------------------


# what .gitignore keeps out of a clone under examples/, deploy/ and benchmarks/ (a checkout that ran
# the benchmarks holds their peers' virtual environments: hundreds of MB, copied for every command)
NOT_IN_A_CLONE = shutil.ignore_patterns(
    ".peers", "results", "__pycache__", "*.pyc", ".venv", ".hermes", ".env"
)


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A clone's folders, and a gateway database with a finished and a failed task in it."""
    import asyncio

    from hermes_core import Agent, ModelUnavailable
    from hermes_core.observe.traces import SQLiteTraceStore, Tracer
    from hermes_core.testing import ScriptedModel, call, reply

    folder = tmp_path_factory.mktemp("clone")
    for name in ("examples", "deploy", "benchmarks"):  # as a clone has them: not what .gitignore names
        shutil.copytree(ROOT / name, folder / name, ignore=NOT_IN_A_CLONE)

    async def record() -> None:
        store = SQLiteTraceStore(folder / ".hermes" / "gateway.db")
        tracer = Tracer(store, xray_dir=folder / ".hermes" / "xray")
        from hermes_core.tools.examples import calculator_tool

        done = ScriptedModel([call("calculator", {"expression": "(12+34)*2"}), reply("92")])
        agent = Agent(model=done, tools=[calculator_tool], tracer=tracer)
        await agent.run("what is (12+34)*2", task_id=TASK_ID)
        failing = Agent(model=ScriptedModel([ModelUnavailable("the endpoint is down")]), tracer=tracer)
        await failing.run("and again?", task_id=FAILED_TASK)
        await store.close()

    asyncio.run(record())
    assert (folder / XRAY).is_file(), sorted((folder / ".hermes" / "xray").iterdir())
    return folder


@pytest.fixture(scope="module")
def endpoint() -> Iterator[str]:
    """The fake OpenAI-compatible server, standing for the documentation's example endpoint."""
    with FakeOpenAIServer() as fake:
        yield fake.base_url


@pytest.fixture
def workdir(recorded: Path, tmp_path: Path) -> Path:
    """The clone, with the README's configuration example as ./hermes.yaml (for the commands that
    name it; the test removes it for the others, which run as in a fresh clone)."""
    folder = tmp_path / "clone"
    shutil.copytree(recorded, folder, symlinks=True)
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    configuration = re.search(r"```yaml\n(.*?)```", readme, re.DOTALL)
    assert configuration, "README.md: no configuration example"
    (folder / "hermes.yaml").write_text(configuration.group(1), encoding="utf-8")
    (folder / "mypkg").mkdir()
    (folder / "mypkg" / "__init__.py").write_text("", encoding="utf-8")
    (folder / "mypkg" / "tools.py").write_text(MYPKG_TOOLS, encoding="utf-8")
    return folder


def environment(cwd: Path, **extra: str) -> dict[str, str]:
    """A clean environment: no model configured; the folder's packages importable (`mypkg`)."""
    path = f"{BIN}{os.pathsep}{CLEAN_ENV.get('PATH', '')}"
    return {**CLEAN_ENV, "PATH": path, "PYTHONPATH": str(cwd), **extra}


def with_placeholders(command: str, endpoint: str = EXAMPLE_ENDPOINT) -> str:
    for pattern, value in PLACEHOLDERS.items():
        command = re.sub(pattern, value, command)
    return command.replace(EXAMPLE_ENDPOINT, endpoint)


def bash(command: str, cwd: Path, env: dict[str, str], stdin: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", "-c", command], cwd=cwd, env=env, input=stdin, capture_output=True, text=True, timeout=180
    )


class Served:
    """`hermes-kernel … serve` in the background until it says where it serves."""

    def __init__(self, command: str, cwd: Path, env: dict[str, str]) -> None:
        self.process = subprocess.Popen(
            ["bash", "-c", f"exec {command}"],
            cwd=cwd,
            env=env,
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        self.output: list[str] = []
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.output.append(line)
            found = re.search(r"serving on (http://\S+) \(", line)
            if found:
                self.address = found.group(1)
                return
        raise AssertionError(f"`{command}` did not start:\n{''.join(self.output)}")

    def stop(self) -> int:
        self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout=60)
        finally:
            if self.process.stdout is not None:
                self.process.stdout.close()


# --- how each kind of command is exercised ---------------------------------------------------------


def run_hermes_core(command: str, cwd: Path) -> None:
    argv = shlex.split(command)
    env = environment(cwd)
    if "serve" in argv[1:]:
        served = Served(command if "--port" in argv else f"{command} --port 0", cwd, env)
        assert served.stop() == 0, "".join(served.output)
        return
    if command in NAMES_ONLY:
        result = bash(f"{command} --help", cwd, env)
        assert result.returncode == 0, result.stderr
        return
    result = bash(command, cwd, env)
    allowed = EXIT_CODES.get(command, (0,))
    assert result.returncode in allowed, f"exit {result.returncode}\n{result.stdout}\n{result.stderr}"
    assert "Traceback" not in result.stderr, result.stderr


def run_curl(command: str, cwd: Path) -> None:
    env = environment(cwd, HERMES_CONSOLE_TOKEN=CONSOLE_TOKEN, TOKEN=CONSOLE_TOKEN)
    served = Served("hermes-kernel serve --port 0", cwd, env)
    try:
        port = served.address.rsplit(":", 1)[1]
        local = re.sub(r"(?<=localhost:|127\.0\.0\.1:)8080\b", port, command)
        assert local != command, f"{command}: no address on port 8080 to point at the gateway"
        result = bash(f"{local} --fail --show-error --max-time 60", cwd, env)
    finally:
        assert served.stop() == 0, "".join(served.output)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip(), "curl printed nothing"


def check_pip_install(command: str) -> None:
    argv = shlex.split(command)
    targets = [word for word in argv[2:] if not word.startswith("-")]
    assert argv[:2] == ["pip", "install"] and targets, command
    extras = set(metadata(DISTRIBUTION).get_all("Provides-Extra") or [])  # pyproject.toml's, installed
    local = []
    for target in targets:
        path, _, wanted = target.partition("[")
        # The distribution's own name installs it from the package index once published; the same
        # project is the tree here (tests/test_packaging.py installs the built wheel in a fresh venv).
        assert path.startswith(".") or path == DISTRIBUTION, (
            f'{command}: installs {path!r} from a package index; from a clone it is pip install ".[…]"'
        )
        missing = set(wanted.rstrip("]").split(",")) - extras - {""}
        assert not missing, f"{command}: {DISTRIBUTION} has no extra {sorted(missing)}"
        local.append(target if path.startswith(".") else "." + target[len(path) :])
    result = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--dry-run", "--no-deps", "--quiet", *local],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr


def check_benchmark(command: str) -> None:
    argv = shlex.split(command)
    script = ROOT / argv[1]
    assert script.is_file(), f"{command}: no {argv[1]}"
    shown = subprocess.run(
        [sys.executable, str(script), "--help"], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert shown.returncode == 0, shown.stderr
    for flag in (word for word in argv[2:] if word.startswith("--")):
        assert flag in shown.stdout, f"{command}: {script.name} has no {flag}"


def check_test_selection(argv: list[str]) -> None:
    """`python -m pytest <options>` (the README's daily loop, `-rs` for the skips): this suite
    collected with those options, its markers registered, and some tests left out when they select
    (`-m`, `-k`). Collected, not run: running the suite from inside itself would run this test again."""
    collected = subprocess.run(
        [sys.executable, "-m", "pytest", *argv[3:], "--collect-only", "--strict-markers",
         "-p", "no:cacheprovider"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert collected.returncode == 0, collected.stdout[-2000:] + collected.stderr[-2000:]
    if {"-m", "-k"} & set(argv[3:]):
        assert "deselected" in collected.stdout, collected.stdout[-500:]


def check_fake_program(command: str, cwd: Path) -> None:
    """`python -m hermes_core.testing.<fake> …`: the module exists and takes these flags (`--help`
    after them); tests/test_fake_commands.py runs the fakes as programs and talks to them."""
    result = bash(f"{command} --help", cwd, environment(cwd))
    assert result.returncode == 0 and "usage:" in result.stdout, result.stderr
    unknown = [flag for flag in re.findall(r"(?<!\S)--[\w-]+", command) if flag not in result.stdout]
    assert not unknown, f"flags the program does not take: {unknown}"


def exercise(command: str, cwd: Path) -> None:
    """Run or check one command (one part of a `&&` chain); fail if nothing here exercises it."""
    argv = shlex.split(command)
    program = argv[0].rpartition("/")[2]
    if program == "hermes-kernel":
        run_hermes_core(command, cwd)
    elif program == "curl":
        run_curl(command, cwd)
    elif program == "pip" and argv[1:2] == ["install"]:
        check_pip_install(command)
    elif program in ("python", "python3") and argv[1:2] == ["-c"]:
        result = bash(command, cwd, environment(cwd))
        assert result.returncode == 0, result.stderr
    elif program in ("python", "python3") and argv[1:3] == ["-m", "pytest"]:
        check_test_selection(argv)
    elif program in ("python", "python3") and argv[1].startswith("benchmarks/"):
        check_benchmark(command)
    elif program.startswith("python") and argv[1:2] == ["-m"] and argv[2].startswith("hermes_core.testing."):
        check_fake_program(command, cwd)
    else:
        pytest.fail(f"this command is not exercised: {command}")


def ci_runs(command: str) -> bool:
    """The README's test set-up line: `.ci/run` runs exactly it (and this suite is its second half)."""
    return command == 'pip install ".[test]" && python -m pytest' and command in (
        ROOT / ".ci" / "run"
    ).read_text("utf-8")


@pytest.mark.slow
@pytest.mark.parametrize("doc", COMMANDS, ids=[c.text[:60] for c in COMMANDS])
def test_each_documented_command_works(doc: DocCommand, workdir: Path, endpoint: str) -> None:
    """Attack: follow the documentation literally, from a fresh clone (the README's
    `hermes-kernel eval --cases evals/` failed: the example cases are in examples/evals/; `pip install
    "hermes-kernel[feishu]"` asked a package index for a package of that name)."""
    command = with_placeholders(doc.text, endpoint)
    if doc.text in NOT_RUN_HERE:
        pytest.skip(f"not run here: {NOT_RUN_HERE[doc.text]}")
    if ci_runs(command):
        return
    pages = {Path(place.split(":")[0]).name for place in doc.places}
    if pages <= set(RUN_BY):
        for page in pages:  # that test must exist and read this page
            assert page in (Path(__file__).parent / RUN_BY[page]).read_text("utf-8"), page
        return
    if "hermes.yaml" not in command:  # a command without --config reads ./hermes.yaml: a fresh clone has none
        (workdir / "hermes.yaml").unlink()
    try:
        for part in command.split(" && "):
            exercise(part.strip(), workdir)
    except AssertionError as exc:
        raise AssertionError(f"{doc.text!r} ({', '.join(doc.places)}): {exc}") from None


def test_every_document_is_read_and_the_allow_list_is_current() -> None:
    """Attack: a page added later (or a command removed) escapes the check unnoticed."""
    read = {place.split(":")[0] for doc in COMMANDS for place in doc.places}
    for path in DOCUMENTS:
        text = path.read_text(encoding="utf-8")
        if re.search(r"`(hermes-kernel|pip|curl|python3?) \w", text):
            name = str(path.relative_to(ROOT))
            assert name in read, f"{name}: shows commands, none was found"
    shown = {doc.text for doc in COMMANDS}
    for command in (*NOT_RUN_HERE, *NAMES_ONLY, *EXIT_CODES):
        assert command in shown or with_placeholders(command) in {with_placeholders(s) for s in shown}, (
            f"{command!r} is no longer in the documentation: take it off the list"
        )
    assert "hermes-kernel eval --cases examples/evals/" in shown
    assert 'hermes-kernel schedule add --cron "0 9 * * 1-5" --prompt "…"' in shown  # README: runs as written


def test_the_extractor_finds_what_a_reader_would_copy() -> None:
    """The rules above, on a small page: prompts, output, comments, continuations, inline code."""
    page = "\n".join([
        "Run `hermes-kernel doctor` first; `hermes-kernel` alone is a name, `/var/lib/hermes-kernel` a path.",
        "```",
        "$ hermes-kernel --config a.yaml doctor",
        "OK    configuration",
        "```",
        "```bash",
        "hermes-kernel run \"what # is\"   # a comment",
        "docker run -d \\",
        "    hermes-kernel",
        "pip install . && hermes-kernel serve",
        "```",
    ])  # fmt: skip
    found = [command for _, command in fenced_commands(page.splitlines()) + inline_commands(page)]
    assert found == [
        "hermes-kernel --config a.yaml doctor",
        'hermes-kernel run "what # is"',
        "pip install . && hermes-kernel serve",
        "hermes-kernel doctor",
    ]
