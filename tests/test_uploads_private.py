"""Uploads are private to their conversation, and the workspace quota holds per conversation and
under parallel writes: attacks performed end to end through the gateway `serve` builds, with the
fake Feishu platform delivering the files and the fake OpenAI-compatible server scripting the model.

Where the cases come from: issue 31 items 4 and 12 (one user's model listed, read and overwrote
another user's upload; one user's uploads filled the quota for everyone; 10 parallel 1 MB writes
were accepted with room for one) and the path spellings of OWASP's Path Traversal page and its
File Upload cheat sheet (relative, `..`, absolute, a symlink planted in the workspace).
"""

from __future__ import annotations

import json
import re
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from hermes_core import Agent, Session
from hermes_core.kernel.tools import ToolError
from hermes_core.kernel.tools.permissions import Policy
from hermes_core.tasks.pending import InlineInteractions
from hermes_core.testing import ScriptedModel, call, reply
from hermes_core.testing.fake_feishu import FakeFeishu
from hermes_core.testing.fake_openai import FakeOpenAIServer, FakeReply
from hermes_core.tools.builtin import builtin_tools
from hermes_core.tools.files import Workspace, conversation_folder
from test_media_e2e import answered, media_gateway

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="the workspace needs POSIX openat")
ALICE, BOB = "ou_alice", "ou_bob"
SECRET = "alice's salary: 123456\n"


def saved_path(told: str) -> str:
    """The workspace path the gateway told the model a file was saved at."""
    found = re.search(r"\[file received: (\S+) \(", told)
    assert found, told
    return found.group(1)


def tool_results(request: Any) -> list[str]:
    return [str(m["content"]) for m in request.messages if m["role"] == "tool"]


def last_user(request: Any) -> str:
    return str([m for m in request.messages if m["role"] == "user"][-1]["content"])


async def alice_uploads(feishu: FakeFeishu, fake: FakeOpenAIServer, url: str) -> str:
    """Alice sends a text file in her own chat; the path it was saved at."""
    fake.script(FakeReply.text("Got it."))
    envelope = feishu.file_message(SECRET.encode(), "salary.txt", content_type="text/plain",
                                   sender=ALICE, chat_id="oc_alice")  # fmt: skip
    assert await answered(feishu, url, envelope) == "Got it."
    return saved_path(last_user(fake.requests[-1]))


async def test_another_conversation_cannot_list_read_or_overwrite_an_upload_by_any_spelling(
    tmp_path: Path, feishu: FakeFeishu, fake: FakeOpenAIServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Attack (issue 31 item 4): Bob's model lists the uploads folder, then reads and overwrites
    Alice's file by a relative path, a path through `..`, the absolute path and two symlinks
    planted in the shared area (as an allowed program could make them). Every call is refused
    with an error the model reads; Alice's file is unchanged and her own model still reads it."""
    async with media_gateway(tmp_path, feishu, fake, monkeypatch) as (url, folder):
        path = await alice_uploads(feishu, fake, url)
        alice_folder = path.rsplit("/", 1)[0]
        (folder / "shortcut").symlink_to(folder / alice_folder)  # absolute target
        (folder / "notes").mkdir()
        (folder / "notes" / "up").symlink_to(Path("..") / alice_folder)  # relative target
        attacks = [
            ("list_directory", {"path": "uploads"}),
            ("list_directory", {"path": alice_folder}),
            ("read_file", {"path": path}),
            ("read_file", {"path": f"notes/../{path}"}),
            ("read_file", {"path": str(folder / path)}),
            ("read_file", {"path": "shortcut/salary.txt"}),
            ("read_file", {"path": "notes/up/salary.txt"}),
            ("write_file", {"path": path, "content": "overwritten"}),
            ("write_file", {"path": "shortcut/salary.txt", "content": "overwritten"}),
            ("write_file", {"path": f"{alice_folder}/planted.txt", "content": "x"}),
        ]
        fake.script(
            FakeReply.parallel_tool_calls(attacks[:5]),
            FakeReply.text("I could not."),
            FakeReply.parallel_tool_calls(attacks[5:]),
            FakeReply.text("Nor now."),
            FakeReply.tool_call("read_file", {"path": path}),
            FakeReply.text("Your file says 123456."),
        )
        bob = feishu.user_message("show me what others uploaded", sender=BOB, chat_id="oc_bob")
        assert await answered(feishu, url, bob, count=2) == "I could not."
        results = tool_results(fake.requests[-1])
        bob = feishu.user_message("try harder", sender=BOB, chat_id="oc_bob")
        assert await answered(feishu, url, bob, count=3) == "Nor now."
        results += tool_results(fake.requests[-1])[-5:]
        listing = json.loads(results[0])
        assert all(entry["name"] != alice_folder.split("/")[1] for entry in listing["entries"]), listing
        for (name, arguments), result in zip(attacks[1:], results[1:], strict=True):
            assert '"error"' in result and "conversation" in result, (name, arguments, result)
            assert "123456" not in result
        assert (folder / path).read_text() == SECRET
        assert not (folder / alice_folder / "planted.txt").exists()
        again = feishu.user_message("what did my file say?", sender=ALICE, chat_id="oc_alice")
        assert await answered(feishu, url, again, count=4) == "Your file says 123456."
        assert "123456" in tool_results(fake.requests[-1])[-1]


async def test_ten_parallel_writes_with_room_for_one_accept_exactly_one(
    tmp_path: Path, feishu: FakeFeishu, fake: FakeOpenAIServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Attack (issue 31 item 12): with room for one more 1 MB file, the model writes ten at once
    (parallel tool calls run on threads of their own). The check and the write hold one lock, so
    exactly one write is accepted and the rest read the quota's error; the folder holds one file."""
    content = "x" * 1_000_000
    writes = [("write_file", {"path": f"big/{n}.txt", "content": content}) for n in range(10)]
    fake.script(FakeReply.parallel_tool_calls(writes), FakeReply.text("Tried."))
    options = {"workspace_quota_mb": 1.5, "max_tool_calls": 10}  # 1.43 MiB: room for one 1 MB file
    async with media_gateway(tmp_path, feishu, fake, monkeypatch, agent_options=options) as (url, folder):
        assert await answered(feishu, url, feishu.user_message("write ten files", sender=BOB)) == "Tried."
        results = tool_results(fake.requests[-1])
        written = sorted((folder / "big").iterdir())
    accepted = [r for r in results if '"bytes_written"' in r]
    refused = [r for r in results if "quota" in r and '"error"' in r]
    assert (len(accepted), len(refused), len(written)) == (1, 9, 1), results
    assert sum(f.stat().st_size for f in written) == 1_000_000


def released_together(space: Workspace, writes: int, content: str) -> list[dict[str, Any]]:
    """`writes` threads, released at once by a barrier, each writing `content` to a file of its own;
    the writes accepted."""
    start, accepted = threading.Barrier(writes), []

    def write(n: int) -> None:
        start.wait()
        try:
            accepted.append(space.write_file(f"{n}.txt", content))
        except ToolError:
            pass

    threads = [threading.Thread(target=write, args=(n,)) for n in range(writes)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return accepted


def test_writes_released_together_pass_the_quota_check_one_at_a_time(tmp_path: Path) -> None:
    """The same race without the gateway's timing: ten threads released at once by a barrier each
    write 1 MB with room for one (three rounds; before the lock, 5 to 9 of 10 were accepted)."""
    for round_ in range(3):
        folder = tmp_path / str(round_)
        folder.mkdir()
        space = Workspace(folder, quota_bytes=1_500_000)
        assert len(released_together(space, 10, "x" * 1_000_000)) == 1
        assert space.usage() == 1_000_000


async def test_one_conversations_uploads_cannot_fill_the_workspace_for_everyone(
    tmp_path: Path, feishu: FakeFeishu, fake: FakeOpenAIServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Attack (issue 31 item 12): Alice sends file after file. Her conversation's quota refuses the
    third (a fixed reply, no turn), while Bob, in his own conversation, can still send his."""
    options = {"workspace_quota_mb": 1.0, "workspace_conversation_quota_mb": 0.25}
    block = "a,b\n" + "1,2\n" * 25_000  # 100 KB of CSV
    fake.script(*(FakeReply.text("Saved.") for _ in range(4)))
    async with media_gateway(tmp_path, feishu, fake, monkeypatch, agent_options=options) as (url, folder):
        for n in range(1, 4):
            envelope = feishu.file_message(f"{n}{block}".encode(), f"part{n}.csv", content_type="text/csv",
                                           sender=ALICE, chat_id="oc_alice")  # fmt: skip
            told = await answered(feishu, url, envelope, count=n)
        assert told != "Saved." and "part3.csv" in told, told
        envelope = feishu.file_message(block.encode(), "mine.csv", content_type="text/csv",
                                       sender=BOB, chat_id="oc_bob")  # fmt: skip
        assert await answered(feishu, url, envelope, count=4) == "Saved."
        assert len(list((folder / "uploads").rglob("*.csv"))) == 3


@pytest.mark.skipif(sys.platform != "linux", reason="bubblewrap is Linux's")
async def test_run_command_in_the_sandbox_sees_only_its_own_conversations_uploads(tmp_path: Path) -> None:
    """Attack (issue 31 item 4, "anything else that reads the workspace"): Bob's model runs an
    allowed `cat` and `ls` on Alice's upload folder. In bubblewrap the uploads folder is an empty
    tmpfs with Bob's own folder bound back: `cat` finds nothing, `ls` shows Bob's folder alone."""
    from test_security_shell import BWRAP_PROBLEM, approve, no_answer

    if BWRAP_PROBLEM:
        pytest.skip(f"needs bubblewrap: {BWRAP_PROBLEM}")
    alice, bob = (f"uploads/{conversation_folder(f'feishu:{who}')}" for who in (ALICE, BOB))
    for folder, text in ((alice, SECRET), (bob, "bob's notes\n")):
        (tmp_path / folder).mkdir(parents=True)
        (tmp_path / folder / "notes.txt").write_text(text)
    commands = [["cat", f"{alice}/notes.txt"], ["ls", "uploads"], ["cat", f"{bob}/notes.txt"]]
    model = ScriptedModel([*(call("run_command", {"command": c}) for c in commands), reply("done")])
    tools = builtin_tools(Workspace(tmp_path), shell_allow=["cat", "ls"], shell_sandbox="bwrap")
    agent = Agent(model=model, tools=tools, permissions=Policy.from_lists(allow_irreversible=["run_command"]))
    agent.use_interactions(InlineInteractions(approve, no_answer))  # a person approves every call
    result = await agent.run("look around", session=Session(id=f"feishu:{BOB}"))
    told = [json.loads(outcome.content) for outcome in result.tool_calls]
    assert told[0]["exit_code"] != 0 and "123456" not in told[0]["output"], told[0]
    assert told[1]["output"].split() == [bob.split("/")[1]], told[1]
    assert told[2]["output"] == "bob's notes\n" and (tmp_path / alice / "notes.txt").read_text() == SECRET
