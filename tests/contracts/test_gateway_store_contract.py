"""The contract of `GatewayStore` (gateway/store.py): what every implementation must do, through the
protocol only, so a second implementation runs this file unchanged (tests/contracts/conftest.py).

Exactly-once accept (message id per channel, event id), arrival order, the done mark atomic with
the turn's history and its replies, retries counted, dead letters kept and resent, poison counts,
pruning that never loses work, nonces, messages their senders took back (a Feishu recall), chats
the bot was removed from, and all of it surviving a reopen.

How each test was seen to fail: tests/contracts/broken_backends.py holds implementations with one
bug each (dedup by message id only, a done mark written apart from its replies, a prune that
deletes pending rows…); test_contracts_fail_when_broken.py runs this suite against them and checks
that every test here fails against at least one of them.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time

import pytest
from contract_backends import Opener

from hermes_core.channels.seam import InboundMessage, OutboundMessage
from hermes_core.gateway.dispatcher import reply_for
from hermes_core.gateway.store import GatewayStore
from hermes_core.kernel.messages import Message
from hermes_core.sessions.store import InMemorySessionStore, SessionStore, TurnAppend
from waiting import eventually

SECRET = "sk-proj1234567890abcdefghijKL"
Stores = Opener[GatewayStore]


def message(text: str, message_id: str, conversation: str = "webhook:alice", *, channel: str = "webhook",
            event_id: str | None = None) -> InboundMessage:  # fmt: skip
    return InboundMessage(
        channel, conversation, conversation.split(":")[-1], text, message_id, event_id=event_id
    )


async def accepted(
    store: GatewayStore, text: str, message_id: str, conversation: str = "webhook:alice"
) -> int:
    inbound_id = await store.accept(message(text, message_id, conversation))
    assert inbound_id is not None
    return inbound_id


async def completed(
    store: GatewayStore, text: str, message_id: str, replies: list[str], conversation: str = "webhook:alice"
) -> list[OutboundMessage]:
    """A message accepted and done, with `replies` queued: the queued replies."""
    inbound = message(text, message_id, conversation)
    inbound_id = await store.accept(inbound)
    assert inbound_id is not None
    return await store.complete(inbound_id, [reply_for(inbound, r, i) for i, r in enumerate(replies)])


async def test_accept_returns_the_row_and_sets_the_message_id(gateway_stores: Stores) -> None:
    store = gateway_stores()
    first, second = message("one", "m1"), message("two", "m2")
    one, two = await store.accept(first), await store.accept(second)
    assert one is not None and two is not None and one != two
    assert (first.id, second.id) == (one, two)


async def test_the_same_message_id_is_accepted_once_per_channel(gateway_stores: Stores) -> None:
    store = gateway_stores()
    assert await store.accept(message("hi", "m1")) is not None
    assert await store.accept(message("hi again", "m1")) is None
    assert await store.accept(message("hi", "m1", channel="feishu")) is not None  # another channel's id
    assert [m.text for m in await store.pending_inbound()] == ["hi", "hi"]


async def test_an_event_id_seen_before_is_a_duplicate_whatever_the_message_id(gateway_stores: Stores) -> None:
    store = gateway_stores()
    assert await store.accept(message("hi", "om_1", channel="feishu", event_id="ev_1")) is not None
    assert await store.accept(message("hi", "om_2", channel="feishu", event_id="ev_1")) is None
    assert await store.accept(message("hi", "om_1", channel="feishu", event_id="ev_2")) is None
    assert await store.accept(message("hi", "om_3", channel="feishu", event_id="ev_3")) is not None
    assert [m.message_id for m in await store.pending_inbound()] == ["om_1", "om_3"]


async def test_concurrent_accepts_of_one_message_make_one_row(gateway_stores: Stores) -> None:
    """A platform that pushes the same event twice at once (Feishu retries after 3 s) is answered once."""
    store = gateway_stores()
    ids = await asyncio.gather(*(store.accept(message("hi", "m1", event_id="ev")) for _ in range(20)))
    assert len([i for i in ids if i is not None]) == 1
    assert len(await store.pending_inbound()) == 1


async def test_pending_inbound_in_arrival_order_with_every_field(gateway_stores: Stores) -> None:
    store = gateway_stores()
    rich = InboundMessage(
        "feishu", "feishu:oc_1", "ou_1", "你好 👋", "om_9", event_id="ev_9", chat_id="oc_1",
        chat_type="group", reply_to="om_8", received_at=1_700_000_000.5, extra={"task_id": "t-9", "n": [1]},
        thread_id="omt_7", speaker='<at user_id="ou_1"></at>',
    )  # fmt: skip
    for i in range(5):
        await accepted(store, f"m{i}", f"id{i}", conversation=f"webhook:u{i % 2}")
    await store.accept(rich)
    found = await store.pending_inbound()
    assert [m.text for m in found] == ["m0", "m1", "m2", "m3", "m4", "你好 👋"]
    assert found[-1] == rich and found[-1].id is not None


async def test_a_reply_keeps_the_topic_of_the_message_it_answers_across_a_reopen(
    gateway_stores: Stores,
) -> None:
    """A Feishu reply in a topic goes out with `reply_in_thread` (open.feishu.cn/document/
    server-docs/im-v1/message/reply): the outbox keeps the topic until it is sent."""
    store = gateway_stores()
    asked = InboundMessage("feishu", "feishu:oc_1:omt_7", "ou_1", "hi", "om_9", chat_id="oc_1",
                           chat_type="group", reply_to="om_9", thread_id="omt_7")  # fmt: skip
    inbound_id = await store.accept(asked)
    assert inbound_id is not None
    await store.complete(inbound_id, [reply_for(asked, "hello", 0)])
    store = await gateway_stores.reopen(store)
    assert [(r.reply_to, r.thread_id) for r in await store.pending_outbound()] == [("om_9", "omt_7")]


async def test_accept_redacts_what_it_stores(gateway_stores: Stores) -> None:
    store = gateway_stores()
    inbound = message(f"my key is {SECRET}", "m1")
    inbound.extra["pasted"] = SECRET
    await store.accept(inbound)
    [stored] = await store.pending_inbound()
    assert SECRET not in json.dumps([stored.text, stored.extra]) and "my key is" in stored.text
    assert SECRET not in inbound.text  # redacted in place: nothing downstream sees it either


async def test_complete_marks_done_and_queues_the_replies_in_order(gateway_stores: Stores) -> None:
    store = gateway_stores()
    later = message("later", "m2", "webhook:bob")
    await store.accept(later)
    queued = await completed(store, "hi", "m1", ["one", "two", "three"])
    assert [r.text for r in queued] == ["one", "two", "three"]
    assert all(r.id is not None for r in queued) and len({r.id for r in queued}) == 3
    assert len({r.inbound_id for r in queued}) == 1 and queued[0].inbound_id is not None
    assert [m.message_id for m in await store.pending_inbound()] == ["m2"]
    assert [(r.id, r.text, r.uuid) for r in await store.pending_outbound()] == [
        (r.id, r.text, r.uuid) for r in queued
    ]


async def test_complete_twice_queues_nothing_twice(gateway_stores: Stores) -> None:
    """A racing duplicate run of the same message completes it again: nothing is queued twice."""
    store = gateway_stores()
    inbound = message("hi", "m1")
    inbound_id = await accepted(store, "hi", "m1")
    inbound.id = inbound_id
    runs = [store.complete(inbound_id, [reply_for(inbound, "answer", 0)]) for _ in range(5)]
    results = await asyncio.gather(*runs)
    assert sorted(len(r) for r in results) == [0, 0, 0, 0, 1]
    assert [r.text for r in await store.pending_outbound()] == ["answer"]


def turn_messages(text: str) -> list[Message]:
    return [{"role": "user", "content": text}, {"role": "assistant", "content": f"re: {text}"}]


async def complete_with_history(store: GatewayStore, sessions: SessionStore, inbound: InboundMessage,
                                turn_id: str, history: list[Message]) -> list[OutboundMessage]:  # fmt: skip
    assert inbound.id is not None
    turn = TurnAppend(sessions, inbound.conversation, turn_id, history)
    return await store.complete(inbound.id, [reply_for(inbound, "done", 0)], turn)


async def check_history_stored_once(store: GatewayStore, sessions: SessionStore) -> None:
    inbound = message("hi", "m1")
    await store.accept(inbound)
    assert len(await complete_with_history(store, sessions, inbound, "t-1", turn_messages("hi"))) == 1
    assert await complete_with_history(store, sessions, inbound, "t-1", turn_messages("hi")) == []
    assert (await sessions.load(inbound.conversation)).messages == turn_messages("hi")
    assert await store.pending_inbound() == [] and len(await store.pending_outbound()) == 1


async def test_complete_stores_the_turns_history_with_the_done_mark(
    gateway_stores: Stores, session_stores: Opener[SessionStore]
) -> None:
    """The backend's own session store: with the embedded one, the same transaction."""
    await check_history_stored_once(gateway_stores(), session_stores())


async def test_a_history_kept_in_another_store_is_stored_once(gateway_stores: Stores) -> None:
    await check_history_stored_once(gateway_stores(), InMemorySessionStore())


async def check_a_failed_complete_changes_nothing(store: GatewayStore, sessions: SessionStore) -> None:
    """All or nothing: a turn's history that cannot be stored (here: not JSON) leaves no done mark
    and no reply; the message is run again."""
    inbound = message("hi", "m1")
    await store.accept(inbound)
    unstorable: list[Message] = [{"role": "user", "content": {"not", "json"}}]
    with pytest.raises(TypeError):
        await complete_with_history(store, sessions, inbound, "t-1", unstorable)
    assert [m.message_id for m in await store.pending_inbound()] == ["m1"]
    assert await store.pending_outbound() == []
    earlier = await store.replies_of("webhook", "m1")
    assert earlier is not None and not earlier.done and earlier.replies == []


async def test_a_complete_that_fails_leaves_the_message_pending_and_queues_nothing(
    gateway_stores: Stores, session_stores: Opener[SessionStore]
) -> None:
    await check_a_failed_complete_changes_nothing(gateway_stores(), session_stores())


async def test_a_complete_whose_history_store_fails_leaves_the_message_pending(
    gateway_stores: Stores,
) -> None:
    await check_a_failed_complete_changes_nothing(gateway_stores(), InMemorySessionStore())


async def test_replies_of_tells_a_retry_whether_it_is_done_and_what_was_replied(
    gateway_stores: Stores,
) -> None:
    store = gateway_stores()
    assert await store.replies_of("webhook", "m1") is None
    inbound = message("hi", "m1")
    inbound_id = await store.accept(inbound)
    assert inbound_id is not None
    waiting = await store.replies_of("webhook", "m1")
    assert waiting is not None and not waiting.done and waiting.replies == []
    assert waiting.message.text == "hi" and waiting.message.id == inbound_id
    queued = await store.complete(inbound_id, [reply_for(inbound, "a", 0), reply_for(inbound, "b", 1)])
    done = await store.replies_of("webhook", "m1")
    assert done is not None and done.done
    assert [(r.id, r.text, r.uuid) for r in done.replies] == [(r.id, r.text, r.uuid) for r in queued]
    assert await store.replies_of("feishu", "m1") is None  # ids are per channel


async def test_a_sent_reply_leaves_the_outbox_and_is_still_read_back(gateway_stores: Stores) -> None:
    store = gateway_stores()
    first, second = await completed(store, "hi", "m1", ["one", "two"])
    assert first.id is not None
    await store.mark_sent(first.id, "om_reply_1")
    assert [r.text for r in await store.pending_outbound()] == ["two"]
    earlier = await store.replies_of("webhook", "m1")
    assert earlier is not None and [r.text for r in earlier.replies] == ["one", "two"]


async def test_failed_attempts_are_counted(gateway_stores: Stores) -> None:
    store = gateway_stores()
    [reply] = await completed(store, "hi", "m1", ["one"])
    assert reply.id is not None and (await store.pending_outbound())[0].attempts == 0
    await store.record_attempt(reply.id, "ConnectionError: refused")
    await store.record_attempt(reply.id, "ConnectionError: refused")
    [pending] = await store.pending_outbound()
    assert pending.id == reply.id and pending.attempts == 2


async def test_a_dead_letter_leaves_the_outbox_and_is_listed_with_why(gateway_stores: Stores) -> None:
    store = gateway_stores()
    [first] = await completed(store, "hi", "m1", ["one"])
    [second] = await completed(store, "hey", "m2", ["two"], "webhook:bob")
    assert first.id is not None and second.id is not None
    await store.record_attempt(first.id, "timeout")
    await store.dead_letter(first.id, f"DeliveryError: chat gone {SECRET}")
    await store.dead_letter(second.id, "DeliveryError: bot removed")
    assert await store.pending_outbound() == []
    dead = await store.dead_letters()
    assert [d["outbox_id"] for d in dead] == [second.id, first.id]  # newest first
    oldest = dead[1]
    assert (oldest["channel"], oldest["conversation"], oldest["attempts"]) == ("webhook", "webhook:alice", 1)
    assert "chat gone" in oldest["error"] and SECRET not in oldest["error"]
    assert json.loads(oldest["payload"])["text"] == "one" and oldest["resend_requested_at"] is None
    assert [d["outbox_id"] for d in await store.dead_letters(limit=1)] == [second.id]
    assert (await store.counts())["dead_letters"] == 2


async def test_a_reply_never_queued_here_is_one_dead_letter_per_uuid(gateway_stores: Stores) -> None:
    """A workflow engine sends its replies itself: the one it gives up on may have no outbox row."""
    store = gateway_stores()
    lost = OutboundMessage("webhook", "webhook:alice", f"lost {SECRET}", "m1:0", message_id="m1", attempts=3)
    first = await store.dead_letter_reply(lost, "HTTP 500")
    # given up on again (a step run again), and by two workers at once: still one dead letter
    again = await asyncio.gather(
        *(store.dead_letter_reply(dataclasses.replace(lost), "HTTP 502") for _ in range(5))
    )
    assert again == [first] * 5
    other = await store.dead_letter_reply(dataclasses.replace(lost, uuid="m1:1", text="two"), "HTTP 500")
    assert other != first
    dead = {d["outbox_id"]: d for d in await store.dead_letters()}
    assert sorted(dead) == sorted([first, other]) and await store.pending_outbound() == []
    kept = dead[first]
    assert (kept["channel"], kept["conversation"], kept["attempts"], kept["error"]) == (
        "webhook", "webhook:alice", 3, "HTTP 502",
    )  # fmt: skip
    assert SECRET not in kept["payload"] and json.loads(kept["payload"])["uuid"] == "m1:0"
    # one that was queued here: its own row, with the attempts the sender counted
    [queued] = await completed(store, "hi", "m2", ["three"])
    assert queued.id is not None
    assert await store.dead_letter_reply(dataclasses.replace(queued, attempts=4), "gone") == queued.id
    assert {d["outbox_id"]: d["attempts"] for d in await store.dead_letters()}[queued.id] == 4
    store = await gateway_stores.reopen(store)
    assert await store.dead_letter_reply(lost, "HTTP 503") == first  # also after a restart
    assert (await store.counts())["dead_letters"] == 3
    revived = await store.resend(first)
    assert revived is not None and (revived.uuid, revived.message_id) == ("m1:0", "m1")


async def test_resend_puts_a_dead_letter_back_once_with_its_uuid(gateway_stores: Stores) -> None:
    store = gateway_stores()
    [reply] = await completed(store, "hi", "m1", ["one"])
    assert reply.id is not None
    await store.record_attempt(reply.id, "boom")
    await store.dead_letter(reply.id, "boom")
    again = await store.resend(reply.id)
    assert again is not None and (again.id, again.uuid, again.text, again.attempts) == (
        reply.id,
        reply.uuid,
        "one",
        0,
    )
    assert await store.dead_letters() == []
    assert [(r.id, r.attempts) for r in await store.pending_outbound()] == [(reply.id, 0)]
    assert await store.resend(reply.id) is None  # no longer a dead letter
    assert await store.resend(reply.id + 1000) is None


async def test_a_resend_requested_elsewhere_is_claimed_once(gateway_stores: Stores) -> None:
    store = gateway_stores()
    [reply] = await completed(store, "hi", "m1", ["one"])
    [kept] = await completed(store, "hey", "m2", ["two"], "webhook:bob")
    assert reply.id is not None and kept.id is not None
    await store.dead_letter(reply.id, "boom")
    await store.dead_letter(kept.id, "boom")
    assert await store.claim_resends() == []  # nothing asked yet
    assert await store.request_resend(reply.id) is True
    assert await store.request_resend(reply.id + 1000) is False
    assert (await store.dead_letters(limit=None))[-1]["resend_requested_at"] is not None
    claimed = await store.claim_resends()
    assert [(r.id, r.uuid) for r in claimed] == [(reply.id, reply.uuid)]
    assert await store.claim_resends() == []
    assert [d["outbox_id"] for d in await store.dead_letters()] == [kept.id]
    assert [r.id for r in await store.pending_outbound()] == [reply.id]


async def test_runs_are_counted_and_a_graceful_stop_takes_its_count_back(gateway_stores: Stores) -> None:
    store = gateway_stores()
    crashing = await accepted(store, "boom", "m1")
    other = await accepted(store, "fine", "m2")
    assert await store.begin_attempt(crashing) == 1
    assert await store.begin_attempt(crashing) == 2
    assert await store.begin_attempt(other) == 1
    await store.release_attempt(other)  # a graceful stop interrupted it: no crash
    assert await store.begin_attempt(other) == 1
    found = await store.crashed_inbound(2)
    assert [(m.message_id, m.id, n) for m, n in found] == [("m1", crashing, 2)]
    assert [m.message_id for m, _ in await store.crashed_inbound(1)] == ["m1", "m2"]
    await store.complete(crashing, [])
    assert await store.crashed_inbound(1) == [(m, 1) for m in await store.pending_inbound()]


async def test_set_aside_stops_a_message_and_queues_its_reply(gateway_stores: Stores) -> None:
    store = gateway_stores()
    poison = message("boom", "m1")
    poison_id = await store.accept(poison)
    assert poison_id is not None
    await accepted(store, "next", "m2")
    await store.begin_attempt(poison_id)
    await store.begin_attempt(poison_id)
    queued = await store.set_aside(poison_id, "took the process down twice", [reply_for(poison, "sorry", 0)])
    assert [r.text for r in queued] == ["sorry"] and queued[0].id is not None
    assert [m.message_id for m in await store.pending_inbound()] == ["m2"]
    assert await store.crashed_inbound(1) == []
    assert [r.text for r in await store.pending_outbound()] == ["sorry"]
    assert await store.set_aside(poison_id, "again", [reply_for(poison, "sorry", 0)]) == []
    assert await store.complete(poison_id, [reply_for(poison, "late", 0)]) == []
    assert (await store.counts())["set_aside"] == 1


async def test_counts_are_the_queue_depths(gateway_stores: Stores) -> None:
    store = gateway_stores()
    assert await store.counts() == {
        "inbox_pending": 0,
        "outbox_pending": 0,
        "dead_letters": 0,
        "set_aside": 0,
    }
    await accepted(store, "waiting", "m1")
    first, second = await completed(store, "hi", "m2", ["one", "two"])
    assert first.id is not None and second.id is not None
    await store.dead_letter(first.id, "boom")
    await store.mark_sent(second.id, None)
    await completed(store, "hey", "m3", ["three"])
    assert await store.counts() == {
        "inbox_pending": 1,
        "outbox_pending": 1,
        "dead_letters": 1,
        "set_aside": 0,
    }


async def test_prune_forgets_finished_rows_and_dedup_keys_but_never_work(gateway_stores: Stores) -> None:
    store = gateway_stores()
    waiting = await accepted(store, "still to answer", "m1")
    [sent] = await completed(store, "hi", "m2", ["sent one"])
    [unsent] = await completed(store, "hey", "m3", ["unsent one"])
    assert sent.id is not None
    await store.mark_sent(sent.id, None)
    await store.accept(message("ev", "m4", event_id="ev_4"))
    await store.prune(time.time() - 3600)  # nothing is that old
    assert await store.accept(message("hi", "m2")) is None
    await store.prune(time.time() + 3600)  # everything finished is
    assert [(m.id, m.message_id) for m in await store.pending_inbound()][:1] == [(waiting, "m1")]
    assert [m.message_id for m in await store.pending_inbound()] == ["m1", "m4"]
    assert [r.id for r in await store.pending_outbound()] == [unsent.id]
    assert await store.replies_of("webhook", "m2") is None
    assert await store.accept(message("hi, months later", "m2")) is not None  # its key was forgotten
    assert await store.accept(message("ev", "m5", event_id="ev_4")) is not None


async def test_a_nonce_is_claimed_once_per_channel_until_it_expires(gateway_stores: Stores) -> None:
    store = gateway_stores()
    assert await store.claim_nonce("webhook", "sig-1", 3600) is True
    assert await store.claim_nonce("webhook", "sig-1", 3600) is False
    assert await store.claim_nonce("feishu", "sig-1", 3600) is True
    claims = await asyncio.gather(*(store.claim_nonce("webhook", "sig-2", 3600) for _ in range(10)))
    assert claims.count(True) == 1
    assert await store.claim_nonce("webhook", "short", 0.05) is True
    # False until its time is past (on the store's clock), then claimed again
    await eventually(lambda: store.claim_nonce("webhook", "short", 0.05), 10, "the nonce to be forgotten")


async def test_everything_survives_a_reopen(gateway_stores: Stores) -> None:
    store = gateway_stores()
    waiting = await accepted(store, "hi", "m1")
    await store.begin_attempt(waiting)
    await store.accept(message("ev", "m2", event_id="ev_2"))
    [unsent] = await completed(store, "hey", "m3", ["unsent"])
    [dead] = await completed(store, "yo", "m4", ["dead"])
    assert dead.id is not None
    await store.dead_letter(dead.id, "boom")
    await store.claim_nonce("webhook", "sig", 3600)
    store = await gateway_stores.reopen(store)
    assert [m.message_id for m in await store.pending_inbound()] == ["m1", "m2"]
    assert [(m.id, n) for m, n in await store.crashed_inbound(1)] == [(waiting, 1)]
    assert [(r.id, r.uuid) for r in await store.pending_outbound()] == [(unsent.id, unsent.uuid)]
    assert [d["outbox_id"] for d in await store.dead_letters()] == [dead.id]
    assert await store.accept(message("hi", "m1")) is None
    assert await store.accept(message("ev", "m9", event_id="ev_2")) is None
    assert await store.claim_nonce("webhook", "sig", 3600) is False


async def test_a_withdrawn_message_is_not_run_and_one_withdrawn_before_it_came_is_a_duplicate(
    gateway_stores: Stores,
) -> None:
    """A Feishu recall (open.feishu.cn/document/server-docs/im-v1/message/events/recalled): the
    message is not answered if its turn has not started; once started, its reply stays."""
    store = gateway_stores()
    waiting = await accepted(store, "never mind", "m1", "feishu:oc_1")
    running = await accepted(store, "answer me", "m2", "feishu:oc_1")
    assert await store.begin_attempt(running) == 1
    assert await store.withdraw("webhook", "m1", "feishu:oc_1") is True
    assert await store.withdraw("webhook", "m2", "feishu:oc_1") is False  # its turn started
    assert await store.begin_attempt(waiting) == 0  # not run
    assert [m.message_id for m in await store.pending_inbound()] == ["m2"]
    assert await store.withdraw("webhook", "m3", "feishu:oc_1") is True  # before it came
    assert await store.accept(message("late", "m3", "feishu:oc_1")) is None
    store = await gateway_stores.reopen(store)
    assert [m.message_id for m in await store.pending_inbound()] == ["m2"]
    assert await store.withdraw("webhook", "m1", "feishu:oc_1") is False  # once
    assert await store.accept(message("late", "m3", "feishu:oc_1")) is None
    await store.prune(time.time() + 3600)
    assert await store.accept(message("weeks later", "m3", "feishu:oc_1")) is not None


async def test_a_chat_the_bot_left_is_remembered_until_it_is_added_again(gateway_stores: Stores) -> None:
    """Feishu's bot removed / added events (open.feishu.cn/document/server-docs/group/chat-member/
    event/deleted-2, …/added-2): nothing is sent to a chat the bot left, across a restart; a late
    redelivery of an older change (the platform pushes at least once) changes nothing."""
    store = gateway_stores()
    assert await store.chat_left("feishu", "oc_1") is False
    await store.set_chat_left("feishu", "oc_1", True, 2000.0)
    await store.set_chat_left("feishu", "oc_1", True, 2000.0)
    assert await store.chat_left("feishu", "oc_1") is True
    assert await store.chat_left("feishu", "oc_2") is False
    assert await store.chat_left("webhook", "oc_1") is False
    store = await gateway_stores.reopen(store)
    assert await store.chat_left("feishu", "oc_1") is True
    await store.set_chat_left("feishu", "oc_1", False, 1000.0)  # an addition before the removal
    assert await store.chat_left("feishu", "oc_1") is True
    await store.set_chat_left("feishu", "oc_1", False, 3000.0)
    assert await store.chat_left("feishu", "oc_1") is False
    await store.set_chat_left("feishu", "oc_1", True, 2000.0)  # the removal again, late
    assert await store.chat_left("feishu", "oc_1") is False
