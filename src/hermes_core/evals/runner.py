"""Run cases against the configured model and print the pass table (`hermes-kernel eval`).

Each case runs a fresh `Agent` built from the settings (`config.build_agent`): the earlier turns
of its conversation become the session history, the last user message is the task, and the
checks of `cases.py` judge the `RunResult`. A case with `files` gets its own temporary workspace.

    hermes-kernel eval --cases evals/          # exit 0: every case passed; 1: a case regressed
    hermes-kernel eval add failure.json --cases evals/
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .cases import Case, CaseError, CheckResult, evaluate, load_cases
from .traces import add_trace

if TYPE_CHECKING:
    from ..config import Settings
    from ..kernel.model import ModelClient

DEFAULT_CASES = "evals"


@dataclass
class CaseResult:
    """What one run of one case did, and which checks it failed."""

    name: str
    passed: bool
    checks: list[CheckResult] = field(default_factory=list)
    steps: int = 0  # model calls
    latency: float = 0.0  # seconds, the whole run
    prompt_tokens: int = 0
    completion_tokens: int = 0
    tools: list[str] = field(default_factory=list)  # tool names in call order
    reply: str = ""
    stop_reason: str = ""
    error: str | None = None  # the run itself failed (configuration, an exception)
    # model → [prompt, completion, cached] tokens
    tokens_by_model: dict[str, list[int]] = field(default_factory=dict)
    cached_tokens: int = 0  # of `prompt_tokens`, those the provider's prompt cache served

    @property
    def failures(self) -> list[CheckResult]:
        return [check for check in self.checks if not check.passed]

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


async def run_case(case: Case, settings: Settings, *, model: str | ModelClient | None = None) -> CaseResult:
    """Run `case` once on a fresh agent. `model` overrides the configured one (a name or a client,
    which the caller then owns and closes)."""
    from ..agent import Session
    from ..config import build_agent
    from ..models.routing import usage_by_model

    with case_workspace(case) as folder:
        started = time.perf_counter()
        try:
            agent = build_agent(case_settings(case, settings, folder), model=model)
            try:
                result = await agent.run(case.task, session=Session(messages=case.history))
            finally:
                if not _is_client(model):  # the agent built its own client: close it
                    await agent.aclose()
        except Exception as exc:  # a broken case or configuration is a failed case, not a crash
            elapsed = time.perf_counter() - started
            return CaseResult(case.name, False, latency=elapsed, error=f"{type(exc).__name__}: {exc}")
        workspace = folder or _configured_workspace(settings)
        checks = evaluate(case.checks, result, workspace)
        return CaseResult(
            case.name,
            all(check.passed for check in checks),
            checks,
            steps=result.model_calls,
            latency=result.timings.get("total", time.perf_counter() - started),
            prompt_tokens=result.usage.prompt_tokens,
            completion_tokens=result.usage.completion_tokens,
            tools=[outcome.call.name for outcome in result.tool_calls],
            reply=result.reply,
            stop_reason=result.stop_reason,
            tokens_by_model={
                name: [usage.prompt_tokens, usage.completion_tokens, usage.cached_tokens]
                for name, usage in usage_by_model(result).items()
            },
            cached_tokens=result.usage.cached_tokens,
        )


async def run_cases(cases: Sequence[Case], settings: Settings, *, concurrency: int = 4) -> list[CaseResult]:
    """Run every case, at most `concurrency` at a time; results in the order of `cases`. The agents
    share one model client, so the model's rate limit and concurrency cap hold across the cases."""
    slots = asyncio.Semaphore(max(1, concurrency))
    client = model_client(settings)

    async def one(case: Case) -> CaseResult:
        async with slots:
            return await run_case(case, settings, model=client)

    try:
        return list(await asyncio.gather(*(one(case) for case in cases)))
    finally:
        await client.aclose()


def model_client(settings: Settings) -> ModelClient:
    """The model client an agent built from `settings` would make for itself, to share between runs."""
    from ..config import build_agent
    from ..kernel.model import ModelClient

    agent = build_agent(settings)
    client: ModelClient = agent.model if isinstance(agent.model, ModelClient) else agent._build_client()
    return client  # with `model.routes`, the routed client (models/routing.py)


@contextmanager
def case_workspace(case: Case) -> Iterator[Path | None]:
    """A temporary folder holding the case's `files`, removed afterwards; None without files."""
    if not case.files:
        yield None
        return
    with tempfile.TemporaryDirectory(prefix="hermes-eval-") as name:
        root = Path(name)
        for path, content in case.files.items():
            (root / path).parent.mkdir(parents=True, exist_ok=True)
            (root / path).write_text(content, encoding="utf-8")
        yield root


def case_settings(case: Case, settings: Settings, workspace: Path | None) -> Settings:
    """The settings for one case: its own workspace and tool modules when it names them."""
    if workspace is None and case.tools is None:
        return settings
    copy = settings.model_copy(deep=True)
    if workspace is not None:
        copy.agent.workspace = str(workspace)
    if case.tools is not None:
        copy.tools = list(case.tools)
    return copy


def _configured_workspace(settings: Settings) -> Path | None:
    return Path(settings.agent.workspace) if settings.agent.workspace else None


def _is_client(model: object) -> bool:
    return model is not None and not isinstance(model, str)


# -- the pass table -------------------------------------------------------------------------------


def format_table(headers: Sequence[str], rows: Sequence[Sequence[str]], align: str = "") -> str:
    """A plain-text table; `align` has one letter per column, "l" or "r" (default "l")."""
    widths = [max(len(str(row[i])) for row in [headers, *rows]) for i in range(len(headers))]

    def line(cells: Sequence[str]) -> str:
        parts = []
        for i, cell in enumerate(cells):
            right = i < len(align) and align[i] == "r"
            parts.append(str(cell).rjust(widths[i]) if right else str(cell).ljust(widths[i]))
        return "  ".join(parts).rstrip()

    return "\n".join([line(headers), line(["-" * width for width in widths]), *(line(row) for row in rows)])


def pass_table(results: Sequence[CaseResult]) -> str:
    """The table `hermes-kernel eval` prints: one row per case, then why each failed case failed."""
    rows = [
        [
            r.name,
            "PASS" if r.passed else "FAIL",
            str(r.steps),
            f"{r.latency:.2f}",
            str(r.total_tokens),
            ",".join(dict.fromkeys(r.tools)) or "-",
        ]
        for r in results
    ]
    lines = [format_table(["case", "result", "steps", "latency (s)", "tokens", "tools"], rows, "llrrrl")]
    passed = sum(r.passed for r in results)
    lines.append(f"\n{len(results)} case(s): {passed} passed, {len(results) - passed} failed")
    for r in results:
        if r.passed:
            continue
        lines.append(f"\nFAIL {r.name}")
        if r.error:
            lines.append(f"  - error: {r.error}")
        lines.extend(f"  - {check.check}: {check.detail}" for check in r.failures)
    return "\n".join(lines)


# -- the command ----------------------------------------------------------------------------------


def eval_command(settings: Settings, args: argparse.Namespace) -> int:
    """`hermes-kernel eval [--cases DIR]` and `hermes-kernel eval add TRACE`."""
    from ..kernel.redaction import redact_text

    cases_dir = args.cases or DEFAULT_CASES
    try:
        if args.eval_command == "add":
            record = None
            if not Path(args.trace).is_file():  # a task id: its record in the trace store
                from ..observe.commands import load_trace

                try:
                    record = asyncio.run(load_trace(args.trace, settings))
                except (ValueError, LookupError) as exc:  # not JSON, or no such file nor task
                    raise CaseError(str(exc)) from None
            path = add_trace(args.trace, cases_dir, name=args.name, force=args.force, record=record)
            print(f"wrote {path}: review its checks, then run `hermes-kernel eval --cases {cases_dir}`")
            return 0
        cases = [case for case in load_cases(cases_dir) if not args.select or args.select in case.name]
    except CaseError as exc:
        print(f"hermes-kernel: {redact_text(str(exc))}", file=sys.stderr)
        return 2
    if not cases:
        matching = f" matching {args.select!r}" if args.select else ""
        print(f"hermes-kernel: no cases in {cases_dir}{matching}", file=sys.stderr)
        return 2
    try:
        results = asyncio.run(run_cases(cases, settings, concurrency=args.concurrency))
    except ValueError as exc:  # e.g. an endpoint without a model name
        print(f"hermes-kernel: {redact_text(str(exc))}", file=sys.stderr)
        return 2
    print(redact_text(pass_table(results)))
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(results_json(results), ensure_ascii=False, indent=2) + "\n")
    return 0 if all(result.passed for result in results) else 1


def results_json(results: Sequence[CaseResult]) -> dict[str, Any]:
    from ..kernel.redaction import redact_data

    cases = [asdict(result) for result in results]
    passed = sum(result.passed for result in results)
    return redact_data({"passed": passed, "failed": len(results) - passed, "cases": cases})
