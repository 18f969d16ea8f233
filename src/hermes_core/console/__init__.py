"""The web console of `hermes-kernel serve` (docs/console.md): chat, task timelines, approvals, status.

Imported only by the processes that serve it, server.py's and engine/temporal/server.py's `serve`:
`mount_console` (app.py) adds the `web` channel (channel.py) to the gateway and the pages (pages.py)
under /console/, behind the access rules of access.py.
"""
