"""Engines that run the gateway's turns. `embedded` is gateway/ itself (one process, SQLite);
`temporal/` runs each conversation as a durable Temporal workflow, so that any number of `serve`
nodes can take events and any number of `worker` nodes run the turns (docs/scale-out.md)."""
