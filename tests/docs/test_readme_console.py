"""README.md's console blocks and card excerpt are what the binary really prints and writes
(tests/docs/readme_console.py; `python tests/docs/readme_console.py --update` rewrites them)."""

from __future__ import annotations

from pathlib import Path

import pytest

import readme_console as rc


@pytest.fixture(scope="module")
def walkthrough(tmp_path_factory) -> tuple[str, rc.Run]:
    text = rc.README.read_text(encoding="utf-8")
    folder = tmp_path_factory.mktemp("walkthrough")
    return text, rc.run_walkthrough(text, rc.binary_path(), folder)


def test_the_walkthrough_has_console_blocks_and_a_card_excerpt(walkthrough) -> None:
    text, run = walkthrough
    assert len(run.commands) >= 6
    assert any(c.text.startswith("mx2nv card ") for c in run.commands)
    assert rc.markdown_after_card(rc.blocks(text), run), "no ```markdown card excerpt after the card command"


def test_every_console_block_is_the_real_output(walkthrough) -> None:
    text, run = walkthrough
    found = rc.problems(text, run)
    assert not found, ("README.md shows output the binary does not print "
                       "(`python tests/docs/readme_console.py --update` rewrites it):\n" + "\n\n".join(found))


def test_every_walkthrough_command_succeeds(walkthrough) -> None:
    _, run = walkthrough
    failed = [f"$ {c.text}: exit {c.returncode}, expected {c.expected_exit}" for c in run.commands
              if c.returncode != c.expected_exit]
    assert not failed, "\n".join(failed)


# The matcher, the normaliser and the update on small texts.

README_TEXT = """# T

```console
$ echo one
one
$ mx2nv card s d
a
…
```

```markdown
# start … here
second
```
"""


def fake_run(outputs: list[list[str]], card: list[str] | None) -> rc.Run:
    cmds = rc.commands(README_TEXT)
    for c, out in zip(cmds, outputs):
        c.output, c.returncode = out, 0
    return rc.Run(cmds, card)


def test_blocks_and_commands_are_found() -> None:
    kinds = [b.kind for b in rc.blocks(README_TEXT)]
    assert kinds == ["console", "markdown"]
    cmds = rc.commands(README_TEXT)
    assert [(c.text, c.expected) for c in cmds] == [("echo one", ["one"]), ("mx2nv card s d", ["a", "…"])]


def test_matching_output_passes() -> None:
    run = fake_run([["one"], ["a", "b", "c"]], ["# start of the card here", "second", "third"])
    assert rc.problems(README_TEXT, run) == []


@pytest.mark.parametrize("outputs, card, where", [
    ([["two"], ["a", "b"]], ["# start X here", "second"], "`$ echo one`"),
    ([["one"], ["b"]], ["# start X here", "second"], "`$ mx2nv card s d`"),
    ([["one"], ["a"]], ["# begin", "second"], "card excerpt"),
    ([["one"], ["a"]], ["# start X here"], "card excerpt"),
    ([["one"], ["a"]], ["# start X here", "third", "second"], "card excerpt"),
    ([["one", "extra"], ["a"]], ["# start X here", "second"], "`$ echo one`"),
    ([["one"], ["a"]], None, "no card command wrote"),
])
def test_differences_fail(outputs, card, where) -> None:
    found = rc.problems(README_TEXT, fake_run(outputs, card))
    assert len(found) == 1 and where in found[0], found


def test_a_declared_exit_code() -> None:
    assert rc.Command(0, 0, "mx2nv inspect x  # exit 1", []).expected_exit == 1
    assert rc.Command(0, 0, "mx2nv inspect x", []).expected_exit == 0


def test_elisions() -> None:
    assert rc.matches(["x … s", "…", "end"], ["x 0.1 s", "end"])
    assert rc.matches(["x … s", "…", "end"], ["x 0.1 s", "m", "n", "end"])
    assert not rc.matches(["x … s", "end"], ["x 0.1 s", "m", "end"])
    assert rc.matches(["a [...] b"], ["a lots of text b", "more"], prefix=True)
    assert not rc.matches(["a [...] b"], ["a lots of text c"], prefix=True)


def test_normalise_hides_paths_durations_and_the_python_version(tmp_path: Path) -> None:
    text = (f"mx2nv verify: ok, window marlin, 12.34 s\n  source   {tmp_path}/demo\n"
            "  (asked in python3, Python 3.11.2, layer x):\n\n")
    assert rc.normalise(text, tmp_path) == [
        "mx2nv verify: ok, window marlin, … s", "  source   …/demo", "  (asked in python3, Python …, layer x):"]


def test_update_rewrites_what_differs_and_keeps_what_matches(tmp_path: Path) -> None:
    run = fake_run([["one", "new line"], ["a", "z"]], ["# start of the card here", "changed", "third"])
    new = rc.updated(README_TEXT, run)
    assert "one\nnew line\n$ mx2nv card" in new
    assert "a\n…\n```" in new  # the elision still matches: kept
    assert "# start … here\nchanged\n```" in new  # the wildcard line kept, the changed line taken
    assert rc.problems(new, run) == []


def test_the_script_checks_and_updates_a_readme(tmp_path: Path) -> None:
    binary = tmp_path / "bin" / "mx2nv"
    binary.parent.mkdir()
    binary.write_text("#!/bin/sh\necho \"fake $*\"\nmkdir -p d && echo '# card' > d/README.md\n")
    binary.chmod(0o755)
    readme = tmp_path / "README.md"
    readme.write_text("```console\n$ mx2nv card s d\nstale\n```\n\n```markdown\n# card\n```\n", encoding="utf-8")
    assert rc.main(["--readme", str(readme), "--binary", str(binary)]) == 1
    assert rc.main(["--readme", str(readme), "--binary", str(binary), "--update"]) == 0
    assert "$ mx2nv card s d\nfake card s d\n```" in readme.read_text(encoding="utf-8")
    assert rc.main(["--readme", str(readme), "--binary", str(binary)]) == 0
