"""The stores in PostgreSQL, for several gateway nodes sharing one database (`database.url`).

Each module mirrors an embedded SQLite store, with the same public methods and guarantees, and
holds up when several processes use the database at once:

- `database.py`: `PostgresDatabase`, one connection pool per URL per process, opened on first use;
  `redacted_url` for logs; `server_check` for `hermes-kernel doctor`.
- `migrations.py`: the versioned schema of every component, applied under a lock.
- `gateway.py`: `PostgresGatewayStore` (inbox, outbox, dead letters, set-aside, replay window,
  the per-conversation turn claim that keeps one turn in flight across nodes, and the messages no
  node is running that every node's sweep takes up).
- `quota.py`: `SharedSendQuota`, Feishu's send limits (the app's per second and per minute, each
  chat's) counted for every node and worker of the app together.
- `sessions.py`, `longterm.py`, `journal.py`, `pending.py`, `traces.py`: conversations, long-term
  memory, task journals, approvals and questions, traces.

Which stores a process uses, these or the SQLite ones, is chosen in one place: hermes_core/stores.py.

The driver (psycopg 3, the `postgres` extra) is imported only when a store is used.
"""
