"""Scheduled and proactive tasks: jobs (`jobs.py`), the chat tools (`tools.py`); the SQLite store and
the firing loop live with the gateway (gateway/schedules.py). docs/scheduling.md has the details."""
