"""Embedded storage shared by the gateway, sessions, memory and task journals: one SQLite file."""

from .sqlite import SQLiteDatabase

__all__ = ["SQLiteDatabase"]
