"""Test doubles shipped with the package: a scripted model and a fake OpenAI-compatible server.

`ScriptedModel` is imported from here directly; the fake HTTP server lives in
`hermes_core.testing.fake_openai` so that importing this package does not import aiohttp.
"""

from .scripted import ScriptedModel, call, reply

__all__ = ["ScriptedModel", "call", "reply"]
