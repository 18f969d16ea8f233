"""The floor for webhook acks: a bare aiohttp.web endpoint that reads the body and answers
{"msg": "success"} -- no decryption, no signature check, no storage.

    python bare_ack_server.py

prints one line ``READY http://127.0.0.1:PORT/feishu/events`` and serves until SIGTERM or SIGINT.
"""

import asyncio
import signal

from aiohttp import web


async def events(request: web.Request) -> web.Response:
    await request.read()
    return web.json_response({"msg": "success"})


async def main() -> None:
    app = web.Application(client_max_size=2 * 1024 * 1024)
    app.add_routes([web.post("/feishu/events", events)])
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    host, port = runner.addresses[0][:2]
    print(f"READY http://{host}:{port}/feishu/events", flush=True)
    try:
        await stop.wait()
    finally:
        await runner.cleanup()


if __name__ == "__main__":
    asyncio.run(main())
