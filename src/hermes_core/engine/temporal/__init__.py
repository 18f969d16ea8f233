"""`engine: temporal`: one durable workflow per conversation (docs/scale-out.md, "Temporal").

- `workflow.py`: `ConversationWorkflow` — messages arrive by signal-with-start, duplicates are
  dropped, one turn runs at a time in arrival order; the turn is the kernel's own `run_loop`, its
  model and tool calls made activities; approvals and questions are waited for in the workflow.
- `activities.py`: the steps a `worker` runs with the configured agent: prepare a task, call the
  model, run one tool call, answer a command, record a turn, an approval or a dead letter, send
  one reply.
- `state.py`: what the engine keeps in PostgreSQL (`database.url`), in the embedded engine's rows:
  conversations, long-term memory, traces, approvals, dead letters.
- `client.py`: what `serve` uses instead of the SQLite inbox (`TemporalInbox`), and the connection.
- `worker.py`: `hermes-kernel worker`; `server.py`: `hermes-kernel serve` with `engine: temporal`, its
  console and /metrics.

Nothing here is imported by `import hermes_core`; `temporalio` is imported by these modules only
(the `temporal` extra).
"""
