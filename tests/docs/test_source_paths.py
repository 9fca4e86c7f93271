"""Every repository path the documentation cites exists, and every cited line range lies inside its file.

Scanned: README.md, docs/**/*.md, examples/** and scripts/* (their comments and messages cite paths too).
A citation is a path that starts with one of the repository's top-level folders (`src/`, `tests/`,
`scripts/`, `bench/`, `python/`, `examples/`, `docs/`, `cmake/`), optionally followed by `:LINE` or
`:FIRST-LAST`; a `*` in it is a glob that must match at least one file. The pages also name sources
relative to `src/` (`common/error.hpp`, `sys/heap.hpp`): in Markdown, a backticked path whose first folder
is one of `src/`'s folders is checked under `src/`. In docs/architecture.md's table of folders, the bare
file names a folder's row gives (`error.hpp`, `expert_table.cpp`) must be files of that folder.

Paths inside the runtimes' released wheels (`vllm/...`, `sglang/...`, `compressed_tensors/...`) start
with no folder of this repository and are not checked. Citations of other projects' source trees whose
first folder happens to share a name with one of ours are declared in EXTERNAL, each with the project it
belongs to; a declared prefix must not exist here, so it can never hide one of our own paths.
"""

from __future__ import annotations

import glob
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

TOP_FOLDERS = ("src", "tests", "scripts", "bench", "python", "examples", "docs", "cmake")

# Other projects' trees cited by path (docs/reference cites their files at a named release or commit).
EXTERNAL = {
    "src/huggingface_hub/": "huggingface/huggingface_hub",
    "src/compressed_tensors/": "vllm-project/compressed-tensors",
    "docs/hub/": "huggingface/hub-docs",
    "examples/_shard_cast_utils.py": "NVIDIA/Model-Optimizer (Kimi K3 branch)",
    "examples/kimi/": "NVIDIA/Model-Optimizer",
    "examples/deepseek/": "NVIDIA/Model-Optimizer",
    "examples/hf_ptq/": "NVIDIA/Model-Optimizer",
}

# Not preceded by a path or word character (a URL's tail, `!!python/object`, `$PWD/src/...` are not ours).
CITATION = re.compile(
    r"(?<![\w./!~$@<>{}-])((?:%s)/[\w.*+/-]*)(?::(\d+)(?:-(\d+))?)?" % "|".join(TOP_FOLDERS))
SRC_RELATIVE = re.compile(r"`([a-z_]+/[\w./*-]*)(?::(\d+)(?:-(\d+))?)?`")
FOLDER_ROW = re.compile(r"^\|\s*`([a-z_]+)/`\s*\|")
BARE_SOURCE = re.compile(r"`([\w-]+\.(?:cpp|hpp|h|py|cmake))`")


def scanned_files(root: Path = REPO) -> list[Path]:
    files = [root / "README.md", *sorted((root / "docs").rglob("*.md"))]
    for folder in ("examples", "scripts"):
        files += sorted(p for p in (root / folder).rglob("*") if p.is_file() and is_text(p))
    return [f for f in files if f.exists()]


def is_text(path: Path) -> bool:
    try:
        path.read_text(encoding="utf-8")
    except (UnicodeDecodeError, OSError):
        return False
    return True


def citations(path: Path, root: Path = REPO) -> list[tuple[int, str, int | None, int | None]]:
    """(line number, path, first, last) of every repository path `path` cites."""
    src_folders = {p.name for p in (root / "src").iterdir() if p.is_dir()} if (root / "src").is_dir() else set()
    markdown = path.suffix == ".md"
    architecture = path == root / "docs" / "architecture.md"
    out = []
    for number, line in enumerate(path.read_text(encoding="utf-8").split("\n"), start=1):
        for m in CITATION.finditer(line):
            out.append((number, m.group(1), m.group(2), m.group(3)))
        if markdown:
            for m in SRC_RELATIVE.finditer(line):
                first = m.group(1).split("/", 1)[0]
                if first in src_folders and first not in TOP_FOLDERS:
                    out.append((number, "src/" + m.group(1), m.group(2), m.group(3)))
        row = FOLDER_ROW.match(line) if architecture else None
        if row and row.group(1) in src_folders:
            for name in BARE_SOURCE.findall(line):
                out.append((number, f"src/{row.group(1)}/{name}", None, None))
    cleaned = []
    for number, cited, first, last in out:
        cited = cited.rstrip(".,;:)")
        cleaned.append((number, cited, None if first is None else int(first), None if last is None else int(last)))
    return cleaned


def problems(path: Path, root: Path = REPO) -> list[str]:
    """Why each citation of `path` does not resolve in `root` (empty when every one does)."""
    found = []
    rel = path.relative_to(root).as_posix()
    for number, cited, first, last in citations(path, root):
        if any(cited.startswith(prefix) or cited + "/" == prefix for prefix in EXTERNAL):
            continue
        where = f"{rel}:{number}: {cited}" + ("" if first is None else f":{first}" + ("" if last is None else f"-{last}"))
        if "*" in cited:
            matches = [Path(p) for p in glob.glob(str(root / cited))]
            if not matches:
                found.append(f"{where}: matches no file")
            continue
        target = root / cited
        if not target.exists():
            found.append(f"{where}: does not exist")
            continue
        if first is None:
            continue
        if not target.is_file():
            found.append(f"{where}: a line number on something that is not a file")
            continue
        lines = len(target.read_text(encoding="utf-8", errors="replace").split("\n"))
        if target.read_bytes().endswith(b"\n"):
            lines -= 1
        end = first if last is None else last
        if first < 1 or end < first or end > lines:
            found.append(f"{where}: outside the file's lines 1-{lines}")
    return found


@pytest.mark.parametrize("page", scanned_files(), ids=lambda p: p.relative_to(REPO).as_posix())
def test_cited_paths_exist(page: Path) -> None:
    found = problems(page)
    assert not found, "cited paths that are not in the repository:\n" + "\n".join(found)


def test_external_prefixes_are_not_ours() -> None:
    ours = [prefix for prefix in EXTERNAL if (REPO / prefix.rstrip("/")).exists()]
    assert not ours, f"declared as another project's tree but present in this repository: {ours}"


def test_the_scan_covers_the_docs_examples_and_scripts() -> None:
    names = {p.relative_to(REPO).as_posix() for p in scanned_files()}
    assert {"README.md", "docs/commands.md", "examples/k8s/convert-job.yaml", "scripts/test.sh"} <= names


# The checker itself, on a small repository.


def write(root: Path, name: str, text: str) -> Path:
    path = root / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def small_repo(root: Path) -> None:
    write(root, "src/common/error.hpp", "a\nb\nc\n")
    write(root, "tests/docs/x.py", "x\n")
    write(root, "scripts/test.sh", "# runs tests/docs\n")


def test_good_citations_pass(tmp_path: Path) -> None:
    small_repo(tmp_path)
    page = write(tmp_path, "README.md", "\n".join([
        "`src/common/error.hpp`, src/common/error.hpp:3, `src/common/error.hpp:1-3`, tests/docs/.",
        "`src/common/*.hpp`, `vllm/model_executor/x.py:9999`, `sglang/srt/y.py:1`, https://x.org/src/nope.cpp,",
        "`!!python/object`, `$PWD/src/nope`, `src/huggingface_hub/utils/_validators.py:95-150` (huggingface_hub)",
        "`compressed_tensors/quantization/x.py:12`", ""]))
    assert problems(page, tmp_path) == []


@pytest.mark.parametrize("text, why", [
    ("`src/io/checkpoint_reader.cpp`", "does not exist"),
    ("see src/core/report.cpp:12.", "does not exist"),
    ("`src/common/error.hpp:4`", "outside the file's lines"),
    ("`src/common/error.hpp:2-9`", "outside the file's lines"),
    ("`src/common/error.hpp:3-2`", "outside the file's lines"),
    ("`src/common/error.hpp:0`", "outside the file's lines"),
    ("`src/io/*`", "matches no file"),
    ("`tests/docs:1`", "not a file"),
    ("bench/benchmark.py --k3-structure", "does not exist"),
    ("`python/mx2nv/gone.py`", "does not exist"),
    ("`examples/k8s/Dockerfile`", "does not exist"),
])
def test_broken_citations_fail(tmp_path: Path, text: str, why: str) -> None:
    small_repo(tmp_path)
    page = write(tmp_path, "docs/page.md", f"# Page\n\n{text}\n")
    found = problems(page, tmp_path)
    assert len(found) == 1 and why in found[0], found


def test_sources_named_relative_to_src(tmp_path: Path) -> None:
    small_repo(tmp_path)
    page = write(tmp_path, "docs/performance.md", "`common/error.hpp` `common/gone.hpp` `utils/x.py:3` `common/error.hpp:9`\n")
    found = problems(page, tmp_path)
    assert len(found) == 2 and "src/common/gone.hpp" in found[0] and "outside" in found[1], found


def test_architecture_rows_name_files_of_their_folder(tmp_path: Path) -> None:
    small_repo(tmp_path)
    page = write(tmp_path, "docs/architecture.md", "\n".join([
        "| folder | what | start |", "|---|---|---|",
        "| `common/` | the error type (`error.hpp`), hashing (`hash.cpp`) | `error.hpp` |",
        "| `vllm/` | not ours (`x.py`) | |", ""]))
    found = problems(page, tmp_path)
    assert len(found) == 1 and "src/common/hash.cpp" in found[0], found


def test_scripts_are_scanned(tmp_path: Path) -> None:
    small_repo(tmp_path)
    write(tmp_path, "README.md", "")
    write(tmp_path, "scripts/run.sh", "# see tests/gone.py\n")
    found = [p for f in scanned_files(tmp_path) for p in problems(f, tmp_path)]
    assert len(found) == 1 and "tests/gone.py" in found[0], found
