"""docs/configuration.md is the settings types rendered (config_reference.py): a key added to a
section without regenerating the page fails here, and every key the page lists is one the loader
accepts, under the name the page gives it.

Cases come from config.py itself: `Settings` and the sections it reuses (`ModelSettings`, `Limits`
through `AgentConfig`, `MediaLimits`), its `ENV_KEYS` table and its refusal of secrets.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pydantic import Field
from pydantic_core import PydanticUndefined

from hermes_core.config import ENV_KEYS, SECRET_KEYS, ConfigError, GatewayConfig, Settings, load_settings
from hermes_core.config_reference import SECTION, render, sections

PAGE = Path(__file__).resolve().parents[1] / "docs" / "configuration.md"
REGENERATE = "regenerate it: python -m hermes_core.config_reference > docs/configuration.md"


def test_the_page_is_the_settings_rendered() -> None:
    assert PAGE.read_text(encoding="utf-8") == render(), f"docs/configuration.md is out of date; {REGENERATE}"


def test_a_new_key_changes_the_page() -> None:
    """The check sees a key added to a nested section (with its type, default and comment)."""

    class WiderGateway(GatewayConfig):
        drain_seconds: float = Field(5.0, gt=0)  # seconds to finish in-flight turns

    class WiderSettings(Settings):
        gateway: WiderGateway = WiderGateway()

    row = "| `gateway.drain_seconds` | number | `5.0` |  | seconds to finish in-flight turns |"
    assert row in render(WiderSettings).splitlines() and row not in render()


def test_reused_sections_and_env_variables_are_there() -> None:
    """Keys declared outside config.py (model, agent limits, media), aliases under their YAML names,
    each `ENV_KEYS` variable beside its key, and no secret as a key."""
    keys = {key.path: key for section in sections() for key in section.keys}
    expected = ["model.name", "model.fallback", "model.vision", "agent.max_turns", "agent.tool_timeout",
                "media.max_image_mb", "media.transcription.model", "schedule.jobs[].cron",
                "apis[].auth.env"]  # fmt: skip
    assert not [path for path in expected if path not in keys]
    for variable, (section, name) in ENV_KEYS.items():
        assert keys[f"{section}.{name}"].env == variable
    assert not [path for path in keys if path.rpartition(".")[2] in SECRET_KEYS]
    assert keys["agent.max_turns"].doc == "model calls per task"  # the comment in kernel/loop.py


def nested(path: str, value: Any) -> dict[str, Any]:
    head, _, rest = path.partition(".")
    return {head: nested(rest, value) if rest else value}


@pytest.mark.parametrize(
    "key",
    [key for section in sections() for key in section.keys
     if "[]" not in key.path and key.default not in (SECTION, PydanticUndefined) and "." in key.path],
    ids=lambda key: key.path,
)  # fmt: skip
def test_each_listed_key_loads_with_its_default(key: Any, tmp_path: Path) -> None:
    """Written as the page names it, with the default the page shows, the key is known (a section
    whose other keys are required may still ask for them)."""
    import yaml

    path = tmp_path / "hermes.yaml"
    path.write_text(yaml.safe_dump(nested(key.path, key.default)), encoding="utf-8")
    try:
        load_settings(path, env={}, dotenv=None)
    except ConfigError as exc:
        assert "unknown key" not in str(exc) and key.path not in str(exc), exc
