"""docs/commands.md and every command line the documentation shows agree with the binary's `--help`.

- The commands are those `mx2nv --help` lists; each has a synopsis line and a `## <command>` section in
  docs/commands.md, and docs/commands.md documents no command the binary lacks.
- Every option of `mx2nv <command> --help` is documented under that command: in its synopsis line (unless
  the synopsis says `[options]` and the section lists them) and described, either in the command's section
  or in the table of options shared by several commands (whose second column names the commands).
- Every option docs/commands.md gives a command (synopsis, shared table, the first column of the
  section's tables) is in that command's `--help`.
- Every `mx2nv <command> ...` written anywhere in README.md, docs/**, examples/** and scripts/* uses only
  options of that command (a `-t1` where the CLI has `--threads` fails here).

The help text is parsed generically (CLI11's default layout, and tolerant of added defaults, choices and
example sections): an option line is a line indented by at most 8 spaces whose first text is one or more
comma-separated option names; the commands are the first words of the indented lines of the section whose
header names subcommands.
"""

from __future__ import annotations

import os
import re
import subprocess
from functools import lru_cache
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
COMMANDS_MD = REPO / "docs" / "commands.md"

OPTION_NAMES = re.compile(r"^ {0,8}((?:--?[A-Za-z0-9][\w-]*)(?:\s*,\s*--?[A-Za-z0-9][\w-]*)*)(?=[\s=\[:]|$)")
OPTION_TOKEN = re.compile(r"(?<![\w/$.-])(--[A-Za-z0-9][\w-]*|-[A-Za-z](?![\w-]))")
HELP_ONLY = {"-h", "--help"}
FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")
CODE_SPAN = re.compile(r"(`+)(.+?)(?<!`)\1(?!`)")


def binary() -> str:
    return str(Path(os.environ.get("MX2NV", REPO / "build" / "mx2nv")).absolute())


def run_help(*args: str) -> str:
    r = subprocess.run([binary(), *args, "--help"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, f"mx2nv {' '.join(args)} --help: exit {r.returncode}\n{r.stderr}"
    return r.stdout + r.stderr


def help_option_groups(text: str) -> list[frozenset[str]]:
    """The options a help text defines, each as the set of its names (`-q,--quiet`), outside sections
    whose header names examples or usage."""
    found: list[frozenset[str]] = []
    skipping = False
    for line in text.split("\n"):
        if line and not line[0].isspace():
            skipping = re.search(r"example|usage", line, re.IGNORECASE) is not None
            continue
        m = None if skipping else OPTION_NAMES.match(line.rstrip())
        if m:
            found.append(frozenset(name.strip() for name in m.group(1).split(",")))
    return found


def help_options(text: str) -> set[str]:
    """Every option name a help text defines."""
    return set().union(*help_option_groups(text))


def help_commands(text: str) -> list[str]:
    """The subcommands a top-level help text lists: the first word of each indented line of the section
    whose header (an unindented line ending in ':') mentions subcommands or commands."""
    out, inside = [], False
    for line in text.split("\n"):
        if line and not line[0].isspace():
            inside = line.rstrip().endswith(":") and re.search(r"(sub)?commands", line, re.IGNORECASE) is not None
            continue
        if inside and line.strip():
            word = line.split()[0]
            if re.fullmatch(r"[a-z][\w-]*", word) and line.startswith((" ", "\t")) and len(line) - len(line.lstrip()) <= 8:
                out.append(word)
    return out


@lru_cache(maxsize=None)
def cli() -> dict[str, list[frozenset[str]]]:
    """command -> its options (each the set of its names; -h/--help left out), from the binary."""
    commands = help_commands(run_help())
    assert commands, "no subcommands found in `mx2nv --help`"
    return {c: [g for g in help_option_groups(run_help(c)) if not g <= HELP_ONLY] for c in commands}


def names(groups) -> set[str]:
    return set().union(*groups) if groups else set()


# docs/commands.md


def sections(text: str) -> dict[str, str]:
    """'## title' -> its text, outside fenced blocks."""
    out: dict[str, str] = {}
    title, fence = None, None
    for line in text.split("\n"):
        m = FENCE.match(line)
        if m:
            fence = None if fence is not None and m.group(1)[0] == fence[0] else (fence or m.group(1))
        if fence is None and line.startswith("## "):
            title = line[3:].strip()
            out[title] = ""
            continue
        if title is not None:
            out[title] += line + "\n"
    return out


def first_code_block(text: str) -> list[str]:
    lines, inside = [], False
    for line in text.split("\n"):
        if FENCE.match(line):
            if inside:
                return lines
            inside = True
            continue
        if inside:
            lines.append(line)
    return lines


def options_in(text: str) -> set[str]:
    return set(OPTION_TOKEN.findall(text))


def synopsis(text: str) -> dict[str, tuple[set[str], bool]]:
    """command -> (options its synopsis lines name, whether they say `[options]`)."""
    out: dict[str, tuple[set[str], bool]] = {}
    current = None
    for line in first_code_block(text):
        code = line.split("#", 1)[0]
        m = re.match(r"^mx2nv\s+(\S+)", code)
        if m:
            current = None if m.group(1).startswith("-") else m.group(1)
            if current is None:
                continue
            code = code[m.end():]
        elif not line.startswith((" ", "\t")):
            current = None
        if current is None:
            continue
        opts, generic = out.get(current, (set(), False))
        out[current] = (opts | options_in(code), generic or "[options]" in code)
    return out


def table_rows(text: str) -> list[list[str]]:
    rows = []
    for line in text.split("\n"):
        if line.startswith("|") and not re.match(r"^\|[\s:|-]+\|?$", line):
            cells = re.split(r"(?<!\\)\|", line.strip().strip("|"))
            rows.append([c.strip().replace("\\|", "|") for c in cells])
    return rows


def shared_options(text: str, commands: list[str]) -> dict[str, set[str]]:
    """command -> options the shared-options table gives it ('all but X' is understood)."""
    out: dict[str, set[str]] = {c: set() for c in commands}
    body = next((v for k, v in sections(text).items() if k.lower().startswith("options shared")), "")
    for row in table_rows(body):
        if len(row) < 2:
            continue
        names = options_in(row[0].split(" ", 1)[0].strip("`")) if row[0].startswith("`") else set()
        if not names:
            continue
        which = row[1].lower()
        if which.startswith("all"):
            excluded = set(re.findall(r"[a-z][\w-]*", which.split("but", 1)[1])) if "but" in which else set()
            targets = [c for c in commands if c not in excluded]
        else:
            targets = re.findall(r"[a-z][\w-]*", which)
        for c in targets:
            out.setdefault(c, set()).update(names)
    return out


def section_options(text: str) -> dict[str, tuple[set[str], set[str]]]:
    """'## <word>' section -> (options its tables' first column names, options it mentions anywhere)."""
    out = {}
    for title, body in sections(text).items():
        if not re.fullmatch(r"[a-z][\w-]*", title):
            continue
        tabled = set()
        for row in table_rows(body):
            if row and row[0].startswith("`"):
                tabled |= options_in(row[0])
        mentioned = set()
        for m in CODE_SPAN.finditer(body):
            mentioned |= options_in(m.group(2))
        out[title] = (tabled, mentioned | tabled)
    return out


def command_doc_problems(text: str, commands: dict[str, list[frozenset[str]]]) -> list[str]:
    """Every disagreement between docs/commands.md (`text`) and the CLI's options (`commands`: each
    command's options, each the set of its names; an option is documented when one of its names is)."""
    found = []
    syn, shared, sect = synopsis(text), shared_options(text, list(commands)), section_options(text)
    for c in syn:
        if c not in commands:
            found.append(f"synopsis: `mx2nv {c}` is not a command of the binary")
    for c in sect:
        if c not in commands:
            found.append(f"section `## {c}` documents a command the binary lacks")
    for c in shared:
        if c not in commands:
            found.append(f"shared options table: `{c}` is not a command of the binary")
    for c, groups in commands.items():
        if c not in syn:
            found.append(f"{c}: no synopsis line `mx2nv {c} ...`")
        if c not in sect:
            found.append(f"{c}: no section `## {c}`")
        syn_opts, generic = syn.get(c, (set(), False))
        described = shared.get(c, set()) | sect.get(c, (set(), set()))[1]
        for group in sorted(groups, key=sorted):
            o = ",".join(sorted(group))
            if not group & syn_opts and not generic:
                found.append(f"{c}: {o} (in --help) is missing from the synopsis")
            if not group & described:
                found.append(f"{c}: {o} (in --help) is described neither in `## {c}` nor in the shared options table")
        for o in sorted((syn_opts | shared.get(c, set()) | sect.get(c, (set(), set()))[0]) - names(groups) - HELP_ONLY):
            found.append(f"{c}: docs/commands.md gives it {o}, which its --help does not have")
    return found


# Command lines anywhere in the documentation.


def documentation_files(root: Path = REPO) -> list[Path]:
    files = [root / "README.md", *sorted((root / "docs").rglob("*.md"))]
    for folder in ("examples", "scripts"):
        files += sorted(p for p in (root / folder).rglob("*") if p.is_file() and p.suffix not in (".png",))
    return [f for f in files if f.exists()]


def segments(path: Path) -> list[tuple[int, str]]:
    """(line, text) pieces in which a command line may be written: fenced lines and whole lines of
    non-Markdown files, code spans, and prose split at table-cell bars."""
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        return []
    if path.suffix != ".md":
        return joined(list(enumerate(text.split("\n"), start=1)))
    out, fence, code = [], None, []
    for number, line in enumerate(text.split("\n"), start=1):
        m = FENCE.match(line)
        if m:
            fence = None if fence is not None and m.group(1)[0] == fence[0] else (fence or m.group(1))
            if fence is None:
                out.extend(joined(code))
                code = []
            continue
        if fence is not None:
            code.append((number, line))
            continue
        for span in CODE_SPAN.finditer(line):
            out.append((number, span.group(2)))
        out.extend((number, piece) for piece in re.split(r"\s\|\s|^\||\|$", CODE_SPAN.sub(" ", line)))
    return out


def joined(lines: list[tuple[int, str]]) -> list[tuple[int, str]]:
    """Shell lines continued with a trailing backslash joined into one (numbered by their first line)."""
    out: list[tuple[int, str]] = []
    pending: tuple[int, str] | None = None
    for number, line in lines:
        if pending is not None:
            number, line = pending[0], pending[1] + " " + line
        if line.rstrip().endswith("\\"):
            pending = (number, line.rstrip()[:-1])
            continue
        pending = None
        out.append((number, line))
    if pending is not None:
        out.append(pending)
    return out


STOP = {"|", "||", "&&", ";", "#", ">", "2>", "&", ")", "2>&1"}


def invocations(path: Path, commands) -> list[tuple[int, str, list[str]]]:
    """(line, command, option tokens) of each `mx2nv <command> ...` in `path`."""
    out = []
    for number, piece in segments(path):
        for m in re.finditer(r"(?<![\w./-])mx2nv\s+([a-z][\w-]*)\b", piece):
            if m.group(1) not in commands:
                continue
            tokens = []
            for token in piece[m.end():].split():
                if token in STOP or token.startswith("#"):
                    break
                token = token.strip("[](){}\"',.`")
                token = token.split("=", 1)[0]
                if re.fullmatch(r"--?[A-Za-z][\w-]*", token):
                    tokens.append(token)
                if token.endswith(";"):
                    break
            out.append((number, m.group(1), tokens))
    return out


def invocation_problems(path: Path, commands, root: Path = REPO) -> list[str]:
    """`commands`: command -> its options (each the set of its names)."""
    found = []
    for number, command, tokens in invocations(path, commands):
        for token in tokens:
            if token not in names(commands[command]) | HELP_ONLY:
                found.append(f"{path.relative_to(root).as_posix()}:{number}: `mx2nv {command}` has no option {token}")
    return found


# The tests against the real binary and documents.


def test_commands_md_matches_every_commands_help() -> None:
    found = command_doc_problems(COMMANDS_MD.read_text(encoding="utf-8"), cli())
    assert not found, "docs/commands.md disagrees with `mx2nv <command> --help`:\n" + "\n".join(found)


@pytest.mark.parametrize("page", documentation_files(), ids=lambda p: p.relative_to(REPO).as_posix())
def test_command_lines_in_the_documentation_use_real_options(page: Path) -> None:
    found = invocation_problems(page, cli())
    assert not found, "command lines with options the binary does not have:\n" + "\n".join(found)


def test_the_binary_lists_the_documented_core_commands() -> None:
    assert {"convert", "verify", "compare", "gate", "card"} <= set(cli())
    assert {"--threads", "--report"} <= names(cli()["convert"])


# The parsers and checkers themselves, on small texts.

CLI11_TOP = """mx2nv: transcoder
Usage: mx2nv [OPTIONS] SUBCOMMAND

Options:
  -h,--help                   Print this help message and exit
  --version                   Display program version information and exit

Subcommands:
  convert                     transcode SRC into DST
  verify                      prove it
"""

CLI11_CONVERT = """transcode SRC into DST
Usage: mx2nv convert [OPTIONS] [SRC] [DST]

Positionals:
  SRC TEXT                    source checkpoint directory
Options:
  -h,--help                   Print this help message and exit
  --window TEXT:{e4m3,marlin}=marlin
                              block-scale window; --other in a description is not an option
  --threads UINT:INT in [1 - 1024]
                              worker threads
  -q,--quiet                  say less
"""

CHANGED_CONVERT = """transcode SRC into DST

Usage: mx2nv convert [OPTIONS] SRC DST

Positionals:
  SRC                         source checkpoint directory (required)

Options:
  -h, --help                  Print this help message and exit
  --window marlin|e4m3        block-scale window (default: marlin)
  --threads N                 worker threads, 1-1024 (default: all cores)
  -q, --quiet                 say less

Examples:
  mx2nv convert src dst --threads 8
      --not-an-option in an example's continuation
"""


def test_help_parser_reads_cli11s_layout_and_a_changed_one() -> None:
    assert help_commands(CLI11_TOP) == ["convert", "verify"]
    assert help_commands(CLI11_TOP.replace("Subcommands:", "Commands:")) == ["convert", "verify"]
    want = {frozenset({"-h", "--help"}), frozenset({"--window"}), frozenset({"--threads"}), frozenset({"-q", "--quiet"})}
    assert set(help_option_groups(CLI11_CONVERT)) == want
    assert set(help_option_groups(CHANGED_CONVERT)) == want


GOOD_DOC = """# Commands

```
mx2nv convert SRC DST [--window marlin|e4m3] [--threads N]
                      [-q]
mx2nv verify  SRC DST [--threads N]
mx2nv --help | --version
```

## Options shared by several commands

| option | commands | meaning |
|---|---|---|
| `--threads N` | all but nothing | threads |
| `--window marlin\\|e4m3` | convert | window |

## convert

| option | meaning |
|---|---|
| `-q`, `--quiet` | say less |

## verify

Proves it.
"""

def opts(*groups: str) -> list[frozenset[str]]:
    return [frozenset(g.split(",")) for g in groups]


GOOD_CLI = {"convert": opts("--window", "--threads", "-q,--quiet"), "verify": opts("--threads")}


def test_a_matching_doc_passes() -> None:
    assert command_doc_problems(GOOD_DOC, GOOD_CLI) == []


@pytest.mark.parametrize("cli_change, doc_change, why", [
    ({"verify": opts("--threads", "--progress")}, None, "verify: --progress (in --help) is missing from the synopsis"),
    ({"verify": opts("--threads", "--progress")}, None, "described neither"),
    ({"compare": []}, None, "compare: no synopsis line"),
    ({"compare": []}, None, "compare: no section `## compare`"),
    ({"convert": opts("--window", "--threads", "-q")}, None, "convert: docs/commands.md gives it --quiet"),
    (None, ("[--threads N]\nmx2nv --help", "[--threads N] [--gone]\nmx2nv --help"), "verify: docs/commands.md gives it --gone"),
    (None, ("| convert | window |", "| convert, verify | window |"), "verify: docs/commands.md gives it --window"),
    (None, ("## verify", "## requantize\n\nx\n\n## verify"), "`## requantize` documents a command the binary lacks"),
    (None, ("mx2nv --help", "mx2nv plan SRC DST\nmx2nv --help"), "`mx2nv plan` is not a command"),
])
def test_a_disagreeing_doc_fails(cli_change, doc_change, why) -> None:
    cli_options = {**GOOD_CLI, **(cli_change or {})}
    doc = GOOD_DOC.replace(*doc_change) if doc_change else GOOD_DOC
    found = command_doc_problems(doc, cli_options)
    assert any(why in f for f in found), found


def test_invocations_with_unknown_options_fail(tmp_path: Path) -> None:
    page = tmp_path / "docs" / "p.md"
    page.parent.mkdir()
    page.write_text("\n".join([
        "| 4-shard | mx2nv convert -t1 | 0.7 |",
        "Run `mx2nv verify SRC DST --threads 2 | jq` or `mx2nv verify --merge A B`.",
        "```sh",
        "mx2nv convert src dst --window=e4m3 --copy auto && mx2nv verify src dst  # --not-checked",
        "mx2nv verify src dst \\",
        "    --threads 2 --gone",
        "```",
        "mx2nv 0.1.0 and mx2nv.convert(x, threads=2) are not command lines; `mx2nv frobnicate --x` is no command.",
        ""]), encoding="utf-8")
    cli_options = {"convert": opts("--window", "--threads"), "verify": opts("--threads")}
    found = invocation_problems(page, cli_options, tmp_path)
    assert [f.split(": ", 1)[1] for f in found] == [
        "`mx2nv convert` has no option -t1",
        "`mx2nv verify` has no option --merge",
        "`mx2nv convert` has no option --copy",
        "`mx2nv verify` has no option --gone",
    ], found
