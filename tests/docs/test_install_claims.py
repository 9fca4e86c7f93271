"""The documentation installs only what exists: mx2nv is published neither on PyPI nor as a container image.

- No `pip install` in README.md, docs/**, examples/** or scripts/* asks a package index for mx2nv
  (`pip install mx2nv`, `'mx2nv[hub]'`, `mx2nv==0.1.0`); `pip install .`, `'.[hub]'` and a wheel file are
  local builds and pass.
- Every container image an example runs (`image:` in examples/**/*.yaml) is the tag of a
  `docker build -f DOCKERFILE -t IMAGE` command written in examples/, whose Dockerfile exists.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PIP_INSTALL = re.compile(r"pip3?\s+install\s+([^`|;&#\n]*)")
MX2NV_FROM_INDEX = re.compile(r"^mx2nv(\[[\w,\s-]*\])?\s*([<>=!~]=?.*)?$", re.IGNORECASE)
DOCKER_BUILD = re.compile(r"docker build\s+(?:.*?\s)?-f\s+(\S+)\s+(?:.*?\s)?-t\s+(\S+)")
IMAGE = re.compile(r"^\s*(?:-\s+)?image:\s*[\"']?([^\"'\s#]+)", re.MULTILINE)


def scanned(root: Path = REPO) -> list[Path]:
    files = [root / "README.md", *sorted((root / "docs").rglob("*.md"))]
    for folder in ("examples", "scripts"):
        files += sorted(p for p in (root / folder).rglob("*") if p.is_file() and p.suffix != ".png")
    return [f for f in files if f.exists()]


def pip_problems(path: Path, root: Path = REPO) -> list[str]:
    found = []
    for number, line in enumerate(path.read_text(encoding="utf-8", errors="replace").split("\n"), start=1):
        for m in PIP_INSTALL.finditer(line):
            try:
                words = shlex.split(m.group(1))
            except ValueError:
                words = m.group(1).split()
            for w in words:
                if MX2NV_FROM_INDEX.match(w.strip("`'\"").lstrip("(").rstrip("),.;`'\"")):
                    found.append(f"{path.relative_to(root).as_posix()}:{number}: `pip install {w}` asks an index for "
                                 "mx2nv, which is not published: `pip install .` from the repository (or a wheel it built)")
    return found


def image_problems(root: Path = REPO) -> list[str]:
    built: dict[str, str] = {}
    for path in (p for p in (root / "examples").rglob("*") if p.is_file()):
        for m in DOCKER_BUILD.finditer(path.read_text(encoding="utf-8", errors="replace")):
            built[m.group(2)] = m.group(1)
    found = []
    for tag, dockerfile in built.items():
        if not (root / dockerfile).is_file():
            found.append(f"`docker build -f {dockerfile} -t {tag}`: {dockerfile} does not exist")
    for path in sorted((root / "examples").rglob("*.y*ml")):
        for m in IMAGE.finditer(path.read_text(encoding="utf-8")):
            if m.group(1) not in built:
                found.append(f"{path.relative_to(root).as_posix()}: image {m.group(1)} is built by no "
                             "`docker build -f DOCKERFILE -t IMAGE` written in examples/")
    return found


@pytest.mark.parametrize("page", scanned(), ids=lambda p: p.relative_to(REPO).as_posix())
def test_no_pip_install_of_an_unpublished_mx2nv(page: Path) -> None:
    found = pip_problems(page)
    assert not found, "\n".join(found)


def test_every_example_image_is_built_from_the_repository() -> None:
    found = image_problems()
    assert not found, "\n".join(found)


# The checkers on small trees.


def write(root: Path, name: str, text: str) -> Path:
    path = root / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def test_local_installs_pass(tmp_path: Path) -> None:
    page = write(tmp_path, "README.md", "`pip install .` `pip install '.[hub]'` `pip install build/wheel/mx2nv-0.1.0-cp311.whl`\n"
                                        "pip install -r tests/python/requirements.txt ray\n")
    assert pip_problems(page, tmp_path) == []


@pytest.mark.parametrize("line", [
    "# the image needs mx2nv (for example: pip install mx2nv)",
    "`pip install 'mx2nv[hub]'`",
    "python -m pip install -q mx2nv==0.1.0",
    "pip3 install --upgrade MX2NV",
])
def test_installs_from_an_index_fail(tmp_path: Path, line: str) -> None:
    page = write(tmp_path, "examples/x.yaml", line + "\n")
    assert len(pip_problems(page, tmp_path)) == 1


def test_images_must_be_built_here(tmp_path: Path) -> None:
    write(tmp_path, "examples/k8s/Dockerfile", "FROM debian\n")
    write(tmp_path, "examples/k8s/job.yaml",
          "# docker build -f examples/k8s/Dockerfile -t reg.example/mx2nv:1 .\n"
          "containers:\n  - name: a\n    image: reg.example/mx2nv:1\n  - image: mx2nv:0.1.0\n")
    found = image_problems(tmp_path)
    assert len(found) == 1 and "image mx2nv:0.1.0" in found[0], found
    write(tmp_path, "examples/other.md", "docker build -f examples/gone/Dockerfile -t x:1 .\n")
    assert any("examples/gone/Dockerfile does not exist" in f for f in image_problems(tmp_path))
