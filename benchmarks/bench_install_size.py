"""Install size: `pip install <repo>` (non-editable) into a fresh venv, minus a fresh venv.

The repository is copied to a temporary folder first (without .git, build outputs, caches), so
pip's in-tree build leaves nothing behind in the working tree. The size is that of the venv's
site-packages less that of an empty venv's (pip's own baseline); the breakdown per distribution
adds up the files each one lists in its RECORD.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from _common import BENCH_DIR, format_table, row

TARGET_MB = 40.0  # the default install stays within 40 MB (optional features go into extras)
REPO = BENCH_DIR.parent
IGNORE = shutil.ignore_patterns(
    ".git", "build", "dist", "*.egg-info", "__pycache__", ".*cache", ".venv", "results"
)

# Run inside the venv: its site-packages and the bytes each distribution's RECORD lists.
SIZES = """
import json, sysconfig
from importlib.metadata import distributions
sizes = {}
for dist in distributions():
    total = 0
    for f in dist.files or ():
        path = dist.locate_file(f)
        if path.is_file():
            total += path.stat().st_size
    sizes[dist.metadata["Name"]] = total
print(json.dumps({"site_packages": sysconfig.get_paths()["purelib"], "dists": sizes}))
"""


def tree_size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())


def venv_sizes(venv: Path) -> tuple[int, dict[str, int]]:
    python = venv / "bin" / "python"
    done = subprocess.run([python, "-c", SIZES], capture_output=True, text=True, check=True)
    report = json.loads(done.stdout)
    return tree_size(Path(report["site_packages"])), report["dists"]


def run(extras: str = "") -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        tmp_path = Path(tmp)
        source = tmp_path / "source"
        shutil.copytree(REPO, source, ignore=IGNORE)
        for name in ("empty", "installed"):
            subprocess.run([sys.executable, "-m", "venv", str(tmp_path / name)], check=True)
        python = tmp_path / "installed" / "bin" / "python"
        env = {**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
        done = subprocess.run(
            [
                python,
                "-m",
                "pip",
                "install",
                "-q",
                "--no-cache-dir",
                f"{source}[{extras}]" if extras else str(source),
            ],
            capture_output=True,
            text=True,
            env=env,
        )
        if done.returncode != 0:
            raise RuntimeError(f"pip install failed:\n{done.stderr}")
        baseline, baseline_dists = venv_sizes(tmp_path / "empty")
        total, dists = venv_sizes(tmp_path / "installed")
    added = {name: size for name, size in dists.items() if name not in baseline_dists}
    figures = {
        "installed_mb": (total - baseline) / 1e6,
        "baseline_mb": baseline / 1e6,
        "dists_mb": {name: size / 1e6 for name, size in sorted(added.items(), key=lambda kv: -kv[1])},
    }
    figures["rows"] = [
        row(
            "install size (site-packages over an empty venv)",
            f"{figures['installed_mb']:.1f} MB",
            f"empty venv {figures['baseline_mb']:.1f} MB",
            figures["installed_mb"],
            TARGET_MB,
            unit=" MB",
        )
    ]
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--extras", default="", help="extras to install too, e.g. web (the target is the default's)"
    )
    args = parser.parse_args()
    figures = run(args.extras)
    mb, baseline = figures["installed_mb"], figures["baseline_mb"]
    what = f"<repo>[{args.extras}]" if args.extras else "<repo>"
    print(f"fresh venv + pip install {what}: {mb:.1f} MB over an empty venv ({baseline:.1f} MB)")
    table = [{"distribution": name, "MB": f"{mb:.2f}"} for name, mb in figures["dists_mb"].items()]
    print(format_table(table, ("distribution", "MB")))
    print()
    print(format_table(figures["rows"]))


if __name__ == "__main__":
    main()
