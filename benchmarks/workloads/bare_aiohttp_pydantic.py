"""The bare-aiohttp floor plus importing pydantic (a required dependency of hermes_core).

Shows how much of the whole-process gap is the cost of importing pydantic itself, which any
framework that builds tool schemas with pydantic pays. Same arguments and output as bare_aiohttp.py.
"""

import runpy
import sys
from pathlib import Path

import pydantic.main  # noqa: F401  (the import is what is measured)

sys.argv[0] = str(Path(__file__).with_name("bare_aiohttp.py"))
runpy.run_path(sys.argv[0], run_name="__main__")
