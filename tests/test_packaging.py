"""The package as the index would carry it: a wheel and an sdist built from the tree, checked by
twine, and the wheel installed into a fresh virtual environment where its commands run.

The distribution is `hermes-kernel`: `hermes-core` on the public package index is an unrelated
project (C bindings for another "Hermes", 2017), so `pip install hermes-core` installs that. The
import name stays `hermes_core`; the command is `hermes-kernel`, with `hermes-core` kept as an alias
for one release. Where the cases come from: the core metadata specification (packaging.python.org,
"Core metadata specifications": Name, Provides-Extra, the entry points file) and `twine check`,
which renders the long description the way the index does (readme_renderer).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
import zipfile
from email.parser import Parser
from pathlib import Path
from typing import Any

import pytest

from clone import ROOT, fresh_clone

NAME = "hermes-kernel"
COMMAND = "hermes_core.cli:main"
pytestmark = pytest.mark.slow


def project() -> dict[str, Any]:
    import tomllib  # Python 3.11 and later; the tests run there

    loaded: dict[str, Any] = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    return loaded


def run(*command: str | Path, cwd: Path | None = None, env: dict[str, str] | None = None) -> str:
    done = subprocess.run(
        [str(c) for c in command], cwd=cwd, env=env, capture_output=True, text=True, timeout=600, check=False
    )
    assert done.returncode == 0, f"{command}: {done.stdout[-2000:]}\n{done.stderr[-3000:]}"
    return done.stdout


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`python -m build` on a fresh clone (the tree itself stays clean of build/)."""
    tree = fresh_clone(tmp_path_factory.mktemp("tree"))
    out = tmp_path_factory.mktemp("dist")
    run(sys.executable, "-m", "build", "--sdist", "--wheel", "--outdir", out, tree)
    return out


def test_the_name_is_the_free_one_everywhere_the_package_is_named() -> None:
    assert project()["name"] == NAME
    assert project()["scripts"] == {"hermes-kernel": COMMAND, "hermes-core": COMMAND}
    for place in ("README.md", "README.zh-CN.md", "Dockerfile", "deploy/systemd/hermes-kernel.service"):
        text = (ROOT / place).read_text(encoding="utf-8")
        assert "pip install hermes-core" not in text and '"hermes-core[' not in text, place
    assert f"pip install {NAME}" in (ROOT / "README.md").read_text(encoding="utf-8")


def test_wheel_and_sdist_pass_twine_check_and_carry_what_the_package_needs(dist: Path) -> None:
    wheels, sdists = list(dist.glob("*.whl")), list(dist.glob("*.tar.gz"))
    assert len(wheels) == 1 and len(sdists) == 1, list(dist.iterdir())
    assert wheels[0].name.startswith("hermes_kernel-") and sdists[0].name.startswith("hermes_kernel-")
    checked = run(sys.executable, "-m", "twine", "check", "--strict", wheels[0], sdists[0])
    assert checked.count("PASSED") == 2, checked

    with zipfile.ZipFile(wheels[0]) as wheel:
        names = set(wheel.namelist())
        info = next(n for n in names if n.endswith(".dist-info/METADATA"))
        metadata = Parser().parsestr(wheel.read(info).decode())
        entry_points = wheel.read(info.replace("METADATA", "entry_points.txt")).decode()
    assert metadata["Name"] == NAME
    assert {"feishu", "web", "postgres", "temporal", "mcp"} <= set(metadata.get_all("Provides-Extra") or [])
    assert "hermes-kernel = hermes_core.cli:main" in entry_points
    assert "hermes-core = hermes_core.cli:main" in entry_points
    # the files beside the code that the package reads at run time
    for needed in ("hermes_core/py.typed", "hermes_core/console/static/console.js",
                   "hermes_core/evals/tasks/default.yaml", "hermes_core/kernel/loop.py"):  # fmt: skip
        assert needed in names, needed
    assert not any(n.startswith("tests/") for n in names)
    with tarfile.open(sdists[0]) as sdist:
        members = {m.name.split("/", 1)[1] for m in sdist.getmembers() if "/" in m.name}
    assert {"pyproject.toml", "README.md", "src/hermes_core/cli.py"} <= members


def test_the_wheel_installs_into_a_fresh_venv_and_its_commands_run(dist: Path, tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    run(sys.executable, "-m", "venv", venv)
    python = venv / "bin" / "python"
    env = {k: v for k, v in os.environ.items() if k not in {"PYTHONPATH", "VIRTUAL_ENV"}}
    env["PIP_CONSTRAINT"] = str(ROOT / "constraints.txt")
    run(python, "-m", "pip", "install", "--quiet", next(dist.glob("*.whl")), env=env)

    shown = run(python, "-c", "import importlib.metadata as m, hermes_core; "
                "print(m.version('hermes-kernel'), hermes_core.__file__)", cwd=tmp_path, env=env)  # fmt: skip
    version, where = shown.split()
    assert version == project()["version"]
    assert Path(where).is_relative_to(venv), where  # the installed copy, not the tree's
    for command in ("hermes-kernel", "hermes-core"):
        helped = run(venv / "bin" / command, "--help", cwd=tmp_path, env=env)
        assert "serve" in helped and "init" in helped, helped
    # the default install answers a turn on its embedded defaults, offline
    answered = run(venv / "bin" / "hermes-kernel", "run", "what is 2+3?", cwd=tmp_path, env=env)
    assert "5" in answered, answered
