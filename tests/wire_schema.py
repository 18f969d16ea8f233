"""Validate what we send against the published OpenAI chat-completions request schema."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

import jsonschema

from hermes_core.testing.fake_openai import RecordedRequest

SCHEMAS = Path(__file__).resolve().parent / "data" / "openai_chat_completions_schemas.json"


@cache
def request_validator() -> jsonschema.protocols.Validator:
    document = json.loads(SCHEMAS.read_text(encoding="utf-8"))
    schemas = document["schemas"]
    # refs in the file point at "#/components/schemas/X": serve them from a root that has that shape
    root = {"components": {"schemas": schemas}, **schemas["CreateChatCompletionRequest"]}
    cls = jsonschema.validators.validator_for(root)
    return cls(root)


def assert_valid_requests(requests: list[RecordedRequest]) -> None:
    validator = request_validator()
    for request in requests:
        errors = sorted(validator.iter_errors(request.body), key=str)
        assert not errors, f"request body does not match CreateChatCompletionRequest: {errors[0].message}"
