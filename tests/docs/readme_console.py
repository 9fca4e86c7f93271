"""The README's console blocks are the binary's real output.

Runs, as the README's walk-through says (PATH with the build's mx2nv first, an empty temporary folder as
the working directory), every `$ command` of every ```console block of README.md, in order, and compares
each command's output (stdout and stderr, as a terminal shows them) with the lines that follow it in the
block. The ```markdown block that follows the card command shows how the card starts: it must be the
start of the DST/README.md that command wrote.

Volatile parts are normalised in the real output before comparing: the temporary folder's path becomes
`…`, a duration `0.12 s` becomes `… s`, and gate's `Python 3.x.y` becomes `Python …`. In the README, `…`
(or `[...]` in the markdown block) inside a line stands for any text, and a line holding only `…` stands
for any number of lines. Every command must exit 0, unless its line ends with a comment `# exit N`.

    python tests/docs/readme_console.py            # check; exit 1 and a diff when the README is stale
    python tests/docs/readme_console.py --update   # rewrite the blocks from the real output

`--update` keeps each README line that still matches (so hand-written elisions survive) and takes the
real, normalised output for the rest. MX2NV (environment) or --binary names the binary (default
build/mx2nv).
"""

from __future__ import annotations

import argparse
import difflib
import os
import re
import shlex
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
ELLIPSIS = "…"
FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})\s*([\w-]*)")
DURATION = re.compile(r"(?<![\w.])\d+(?:\.\d+)? s\b")
PYTHON_VERSION = re.compile(r"\bPython \d+\.\d+(?:\.\d+)?\S*?(?=[,)\s]|$)")


@dataclass
class Block:
    kind: str  # "console" or "markdown"
    first: int  # index of the block's first content line in the README's lines
    lines: list[str]


@dataclass
class Command:
    block: int
    line: int  # index inside the block of the `$ ` line
    text: str
    expected: list[str]
    output: list[str] = field(default_factory=list)
    returncode: int | None = None

    @property
    def expected_exit(self) -> int:
        m = re.search(r"#\s*exit\s+(\d+)\s*$", self.text)
        return int(m.group(1)) if m else 0


def blocks(text: str) -> list[Block]:
    """The ```console and ```markdown fenced blocks of a Markdown text."""
    out, lines = [], text.split("\n")
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        fence, info = m.group(1), m.group(2)
        j = i + 1
        while j < len(lines) and not (lines[j].strip().startswith(fence[0] * len(fence))
                                      and not lines[j].strip().strip(fence[0])):
            j += 1
        if info in ("console", "markdown"):
            out.append(Block(info, i + 1, lines[i + 1:j]))
        i = j + 1
    return out


def commands(text: str) -> list[Command]:
    """Every `$ command` of the console blocks, with the lines the README shows as its output."""
    out = []
    for b, block in enumerate(blocks(text)):
        if block.kind != "console":
            continue
        current = None
        for k, line in enumerate(block.lines):
            if line.startswith("$ "):
                current = Command(b, k, line[2:].strip(), [])
                out.append(current)
            elif current is not None:
                current.expected.append(line)
    for c in out:
        while c.expected and not c.expected[-1].strip():
            c.expected.pop()
    return out


def normalise(text: str, folder: Path) -> list[str]:
    """Real output with its volatile parts written as the README writes them."""
    for path in sorted({str(folder), os.path.realpath(folder)}, key=len, reverse=True):
        text = text.replace(path, ELLIPSIS)
    text = DURATION.sub(f"{ELLIPSIS} s", text)
    text = PYTHON_VERSION.sub(f"Python {ELLIPSIS}", text)
    lines = text.split("\n")
    while lines and not lines[-1].strip():
        lines.pop()
    return [line.rstrip() for line in lines]


def line_pattern(expected: str) -> re.Pattern[str]:
    parts = re.split(r"…|\[\.\.\.\]", expected.rstrip())
    return re.compile(".*?".join(re.escape(p) for p in parts) + r"\Z", re.DOTALL)


def is_elision(line: str) -> bool:
    return line.strip() in (ELLIPSIS, "[...]")


def matches(expected: list[str], actual: list[str], prefix: bool = False) -> bool:
    """Whether `expected` (with inline `…` wildcards and whole-line `…` elisions) describes `actual`
    (or, with prefix=True, its first lines)."""
    @_memo
    def go(i: int, j: int) -> bool:
        if i == len(expected):
            return prefix or j == len(actual)
        if is_elision(expected[i]):
            return any(go(i + 1, k) for k in range(j, len(actual) + 1))
        return j < len(actual) and line_pattern(expected[i]).match(actual[j].rstrip()) is not None and go(i + 1, j + 1)
    return go(0, 0)


def _memo(f):
    cache: dict = {}

    def wrapped(*args):
        if args not in cache:
            cache[args] = f(*args)
        return cache[args]
    return wrapped


def merged(expected: list[str], actual: list[str], prefix: bool = False) -> list[str]:
    """What --update writes: the README's lines where they still match line for line, the real ones
    elsewhere (a block with whole-line elisions that no longer matches is replaced whole)."""
    if matches(expected, actual, prefix):
        return expected
    if prefix:
        actual = actual[:max(len(expected), 1)]
    if any(is_elision(e) for e in expected) or len(expected) != len(actual):
        return list(actual)
    return [e if line_pattern(e).match(a) else a for e, a in zip(expected, actual)]


def binary_path(given: str | None = None) -> Path:
    return Path(given or os.environ.get("MX2NV") or REPO / "build" / "mx2nv").absolute()


@dataclass
class Run:
    commands: list[Command]
    card: list[str] | None  # DST/README.md of the last card command, normalised


def run_walkthrough(text: str, binary: Path, folder: Path) -> Run:
    """Runs every console command in `folder` with `binary`'s folder first on PATH."""
    env = dict(os.environ)
    env["PATH"] = f"{binary.parent}{os.pathsep}{env.get('PATH', '')}"
    env.pop("MX2NV", None)
    cmds = commands(text)
    card_dst = None
    for c in cmds:
        r = subprocess.run(["bash", "-c", c.text], cwd=folder, env=env, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True, timeout=600)
        c.returncode = r.returncode
        c.output = normalise(r.stdout, folder)
        words = shlex.split(c.text)
        if len(words) >= 4 and words[0] == "mx2nv" and words[1] == "card":
            positional = [w for w in words[2:] if not w.startswith("-")]
            # SRC and DST come first; the option values follow their options.
            card_dst = folder / positional[1] if len(positional) >= 2 else None
    card = None
    if card_dst is not None and (card_dst / "README.md").is_file():
        card = normalise((card_dst / "README.md").read_text(encoding="utf-8"), folder)
    return Run(cmds, card)


def problems(text: str, run: Run) -> list[str]:
    """Where the README's blocks and the real output differ, each with a diff."""
    found = []
    all_blocks = blocks(text)
    shown = commands(text)
    if [c.text for c in shown] != [c.text for c in run.commands]:
        return ["README.md's commands are not those that were run: " + repr([c.text for c in shown])]
    for c, ran in zip(shown, run.commands):
        c.output, c.returncode = ran.output, ran.returncode
        if not matches(c.expected, c.output):
            where = all_blocks[c.block].first + c.line + 1
            diff = "\n".join(difflib.unified_diff(c.expected, c.output, "README", "real", lineterm="", n=1))
            found.append(f"README.md:{where}: `$ {c.text}` (exit {c.returncode}) prints otherwise:\n{diff}")
    for block in markdown_after_card(all_blocks, run):
        if run.card is None:
            found.append(f"README.md:{block.first}: a card excerpt, but no card command wrote a README.md")
        elif not matches(block.lines, run.card, prefix=True):
            diff = "\n".join(difflib.unified_diff(block.lines, run.card[:len(block.lines)], "README", "card",
                                                  lineterm="", n=1))
            found.append(f"README.md:{block.first}: the card excerpt is not how DST/README.md starts:\n{diff}")
    return found


def markdown_after_card(all_blocks: list[Block], run: Run) -> list[Block]:
    """The ```markdown blocks that follow the console block holding the card command."""
    card_blocks = [c.block for c in run.commands if shlex.split(c.text)[:2] == ["mx2nv", "card"]]
    if not card_blocks:
        return [b for b in all_blocks if b.kind == "markdown"]
    return [b for i, b in enumerate(all_blocks) if b.kind == "markdown" and i > card_blocks[0]]


def updated(text: str, run: Run) -> str:
    """`text` with every console block and the card excerpt rewritten from the real output."""
    lines = text.split("\n")
    all_blocks = blocks(text)
    replacements: dict[int, list[str]] = {}
    for b, block in enumerate(all_blocks):
        if block.kind != "console":
            continue
        new = []
        for c in (c for c in run.commands if c.block == b):
            new.append(block.lines[c.line])
            new.extend(merged(c.expected, c.output))
        replacements[b] = new
    for block in markdown_after_card(all_blocks, run):
        if run.card is not None:
            replacements[all_blocks.index(block)] = merged(block.lines, run.card, prefix=True)
    for b in sorted(replacements, reverse=True):
        block = all_blocks[b]
        lines[block.first:block.first + len(block.lines)] = replacements[b]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--update", action="store_true", help="rewrite README.md's blocks from the real output")
    parser.add_argument("--binary", help="the mx2nv to run (default: $MX2NV or build/mx2nv)")
    parser.add_argument("--readme", default=str(README), help="the README to check or update")
    args = parser.parse_args(argv)
    readme = Path(args.readme)
    text = readme.read_text(encoding="utf-8")
    with tempfile.TemporaryDirectory(prefix="mx2nv-readme-") as folder:
        run = run_walkthrough(text, binary_path(args.binary), Path(folder))
    if args.update:
        new = updated(text, run)
        if new != text:
            readme.write_text(new, encoding="utf-8")
            print(f"readme_console: updated {readme}")
        else:
            print(f"readme_console: {readme} already matches")
        return 0
    found = problems(text, run)
    for f in found:
        print(f, file=sys.stderr)
    if not found:
        print(f"readme_console: {readme}: {len(run.commands)} commands match their output")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
