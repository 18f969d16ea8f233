"""Cold import time: `python -c "import hermes_core"` vs `python -c "import httpx"`.

Each case is a whole new interpreter process (wall time, so interpreter start-up is included;
`python -c pass` is shown as that floor). The cases alternate, in a rotating order, and every
case runs once untimed first so that all .pyc files exist (cold process, warm disk cache).
"""

from __future__ import annotations

import argparse
import importlib.util
import subprocess
import sys
import tempfile

from _common import format_table, median, ratio, row, timed_run

CASES = {
    "floor (pass)": "pass",
    "import httpx": "import httpx",
    "from pydantic import BaseModel": "from pydantic import BaseModel",
    "import hermes_core": "import hermes_core",
    "from hermes_core import Agent, tool": "from hermes_core import Agent, tool",
}
TARGET = 1.5


def ensure_httpx() -> None:
    """httpx is no dependency of the project: install it here if it is missing."""
    if importlib.util.find_spec("httpx") is not None:
        return
    print("httpx is not installed: pip install httpx (for this benchmark only)", flush=True)
    command = [sys.executable, "-m", "pip", "install", "-q", "httpx"]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"pip install httpx failed:\n{done.stderr}")


def run(runs: int = 9) -> dict:
    ensure_httpx()
    times: dict[str, list[float]] = {name: [] for name in CASES}
    names = list(CASES)
    with tempfile.TemporaryDirectory() as cwd:  # an empty cwd: nothing on it shadows a package
        for name in names:
            timed_run([sys.executable, "-c", CASES[name]], cwd=cwd)
        for i in range(runs):
            for name in names[i % len(names) :] + names[: i % len(names)]:
                times[name].append(timed_run([sys.executable, "-c", CASES[name]], cwd=cwd)[0])
    medians = {name: median(values) for name, values in times.items()}
    httpx, floor = medians["import httpx"], medians["floor (pass)"]
    figures = {"runs": runs, "median_s": medians, "floor_s": floor}
    rows = []
    for name in ("import hermes_core", "from hermes_core import Agent, tool"):
        figures[f"ratio {name}"] = ratio(medians[name], httpx)
        rows.append(
            row(
                f"{name} vs import httpx (process)",
                f"{medians[name] * 1e3:.0f} ms",
                f"{httpx * 1e3:.0f} ms",
                figures[f"ratio {name}"],
                TARGET,
            )
        )
    figures["rows"] = rows
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=9, help="timed runs of each case (>= 7)")
    figures = run(parser.parse_args().runs)
    floor = figures["floor_s"]
    print(f"cold import, whole process, median of {figures['runs']} alternating runs")
    table = [
        {
            "case": f"python -c {CASES[name]!r}",
            "median": f"{t * 1e3:.1f} ms",
            "over floor": f"{(t - floor) * 1e3:.1f} ms",
        }
        for name, t in figures["median_s"].items()
    ]
    print(format_table(table, ("case", "median", "over floor")))
    print()
    print(format_table(figures["rows"]))


if __name__ == "__main__":
    main()
