"""README.zh-CN.md carries every section of README.md, and both list every conversation command word.

A Chinese reader should find in README.zh-CN.md what README.md shows, in the same place: the two
files are split at their `##`/`###` headings and matched by position (the headings themselves are
in different languages). Matched sections must have the same heading level, the same fenced code
blocks (code lines compared with `#` comments left out, as those may be translated), and the
Chinese section must hold every link target and every inline command of the English one — the
commands as tests/test_doc_commands.py extracts and runs them. Links inside the page (`#…`) must
reach a heading of the same file under GitHub's anchor rule (lower-cased; punctuation other than
`-` and `_` dropped; spaces become `-`).

The conversation commands' table is checked against the parser's own declaration
(gateway/commands.py `WORDS`): each row pairs English and Chinese words of one command, and every
declared word is in the table of both files. The case that started this: issue 29, item 10 — the
Chinese file was half of the English one, and the Chinese command words were documented nowhere.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from hermes_core.gateway.commands import WORDS
from test_doc_commands import fenced_commands, inline_commands

ROOT = Path(__file__).resolve().parents[1]
ENGLISH = ROOT / "README.md"
CHINESE = ROOT / "README.zh-CN.md"

_FENCE = re.compile(r"^(```|~~~)([\w+-]*)[ \t]*\n(.*?)^\1[ \t]*$", re.M | re.S)
_HEADING = re.compile(r"^(#{2,3}) (.+)$", re.M)
_LINK = re.compile(r"\]\(([^)\s]+)\)|<(https?://[^>\s]+)>")
_CJK = re.compile(r"[\u4e00-\u9fff]")


@dataclass
class Section:
    heading: str  # "" for the text above the first `##`
    level: int
    text: str
    blocks: list[tuple[str, list[str]]] = field(default_factory=list)


def without_comment(line: str) -> str:
    """The line up to a `#` comment (a `#` inside quotes or glued to a word stays), right-stripped."""
    quote = ""
    for index, char in enumerate(line):
        if quote:
            quote = "" if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char == "#" and (index == 0 or line[index - 1].isspace()):
            return line[:index].rstrip()
        # a `#` elsewhere (in a URL's fragment, `#!`) is code
    return line.rstrip()


def code_lines(code: str) -> list[str]:
    """The block's lines without comments; a line that was only a comment is left out."""
    kept = []
    for line in code.splitlines():
        bare = without_comment(line)
        if bare or not line.strip():
            kept.append(bare)
    return kept


def sections(path: Path) -> list[Section]:
    text = path.read_text(encoding="utf-8")
    prose = _FENCE.sub(lambda m: re.sub(r"[^\n]", " ", m.group(0)), text)  # no headings in code
    starts = [(m.start(), len(m.group(1)), m.group(2).strip()) for m in _HEADING.finditer(prose)]
    bounds = [(0, 1, ""), *starts, (len(text), 0, "")]
    found = []
    for (start, level, heading), (end, _, _) in zip(bounds, bounds[1:], strict=False):
        part = text[start:end]
        blocks = [(m.group(2), code_lines(m.group(3))) for m in _FENCE.finditer(part)]
        found.append(Section(heading, level, part, blocks))
    return found


def paired() -> list[tuple[Section, Section]]:
    english, chinese = sections(ENGLISH), sections(CHINESE)
    outline = [(s.level, s.heading) for s in english], [(s.level, s.heading) for s in chinese]
    assert len(english) == len(chinese), f"the headings differ in number:\n{outline[0]}\n{outline[1]}"
    return list(zip(english, chinese, strict=True))


def links(text: str) -> set[str]:
    return {inside or auto for inside, auto in _LINK.findall(text)}


def commands(section: Section) -> set[str]:
    """What tests/test_doc_commands.py would run from this section: inline spans and shell lines."""
    found = inline_commands(section.text) + fenced_commands(section.text.splitlines())
    return {command for _, command in found}


def anchor(heading: str) -> str:
    """GitHub's id for a heading: lower case, punctuation but `-`/`_` dropped, spaces to `-`."""
    plain = re.sub(r"`|\*\*|\[([^\]]*)\]\([^)]*\)", r"\1", heading).strip().lower()
    return re.sub(r"[^\w\- ]", "", plain).replace(" ", "-")


def label(pair: tuple[Section, Section]) -> str:
    return f"{pair[0].heading or '(top)'!r} ↔ {pair[1].heading or '(top)'!r}"


def test_the_headings_match_in_number_level_and_order() -> None:
    """Attack: README.zh-CN.md as it was (190 lines: no testing, approvals or guarantees sections)."""
    for english, chinese in paired():
        assert english.level == chinese.level, label((english, chinese))
    assert all(_CJK.search(c.heading) for _, c in paired()[1:]), "every Chinese heading is in Chinese"


def test_every_code_block_is_the_same_in_the_same_section() -> None:
    """Attack: a YAML example left out, a command changed in translation (`hermes-kernel run "现在几点"`
    where README.md runs `"计算 (12+34)*2"`), a string inside the Python examples translated."""
    for pair in paired():
        english, chinese = pair
        for index, (want, got) in enumerate(zip(english.blocks, chinese.blocks, strict=False)):
            assert want == got, f"{label(pair)}: code block {index + 1} differs"
        assert len(english.blocks) == len(chinese.blocks), f"{label(pair)}: a code block is missing"


def test_every_command_and_link_is_in_the_same_section() -> None:
    """Attack: the quick start without the console's address; a docs/ page linked only in English;
    a command that tests/test_doc_commands.py runs from README.md missing from the Chinese file.
    Each file's top links the other."""
    pairs = paired()
    assert links(pairs[0][0].text) >= {CHINESE.name} and links(pairs[0][1].text) >= {ENGLISH.name}
    for pair in pairs:
        english, chinese = pair
        missing = sorted(commands(english) - commands(chinese))
        assert not missing, f"{label(pair)}: commands missing from README.zh-CN.md: {missing}"
        outside = {link for link in links(english.text) if not link.startswith("#")} - {CHINESE.name}
        absent = sorted(outside - links(chinese.text))
        assert not absent, f"{label(pair)}: links missing from README.zh-CN.md: {absent}"


@pytest.mark.parametrize("path", [ENGLISH, CHINESE], ids=lambda p: p.name)
def test_links_inside_the_page_reach_a_heading(path: Path) -> None:
    """Attack: the quick start's link to its model section copied as `#connect-a-model` into the
    Chinese file, whose heading is 接入模型 (ids by GitHub's rule, as in the module docstring)."""
    text = path.read_text(encoding="utf-8")
    targets = {anchor(heading) for _, heading in _HEADING.findall(text)}
    broken = sorted(link for link in links(text) if link.startswith("#") and link[1:] not in targets)
    assert not broken, f"{path.name}: no heading for {broken} (headings: {sorted(targets)})"


def command_table(path: Path) -> list[tuple[list[str], list[str]]]:
    """The rows of the conversation commands' table: (English words, Chinese words)."""
    rows = []
    for line in path.read_text(encoding="utf-8").splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if line.lstrip().startswith("|") and len(cells) >= 2 and cells[0].startswith("`/"):
            rows.append((re.findall(r"`/([^`\s]+)", cells[0]), re.findall(r"`/([^`\s]+)", cells[1])))
    return rows


@pytest.mark.parametrize("path", [ENGLISH, CHINESE], ids=lambda p: p.name)
def test_the_command_table_lists_every_declared_word_in_both_languages(path: Path) -> None:
    """Attack: a command word added to the parser (gateway/commands.py `WORDS`) and not to the
    READMEs, or a row pairing an English word with another command's Chinese word."""
    rows = command_table(path)
    assert rows, f"{path.name}: no table of conversation commands (rows starting with `/word`)"
    for english, chinese in rows:
        assert english and chinese, f"{path.name}: a row lacks a language: {english} {chinese}"
        assert not any(_CJK.search(word) for word in english), f"{path.name}: {english}"
        assert all(_CJK.search(word) for word in chinese), f"{path.name}: {chinese}"
        names = {WORDS.get(word.lower()) for word in english + chinese}
        assert len(names) == 1 and None not in names, f"{path.name}: {english} ≠ {chinese} ({names})"
    listed = {word for english, chinese in rows for word in english + chinese}
    missing = sorted(set(WORDS) - listed)
    assert not missing, f"{path.name}: the command table lacks {missing}"
