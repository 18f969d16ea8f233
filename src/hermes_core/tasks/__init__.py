"""Durable task state: the journal that lets an interrupted task resume instead of starting over."""

from .journal import SQLiteTaskJournal, TaskJournal

__all__ = ["SQLiteTaskJournal", "TaskJournal"]
