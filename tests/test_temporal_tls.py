"""The Temporal frontend behind TLS and mutual TLS (`temporal.tls`), and an API key (`temporal.api_key_env`).

Whoever reaches the frontend unauthenticated can signal and update every conversation's workflow
(docs/security.md), so a deployment puts it behind mutual TLS (Temporal's own TLS settings, or a
proxy that checks client certificates) or an API key. Here a real nginx terminates mutual TLS in
front of the real dev server and passes gRPC on (nginx's `grpc_pass` and `ssl_verify_client`, as
nginx.org/en/docs/http/ngx_http_grpc_module.html and ngx_http_ssl_module.html describe them); the
client is `connect` (engine/temporal/client.py), as `serve` and `worker` use it.
"""

from __future__ import annotations

import asyncio
import datetime
import ipaddress
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from hermes_core.config import TemporalConfig, TemporalTLSConfig
from serve_process import free_port
from waiting import wait_for

pytest.importorskip("temporalio", reason="the temporal extra is not installed (temporalio)")
SBIN_PATH = "/usr/sbin:/usr/local/sbin:/sbin:/usr/bin:/bin"


def issue(folder: Path) -> dict[str, Path]:
    """A CA, the frontend's certificate (localhost, 127.0.0.1) and a client certificate it signed."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.timezone.utc)

    def certificate(name: str, issuer: tuple[x509.Name, ec.EllipticCurvePrivateKey] | None, **extra: bool):
        key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        issuer_name, issuer_key = issuer or (subject, key)
        builder = (
            x509.CertificateBuilder().subject_name(subject).issuer_name(issuer_name)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=extra.get("ca", False), path_length=None), critical=True)
        )  # fmt: skip
        if extra.get("server"):
            names = [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
        return builder.sign(issuer_key, hashes.SHA256()), key

    def write(stem: str, cert: x509.Certificate, key: ec.EllipticCurvePrivateKey) -> None:
        (folder / f"{stem}.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        (folder / f"{stem}.key").write_bytes(key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        ))  # fmt: skip

    ca, ca_key = certificate("test CA", None, ca=True)
    server, server_key = certificate("localhost", (ca.subject, ca_key), server=True)
    client, client_key = certificate("hermes worker", (ca.subject, ca_key))
    write("ca", ca, ca_key), write("server", server, server_key), write("client", client, client_key)
    return {stem: folder / f"{stem}.{kind}" for stem in ("ca", "server", "client") for kind in ("pem",)} | {
        "server_key": folder / "server.key", "client_key": folder / "client.key"
    }  # fmt: skip


@pytest.fixture
def mtls_frontend(tmp_path: Path, temporal_dev: str) -> Iterator[tuple[str, dict[str, Path]]]:
    """nginx on a free loopback port: mutual TLS outside, the dev server's gRPC inside."""
    nginx = shutil.which("nginx", path=SBIN_PATH)
    if nginx is None:
        pytest.skip("nginx is not installed here (.ci/run installs it)")
    files, port = issue(tmp_path), free_port()
    temp = "\n".join(
        f"    {k}_temp_path {tmp_path / k};" for k in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")
    )
    (tmp_path / "nginx.conf").write_text(f"""
error_log {tmp_path / "error.log"};
pid {tmp_path / "nginx.pid"};
events {{ worker_connections 64; }}
http {{
    access_log {tmp_path / "access.log"};
{temp}
    server {{
        listen 127.0.0.1:{port} ssl http2;
        ssl_certificate {files["server"]};
        ssl_certificate_key {files["server_key"]};
        ssl_client_certificate {files["ca"]};
        ssl_verify_client on;
        location / {{ grpc_pass grpc://{temporal_dev}; }}
    }}
}}
""", encoding="utf-8")  # fmt: skip
    command = [
        nginx,
        "-p",
        f"{tmp_path}/",
        "-c",
        str(tmp_path / "nginx.conf"),
        "-e",
        str(tmp_path / "error.log"),
    ]
    process = subprocess.Popen([*command, "-g", "daemon off;"])
    try:
        wait_for((tmp_path / "nginx.pid").exists, 10, "nginx to start")
        yield f"127.0.0.1:{port}", files
    finally:
        process.terminate()
        process.wait(10)


async def reachable(config: TemporalConfig) -> str:
    """ "ok" when a client of `config` describes the default namespace; else what went wrong."""
    from temporalio.api.workflowservice.v1 import DescribeNamespaceRequest

    from hermes_core.engine.temporal.client import Unreachable, connect

    try:
        client = await asyncio.wait_for(connect(config), 20)
        await client.workflow_service.describe_namespace(DescribeNamespaceRequest(namespace="default"))
        return "ok"
    except Unreachable as exc:
        return f"unreachable: {exc}"
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"


async def test_mutual_tls_reaches_the_frontend_and_nothing_less_does(
    mtls_frontend: tuple[str, dict[str, Path]],
) -> None:
    address, files = mtls_frontend
    mutual = TemporalTLSConfig(
        server_ca=str(files["ca"]), client_cert=str(files["client"]), client_key=str(files["client_key"]),
        server_name="localhost",
    )  # fmt: skip
    assert await reachable(TemporalConfig(address=address, tls=mutual)) == "ok"
    server_only = TemporalTLSConfig(server_ca=str(files["ca"]), server_name="localhost")
    assert await reachable(TemporalConfig(address=address, tls=server_only)) != "ok"  # no client certificate
    assert await reachable(TemporalConfig(address=address)) != "ok"  # no TLS at all
    # doctor connects as the nodes do: with their TLS settings it gets through, without them not
    from hermes_core.config import Settings
    from hermes_core.doctor import check_temporal

    for tls, status in ((mutual, "OK"), (server_only, "FAIL")):
        settings = Settings.model_validate(
            {"engine": "temporal", "temporal": {"address": address, "tls": tls}}
        )
        check = await check_temporal(settings)
        assert check.status == status, check


async def test_unreadable_files_and_a_missing_api_key_say_which(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    missing = TemporalTLSConfig(server_ca=str(tmp_path / "nope.pem"))
    said = await reachable(TemporalConfig(address="127.0.0.1:1", tls=missing))
    assert said.startswith("unreachable: cannot read temporal.tls's") and "nope.pem" in said
    monkeypatch.delenv("TEMPORAL_TEST_KEY", raising=False)
    said = await reachable(TemporalConfig(address="127.0.0.1:1", api_key_env="TEMPORAL_TEST_KEY"))
    assert said == "unreachable: temporal.api_key_env names TEMPORAL_TEST_KEY, which is not set"


def test_a_client_certificate_needs_its_key() -> None:
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="client_cert and temporal.tls.client_key"):
        TemporalTLSConfig(client_cert="client.pem")
