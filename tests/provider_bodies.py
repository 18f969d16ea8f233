"""The recorded provider bodies (tests/data/provider_bodies/), served by the fake endpoint as sent."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hermes_core.testing.fake_openai import FakeReply

BODIES = Path(__file__).parent / "data" / "provider_bodies"


def recorded(name: str) -> dict[str, Any]:
    return json.loads((BODIES / f"{name}.json").read_text(encoding="utf-8"))


def replay(name: str) -> FakeReply:
    """The recorded answer as the fake sends it: status, headers and body byte for byte."""
    body = recorded(name)
    return FakeReply(status=body["status"], headers=dict(body["headers"]), raw_body=body["body"])
