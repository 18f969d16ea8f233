"""The contract of `SessionStore` (sessions/store.py), through the protocol only: run for every
registered backend (tests/contracts/conftest.py), the embedded SQLite store and the in-memory one.

A conversation is an append-only log plus its state: appends kept in order and per conversation, a
turn appended once by its id and its reply read back by it, the window after `state.folded`,
read-modify-write state updates that never lose one another and write nothing when they fail,
`/forget` clearing the notes, copies handed out (never the stored objects), secrets redacted,
everything there after a reopen.

How each test was seen to fail: tests/contracts/broken_backends.py has session stores with one bug
each (a turn id ignored, the window ignored, an update that reads, yields and writes…), and
test_contracts_fail_when_broken.py checks that each test here fails against one of them.
"""

from __future__ import annotations

import asyncio
import time

import pytest
from contract_backends import Opener

from hermes_core.kernel.messages import Message
from hermes_core.memory.conversation import ConversationMemory
from hermes_core.sessions.store import ConversationState, SessionStore

SECRET = "sk-proj1234567890abcdefghijKL"
Stores = Opener[SessionStore]


def turn(text: str) -> list[Message]:
    return [{"role": "user", "content": text}, {"role": "assistant", "content": f"re: {text}"}]


async def test_a_new_conversation_is_empty(session_stores: Stores) -> None:
    store = session_stores()
    await store.append("webhook:somebody", turn("hi"))
    await store.update_state("webhook:somebody", lambda s: s.facts.append("theirs"))
    loaded = await store.load("webhook:nobody")
    assert loaded.id == "webhook:nobody" and loaded.messages == [] and loaded.state == ConversationState()


async def test_appends_are_kept_in_order_and_per_conversation(session_stores: Stores) -> None:
    store = session_stores()
    await store.append("a", turn("一"))
    await store.append("b", turn("other"))
    result: Message = {"role": "tool", "tool_call_id": "c1", "content": '{"n": 2}'}
    await store.append("a", [*turn("two"), result])
    assert (await store.load("a")).messages == [*turn("一"), *turn("two"), result]
    assert (await store.load("b")).messages == turn("other")


async def test_a_turn_is_appended_once_by_its_id(session_stores: Stores) -> None:
    store = session_stores()
    assert await store.append("a", turn("one"), turn_id="t-1") is True
    # the same turn, stored again after a crash: nothing added, and the caller is told
    assert await store.append("a", turn("one"), turn_id="t-1") is False
    assert await store.append("a", turn("two"), turn_id="t-2") is True
    # another conversation's turn ids are its own
    assert await store.append("b", turn("one"), turn_id="t-1") is True
    assert await store.append("a", turn("untracked")) is True
    assert await store.append("a", turn("untracked")) is True  # no id: appended every time
    assert (await store.load("a")).messages == turn("one") + turn("two") + turn("untracked") * 2
    assert (await store.load("b")).messages == turn("one")


async def test_a_turns_reply_is_read_back_by_its_id(session_stores: Stores) -> None:
    store = session_stores()
    await store.append("a", turn("one"), turn_id="t-1")
    await store.append("a", turn("two"), turn_id="t-2")
    await store.append("b", turn("other"), turn_id="t-1")
    ends_with_a_call: list[Message] = [
        {"role": "user", "content": "three"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function"}]},
    ]
    await store.append("a", ends_with_a_call, turn_id="t-3")
    await store.append("a", turn("untracked"))
    assert await store.turn_reply("a", "t-1") == "re: one"  # not the conversation's last reply
    assert await store.turn_reply("a", "t-2") == "re: two"
    assert await store.turn_reply("b", "t-1") == "re: other"
    assert await store.turn_reply("a", "t-3") is None  # its last message is not a reply
    assert await store.turn_reply("a", "t-9") is None and await store.turn_reply("c", "t-1") is None
    store = await session_stores.reopen(store)
    assert await store.turn_reply("a", "t-2") == "re: two"


async def test_concurrent_appends_of_one_turn_store_it_once(session_stores: Stores) -> None:
    store = session_stores()
    stored = await asyncio.gather(*(store.append("a", turn("one"), turn_id="t-1") for _ in range(10)))
    assert sorted(stored) == [False] * 9 + [True]  # exactly one of them added it
    # ten turns of one conversation at once (in PostgreSQL they race for the same numbers)
    await asyncio.gather(*(store.append("a", turn(f"n{i}"), turn_id=f"u-{i}") for i in range(10)))
    messages = (await store.load("a")).messages
    assert messages[:2] == turn("one") and len(messages) == 2 + 20
    assert sorted(m["content"] for m in messages[2::2]) == sorted(f"n{i}" for i in range(10))


async def test_load_returns_only_the_messages_after_the_folded_ones(session_stores: Stores) -> None:
    store = session_stores()
    for text in ("one", "two", "three"):
        await store.append("a", turn(text))
    await store.update_state("a", lambda state: setattr(state, "folded", 4))
    loaded = await store.load("a")
    assert loaded.messages == turn("three") and loaded.state.folded == 4
    await store.append("a", turn("four"))
    assert (await store.load("a")).messages == turn("three") + turn("four")


async def test_state_updates_read_modify_write_and_return_the_new_state(session_stores: Stores) -> None:
    store = session_stores()
    first = await store.update_state("a", lambda s: s.facts.append("预算 ≤ 5000"))
    second = await store.update_state("a", lambda s: s.pending.append("send the report"))
    assert first.facts == ["预算 ≤ 5000"] and first.pending == []
    assert second.facts == ["预算 ≤ 5000"] and second.pending == ["send the report"]
    assert (await store.load("a")).state == second and (await store.load("b")).state == ConversationState()


async def test_concurrent_state_updates_never_lose_one_another(session_stores: Stores) -> None:
    store = session_stores()

    async def add(fact: str) -> None:
        await store.update_state("a", lambda s: s.facts.append(fact))

    await asyncio.gather(*(add(f"fact {i}") for i in range(20)))
    assert sorted((await store.load("a")).state.facts) == sorted(f"fact {i}" for i in range(20))


async def test_a_failing_state_change_writes_nothing(session_stores: Stores) -> None:
    store = session_stores()
    await store.update_state("a", lambda s: s.facts.append("kept"))

    def clear_then_fail(state: ConversationState) -> None:
        state.facts.clear()
        raise ZeroDivisionError

    with pytest.raises(ZeroDivisionError):
        await store.update_state("a", clear_then_fail)
    assert (await store.load("a")).state.facts == ["kept"]


async def test_what_is_handed_out_is_a_copy(session_stores: Stores) -> None:
    store = session_stores()
    mine = turn("one")
    await store.append("a", mine)
    mine[0]["content"] = "changed after the append"
    loaded = await store.load("a")
    loaded.messages[1]["content"] = "changed after the load"
    loaded.messages.append({"role": "user", "content": "extra"})
    loaded.state.facts.append("not stored")
    returned = await store.update_state("a", lambda s: s.facts.append("stored"))
    returned.facts.append("not stored either")
    again = await store.load("a")
    assert again.messages == turn("one") and again.state.facts == ["stored"]


async def test_forget_clears_the_notes_and_keeps_the_log(session_stores: Stores) -> None:
    """`/forget` (memory/conversation.py) works through the protocol alone."""
    store = session_stores()
    memory = ConversationMemory(store)
    await store.append("a", turn("budget"))
    await memory.remember("a", "budget ≤ 5000")
    await memory.remember("a", "email the report", kind="pending")
    assert await memory.command("a", "/forget 1", "en") is not None
    assert (await store.load("a")).state.facts == [] and (await store.load("a")).state.pending == [
        "email the report"
    ]
    assert await memory.command("a", "/forget", "en") is not None
    state = (await store.load("a")).state
    assert (state.facts, state.pending, state.done, state.summary) == ([], [], [], "")
    assert (await store.load("a")).messages == turn("budget")


async def test_what_is_stored_is_redacted(session_stores: Stores) -> None:
    store = session_stores()
    await store.append("a", [{"role": "user", "content": f"my key is {SECRET}"}])
    await store.update_state("a", lambda s: s.facts.append(f"key {SECRET}"))
    loaded = await store.load("a")
    assert SECRET not in str(loaded.messages) and "my key is" in loaded.messages[0]["content"]
    assert SECRET not in str(loaded.state.facts) and loaded.state.facts[0].startswith("key ")


async def test_everything_survives_a_reopen(session_stores: Stores) -> None:
    store = session_stores()
    await store.append("a", turn("one"), turn_id="t-1")
    await store.update_state("a", lambda s: s.facts.append("kept"))
    store = await session_stores.reopen(store)
    await store.append("a", turn("one"), turn_id="t-1")  # still known: not added again
    loaded = await store.load("a")
    assert loaded.messages == turn("one") and loaded.state.facts == ["kept"]


async def stored_before_and_after(store: SessionStore) -> float:
    """A cut between what was stored so far and what comes next (stored times are the real clock)."""
    await asyncio.sleep(0.02)  # the stores take no clock: time must pass on the real one
    cut = time.time()
    await asyncio.sleep(0.02)
    return cut


async def test_prune_deletes_older_messages_and_forgets_idle_conversations(session_stores: Stores) -> None:
    """`memory.retention_days`: what was stored before the cut goes; a conversation still in use
    keeps its newer messages and its notes; one idle since the cut is forgotten entirely."""
    store = session_stores()
    await store.append("a", turn("old"), turn_id="t-1")
    await store.update_state("a", lambda s: s.facts.append("fact"))
    await store.append("b", turn("idle"))
    await store.update_state("b", lambda s: s.facts.append("idle fact"))
    cut = await stored_before_and_after(store)
    await store.append("a", turn("new"), turn_id="t-2")
    assert await store.prune(cut) == 4
    a, b = await store.load("a"), await store.load("b")
    assert a.messages == turn("new") and a.state.facts == ["fact"]
    assert b.messages == [] and b.state == ConversationState()


async def test_after_a_prune_the_window_goes_on_after_what_was_deleted(session_stores: Stores) -> None:
    """The window is the messages after `state.folded`: deleting older ones, folded or not, must not
    bring folded ones back or hide new ones, when the conversation folds again or starts afresh."""
    store = session_stores()
    await store.append("a", turn("one") + turn("two") + turn("three"))
    await store.update_state("a", lambda s: setattr(s, "folded", 2))  # "one" was folded
    cut = await stored_before_and_after(store)
    await store.append("a", turn("four") + turn("five"))
    assert await store.prune(cut) == 6
    assert (await store.load("a")).messages == turn("four") + turn("five")
    await store.update_state("a", lambda s: setattr(s, "folded", s.folded + 2))  # "four" folded now
    assert (await store.load("a")).messages == turn("five")


async def test_a_conversation_whose_messages_all_went_shows_its_next_turn(session_stores: Stores) -> None:
    """Every message older than the cut, the notes changed since: the notes stay, and the turn
    appended next is in the window (not numbered below the old fold)."""
    store = session_stores()
    await store.append("c", turn("x") + turn("y"))
    await store.update_state("c", lambda s: setattr(s, "folded", 4))
    cut = await stored_before_and_after(store)
    await store.update_state("c", lambda s: s.facts.append("kept"))
    assert await store.prune(cut) == 4
    await store.append("c", turn("z"))
    loaded = await store.load("c")
    assert loaded.messages == turn("z") and loaded.state.facts == ["kept"]
