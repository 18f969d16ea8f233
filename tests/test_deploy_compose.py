"""deploy/compose/docker-compose.yml (docs/scale-out.md) without a container daemon: the file is
read as YAML and checked for what a `docker compose up` relies on — the services and their order,
the image built with the temporal extra, every node on the one configuration (which loads, as
`engine: temporal`, and names the Temporal service), commands that `hermes-kernel` accepts, ports on
loopback only, and no secret written into it."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from hermes_core.config import load_settings

ROOT = Path(__file__).resolve().parents[1]
COMPOSE = ROOT / "deploy" / "compose"
HERMES = ("gateway-1", "gateway-2", "worker-1", "worker-2")


def compose() -> dict[str, Any]:
    data = yaml.safe_load((COMPOSE / "docker-compose.yml").read_text(encoding="utf-8"))
    assert isinstance(data, dict)
    return data


def test_the_stack_has_temporal_postgresql_two_gateways_and_two_workers() -> None:
    services = compose()["services"]
    assert set(services) == {"postgresql", "temporal", *HERMES}
    assert services["temporal"]["depends_on"]["postgresql"]["condition"] == "service_healthy"
    assert services["temporal"]["environment"]["POSTGRES_SEEDS"] == "postgresql"
    for name in HERMES:
        assert "temporal" in services[name]["depends_on"], name


def test_every_node_runs_the_image_with_the_temporal_extra_on_one_configuration() -> None:
    services = compose()["services"]
    dockerfile = (ROOT / "Dockerfile").read_text(encoding="utf-8")
    assert re.search(r"^ARG EXTRAS=", dockerfile, re.M) and '".[${EXTRAS}]"' in dockerfile
    mounted = set()
    for name in HERMES:
        service = services[name]
        assert "temporal" in service["build"]["args"]["EXTRAS"].split(","), name
        assert (COMPOSE / service["build"]["context"] / "Dockerfile").resolve() == ROOT / "Dockerfile"
        source, target = service["volumes"][0].removesuffix(":ro").split(":")
        assert (COMPOSE / source).is_file(), source
        mounted.add(source)
        command = service["command"]
        assert command[:3] == ["hermes-kernel", "--config", target], name
        assert command[3] == ("serve" if name.startswith("gateway") else "worker"), name
    assert len(mounted) == 1


def test_the_configuration_loads_as_engine_temporal_and_names_the_temporal_service() -> None:
    settings = load_settings(COMPOSE / "hermes.yaml", env={}, dotenv=None)
    assert settings.engine == "temporal"
    host, port = settings.temporal.address.split(":")
    assert host in compose()["services"] and port == "7233"
    environment = compose()["services"]["gateway-1"]["environment"]
    assert environment["HERMES_TEMPORAL_ADDRESS"] == settings.temporal.address
    # the engine's state is in PostgreSQL (database.url is required): the stack's own server
    services = compose()["services"]
    for name in HERMES:
        url = services[name]["environment"]["HERMES_DATABASE_URL"]
        assert url.startswith("postgresql://temporal:${POSTGRES_PASSWORD") and url.endswith(
            "@postgresql:5432/hermes"
        )
        assert services[name]["depends_on"]["postgresql"]["condition"] == "service_healthy", name
    assert services["postgresql"]["environment"]["POSTGRES_DB"] == "hermes"


def test_the_commands_are_accepted_by_hermes_core() -> None:
    for name in ("gateway-1", "worker-1"):
        command = compose()["services"][name]["command"]
        words = [w for w in command[3:] if not w.startswith("--host") and w != "0.0.0.0"]
        help_text = subprocess.run(
            [sys.executable, "-m", "hermes_core", *words, "--help"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert help_text.returncode == 0, (shlex.join(command), help_text.stderr)


def test_ports_on_loopback_only_and_no_secret_in_the_file() -> None:
    services = compose()["services"]
    published = [port for service in services.values() for port in service.get("ports", [])]
    assert published and all(port.startswith("127.0.0.1:") for port in published), published
    for service in services.values():
        for key, value in (service.get("environment") or {}).items():
            if any(word in key for word in ("SECRET", "PASSWORD", "PWD", "KEY", "TOKEN")):
                assert re.fullmatch(r"\$\{[A-Z_]+(:[?-][^}]*)?\}", str(value)), (
                    f"{key} is written in the file"
                )
