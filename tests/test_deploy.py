"""The deployment files (deploy/, Dockerfile) are checked by the tools that will read them.

- the systemd unit: `systemd-analyze verify`, on a copy whose ExecStart is this environment's
  `hermes-kernel` (verify refuses a unit whose program does not exist);
- the nginx site: `nginx -t` inside a throw-away nginx.conf (temporary prefix, logs, pid and temp
  folders, a self-signed certificate), then a real nginx in front of a real `hermes-kernel serve`;
- the Dockerfile: hadolint, and its HEALTHCHECK command against a running gateway;
- the per-environment configurations load, and each has its skills folder.

A test whose tool is missing here is skipped, saying which; `.ci/run` installs them.
"""

from __future__ import annotations

import datetime
import ipaddress
import json
import os
import re
import shutil
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from hermes_core.channels.webhook import sign
from hermes_core.config import build_agent, load_settings
from serve_process import CLEAN_ENV, listening
from waiting import wait_for

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
UNIT = DEPLOY / "systemd" / "hermes-kernel.service"
SITE = DEPLOY / "nginx" / "hermes-kernel.conf"
DOCKERFILE = ROOT / "Dockerfile"
ENVIRONMENTS = ("dev", "staging", "prod")
SBIN_PATH = os.pathsep.join([os.environ.get("PATH", ""), "/usr/local/sbin", "/usr/sbin", "/sbin"])
WEBHOOK_SECRET = "deploy-webhook-secret"  # through a proxy, the webhook answers signed requests only


def tool(name: str) -> str:
    found = shutil.which(name, path=SBIN_PATH)
    if found is None:
        pytest.skip(f"{name} is not installed here (.ci/run installs it)")
    return found


def hermes_core_executable() -> str:
    """The `hermes-kernel` script of the environment running the tests."""
    beside = Path(sys.executable).with_name("hermes-kernel")
    found = str(beside) if beside.exists() else shutil.which("hermes-kernel")
    if found is None:
        pytest.skip("the hermes-kernel script is not installed (pip install -e .)")
    return found


def unit_settings(text: str) -> dict[str, list[str]]:
    """Each `Key=value` of a unit file; keys that repeat keep every value."""
    settings: dict[str, list[str]] = {}
    for line in text.splitlines():
        if "=" in line and not line.startswith(("#", ";", "[")):
            key, _, value = line.partition("=")
            settings.setdefault(key.strip(), []).append(value.strip())
    return settings


# --- systemd -------------------------------------------------------------------------------------


def verify_unit(text: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """`systemd-analyze verify` on `text`, saved as hermes-kernel.service, with ExecStart runnable here."""
    program = unit_settings(text)["ExecStart"][0].split()[0]
    unit = tmp_path / "hermes-kernel.service"
    unit.write_text(text.replace(program, hermes_core_executable()), encoding="utf-8")
    command = [tool("systemd-analyze"), "verify", "--man=no", str(unit)]
    return subprocess.run(command, capture_output=True, text=True, timeout=60)


def test_unit_passes_systemd_analyze_verify(tmp_path: Path) -> None:
    result = verify_unit(UNIT.read_text(encoding="utf-8"), tmp_path)
    assert result.returncode == 0 and not lines_about_the_unit(result), result.stdout + result.stderr


def test_verify_would_catch_a_mistake(tmp_path: Path) -> None:
    broken = UNIT.read_text(encoding="utf-8").replace("ProtectSystem=strict", "ProtectSystem=strictly")
    assert lines_about_the_unit(verify_unit(broken, tmp_path))


def lines_about_the_unit(result: subprocess.CompletedProcess[str]) -> list[str]:
    """verify exits 0 even for an unknown key or a bad value (it only warns), so any line about our
    unit is a failure; lines about other units of the machine are not ours to judge."""
    return [line for line in (result.stdout + result.stderr).splitlines() if "hermes-kernel" in line]


def test_unit_runs_serve_hardened_with_secrets_from_a_file() -> None:
    settings = unit_settings(UNIT.read_text(encoding="utf-8"))
    command = settings["ExecStart"][0].split()
    assert command[-1] == "serve" and "--config" in command
    assert settings["User"] != ["root"] and settings["Restart"] == ["on-failure"]
    assert settings["NoNewPrivileges"] == ["yes"] and settings["ProtectSystem"] == ["strict"]
    assert settings["EnvironmentFile"] and settings["CapabilityBoundingSet"] == [""]
    prod = load_settings(DEPLOY / "config" / "prod.yaml", env={}, dotenv=None)
    assert settings["ReadWritePaths"] == [prod.gateway.data_dir] == settings["WorkingDirectory"]
    assert settings["StateDirectory"] == [Path(prod.gateway.data_dir).name]
    stop_timeout = float(settings["TimeoutStopSec"][0])
    assert stop_timeout > prod.gateway.shutdown_grace  # in-flight turns get their grace period


# --- nginx ---------------------------------------------------------------------------------------


def self_signed_certificate(folder: Path) -> tuple[Path, Path]:
    """A certificate for localhost and 127.0.0.1, and its key, as PEM files."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.timezone.utc)
    alt_names = x509.SubjectAlternativeName(
        [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
    )
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(alt_names, critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_file, key_file = folder / "cert.pem", folder / "key.pem"
    cert_file.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    return cert_file, key_file


def nginx_prefix(tmp_path: Path, site: str) -> Path:
    """A complete nginx.conf in `tmp_path` that includes `site`; every path nginx writes is in there,
    so it runs as any user. Returns the nginx.conf."""
    cert_file, key_file = self_signed_certificate(tmp_path)
    site = re.sub(r"ssl_certificate\s+\S+;", f"ssl_certificate {cert_file};", site)
    site = re.sub(r"ssl_certificate_key\s+\S+;", f"ssl_certificate_key {key_file};", site)
    (tmp_path / "site.conf").write_text(site, encoding="utf-8")
    temp_paths = "\n".join(
        f"    {kind}_temp_path {tmp_path / kind};"
        for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")
    )
    main_conf = f"""
error_log {tmp_path / "error.log"};
pid {tmp_path / "nginx.pid"};
events {{ worker_connections 64; }}
http {{
    access_log {tmp_path / "access.log"};
{temp_paths}
    client_body_buffer_size 2m;  # bodies in memory: workers run as nobody when the tests run as root
    include {tmp_path / "site.conf"};
}}
"""
    conf = tmp_path / "nginx.conf"
    conf.write_text(main_conf, encoding="utf-8")
    return conf


def nginx_command(conf: Path) -> list[str]:
    prefix = conf.parent
    return [tool("nginx"), "-p", f"{prefix}/", "-c", str(conf), "-e", str(prefix / "error.log")]


def site_on_loopback(http_port: int, https_port: int) -> str:
    """The example site listening on loopback ports instead of 80 and 443: nginx binds its ports even
    for `-t`, only root may bind ports below 1024, and 80 may be taken. The rest is unchanged."""
    site = SITE.read_text(encoding="utf-8")
    if not socket.has_ipv6 or not ipv6_loopback():
        site = re.sub(r"\n\s*listen \[::\]:\d+[^;]*;", "", site)
    site = re.sub(r"listen 80;", f"listen 127.0.0.1:{http_port};", site)
    site = re.sub(r"listen \[::\]:80;", f"listen [::1]:{http_port};", site)
    site = re.sub(r"listen 443 ssl;", f"listen 127.0.0.1:{https_port} ssl;", site)
    site = re.sub(r"listen \[::\]:443 ssl;", f"listen [::1]:{https_port} ssl;", site)
    assert not re.search(r"listen (\[::\]:)?(80|443)\b", site), "the site's listen lines changed"
    return site


def ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as sock:
            sock.bind(("::1", 0))
        return True
    except OSError:
        return False


def test_nginx_site_passes_nginx_t(tmp_path: Path) -> None:
    conf = nginx_prefix(tmp_path, site_on_loopback(free_port(), free_port()))
    result = subprocess.run([*nginx_command(conf), "-t"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "syntax is ok" in result.stderr and "test is successful" in result.stderr
    assert "[warn]" not in result.stderr and "[emerg]" not in result.stderr, result.stderr


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real `hermes-kernel serve` (offline demo model) on a free port: its base URL."""
    folder = tmp_path_factory.mktemp("gateway")
    config = folder / "hermes.yaml"
    config.write_text(f"gateway:\n  data_dir: {folder / 'data'}\n  shutdown_grace: 1\n", encoding="utf-8")
    log = (folder / "serve.log").open("w")
    process = subprocess.Popen(
        [sys.executable, "-m", "hermes_core", "--config", str(config), "serve", "--port", "0"],
        cwd=folder, env={**CLEAN_ENV, "HERMES_WEBHOOK_SECRET": WEBHOOK_SECRET}, stdout=subprocess.PIPE,
        stderr=log, text=True,
    )  # fmt: skip
    try:
        assert process.stdout is not None
        found = re.search(r"serving on (http://\S+) ", process.stdout.readline())
        assert found, (folder / "serve.log").read_text()
        yield found.group(1)
    finally:
        process.terminate()
        process.wait(30)
        log.close()


def wait_for_port(port: int, process: subprocess.Popen[str]) -> None:
    wait_for(lambda: process.poll() is not None or listening(port), 10, f"something listening on port {port}")
    assert process.poll() is None, f"nginx exited with {process.returncode}"


class NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: object, **kwargs: object) -> None:
        return None


@pytest.mark.slow
def test_nginx_serves_the_gateway_over_https(tmp_path: Path, gateway: str) -> None:
    """The example site in a real nginx, in front of a real gateway (only ports and paths changed)."""
    http_port, https_port = free_port(), free_port()
    site = site_on_loopback(http_port, https_port)
    site = site.replace("server 127.0.0.1:8080;", f"server {gateway.removeprefix('http://')};")
    conf = nginx_prefix(tmp_path, site)
    nginx = subprocess.Popen([*nginx_command(conf), "-g", "daemon off;"], text=True)
    try:
        wait_for_port(https_port, nginx)
        wait_for_port(http_port, nginx)
        tls = ssl.create_default_context(cafile=str(tmp_path / "cert.pem"))
        base = f"https://127.0.0.1:{https_port}"

        with urllib.request.urlopen(f"{base}/healthz", context=tls, timeout=30) as response:
            assert response.status == 200 and json.loads(response.read())["ok"] is True
            assert "max-age" in response.headers["Strict-Transport-Security"]
        body = json.dumps({"message": "hello", "user_id": "u1"}).encode()
        stamp = str(int(time.time()))
        signed = {"X-Hermes-Timestamp": stamp, "X-Hermes-Signature": sign(WEBHOOK_SECRET, stamp, body)}
        request = urllib.request.Request(f"{base}/webhook", data=body, method="POST", headers=signed)
        with urllib.request.urlopen(request, context=tls, timeout=60) as response:
            assert response.status == 200 and json.loads(response.read())["reply"]

        with pytest.raises(urllib.error.HTTPError) as not_proxied:
            urllib.request.urlopen(f"{base}/somewhere-else", context=tls, timeout=30)
        assert not_proxied.value.code == 404

        opener = urllib.request.build_opener(NoRedirect)
        with pytest.raises(urllib.error.HTTPError) as redirected:
            opener.open(f"http://127.0.0.1:{http_port}/feishu/events?x=1", timeout=30)
        assert redirected.value.code == 301
        assert redirected.value.headers["Location"] == "https://127.0.0.1/feishu/events?x=1"
    finally:
        nginx.terminate()
        nginx.wait(30)


# Every route the gateway serves, and whether the shipped nginx site passes it on. A route missing
# here fails test_nginx_decides_every_route_the_gateway_serves: decide, then add it.
PROXIED = {("POST", "/webhook"), ("POST", "/webhook/approvals/{id}"), ("POST", "/feishu/events"),
           ("GET", "/healthz")}  # fmt: skip
NOT_PROXIED = {("GET", "/"), ("GET", "/console"), ("GET", "/console/"), ("GET", "/metrics")}  # this machine


@pytest.fixture
def every_route_gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """`serve` with every channel on: the signed webhook, Feishu (its platform unreachable: the
    gateway starts degraded and still serves the callback) and the console (loopback bind).
    Its base URL and the routes its start-up line names (from the aiohttp router)."""
    folder = tmp_path_factory.mktemp("every-route")
    config = folder / "hermes.yaml"
    config.write_text(f"gateway:\n  data_dir: {folder / 'data'}\n  shutdown_grace: 1\n", encoding="utf-8")
    env = {**CLEAN_ENV, "HERMES_WEBHOOK_SECRET": WEBHOOK_SECRET, "FEISHU_APP_ID": "cli_deploy",
           "FEISHU_APP_SECRET": "deploy-app-secret", "FEISHU_VERIFICATION_TOKEN": "deploy-vt",
           "FEISHU_BASE_URL": f"http://127.0.0.1:{free_port()}"}  # fmt: skip
    log = (folder / "serve.log").open("w")
    process = subprocess.Popen(
        [sys.executable, "-m", "hermes_core", "--config", str(config), "serve", "--port", "0"],
        cwd=folder, env=env, stdout=subprocess.PIPE, stderr=log, text=True,
    )  # fmt: skip
    try:
        assert process.stdout is not None
        found = re.search(r"serving on (http://\S+) \((.*)\)", process.stdout.readline())
        assert found, (folder / "serve.log").read_text()
        yield found.group(1), found.group(2)
    finally:
        process.terminate()
        process.wait(30)
        log.close()


def served_routes(summary: str) -> set[tuple[str, str]]:
    """`POST /a, /b; GET /c` → {("POST", "/a"), ("POST", "/b"), ("GET", "/c")}."""
    routes = set()
    for group in summary.split("; "):
        method, _, paths = group.partition(" ")
        routes |= {(method, path) for path in paths.split(", ")}
    return routes


def exchange(url: str, method: str, body: bytes | None, headers: dict[str, str], tls: ssl.SSLContext | None
             ) -> tuple[int, str, bytes]:  # fmt: skip
    """One request without following redirects: status, Content-Type and body, errors included."""
    request = urllib.request.Request(url, data=body, method=method, headers=headers)
    opener = urllib.request.build_opener(NoRedirect, urllib.request.HTTPSHandler(context=tls))
    try:
        with opener.open(request, timeout=60) as response:
            return response.status, response.headers.get("Content-Type", ""), response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.headers.get("Content-Type", ""), error.read()


def route_request(method: str, path: str) -> tuple[str, bytes | None, dict[str, str]]:
    """A request each route answers meaningfully: a signed webhook call, a signed decision on an
    unknown approval, Feishu's url_verification challenge; plain GETs otherwise."""
    if method == "GET":
        return path, None, {}
    if path == "/feishu/events":
        body = json.dumps({"type": "url_verification", "token": "deploy-vt", "challenge": "c-42"}).encode()
        return path, body, {"Content-Type": "application/json"}
    decision, message = {"user_id": "u1", "decision": "approve"}, {"message": "hi", "user_id": "u1"}
    fields = decision if "approvals" in path else message
    body = json.dumps({**fields, "nonce": os.urandom(8).hex()}).encode()  # each signed request is taken once
    stamp = str(int(time.time()))
    signed = {"X-Hermes-Timestamp": stamp, "X-Hermes-Signature": sign(WEBHOOK_SECRET, stamp, body),
              "Content-Type": "application/json"}  # fmt: skip
    return re.sub(r"\{[^}]+\}", "ap_unknown", path), body, signed


@pytest.mark.slow
def test_nginx_decides_every_route_the_gateway_serves(
    tmp_path: Path, every_route_gateway: tuple[str, str]
) -> None:
    """Attack: a route the gateway serves is forgotten by the site. Before, `POST
    /webhook/approvals/<id>` was nginx's 404, so webhook approvals could not be decided behind the
    documented set-up. Every route from the gateway's router (its start-up line) must be decided
    here; each passed one must reach the gateway through the real nginx, each other one must stay
    nginx's own 404 (console, metrics, the route list), though the gateway itself serves it."""
    gateway, summary = every_route_gateway
    routes = served_routes(summary)
    assert routes <= PROXIED | NOT_PROXIED, f"undecided for nginx: {sorted(routes - PROXIED - NOT_PROXIED)}"
    assert PROXIED <= routes and ("GET", "/console/") in routes
    http_port, https_port = free_port(), free_port()
    site = site_on_loopback(http_port, https_port)
    site = site.replace("server 127.0.0.1:8080;", f"server {gateway.removeprefix('http://')};")
    nginx = subprocess.Popen([*nginx_command(nginx_prefix(tmp_path, site)), "-g", "daemon off;"], text=True)
    try:
        wait_for_port(https_port, nginx)
        tls = ssl.create_default_context(cafile=str(tmp_path / "cert.pem"))
        base = f"https://127.0.0.1:{https_port}"
        for method, route in sorted(routes):
            path, body, headers = route_request(method, route)
            status, kind, answer = exchange(base + path, method, body, headers, tls)
            if (method, route) in PROXIED:
                assert kind.startswith("application/json"), (method, route, status, answer[:200])
                assert status < 500, (method, route, status, answer[:200])
            else:
                assert status == 404 and b"nginx" in answer, (method, route, status)
                path, body, headers = route_request(method, route)
                assert exchange(gateway + path, method, body, headers, None)[0] != 404, (method, route)
        for hidden in ("/console/api/status", "/console/tasks", "/metrics"):
            assert exchange(base + hidden, "GET", None, {}, tls)[0] == 404, hidden
        path, body, headers = route_request("POST", "/feishu/events")
        _, _, challenge = exchange(base + path, "POST", body, headers, tls)
        assert json.loads(challenge) == {"challenge": "c-42"}
        path, body, headers = route_request("POST", "/webhook/approvals/{id}")
        status, _, decision = exchange(base + path, "POST", body, headers, tls)
        assert (status, json.loads(decision)) == (404, {"error": "approval_unknown"})  # the gateway's answer
    finally:
        nginx.terminate()
        nginx.wait(30)


@pytest.mark.slow
def test_nginx_refuses_a_body_over_the_gateway_limit(tmp_path: Path, gateway: str) -> None:
    """Attack: a body over 1 MiB (the webhook's and Feishu's limit, docs/webhook.md). nginx's
    client_max_body_size agrees with the gateway: 413 at the edge, a body at the limit goes on."""
    http_port, https_port = free_port(), free_port()
    site = site_on_loopback(http_port, https_port)
    site = site.replace("server 127.0.0.1:8080;", f"server {gateway.removeprefix('http://')};")
    nginx = subprocess.Popen([*nginx_command(nginx_prefix(tmp_path, site)), "-g", "daemon off;"], text=True)
    try:
        wait_for_port(https_port, nginx)
        tls = ssl.create_default_context(cafile=str(tmp_path / "cert.pem"))
        base = f"https://127.0.0.1:{https_port}"
        over = b"x" * (1024 * 1024 + 1)
        json_type = {"Content-Type": "application/json"}
        status, _, answer = exchange(base + "/webhook", "POST", over, json_type, tls)
        assert status == 413 and b"nginx" in answer
        at_limit = b" " * (1024 * 1024)  # not JSON: the gateway, not nginx, answers (401 unsigned)
        status, kind, _ = exchange(base + "/webhook", "POST", at_limit, json_type, tls)
        assert status == 401 and kind.startswith("application/json")
    finally:
        nginx.terminate()
        nginx.wait(30)


# --- Docker --------------------------------------------------------------------------------------


def test_dockerfile_passes_hadolint() -> None:
    result = subprocess.run(
        [tool("hadolint"), str(DOCKERFILE)], capture_output=True, text=True, timeout=60, cwd=ROOT
    )
    assert result.returncode == 0, result.stdout + result.stderr


def dockerfile_instructions() -> list[tuple[str, str]]:
    text = DOCKERFILE.read_text(encoding="utf-8").replace("\\\n", " ")
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.startswith("#")]
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1]) for line in lines]


def test_dockerfile_image_shape() -> None:
    instructions = dockerfile_instructions()
    bases = [value for name, value in instructions if name == "FROM"]
    assert bases and all(base.startswith("python:3.11-slim") for base in bases)
    user = [value for name, value in instructions if name == "USER"][-1]
    assert user.split(":")[0] not in ("root", "0")
    assert ("EXPOSE", "8080") in instructions
    cmd = json.loads(next(value for name, value in instructions if name == "CMD"))
    assert cmd[0] == "hermes-kernel" and cmd[-3:] == ["serve", "--host", "0.0.0.0"]
    config = cmd[cmd.index("--config") + 1]
    assert (DEPLOY / "config" / Path(config).name).is_file()
    for name, value in instructions:
        if name == "COPY" and not value.startswith("--from"):
            for source in value.split()[:-1]:
                assert (ROOT / source).exists(), f"COPY {source}: missing"
    ignored = (ROOT / ".dockerignore").read_text(encoding="utf-8").split()
    assert ".env" in ignored and ".git" in ignored and ".hermes" in ignored


def healthcheck_command(port: int) -> list[str]:
    healthcheck = next(value for name, value in dockerfile_instructions() if name == "HEALTHCHECK")
    command = json.loads(healthcheck.split(" CMD ", 1)[1])
    assert command[0] == "python"  # in the image, python is the venv's
    return [sys.executable, *(part.replace(":8080/", f":{port}/") for part in command[1:])]


@pytest.mark.slow
def test_docker_healthcheck_command_against_a_running_gateway(gateway: str) -> None:
    port = int(gateway.rsplit(":", 1)[1])
    healthy = subprocess.run(healthcheck_command(port), capture_output=True, text=True, timeout=30)
    assert healthy.returncode == 0, healthy.stderr
    down = subprocess.run(healthcheck_command(free_port()), capture_output=True, text=True, timeout=30)
    assert down.returncode != 0


# --- per-environment configuration ----------------------------------------------------------------


@pytest.mark.parametrize("environment", ENVIRONMENTS)
def test_environment_configuration_loads_with_its_skills_folder(
    environment: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each configuration builds an agent with its own skills folder: dev's relative to the checkout,
    staging's and prod's where docs/deploy.md installs that folder (here: the folder in deploy/)."""
    monkeypatch.chdir(ROOT)
    settings = load_settings(DEPLOY / "config" / f"{environment}.yaml", env={}, dotenv=None)
    source = DEPLOY / "skills" / environment
    installed = {"dev": "deploy/skills/dev"}.get(environment, f"/etc/hermes-kernel/skills/{environment}")
    assert settings.skills.dirs == [installed] and (source / "README.md").is_file()
    settings.skills.dirs = [str(source)]
    assert build_agent(settings).registry.names
    if environment != "dev":
        assert settings.gateway.host == "127.0.0.1"  # behind nginx: not reachable from outside
        assert settings.feishu.mode == "webhook"


def test_deploy_guide_covers_every_file() -> None:
    guide = (ROOT / "docs" / "deploy.md").read_text(encoding="utf-8")
    for path in (UNIT, SITE, DOCKERFILE, ROOT / ".dockerignore", *sorted((DEPLOY / "config").iterdir())):
        assert str(path.relative_to(ROOT)) in guide, path
    assert "hermes-kernel doctor" in guide
    for environment in ENVIRONMENTS:
        assert f"/etc/hermes-kernel/skills/{environment}" in guide or environment == "dev"
        assert f"deploy/skills/{environment}" in guide


# Advisories the floors in pyproject.toml exclude: package → (the last affected release, advisories).
# aiohttp: CVE-2024-52304 (fixed in 3.10.11), CVE-2025-53643 (3.12.14), CVE-2026-69244 (3.14.3);
# cryptography: CVE-2024-12797 (44.0.1), CVE-2026-69247 (50.0.0).
LAST_AFFECTED = {"aiohttp": "3.14.2", "cryptography": "49.0.0"}


def _requirements() -> list[str]:
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    extras = project["optional-dependencies"]  # `dev` (linters) is not installed by CI or the image
    return [*project["dependencies"], *(r for name, extra in extras.items() if name != "dev" for r in extra)]


def test_dependency_floors_exclude_releases_with_published_advisories() -> None:
    from packaging.requirements import Requirement

    seen = set()
    for text in _requirements():
        requirement = Requirement(text)
        if requirement.name in LAST_AFFECTED:
            seen.add(requirement.name)
            assert not requirement.specifier.contains(LAST_AFFECTED[requirement.name]), text
    assert seen == set(LAST_AFFECTED)


def test_constraints_pin_every_dependency_within_its_floor() -> None:
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    pins = {}
    for line in (ROOT / "constraints.txt").read_text(encoding="utf-8").splitlines():
        if line and not line.startswith("#"):
            name, _, version = line.partition("==")
            pins[canonicalize_name(name)] = version
    for text in _requirements():
        requirement = Requirement(text)
        if requirement.name == "hermes-kernel":
            continue
        name = canonicalize_name(requirement.name)
        assert name in pins, f"{name} is not pinned in constraints.txt"
        assert requirement.specifier.contains(pins[name]), f"{name}=={pins[name]} is outside {text}"
