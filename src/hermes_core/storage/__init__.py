"""Embedded storage shared by the gateway, sessions, memory and task journals: one SQLite file.

`StoreUnavailable` is what a store raises when its database cannot be reached for now (PostgreSQL
restarting, its connections cut): the gateway takes it as passing — an HTTP request gets 503 with
Retry-After, a turn or a send is tried again once the database answers — never as the turn's
failure (dispatcher.py)."""

from .sqlite import SQLiteDatabase


class StoreUnavailable(ConnectionError):
    """The database cannot be reached just now; what failed may be tried again unchanged."""


__all__ = ["SQLiteDatabase", "StoreUnavailable"]
