"""Files bundled with a skill (`references/`, `scripts/`, `assets/` beside its SKILL.md): listed to
the model with the skill, read through `read_skill_file` inside the skill's folder only; a body is
not cut at the tool-result cap; each environment's folder ships a skill that works end to end."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from hermes_core import Agent
from hermes_core.config import build_agent, load_settings
from hermes_core.skills import MAX_SKILL_CHARS, SkillSet
from hermes_core.testing import ScriptedModel, call, reply
from hermes_core.testing.fake_openai import FakeOpenAIServer, FakeReply
from prompt_parts import context_of

ROOT = Path(__file__).resolve().parent.parent
ENVIRONMENTS = ("dev", "staging", "prod")


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


@pytest.fixture
def skill_dir(tmp_path: Path) -> Path:
    folder = tmp_path / "skills" / "release"
    write(
        folder / "SKILL.md",
        "---\nname: release\ndescription: Cut a release.\n---\nSee references/checklist.md.\n",
    )
    write(folder / "references" / "checklist.md", "CHECK-1: tag the commit.\nCHECK-2: write the notes.\n")
    write(folder / "scripts" / "bump.sh", "#!/bin/sh\necho bump\n")
    (folder / "assets").mkdir()
    (folder / "assets" / "logo.png").write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(range(256)))
    write(folder / ".hidden", "not listed")
    write(tmp_path / "outside.txt", "SECRET-OUTSIDE")
    (folder / "references" / "escape.md").symlink_to(tmp_path / "outside.txt")
    return tmp_path / "skills"


async def run_with(skills: SkillSet, *script: object) -> tuple[object, ScriptedModel]:
    model = ScriptedModel(list(script))
    agent = Agent(model=model, skills=skills)
    return await agent.run("release it, please"), model


def test_bundled_files_are_listed_with_their_sizes_and_escaping_links_left_out(skill_dir: Path) -> None:
    skill = SkillSet.load([skill_dir]).skills["release"]
    assert [name for name, _ in skill.files] == [
        "assets/logo.png",
        "references/checklist.md",
        "scripts/bump.sh",
    ]
    text = skill.instructions()
    assert "read_skill_file" in text and "references/checklist.md (51 bytes)" in text
    assert "escape.md" not in text and ".hidden" not in text


async def test_read_skill_file_returns_the_file_and_refuses_to_leave_the_folder(skill_dir: Path) -> None:
    skills = SkillSet.load([skill_dir])
    reads = [
        ("references/checklist.md", "CHECK-2: write the notes."),
        ("../outside.txt", "not a path inside"),
        ("references/escape.md", "has no file"),  # a symlink leading out
        (str(skill_dir.parent / "outside.txt"), "not a path inside"),
        ("assets/logo.png", "not a text file"),
        ("references/none.md", "has no file"),
        ("SKILL.md", "See references/checklist.md."),
    ]
    for path, expected in reads:  # one task each: three failures in a row withdraw a tool
        result, _ = await run_with(
            skills, call("read_skill_file", {"skill": "release", "path": path}), reply("ok")
        )
        outcome = result.tool_calls[0]
        assert expected in outcome.content, (path, outcome.content)
        assert "SECRET-OUTSIDE" not in outcome.content
    unknown, _ = await run_with(skills, call("read_skill_file", {"skill": "nope", "path": "x"}), reply("ok"))
    assert "no skill named 'nope'" in unknown.tool_calls[0].content


async def test_read_skill_file_pages_through_a_long_file(skill_dir: Path) -> None:
    lines = [f"line {i:06d}\n" for i in range(10_000)]  # 120,000 characters
    write(skill_dir / "release" / "references" / "long.md", "".join(lines))
    skills = SkillSet.load([skill_dir])
    result, _ = await run_with(
        skills,
        call("read_skill_file", {"skill": "release", "path": "references/long.md"}),
        call(
            "read_skill_file", {"skill": "release", "path": "references/long.md", "offset": MAX_SKILL_CHARS}
        ),
        reply("done"),
    )
    first, second = (outcome.content for outcome in result.tool_calls)
    text = "".join(lines)
    assert first.startswith(text[:MAX_SKILL_CHARS]) and f"[read on with offset={MAX_SKILL_CHARS}]" in first
    assert second.startswith(text[MAX_SKILL_CHARS : 2 * MAX_SKILL_CHARS])
    assert f"[read on with offset={2 * MAX_SKILL_CHARS}]" in second


async def test_load_skill_returns_a_long_body_whole(tmp_path: Path) -> None:
    """The tool-result cap (3,000 characters) used to cut a body; up to MAX_SKILL_CHARS it is whole."""
    body = "".join(f"Step {i}: do thing number {i}.\n" for i in range(400))  # about 11,000 characters
    write(tmp_path / "long" / "SKILL.md", f"---\nname: long\ndescription: A long procedure.\n---\n{body}")
    result, model = await run_with(
        SkillSet.load([tmp_path]), call("load_skill", {"name": "long"}), reply("ok")
    )
    content = result.tool_calls[0].content
    assert "Step 399: do thing number 399." in content and "truncated" not in content
    assert model.calls[1].messages[-1]["content"] == content


async def test_a_body_beyond_the_limit_is_cut_with_a_note(tmp_path: Path) -> None:
    body = "x" * (MAX_SKILL_CHARS + 5_000)
    write(tmp_path / "huge" / "SKILL.md", f"---\nname: huge\ndescription: Too long.\n---\n{body}")
    result, _ = await run_with(SkillSet.load([tmp_path]), call("load_skill", {"name": "huge"}), reply("ok"))
    assert (
        f"[truncated: shown {MAX_SKILL_CHARS} of {MAX_SKILL_CHARS + 5_000} chars]"
        in result.tool_calls[0].content
    )


def test_read_skill_file_is_offered_only_with_bundled_files(skill_dir: Path, tmp_path: Path) -> None:
    assert (
        "read_skill_file" in Agent(model=ScriptedModel([]), skills=SkillSet.load([skill_dir])).registry.names
    )
    write(tmp_path / "bare" / "plain" / "SKILL.md", "---\nname: plain\ndescription: d\n---\nsteps\n")
    bare = Agent(model=ScriptedModel([]), skills=SkillSet.load([tmp_path / "bare"]))
    assert "read_skill_file" not in bare.registry.names and "load_skill" in bare.registry.names


@pytest.mark.parametrize("environment", ENVIRONMENTS)
async def test_each_environment_ships_a_skill_the_model_loads_and_reads(
    environment: str, fake: FakeOpenAIServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The environment's configuration and its skills folder, a model over HTTP (the fake server):
    the model loads the skill, reads its table, computes, and each tool result reached it."""
    monkeypatch.chdir(ROOT)
    env = {"HERMES_BASE_URL": fake.base_url, "HERMES_MODEL": "fake-model"}
    settings = load_settings(ROOT / "deploy" / "config" / f"{environment}.yaml", env=env, dotenv=None)
    settings.skills.dirs = [str(ROOT / "deploy" / "skills" / environment)]
    os.environ.update(env)
    agent = build_agent(settings)
    assert agent.skills is not None and "unit-convert" in [s.name for s in agent.skills.available]
    fake.script(
        FakeReply.tool_call("load_skill", {"name": "unit-convert"}),
        FakeReply.tool_call("read_skill_file", {"skill": "unit-convert", "path": "references/units.md"}),
        FakeReply.tool_call("calculator", {"expression": "3 * 0.5"}),
        FakeReply.text("3 斤 = 1.5 公斤"),
    )
    try:
        result = await agent.run("3 斤换算成公斤是多少？")
    finally:
        await agent.aclose()
    assert result.ok and result.reply == "3 斤 = 1.5 公斤"
    steps, table, product = (fake.requests[i].messages[-1]["content"] for i in (1, 2, 3))
    assert "## Skill: unit-convert" in steps and "references/units.md" in steps
    assert "| 斤 (jin) | kilogram | 0.5 |" in table
    assert "1.5" in product
    assert "## Skill: unit-convert" in context_of(fake.requests[0].messages)  # triggered by 换算: its steps
