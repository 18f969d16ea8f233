"""`python -m hermes_core.testing.fake_feishu --serve`: the fake platform as a program, to see the
Feishu path by hand without a real app.

It serves the fake open API on 127.0.0.1, prints its base URL and the environment that points a bot
at it, then reads standard input: each line is sent to the bot as a person's p2p text message — to
the bot's event URL (`--bot-url`, webhook mode) or, without one, over the long connection the bot
opens (longconn mode). The bot's messages are printed as they arrive, once their text has stopped
changing (a streamed card is shown when complete, and again if it is edited later). End of input
(Ctrl-D), SIGINT or SIGTERM stops it.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
import threading

from . import FakeFeishu

SETTLED = 0.5  # seconds a bot message's text must stay the same before it is shown


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m hermes_core.testing.fake_feishu",
        description="A fake Feishu platform on 127.0.0.1, with a prompt for messages a person sends.",
    )
    parser.add_argument("--serve", action="store_true", help="start the fake and the prompt")
    parser.add_argument("--port", type=int, default=0, help="port to listen on (default: a free one)")
    parser.add_argument("--bot-url", help="the bot's event URL, e.g. http://127.0.0.1:8080/feishu/events "
                        "(none: events go over the long connection)")  # fmt: skip
    parser.add_argument("--app-id", default="cli_fake")
    parser.add_argument("--app-secret", default="fake-secret")
    parser.add_argument("--verification-token", default="fake-vt")
    parser.add_argument("--user", default="ou_user1", help="the open_id messages are sent as")
    parser.add_argument("--chat", default="oc_chat1", help="the p2p chat's id")
    args = parser.parse_args(argv)
    if not args.serve:
        parser.error("nothing to do: add --serve")
    return args


def environment(feishu: FakeFeishu, bot_url: str | None) -> list[str]:
    """The lines that point a bot at this fake (for its environment or `.env`)."""
    return [
        f"FEISHU_BASE_URL={feishu.base_url}",
        f"FEISHU_APP_ID={feishu.app_id}",
        f"FEISHU_APP_SECRET={feishu.app_secret}",
        f"FEISHU_VERIFICATION_TOKEN={feishu.verification_token}",
        f"FEISHU_MODE={'webhook' if bot_url else 'longconn'}",
    ]


async def show_replies(feishu: FakeFeishu, chat: str) -> None:
    """Print each bot message in `chat` once its text has settled; again when it changes later."""
    shown: dict[str, str] = {}
    seen: dict[str, tuple[str, float]] = {}
    loop = asyncio.get_running_loop()
    while True:
        await asyncio.sleep(0.1)
        for message in feishu.messages_in(chat):
            text, now = message.text, loop.time()
            if seen.get(message.message_id, ("", 0.0))[0] != text:
                seen[message.message_id] = (text, now)
            elif shown.get(message.message_id) != text and now - seen[message.message_id][1] >= SETTLED:
                label = "bot" if message.message_id not in shown else "bot (edited)"
                shown[message.message_id] = text
                print(f"\n{label}: {text}\n> ", end="", flush=True)


async def prompt(feishu: FakeFeishu, args: argparse.Namespace) -> None:
    """Send each line of standard input as the user's message, until its end."""
    lines: asyncio.Queue[str | None] = asyncio.Queue()
    loop = asyncio.get_running_loop()

    def read() -> None:  # a daemon thread: a blocked read never holds up the exit
        for line in iter(sys.stdin.readline, ""):
            loop.call_soon_threadsafe(lines.put_nowait, line)
        loop.call_soon_threadsafe(lines.put_nowait, None)

    threading.Thread(target=read, name="fake-feishu-stdin", daemon=True).start()
    while True:
        print("> ", end="", flush=True)
        line = await lines.get()
        if line is None:
            return
        if not line.strip():
            continue
        envelope = feishu.user_message(line, chat_id=args.chat, sender=args.user)
        if args.bot_url:
            feishu.deliver(envelope, args.bot_url)
        else:
            await feishu.ws_deliver(envelope)


async def serve(args: argparse.Namespace) -> None:
    fake = FakeFeishu(app_id=args.app_id, app_secret=args.app_secret,
                      verification_token=args.verification_token, port=args.port)  # fmt: skip
    async with fake as feishu:
        print(f"fake Feishu serving on {feishu.base_url}")
        print("Point the bot at it (its environment or .env):")
        print("\n".join(f"  {line}" for line in environment(feishu, args.bot_url)))
        where = f"POSTed to {args.bot_url}" if args.bot_url else "sent over the bot's long connection"
        print(f"Each line you type is a message from {args.user} in chat {args.chat}, {where}; "
              "Ctrl-D ends.", flush=True)  # fmt: skip
        stopping = asyncio.get_running_loop().create_future()
        for sig in (signal.SIGTERM, signal.SIGINT):
            try:
                asyncio.get_running_loop().add_signal_handler(sig, stopping.cancel)
            except NotImplementedError:  # Windows: Ctrl+C raises KeyboardInterrupt instead
                pass
        watcher = asyncio.create_task(show_replies(feishu, args.chat))
        typing = asyncio.create_task(prompt(feishu, args))
        await asyncio.wait([typing, stopping], return_when=asyncio.FIRST_COMPLETED)
        watcher.cancel()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        asyncio.run(serve(args))
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
