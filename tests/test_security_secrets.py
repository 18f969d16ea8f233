"""Attacks on secret redaction, each performed end to end against a real `hermes-kernel serve` process.

The process runs with DEBUG logs, a JSON log file, traces and the console, a workspace the file tools
read, and a fake OpenAI-compatible model server. Afterwards everything that left the process is
searched: standard output and error, the log file, every byte of the data directory (the SQLite
database with its inbox, outbox, session history, task journal and traces; its WAL; X-rays), the
webhook replies, the console's pages and trace JSON, and every prompt the model server received.

1. A known secret straddling a cut. Redaction used to run after truncation and match whole values
   only, so a secret cut by the tool-result cap (3,000 characters) or by `read_file(max_chars=…)`
   left all but its last characters behind, everywhere. The model here reads files in which the
   secret (HERMES_API_KEY, 40 characters) straddles the cap, and the max_chars cut, at every offset
   1…39; a user message also straddles the log summary's cut (300). Wanted: no prefix of the secret
   longer than 4 characters anywhere.
2. Pasted credentials. A user pasting an API key, a token or a private key into a message had it
   stored raw in the inbox and the session history, and sent to the model. Wanted: none of it stored,
   logged, traced or sent; the model sees a handle `[secret:<n>:<kind>]` and the reply flow works. The
   test vectors follow the shapes of gitleaks' rules (config/gitleaks.toml: github-pat, slack-bot-
   token, aws-access-token, private-key, jwt, …); they are built at run time from a seeded random
   source, so no credential-shaped literal sits in this file.
"""

from __future__ import annotations

import asyncio
import json
import random
import re
import signal
import sqlite3
import string
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from hermes_core.channels.webhook import sign
from hermes_core.kernel.redaction import Redactor
from hermes_core.testing.fake_openai import FakeOpenAIServer, FakeReply, RecordedRequest
from serve_process import address_in, clean_environ

_random = random.Random(13)


def _random_chars(n: int, alphabet: str = string.ascii_letters + string.digits) -> str:
    return "".join(_random.choice(alphabet) for _ in range(n))


API_KEY = "Zq7Wx" + _random_chars(35)  # 40 characters; its first five occur nowhere else
WEBHOOK_SECRET = "wh-" + _random_chars(29)
LONG_TOKEN = "Lq3Vz" + _random_chars(85)  # a `*_TOKEN` variable of 90 characters: longer than HOLD_BACK
PARTIAL_CHARS = 5  # a start of the secret this long must not leave the process ("longer than 4")
CAP = 3000  # agent.max_result_chars, the default
READ_CUT = 120  # the max_chars the model passes to read_file
LOG_CUT = 300  # observe/logs.py SUMMARY_CHARS: a message's readable summary in a log line
OFFSETS = range(1, len(API_KEY))  # how many characters of the secret come before the cut
FILLER = "the quick brown fox jumps over the lazy dog "


def _filled(before: int, total: int) -> str:
    """`before` characters of prose, the secret, more prose up to `total`: one line, no JSON escapes."""
    text = (FILLER * (total // len(FILLER) + 2))[:before] + API_KEY
    return text + (FILLER * (total // len(FILLER) + 2))[: total - len(text)]


def _straddling(*cuts: int) -> str:
    """Prose with the secret straddling each of `cuts` (7 characters of it before each)."""
    text = ""
    for cut in cuts:
        text += (FILLER * (cut // len(FILLER) + 1))[: cut - 7 - len(text)] + API_KEY
    return text + " " + FILLER


def _cap_file(k: int) -> tuple[str, str]:
    """A file whose read_file result (`{"path": …, "content": …}`) has the secret's k-th char at 3,000."""
    name = f"cap_{k:02d}.txt"
    prefix = len(json.dumps({"path": name, "content": ""})) - 2  # up to the content's first character
    return name, _filled(CAP - k - prefix, CAP + 200)


def _cut_file(k: int) -> tuple[str, str]:
    """A one-line file whose first `READ_CUT` characters end with the secret's first k."""
    return f"cut_{k:02d}.txt", _filled(READ_CUT - k, READ_CUT + 100)


# --- pasted credentials (attack 2) ---------------------------------------------------------------------

_B64 = string.ascii_letters + string.digits + "+/"
PASTED = {  # kind → (the credential as pasted, its secret part: none of it may leave the process)
    "openai-key": "sk-" + "proj-" + _random_chars(48),
    "github-token": "gh" + "p_" + _random_chars(36),
    "aws-access-key": "AK" + "IA" + _random_chars(16, string.ascii_uppercase + "234567"),
    "slack-token": "xo"
    + "xb-"
    + _random_chars(10, string.digits)
    + "-"
    + _random_chars(13, string.digits)
    + "-"
    + _random_chars(24),
    "google-api-key": "AI" + "za" + _random_chars(35),
    "jwt": "ey" + "JhbGciOiJIUzI1NiJ9.ey" + "J" + _random_chars(40) + "." + _random_chars(43),
    "private-key": "-----BEGIN RSA PRIVATE KEY-----\n"
    + "\n".join(_random_chars(64, _B64) for _ in range(6))
    + "\n-----END RSA PRIVATE KEY-----",
}
PASTED_BEARER = _random_chars(32)  # after "Authorization: Bearer "
PASTED_PASSWORD = "Hx" + _random_chars(12) + "7"  # after "password="
PASTED_MESSAGE = (
    "Here are my keys, please check the config: "
    + " ; ".join(f"{kind}: {value}" for kind, value in PASTED.items())
    + f" ; curl -H 'Authorization: Bearer {PASTED_BEARER}' ; password={PASTED_PASSWORD}"
)
# Ordinary identifiers that must reach the model untouched: no false positives.
ORDINARY = [
    "550e8400-e29b-41d4-a716-446655440000",  # a UUID
    "3f2a9c1e8b7d6a5f4e3d2c1b0a9f8e7d6c5b4a39",  # a commit hash
    "ou_7d8a6e6df7621556ce0d21922b676706",  # a Feishu open_id
    "om_dc13264520392913993dd051dba21dcf",  # a Feishu message id
    "oc_5ad11d72b830411d72b836c20a9b0f3e",  # a Feishu chat id
    "请把季度报告发给张三，截止日期是周五。",
    "The token expired, so the secret handshake failed; ask for authorization.",
]
ORDINARY_MESSAGE = "Please look at these: " + " | ".join(ORDINARY)


def _secret_parts(value: str, width: int = 8) -> set[str]:
    """Every `width`-character piece of the random part of a pasted credential."""
    if value.startswith("-----BEGIN"):
        body = "".join(value.splitlines()[1:-1])
    else:
        body = value[5:]  # past the prefix that names the kind (sk-pr, ghp_x, AKIAx, …)
    return {body[i : i + width] for i in range(len(body) - width + 1)}


# --- the model -------------------------------------------------------------------------------------------


def scripted_model(request: RecordedRequest) -> FakeReply:
    """Reads every file when asked; echoes the tool results back (as a prompt-injected model would);
    echoes the secret itself straddling the console's and the traces' cuts; otherwise says ok."""
    last = request.messages[-1]
    if last.get("role") == "tool":
        results = [str(m.get("content")) for m in request.messages if m.get("role") == "tool"]
        return FakeReply.text("the tools said:\n" + "\n".join(results))
    text = str(last.get("content"))
    if "read the files" in text:
        calls = [("read_file", {"path": _cap_file(k)[0]}) for k in OFFSETS]
        calls += [("read_file", {"path": _cut_file(k)[0], "max_chars": READ_CUT}) for k in OFFSETS]
        return FakeReply.parallel_tool_calls(calls)
    if "stream the long token" in text:
        return FakeReply.text(f"{FILLER * 3}here it is: {LONG_TOKEN} and {FILLER * 3}")
    if "echo the key" in text:
        return FakeReply.text(_straddling(80, 200, 300, 500))
    return FakeReply.text("ok, noted")


# --- one serve process --------------------------------------------------------------------------------


@dataclass
class Run:
    produced: dict[str, bytes] = field(default_factory=dict)  # where → what left the process there
    replies: dict[str, dict] = field(default_factory=dict)
    prompts: list[RecordedRequest] = field(default_factory=list)


def post_webhook(url: str, payload: dict[str, str]) -> dict:
    body = json.dumps(payload).encode()
    stamp = str(int(time.time()))
    headers = {"X-Hermes-Timestamp": stamp, "X-Hermes-Signature": sign(WEBHOOK_SECRET, stamp, body)}
    request = urllib.request.Request(url, data=body, headers=headers, method="POST")
    with urllib.request.urlopen(request, timeout=120) as response:
        assert response.status == 200
        return json.loads(response.read())


def get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=30) as response:
        return response.read()


def talk(address: str, work: Path, run: Run) -> None:
    """Both attacks, over the webhook; then the console's pages and trace JSON of every task."""
    messages = {
        "read": "please read the files in the workspace",
        "echo": "echo the key back to me",
        "pasted": PASTED_MESSAGE,
        "ordinary": ORDINARY_MESSAGE,
    }
    for k in (1, 4, 5, 6, 20, 39):  # the secret straddles the log summary's cut
        messages[f"log cut {k}"] = _filled(LOG_CUT - k, LOG_CUT + 60)
    for name, text in messages.items():
        payload = {
            "message": text,
            "user_id": "u-" + name.replace(" ", "-"),
            "message_id": f"m-{len(run.replies)}",
        }
        run.replies[name] = post_webhook(f"{address}/webhook", payload)
        run.produced[f"webhook reply to {name!r}"] = json.dumps(run.replies[name]).encode()
    chat = urllib.request.Request(
        f"{address}/console/api/chat",
        data=json.dumps({"message": "stream the long token", "conversation": "c1"}).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(chat, timeout=60) as response:
        run.produced["console chat stream"] = response.read()
    with sqlite3.connect(f"file:{work / '.hermes' / 'gateway.db'}?mode=ro", uri=True) as db:
        task_ids = [row[0] for row in db.execute("SELECT task_id FROM traces")]
    run.produced["console tasks page"] = get(f"{address}/console/tasks")
    for task_id in task_ids:
        quoted = urllib.parse.quote(task_id, safe="")
        run.produced[f"console trace JSON {task_id}"] = get(f"{address}/console/api/tasks/{quoted}")
        run.produced[f"console task page {task_id}"] = get(f"{address}/console/tasks/{quoted}")


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Run:
    work = tmp_path_factory.mktemp("serve")
    workspace = work / "ws"
    workspace.mkdir()
    for k in OFFSETS:
        for name, content in (_cap_file(k), _cut_file(k)):
            (workspace / name).write_text(content)
    (work / "hermes.yaml").write_text(
        "agent:\n  workspace: ws\n  max_tool_calls: 200\n"
        "observe:\n  log_dir: logs\n  traces: true\n"
        "model:\n  max_retries: 1\n"
    )
    model = FakeOpenAIServer(handler=scripted_model, api_key=API_KEY).start_in_thread()
    env = clean_environ()
    env.update(
        HERMES_API_KEY=API_KEY, HERMES_WEBHOOK_SECRET=WEBHOOK_SECRET, HERMES_BASE_URL=model.base_url,
        HERMES_MODEL="m", HERMES_LOG_LEVEL="DEBUG", SERVICE_TOKEN=LONG_TOKEN,
    )  # fmt: skip
    command = [sys.executable, "-m", "hermes_core", "--config", "hermes.yaml", "serve", "--port", "0"]
    result = Run()
    with (work / "stdout.txt").open("wb") as out, (work / "stderr.txt").open("wb") as err:
        process = subprocess.Popen(command, cwd=work, env=env, stdout=out, stderr=err)
    try:
        talk(address_in(work / "stdout.txt", process), work, result)
    finally:
        process.send_signal(signal.SIGTERM)
        exit_code = process.wait(timeout=30)
        model.stop()
    assert exit_code == 0, (work / "stderr.txt").read_text()
    for path in sorted(work.rglob("*")):
        if path.is_file() and workspace not in path.parents and path.name != "hermes.yaml":
            result.produced[f"file {path.relative_to(work)}"] = path.read_bytes()
    for n, request in enumerate(model.requests):
        headers = dict(request.headers)
        headers.pop("Authorization")  # the API key sent TO the model server: its job
        result.produced[f"model request {n} (the prompt)"] = request.raw + json.dumps(headers).encode()
    result.prompts = list(model.requests)
    return result


# --- the checks ------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_the_scenario_ran_as_intended(run: Run) -> None:
    """The reads happened and were cut where intended; every message got its reply."""
    reply = run.replies["read"]["reply"]
    assert reply.startswith("the tools said:") and reply.count("[truncated: shown 3000 of") == len(OFFSETS)
    assert reply.count('"truncated": true') == len(OFFSETS)
    assert all(r["reply"] for r in run.replies.values())
    where = set(run.produced)
    assert {"file stderr.txt", "file logs/hermes-kernel.log", "file .hermes/gateway.db"} <= where
    assert any(name.startswith("console trace JSON webhook:") for name in where)
    stderr = run.produced["file stderr.txt"].decode()
    assert " DEBUG " in stderr and "tool result: read_file ok" in stderr
    stream = [json.loads(line) for line in run.produced["console chat stream"].splitlines() if line.strip()]
    assert [event["type"] for event in stream][-1] == "reply" and any(e["type"] == "text" for e in stream)
    assert "here it is: [REDACTED] and" in stream[-1]["text"]


@pytest.mark.slow
def test_no_start_of_a_straddling_secret_leaves_the_process(run: Run) -> None:
    """Attack 1: the secret straddles the 3,000-character result cap, read_file's max_chars cut and the
    log summary's cut at every offset; nothing of it longer than 4 characters may leave the process.
    Nor of the 90-character token the model streams to the console (see the next test but one)."""
    starts = [API_KEY[:PARTIAL_CHARS].encode(), LONG_TOKEN[:PARTIAL_CHARS].encode()]
    leaks = [where for where, data in run.produced.items() if any(start in data for start in starts)]
    assert leaks == []


@pytest.mark.slow
def test_a_pasted_credential_is_not_stored_logged_traced_or_sent(run: Run) -> None:
    """Attack 2: keys pasted into a webhook message. No piece of any of them (8 characters of its
    random part) is in the database file, the logs, the traces, the console, the reply or a prompt."""
    pieces = {kind: _secret_parts(value) for kind, value in PASTED.items()}
    pieces["bearer-token"] = _secret_parts("xxxxx" + PASTED_BEARER)
    pieces["password"] = _secret_parts("xxxxx" + PASTED_PASSWORD, width=6)
    leaks = [
        f"{where}: {kind}"
        for where, data in run.produced.items()
        for kind, parts in pieces.items()
        if any(part.encode() in data for part in parts)
    ]
    assert leaks == []


@pytest.mark.slow
def test_the_model_sees_what_kind_of_credential_was_pasted_and_the_reply_flows(run: Run) -> None:
    """Attack 2, continued: the turn still runs and answers; the model reads a handle that names the
    kind, `[secret:<n>:<kind>]` (issue 28: a handle a tool declared to accept secrets gets back as the
    value; it was `[REDACTED:<kind>]` before)."""
    assert run.replies["pasted"]["reply"] == "ok, noted"
    prompt = next(r for r in run.prompts if "Here are my keys" in json.dumps(r.messages))
    user = next(m for m in reversed(prompt.messages) if m.get("role") == "user")["content"]
    for kind in (*PASTED, "credential"):
        assert re.search(rf"\[secret:\d+:{kind}\]", user), kind
    assert re.search(r"Authorization: Bearer \[secret:\d+:", user)
    assert re.search(r"password=\[secret:\d+:credential\]", user)


@pytest.mark.slow
def test_ordinary_identifiers_and_prose_reach_the_model_untouched(run: Run) -> None:
    """False positives: UUIDs, commit hashes, Feishu ids, Chinese and English prose are not redacted."""
    prompt = next(r for r in run.prompts if "Please look at these" in json.dumps(r.messages))
    user = next(m for m in reversed(prompt.messages) if m.get("role") == "user")["content"]
    assert user == ORDINARY_MESSAGE


# --- the redactor's cut, at every offset -----------------------------------------------------------------


def test_cut_leaves_nothing_of_a_secret_at_any_offset_or_limit() -> None:
    """Attack 1 at the function every cut goes through: a text with the secret at each position,
    cut at each limit around it, as is and followed by each cut marker."""
    redactor = Redactor([API_KEY])
    start = API_KEY[:PARTIAL_CHARS]
    for before in range(0, 12):
        text = "x" * before + API_KEY + " and more"
        for limit in range(len(text) + 1):
            shown, total = redactor.cut(text, limit)
            assert start not in shown and total == len(redactor.redact(text))
            for marker in ("…", "\n[truncated: shown 9 of 99 chars]", "\\n[output truncated: 9 bytes"):
                assert start not in redactor.redact(text[:limit] + marker)


# --- the recognised shapes: test vectors -----------------------------------------------------------------

SHAPE_VECTORS = {  # text → what redaction leaves of it (vectors after gitleaks' rules and examples)
    f"key {PASTED['openai-key']} end": "key [REDACTED:openai-key] end",
    "sk-" + "ant-api03-" + "x1" * 20: "[REDACTED:anthropic-key]",
    f"{PASTED['github-token']}.": "[REDACTED:github-token].",
    "github_" + "pat_" + "A1b2" * 12: "[REDACTED:github-token]",
    "glpat-" + "a1B2c3" * 4: "[REDACTED:gitlab-token]",
    f"aws {PASTED['aws-access-key']}": "aws [REDACTED:aws-access-key]",
    PASTED["slack-token"]: "[REDACTED:slack-token]",
    "https://hooks.slack.com/services/"
    + "T0A1B2C3D/B4E5F6G7H/"
    + "q1" * 12: "https://[REDACTED:slack-webhook]",
    PASTED["google-api-key"]: "[REDACTED:google-api-key]",
    "sk_" + "live_" + "4eC39HqLyjWDarjtT1zdp7dc": "[REDACTED:stripe-key]",
    "hf_" + "abcdefghijklmnopqrstuvwxyzABCDEFGH": "[REDACTED:huggingface-token]",
    f"id_token={PASTED['jwt']}": "id_token=[REDACTED:jwt]",
    PASTED["private-key"] + "\nafter": "[REDACTED:private-key]\nafter",
    "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAA\nQ2Fu": "[REDACTED:private-key]",  # cut
    "curl -H 'Authorization: Bearer abc.DEF-123_xyz~45'": (
        "curl -H 'Authorization: Bearer [REDACTED:credential]'"
    ),
    "sent Bearer 9f8e7d6c5b4a39281706 upstream": "sent Bearer [REDACTED:bearer-token] upstream",
    "https://bob:s3cr3t-pw@db.example.com/x": "https://bob:[REDACTED:url-password]@db.example.com/x",
    "password=Hunter2Hunter2": "password=[REDACTED:credential]",
    '{"client_secret": "a9Fq2Lm8Zx"}': '{"client_secret": "[REDACTED:credential]"}',
    "AWS_SECRET_ACCESS_KEY=wJalrXUtnFEMI/K7MDENG/bPxRfiCY": "AWS_SECRET_ACCESS_KEY=[REDACTED:credential]",
    "密码是 Abc@2024xyz，别告诉别人": "密码是 [REDACTED:password]，别告诉别人",
    "t-" + "g1044ddgDEFXTB6NDJOXO6GCNWB3ANEZHPE3Z5BYV": "[REDACTED:feishu-token]",
    # the start of one left at a cut
    "ghp_" + "Ab3dE…": "[REDACTED:github-token]…",
    "password=hunte\n[truncated: shown 9 of 99 chars]": (
        "password=[REDACTED:credential]\n[truncated: shown 9 of 99 chars]"
    ),
}
NOT_SECRETS = [
    *ORDINARY,
    "task-1234567890abcdefghijk, at-1234567890abcdefghijkl, t-shirt, sk-learn-is-a-library",
    'prompt 345 tokens; "total_tokens": 1234, "max_tokens": 4096, "token_env": "HERMES_CONSOLE_TOKEN"',
    "call_a1B2c3D4e5F6g7H8i9J0k1L2, ap_0123456789abcdef, webhook:m-12, AKIAEXAMPLE",
    "password: please ask the admin; 密码为空；the secret is to practise",
    "calculator(expression='(12+34)*2') -> 92 in 0.02s; model qwen2.5-14b; https://example.com:8080/a@b",
    "eyJhbGciOiJIUzI1NiJ9 alone is a header, not a token",
]


@pytest.mark.parametrize("text", list(SHAPE_VECTORS))
def test_each_recognised_shape_is_redacted(text: str) -> None:
    """The pattern table of the security notes, one vector per rule; redacting twice changes nothing."""
    redactor = Redactor()
    assert redactor.redact(text) == SHAPE_VECTORS[text]
    assert redactor.redact(SHAPE_VECTORS[text]) == SHAPE_VECTORS[text]


@pytest.mark.parametrize("text", NOT_SECRETS)
def test_ordinary_text_ids_and_hashes_are_not_redacted(text: str) -> None:
    """False positives: prose (Chinese and English), UUIDs, commit hashes, Feishu and call ids."""
    assert Redactor([API_KEY]).redact(text) == text


def test_redaction_stays_cheap() -> None:
    """Redaction is on every log line and prompt: a 200-character line and a 3,000-character
    result, each new (not cached), stay within tens of microseconds."""
    redactor = Redactor([API_KEY, WEBHOOK_SECRET])
    lines = [
        f"{n} model qwen2.5 answered in 1.23s with 345 tokens, tool calculator(expression='(12+34)*2')"
        " -> 92; reply 42 to webhook:u1 sent after 3 attempt(s) " + FILLER * 2
        for n in range(2000)
    ]
    started = time.perf_counter()
    for line in lines:
        redactor.redact(line)
    assert (time.perf_counter() - started) / len(lines) < 100e-6  # ~5 µs here


def test_streamed_console_text_never_shows_the_start_of_a_long_secret() -> None:
    """Attack 1 at the console's cut: streamed text was shown but for its last 64 characters, so a
    secret longer than that (a 90-character token from the environment) showed its start before its
    end had arrived (now the whole last word waits, however long). The console's own channel, fed
    piece by piece as the model client feeds it (over a local socket the pieces arrive together, so
    the end-to-end run above cannot show this cut)."""
    from hermes_core.console.channel import WebChannel

    token = LONG_TOKEN
    streams = WebChannel(Redactor([token])).streams
    queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    streams.open("web:1", queue)
    on_text = streams.on_text("web:1")
    assert on_text is not None
    text = "x" * 80 + f" the token is {token} " + "y" * 100
    for start in range(0, len(text), 3):
        on_text(text[start : start + 3])
    shown = [queue.get_nowait()["text"] for _ in range(queue.qsize())]
    assert len(shown) >= 4 and not any(token[:PARTIAL_CHARS] in piece for piece in shown)  # a word at a time
    assert shown[-1].endswith(" the token is [REDACTED] ")
