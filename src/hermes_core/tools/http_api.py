"""A team's HTTP API as tools: declared in YAML (`apis:`), by hand or by an OpenAPI 3 document.

Each operation becomes one tool. Its parameters are the operation's path and query parameters
(header and cookie parameters are the operator's business, not the model's) and, for a JSON request
body, a `body` parameter with the body's schema; every `$ref` is resolved first. Its name is the
`operationId` (characters the model API refuses become `_`), its description the summary and
description, its level comes from the method (GET/HEAD 0, POST/PUT/PATCH 1, DELETE 2) unless
`levels` says otherwise.

The credential (`auth`: a header or a query parameter, its value read from an environment variable)
is added when the request is sent. It is in no schema, so the model never writes it; it is added to
the process's redactor (kernel/redaction.py), so an API that echoes it, an error that quotes the
URL, a log line or a trace shows `[REDACTED]` instead.

Answers: JSON is parsed and serialised again compactly (no spaces: more of the data fits), then
capped with `[truncated: …]` like every result, anything else as text; a 4xx or 5xx is an error result with
the status and the start of the body; an unreachable host, a TLS failure or a slow answer is an
error result too. Bodies are read up to `MAX_BODY_BYTES`, whatever the server sends.

Why no OpenAPI library: `openapi-spec-validator` would bring five more packages (jsonschema-path,
openapi-schema-validator, lazy-object-proxy, rfc3339-validator, pathable) to check a document of
which only `paths`, `parameters` and `requestBody` are read here. Those parts are checked here, with
the JSON pointer of a problem, and every tool schema built from them is checked against the JSON
Schema metaschema by `jsonschema` (kernel/tools/schema.py), already a dependency.

Every request goes through `send_request`, the one function that reaches the network: operator-
declared base URLs are trusted (internal APIs are the point), so it connects where it is told.
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from ..kernel.messages import JSON
from ..kernel.redaction import default_redactor
from ..kernel.tools.declare import Tool, ToolDefinitionError, ToolError, tool_from_entry

if TYPE_CHECKING:
    from ..config import APIConfig, APIOperationConfig

log = logging.getLogger(__name__)

METHOD_LEVELS = {"get": 0, "head": 0, "post": 1, "put": 1, "patch": 1, "delete": 2}
MAX_BODY_BYTES = 1024 * 1024  # of one answer, read at most; the result the model reads is capped far lower
ERROR_BODY_CHARS = 500  # of a 4xx/5xx body, quoted in the error result
_OPERATION_ID = re.compile(r"[^a-zA-Z0-9_-]+")
_PATH_PARAMETER = re.compile(r"{([^{}]+)}")
_MAX_REF_DEPTH = 32


class APIDeclarationError(ValueError):
    """An `apis:` entry that cannot become tools; the message names the API and the fix."""


@dataclass(frozen=True)
class Credential:
    """Where the secret goes (`header` or `query`) and its value, read from the environment at start-up."""

    value: str = field(repr=False)
    header: str | None = None
    query: str | None = None


@dataclass(frozen=True)
class Operation:
    """One callable operation: where it goes and what each tool argument becomes."""

    api: str
    method: str
    path: str
    name: str
    description: str
    schema: dict[str, JSON]
    path_names: tuple[str, ...]
    query_names: tuple[str, ...]
    has_body: bool


@dataclass(frozen=True)
class Answer:
    status: int
    content_type: str
    body: bytes
    cut: bool  # the body was longer than MAX_BODY_BYTES


async def send_request(
    method: str,
    url: str,
    *,
    params: list[tuple[str, str]],
    headers: Mapping[str, str],
    body: JSON | None,
    has_body: bool,
    timeout: float,
) -> Answer:
    """The one place an API call reaches the network (aiohttp, imported on the first call)."""
    import aiohttp

    limit = aiohttp.ClientTimeout(total=timeout)
    async with aiohttp.ClientSession(timeout=limit) as session:
        extra: dict[str, Any] = {"json": body} if has_body else {}
        async with session.request(
            method.upper(), url, params=params, headers=dict(headers), allow_redirects=False, **extra
        ) as response:
            data = b""
            while len(data) <= MAX_BODY_BYTES and (chunk := await response.content.read(64 * 1024)):
                data += chunk
            return Answer(
                response.status, response.content_type, data[:MAX_BODY_BYTES], len(data) > MAX_BODY_BYTES
            )


def api_tools(config: APIConfig, folder: Path, environ: Mapping[str, str] | None = None) -> list[Tool]:
    """The tools of one `apis:` entry; APIDeclarationError naming the fix for a bad declaration.

    `folder` is where a relative `openapi:` path is read from (the configuration file's folder).
    """
    environ = os.environ if environ is None else environ
    credential = _credential(config, environ)
    document = _openapi_document(config, folder) if config.openapi else _hand_written(config.operations)
    operations = _operations(config.name, document)
    wanted = set(config.tools) if config.tools is not None else None
    for listed in (wanted or set()) | set(config.levels):
        if listed not in {op.name for op in operations}:
            known = ", ".join(op.name for op in operations)
            raise APIDeclarationError(
                f"apis.{config.name}: no operation named {listed!r} (operations: {known})"
            )
    return [
        _tool(config, operation, credential)
        for operation in operations
        if wanted is None or operation.name in wanted
    ]


def _credential(config: APIConfig, environ: Mapping[str, str]) -> Credential | None:
    auth = config.auth
    if auth is None:
        return None
    secret = environ.get(auth.env, "")
    if not secret:
        raise APIDeclarationError(
            f"apis.{config.name}.auth: the environment variable {auth.env} is not set; set it (or in .env) "
            "to the API's credential"
        )
    default_redactor().add(secret, auth.prefix + secret)  # never shown, wherever an answer echoes it
    return Credential(auth.prefix + secret, auth.header, auth.query)


def _openapi_document(config: APIConfig, folder: Path) -> dict[str, Any]:
    import yaml

    path = folder / str(config.openapi)
    where = f"apis.{config.name}.openapi"
    try:
        document = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise APIDeclarationError(f"{where}: cannot read {path}: {exc.strerror}; check the path") from None
    except yaml.YAMLError as exc:
        problem = " ".join(str(exc).split())
        raise APIDeclarationError(f"{where}: {path} is not valid YAML or JSON ({problem})") from None
    if not isinstance(document, dict) or not str(document.get("openapi", "")).startswith("3."):
        raise APIDeclarationError(f"{where}: {path} is not an OpenAPI 3 document (no `openapi: 3.x` field)")
    if not isinstance(document.get("paths"), dict):
        raise APIDeclarationError(f"{where}: {path} has no `paths` mapping")
    return document


def _hand_written(operations: list[APIOperationConfig]) -> dict[str, Any]:
    """Hand-written operations as the OpenAPI document they stand for, so both take one path."""
    paths: dict[str, dict[str, Any]] = {}
    for op in operations:
        in_path = set(_PATH_PARAMETER.findall(op.path))
        parameters = []
        for name, declared in op.parameters.items():
            schema = {key: value for key, value in declared.items() if key != "required"}
            parameters.append(
                {"name": name, "in": "path" if name in in_path else "query", "schema": schema,
                 "required": name in in_path or bool(declared.get("required"))}
            )  # fmt: skip
        entry: dict[str, Any] = {"operationId": op.name, "summary": op.description, "parameters": parameters}
        if op.body is not None:
            entry["requestBody"] = {"required": True, "content": {"application/json": {"schema": op.body}}}
        paths.setdefault(op.path, {})[op.method.lower()] = entry
    return {"openapi": "3.1.0", "paths": paths}


def _operations(api: str, document: dict[str, Any]) -> list[Operation]:
    operations: list[Operation] = []
    seen: dict[str, str] = {}
    for path, item in document["paths"].items():
        where = f"apis.{api}: paths/{path}"
        item = _resolved(item, document, where)
        if not isinstance(item, dict):
            raise APIDeclarationError(f"{where} is not a mapping of operations")
        shared = item.get("parameters", [])
        for method in METHOD_LEVELS:
            if not isinstance(item.get(method), dict):
                continue
            operation = _operation(api, document, path, method, item[method], shared)
            if operation is None:
                continue
            if operation.name in seen:
                raise APIDeclarationError(
                    f"apis.{api}: {seen[operation.name]} and {method.upper()} {path} are both named "
                    f"{operation.name!r}; give one another operationId"
                )
            seen[operation.name] = f"{method.upper()} {path}"
            operations.append(operation)
    return operations


def _operation(
    api: str, document: dict[str, Any], path: str, method: str, entry: dict[str, Any], shared: Any
) -> Operation | None:
    where = f"apis.{api}: {method.upper()} {path}"
    name = _OPERATION_ID.sub("_", str(entry.get("operationId") or f"{method}_{path}")).strip("_")[:64]
    properties: dict[str, JSON] = {}
    required: list[str] = []
    locations: dict[str, str] = {}
    declared = {(p.get("name"), p.get("in")): p for p in _parameters(shared, document, where)}
    declared.update(
        {(p.get("name"), p.get("in")): p for p in _parameters(entry.get("parameters", []), document, where)}
    )
    for (pname, place), parameter in declared.items():
        if place not in ("path", "query"):
            continue  # headers and cookies: the operator's (auth), not the model's
        if not isinstance(pname, str) or pname in locations:
            raise APIDeclarationError(f"{where}: parameter {pname!r} is declared twice or has no name")
        schema = dict(standard_schema(parameter.get("schema") or {"type": "string"}))
        if parameter.get("description") and "description" not in schema:
            schema["description"] = parameter["description"]
        properties[pname], locations[pname] = schema, place
        if place == "path" or parameter.get("required"):
            required.append(pname)
    missing = set(_PATH_PARAMETER.findall(path)) - {n for n, p in locations.items() if p == "path"}
    if missing:
        raise APIDeclarationError(
            f"{where}: the path names {', '.join(sorted(missing))}, which no parameter declares"
        )
    has_body = _body(entry, document, where, properties, required)
    if has_body is None:
        log.warning("%s: its request body is not JSON; the operation is left out", where)
        return None
    text = " ".join(str(entry.get(k, "")).strip() for k in ("summary", "description") if entry.get(k)).strip()
    return Operation(
        api=api,
        method=method,
        path=path,
        name=name,
        description=(text or f"{method.upper()} {path} of the {api} API")[:1000],
        schema={"type": "object", "properties": properties, "required": required},
        path_names=tuple(n for n, p in locations.items() if p == "path"),
        query_names=tuple(n for n, p in locations.items() if p == "query"),
        has_body=has_body,
    )


def _parameters(parameters: Any, document: dict[str, Any], where: str) -> list[dict[str, Any]]:
    if not isinstance(parameters, list):
        raise APIDeclarationError(f"{where}: `parameters` must be a list")
    resolved = [_resolved(p, document, where) for p in parameters]
    if not all(isinstance(p, dict) for p in resolved):
        raise APIDeclarationError(f"{where}: every parameter must be a mapping")
    return resolved


def _body(
    entry: dict[str, Any],
    document: dict[str, Any],
    where: str,
    properties: dict[str, JSON],
    required: list[str],
) -> bool | None:
    """Whether the operation takes a JSON body (added as `body`); None: a body that is not JSON."""
    if "requestBody" not in entry:
        return False
    body = _resolved(entry["requestBody"], document, where)
    content = body.get("content") if isinstance(body, dict) else None
    if not isinstance(content, dict):
        raise APIDeclarationError(f"{where}: requestBody has no `content` mapping")
    json_type = next((t for t in content if t == "application/json" or t.endswith("+json")), None)
    if json_type is None:
        return None
    if "body" in properties:
        raise APIDeclarationError(f"{where}: a parameter is named `body`, which the JSON request body is")
    media = content[json_type] if isinstance(content[json_type], dict) else {}
    properties["body"] = dict(standard_schema(media.get("schema") or {}))
    if body.get("required"):
        required.append("body")
    return True


def _resolved(node: Any, document: dict[str, Any], where: str, seen: tuple[str, ...] = ()) -> Any:
    """`node` with every local `$ref` replaced by what it points at; a recursive one becomes `{}`
    (anything) where it recurs; a reference to another file is an error."""
    if isinstance(node, list):
        return [_resolved(item, document, where, seen) for item in node]
    if not isinstance(node, dict):
        return node
    ref = node.get("$ref")
    if isinstance(ref, str):
        if not ref.startswith("#/"):
            raise APIDeclarationError(f"{where}: $ref {ref!r} points outside the document; inline it")
        if ref in seen or len(seen) > _MAX_REF_DEPTH:
            return {"description": "(recursive: same shape as its parent)"}
        target = _pointer(document, ref, where)
        siblings = {k: v for k, v in node.items() if k != "$ref"}
        resolved = _resolved(target, document, where, (*seen, ref))
        return (
            {**resolved, **_resolved(siblings, document, where, seen)}
            if isinstance(resolved, dict)
            else resolved
        )
    return {key: _resolved(value, document, where, seen) for key, value in node.items()}


def standard_schema(node: Any) -> Any:
    """An OpenAPI 3.0 schema as JSON Schema 2020-12 (what 3.1 uses): `nullable: true` becomes a
    `"null"` type, a boolean `exclusiveMinimum`/`exclusiveMaximum` the bound itself."""
    if isinstance(node, list):
        return [standard_schema(item) for item in node]
    if not isinstance(node, dict):
        return node
    out = {key: standard_schema(value) for key, value in node.items()}
    for bound in ("minimum", "maximum"):
        exclusive = f"exclusive{bound.title()}"
        if isinstance(out.get(exclusive), bool):
            if out.pop(exclusive) and bound in out:
                out[exclusive] = out.pop(bound)
    if out.get("nullable") is True:
        del out["nullable"]
        if isinstance(out.get("type"), str):
            out["type"] = [out["type"], "null"]
    return out


def _pointer(document: dict[str, Any], ref: str, where: str) -> Any:
    node: Any = document
    for part in ref[2:].split("/"):
        key = part.replace("~1", "/").replace("~0", "~")
        if not isinstance(node, dict) or key not in node:
            raise APIDeclarationError(f"{where}: $ref {ref!r} points at nothing in the document")
        node = node[key]
    return node


def _tool(config: APIConfig, operation: Operation, credential: Credential | None) -> Tool:
    level = config.levels.get(operation.name, METHOD_LEVELS[operation.method])

    async def call(**arguments: JSON) -> JSON:
        return await call_operation(config.base_url, operation, credential, arguments, config.timeout)

    entry = {"description": operation.description, "parameters": operation.schema, "handler": call,
             "level": level, "idempotent": operation.method in ("get", "head", "put", "delete"),
             "timeout": config.timeout + 1}  # fmt: skip
    try:
        declared = tool_from_entry(config.prefix + operation.name, entry)
    except ToolDefinitionError as exc:
        raise APIDeclarationError(f"apis.{config.name}: {exc}") from None
    declared.max_chars = config.max_chars
    return declared


async def call_operation(
    base_url: str,
    operation: Operation,
    credential: Credential | None,
    arguments: Mapping[str, JSON],
    timeout: float,
) -> JSON:
    """Send one call and turn the answer into what the model reads (module docstring)."""
    import asyncio

    import aiohttp

    path = operation.path
    for name in operation.path_names:
        path = path.replace("{" + name + "}", quote(_text(arguments[name]), safe=""))
    params = [
        (n, _text(v))
        for n in operation.query_names
        if arguments.get(n) is not None
        for v in _values(arguments[n])
    ]
    headers = {"Accept": "application/json, text/plain;q=0.9, */*;q=0.5"}
    if credential is not None and credential.header:
        headers[credential.header] = credential.value
    elif credential is not None and credential.query:
        params.append((credential.query, credential.value))
    url = base_url.rstrip("/") + path
    try:
        answer = await send_request(
            operation.method, url, params=params, headers=headers, body=arguments.get("body"),
            has_body=operation.has_body, timeout=timeout,
        )  # fmt: skip
    except asyncio.TimeoutError:
        raise ToolError(f"{operation.api} API: no answer within {timeout:g} s") from None
    except (aiohttp.ClientError, OSError, ValueError) as exc:
        raise ToolError(f"{operation.api} API unreachable: {type(exc).__name__}: {exc}") from None
    return _read(operation, answer)


def _read(operation: Operation, answer: Answer) -> JSON:
    text = answer.body.decode("utf-8", errors="replace")
    if answer.status >= 400:
        start = " ".join(text.split())[:ERROR_BODY_CHARS]
        raise ToolError(f"{operation.api} API answered HTTP {answer.status} to {operation.name}: {start}")
    if answer.cut:
        return f"{text}\n[truncated: the answer is larger than {MAX_BODY_BYTES} bytes]"
    is_json = answer.content_type == "application/json" or answer.content_type.endswith("+json")
    if is_json and text.strip():
        try:  # compact: the cap leaves the model more of the data
            return json.dumps(json.loads(text), ensure_ascii=False, separators=(",", ":"))
        except (ValueError, RecursionError):
            pass  # a body that says JSON and is not: the model reads it as text
    return text if text.strip() else {"status": answer.status}


def _values(value: JSON) -> list[JSON]:
    return list(value) if isinstance(value, list) else [value]


def _text(value: JSON) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return (
        value
        if isinstance(value, str)
        else json.dumps(value)
        if isinstance(value, (dict, list))
        else str(value)
    )


__all__ = ["APIDeclarationError", "api_tools", "call_operation", "send_request"]
