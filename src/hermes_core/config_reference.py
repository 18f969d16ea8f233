"""docs/configuration.md, generated from the settings types themselves (config.py `Settings` and the
sections it reuses: `ModelSettings`, `Limits`, `MediaLimits`, …), so no key can go undocumented.

Each section gives its YAML path, the type it is declared in and the first paragraph of that type's
docstring (the feature it belongs to); each key its dotted path, type, default, environment
variable (config.py `ENV_KEYS`) and the comment written beside its declaration. Secrets are no keys
(the file refuses them): they are listed once, with the variables that hold them. Run as a module,
it prints the page; tests/test_configuration_doc.py compares the file with a fresh rendering.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import io
import json
import sys
import textwrap
import tokenize
import types
import typing
from collections.abc import Iterator
from typing import Any, Literal

from pydantic import AliasChoices, BaseModel
from pydantic_core import PydanticUndefined

from .config import ENV_KEYS, SECRET_KEYS, Settings

COMMANDS = ("pip", "hermes-kernel", "python", "python3", "curl")
SECTION = object()  # the default of a key that is a section of its own
SECRETS = """Secrets are read from the environment (or `.env`) only; a configuration file holding one is
refused. The model's key is `HERMES_API_KEY` or the provider preset's own variable (`DEEPSEEK_API_KEY`,
`DASHSCOPE_API_KEY`, … — docs/providers.md); the Feishu app's are `FEISHU_APP_SECRET`,
`FEISHU_VERIFICATION_TOKEN` and `FEISHU_ENCRYPT_KEY`; the webhook's `HERMES_WEBHOOK_SECRET`; the
console's token the variable `console.token_env` names; PostgreSQL's password `PGPASSWORD` (or the
whole URL in `HERMES_DATABASE_URL`). The `init` command writes a `.env.example` naming those a
set-up needs."""


@dataclasses.dataclass(frozen=True)
class Key:
    path: str  # dotted; `[]` marks the items of a list
    type: str
    default: Any  # PydanticUndefined: required
    env: str | None
    doc: str


@dataclasses.dataclass(frozen=True)
class Section:
    path: str  # "" for the top level
    declared: type
    keys: list[Key]


def sections(root: type = Settings, path: str = "") -> Iterator[Section]:
    """`root`'s section and, after it, each section nested in it, in declaration order."""
    comments, nested, keys = field_comments(root), [], []
    for name, info in declared_fields(root).items():
        if name in SECRET_KEYS:
            continue
        here = f"{path}.{yaml_name(name, info)}" if path else yaml_name(name, info)
        default = info.get_default(call_default_factory=True)
        if isinstance(default, BaseModel) or dataclasses.is_dataclass(default):
            default = SECTION  # its keys carry the defaults
        inside = list(section_types(info.annotation))
        doc = comments.get(name) or (first_sentence(inside[0][0]) if inside else "")
        keys.append(Key(here, type_text(info.annotation), default, env_of(here), doc))
        nested += [(inner, f"{here}[]" if listed else here) for inner, listed in inside]
    yield Section(path, root, keys)
    for inner, where in nested:
        yield from sections(inner, where)


def declared_fields(cls: type) -> dict[str, Any]:
    """The pydantic `FieldInfo` of each field of a model or a pydantic dataclass."""
    found = getattr(cls, "__pydantic_fields__", None) or getattr(cls, "model_fields", {})
    return dict(found)


def yaml_name(name: str, info: Any) -> str:
    """The name the YAML file uses (a validation alias's first choice: `model.name`, `model.fallback`)."""
    alias = info.validation_alias
    if isinstance(alias, AliasChoices) and isinstance(alias.choices[0], str):
        return alias.choices[0]
    return alias if isinstance(alias, str) else name


def env_of(path: str) -> str | None:
    return next((variable for variable, key in ENV_KEYS.items() if ".".join(key) == path), None)


def is_section(tp: Any) -> bool:
    return isinstance(tp, type) and (issubclass(tp, BaseModel) or hasattr(tp, "__pydantic_fields__"))


def section_types(tp: Any, listed: bool = False) -> Iterator[tuple[type, bool]]:
    """The section types inside an annotation, each with whether it is a list's item."""
    if is_section(tp):
        yield tp, listed
        return
    origin = typing.get_origin(tp)
    for arg in typing.get_args(tp):
        if origin is not Literal:
            yield from section_types(arg, listed or origin in (list, tuple))


def type_text(tp: Any) -> str:
    """An annotation in words: `int`, `string or null`, `list of string`, `one of a, b`."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if tp is type(None):
        return "null"
    if origin is typing.Annotated:
        return type_text(args[0])
    if origin is Literal:
        return "one of " + ", ".join(str(value) for value in args)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(type_text(arg) for arg in args)
    if origin in (list, tuple):
        return f"list of {type_text(args[0])}"
    if origin is dict:
        return f"map of {type_text(args[0])} to {type_text(args[1])}"
    if is_section(tp):
        return "section"
    names = {str: "string", int: "integer", float: "number", bool: "boolean", Any: "any"}
    return names.get(tp, getattr(tp, "__name__", str(tp)))


def field_comments(cls: type) -> dict[str, str]:
    """The comment beside (or on the lines just above) each field's declaration, in `cls` and its bases."""
    found: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if klass.__module__.partition(".")[0] in ("builtins", "pydantic"):
            continue
        try:
            source = textwrap.dedent(inspect.getsource(klass))
        except (OSError, TypeError):  # a class without a source file
            continue
        lines = source.splitlines()
        comments = {
            token.start[0]: token.string.lstrip("#").strip()
            for token in tokenize.generate_tokens(io.StringIO(source).readline)
            if token.type == tokenize.COMMENT and "fmt:" not in token.string
        }
        body = next(node for node in ast.parse(source).body if isinstance(node, ast.ClassDef)).body
        for node in body:
            if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                above: list[str] = []
                line = node.lineno - 1
                while line in comments and lines[line - 1].lstrip().startswith("#"):
                    above.insert(0, comments[line])
                    line -= 1
                beside = comments.get(node.end_lineno or node.lineno, "")
                found[node.target.id] = " ".join(part for part in (*above, beside) if part)
    return found


def first_paragraph(cls: type) -> str:
    doc = inspect.getdoc(cls) or ""
    if cls.__module__ == "hermes_core.config" and doc == inspect.getdoc(BaseModel):
        return ""
    return " ".join(doc.split("\n\n")[0].split())


def first_sentence(cls: type) -> str:
    paragraph = first_paragraph(cls)
    return paragraph.split(". ")[0].rstrip(".") + (" (below)" if paragraph else "")


def default_text(value: Any) -> str:
    if value is SECTION:
        return "(section)"
    if value is PydanticUndefined:
        return "required"
    if value is None:
        return "null"
    if isinstance(value, str):
        return f"`{value}`" if value else '`""`'
    if isinstance(value, tuple):
        value = list(value)
    return f"`{json.dumps(value, ensure_ascii=False)}`"


def cell(text: str) -> str:
    """`text` in a table cell: `|` escaped, `<` escaped outside code, and a command in a docstring
    (`pip install …`) as plain words: the pages' code spans are commands the docs tests run."""
    parts = text.replace("|", "\\|").replace("\n", " ").split("`")
    for index, part in enumerate(parts):
        if index % 2 == 0:
            parts[index] = part.replace("<", "&lt;")
        elif part.split(" ")[0] not in COMMANDS or " " not in part:
            parts[index] = f"`{part}`"
    return "".join(parts)


def render(root: type = Settings) -> str:
    """The whole page."""
    out = [
        "# Configuration reference",
        "",
        "Every key of the YAML configuration file (the file `--config` names), generated from the settings",
        "types by `hermes_core/config_reference.py` (run it as a module; its output is this file, and a",
        "test fails when they differ). A key's environment variable, when it has one, overrides the file;",
        "`.env` is read first. The `init` command writes a starting file with the keys a set-up needs.",
        "",
        SECRETS,
    ]
    for section in sections(root):
        where = section.declared.__module__.removeprefix("hermes_core.").replace(".", "/") + ".py"
        title = f"`{section.path}`" if section.path else "Top level"
        out += ["", f"## {title}", "", f"Declared by `{section.declared.__name__}` in `{where}`."]
        about = first_paragraph(section.declared)
        out += ["", cell(about)] if about else []
        out += ["", "| key | type | default | environment | what |", "|---|---|---|---|---|"]
        for key in section.keys:
            env = f"`{key.env}`" if key.env else ""
            row = [f"`{key.path}`", cell(key.type), cell(default_text(key.default)), env, cell(key.doc)]
            out.append("| " + " | ".join(row) + " |")
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    sys.stdout.write(render())
