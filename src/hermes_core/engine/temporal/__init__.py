"""`engine: temporal`: one durable workflow per conversation (docs/scale-out.md, "Temporal").

- `workflow.py`: `ConversationWorkflow` — messages arrive by signal-with-start, duplicates are
  dropped, one turn runs at a time in arrival order; the turn is the kernel's own `run_loop`, its
  model and tool calls made activities; approvals and questions are waited for in the workflow.
- `activities.py`: the steps a `worker` runs with the configured agent: prepare a task, call the
  model, run one tool call, send one reply.
- `client.py`: what `serve` uses instead of the SQLite inbox (`TemporalInbox`), and the connection.
- `worker.py`: `hermes-core worker`; `server.py`: `hermes-core serve` with `engine: temporal`.

Nothing here is imported by `import hermes_core`; `temporalio` is imported by these modules only
(the `temporal` extra).
"""
