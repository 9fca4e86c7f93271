"""docs/python.md covers the package's public functions and says which commands have none.

- Every public function of the package (the lower-case names of `mx2nv.__all__`, read from
  python/mx2nv/__init__.py without importing the extension) is named in the table of functions.
- Every command of the binary (`mx2nv --help`) is either the command line of a row of that table
  (`mx2nv <command>`) or named in the page's "CLI only" sentence, and the sentence names only commands
  that have no function.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from test_commands_doc import cli

REPO = Path(__file__).resolve().parents[2]
PYTHON_MD = REPO / "docs" / "python.md"
INIT = REPO / "python" / "mx2nv" / "__init__.py"


def public_functions(init_source: str) -> list[str]:
    for node in ast.walk(ast.parse(init_source)):
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
            return [e.value for e in node.value.elts if isinstance(e, ast.Constant) and e.value[:1].islower()]
    raise AssertionError("no __all__ in python/mx2nv/__init__.py")


def functions_table(text: str) -> list[tuple[str, str]]:
    """(function cell, command-line cell) of each row of the table under '## Functions'."""
    body = text.split("## Functions", 1)[1].split("\n## ", 1)[0] if "## Functions" in text else ""
    rows = []
    for line in body.split("\n"):
        if line.startswith("|") and not re.match(r"^\|[\s:|-]+\|?$", line):
            cells = [c.strip() for c in re.split(r"(?<!\\)\|", line.strip().strip("|"))]
            if len(cells) >= 2 and cells[0] != "function":
                rows.append((cells[0], cells[1]))
    return rows


def cli_only(text: str) -> set[str]:
    line = next((l for l in text.split("\n") if l.lower().startswith("cli only")), "")
    # The sentence may run over several lines: up to the end of its paragraph.
    paragraph = text[text.find(line):].split("\n\n", 1)[0] if line else ""
    return set(re.findall(r"`([a-z][\w-]*)`", paragraph))


def python_doc_problems(text: str, functions: list[str], commands: list[str]) -> list[str]:
    found = []
    rows = functions_table(text)
    named = " ".join(cell for cell, _ in rows)
    for f in functions:
        if not re.search(rf"(?<![\w.]){re.escape(f)}\b", named):
            found.append(f"mx2nv.{f} is not in docs/python.md's table of functions")
    covered = {m.group(1) for _, cell in rows for m in re.finditer(r"`mx2nv ([a-z][\w-]*)", cell)}
    only = cli_only(text)
    for c in commands:
        if c not in covered and c not in only:
            found.append(f"`mx2nv {c}` has no row in docs/python.md and is not declared CLI only")
    for c in sorted(only & covered):
        found.append(f"`{c}` is declared CLI only but has a function in docs/python.md")
    for c in sorted(only - set(commands)):
        found.append(f"`{c}` is declared CLI only but is no command of the binary")
    return found


def test_python_md_covers_the_package_and_the_commands() -> None:
    found = python_doc_problems(PYTHON_MD.read_text(encoding="utf-8"), public_functions(INIT.read_text(encoding="utf-8")),
                                list(cli()))
    assert not found, "\n".join(found)


def test_the_package_exports_the_functions_the_readme_uses() -> None:
    assert {"convert", "verify", "compare", "gate", "card"} <= set(public_functions(INIT.read_text(encoding="utf-8")))


DOC = """# Python API

## Functions

| function | command line |
|---|---|
| `convert(src, dst)` | `mx2nv convert` |
| `compare(src, other)` | `mx2nv compare --json` |

CLI only (no Python function): `requantize`
and `demo`.

## Results
"""


def test_a_complete_page_passes() -> None:
    assert python_doc_problems(DOC, ["convert", "compare"], ["convert", "compare", "requantize", "demo"]) == []


@pytest.mark.parametrize("doc, functions, commands, why", [
    (DOC.replace("| `compare(src, other)` | `mx2nv compare --json` |\n", ""), ["convert", "compare"],
     ["convert", "compare"], "mx2nv.compare is not in"),
    (DOC.replace("| `compare(src, other)` | `mx2nv compare --json` |\n", ""), ["convert"],
     ["convert", "compare"], "`mx2nv compare` has no row"),
    (DOC.replace("`requantize`\nand ", ""), ["convert", "compare"], ["convert", "compare", "requantize", "demo"],
     "`mx2nv requantize` has no row"),
    (DOC.replace("`requantize`", "`convert`"), ["convert", "compare"], ["convert", "compare", "demo"],
     "`convert` is declared CLI only but has a function"),
    (DOC, ["convert", "compare"], ["convert", "compare", "demo"], "`requantize` is declared CLI only but is no command"),
])
def test_gaps_fail(doc, functions, commands, why) -> None:
    found = python_doc_problems(doc, functions, commands)
    assert any(why in f for f in found), found
