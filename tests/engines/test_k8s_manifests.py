"""The Kubernetes recipe (examples/k8s/convert-job.yaml) against the
Kubernetes API schema (kubernetes-validate's bundled OpenAPI schemas, strict:
unknown fields are errors), since no cluster runs here, plus the semantics the
recipe relies on: an Indexed Job whose completions match the N in --shards
I/N, per-index retries, and every step running a real mx2nv command line."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
MANIFEST = REPO / "examples" / "k8s" / "convert-job.yaml"
# backoffLimitPerIndex is GA since 1.33; check the oldest supported and the newest.
VERSIONS = ["1.33.0", "1.37.0"]


@pytest.fixture(scope="module")
def mx2nv() -> str:
    # No conftest.py here: the suites run in one pytest session with
    # tests/conformance, whose modules import from their own conftest.
    return str(Path(os.environ.get("MX2NV", REPO / "build" / "mx2nv")).absolute())


def documents() -> list[dict]:
    return [d for d in yaml.safe_load_all(MANIFEST.read_text()) if d]


@pytest.mark.parametrize("version", VERSIONS)
def test_every_document_is_valid_against_the_api_schema(version):
    docs = documents()
    assert [d["metadata"]["name"] for d in docs] == ["mx2nv-plan", "mx2nv-convert", "mx2nv-finalize"]
    for doc in docs:
        kubernetes_validate.validate(doc, version, strict=True)


def test_the_validator_rejects_a_broken_manifest():
    doc = documents()[1]
    doc["spec"]["completions"] = "eight"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(doc, VERSIONS[-1], strict=True)
    doc = documents()[1]
    doc["spec"]["template"]["spec"]["containers"][0]["argz"] = []  # a typo: unknown field
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(doc, VERSIONS[-1], strict=True)


def test_the_indexed_job_covers_every_part_and_retries_per_index():
    plan, convert, finalize = documents()
    spec = convert["spec"]
    assert spec["completionMode"] == "Indexed"
    assert spec["backoffLimitPerIndex"] >= 1
    assert spec["template"]["spec"]["restartPolicy"] == "Never"  # required by backoffLimitPerIndex
    args = spec["template"]["spec"]["containers"][0]["args"]
    shards = args[args.index("--shards") + 1]
    m = re.fullmatch(r"\$\(JOB_COMPLETION_INDEX\)/(\d+)", shards)
    assert m and int(m.group(1)) == spec["completions"]
    plan_path = args[args.index("--plan") + 1]
    f_args = finalize["spec"]["template"]["spec"]["containers"][0]["args"]
    assert f_args == ["convert", "--plan", plan_path, "--finalize"]
    p_args = plan["spec"]["template"]["spec"]["containers"][0]["args"]
    assert p_args[0] == "plan" and plan_path == p_args[2] + "/.mx2nv/plan.json"


def test_the_recipe_runs_with_the_real_cli(mx2nv, tmp_path):
    """Run each step's command line as the pods would (the index substituted),
    on a generated checkpoint, and compare with a single-process convert."""
    src, dst, ref = tmp_path / "src", tmp_path / "dst", tmp_path / "ref"
    subprocess.run([mx2nv, "generate", src, "--shards", "5", "--layers", "2", "--experts", "2",
                    "--hidden", "64", "--intermediate", "64"], check=True, capture_output=True)
    subprocess.run([mx2nv, "convert", src, ref], check=True, capture_output=True)
    plan, convert, finalize = documents()

    def run(doc, index=None):
        args = doc["spec"]["template"]["spec"]["containers"][0]["args"]
        args = [a.replace("/data/src", str(src)).replace("/data/dst", str(dst)) for a in args]
        if index is not None:
            args = [a.replace("$(JOB_COMPLETION_INDEX)", str(index)) for a in args]
        r = subprocess.run([mx2nv, *args], capture_output=True, text=True)
        assert r.returncode == 0, r.stderr

    run(plan)
    for index in reversed(range(convert["spec"]["completions"])):
        run(convert, index)
    run(convert, 3)  # a retried index
    run(finalize)
    run(finalize)  # a re-applied step
    files = lambda root: {p.relative_to(root): p.read_bytes() for p in root.rglob("*") if p.is_file()}
    assert files(dst) == files(ref)


# The image the recipe runs: mx2nv publishes none, so examples/k8s/Dockerfile builds it, and the manifest
# names the image that Dockerfile's documented build command tags.

DOCKERFILE = REPO / "examples" / "k8s" / "Dockerfile"
BUILD_COMMAND = re.compile(r"docker build -f examples/k8s/Dockerfile -t (\S+) \.")


def documented_tags(*texts: str) -> set[str]:
    return {m.group(1) for text in texts for m in BUILD_COMMAND.finditer(text)}


def image_problems(manifest_docs: list[dict], manifest_text: str, dockerfile_text: str, version: str) -> list[str]:
    found = []
    tags = documented_tags(manifest_text, dockerfile_text)
    if len(tags) != 1:
        found.append(f"the manifest and the Dockerfile should document one build tag, not {sorted(tags)}")
    for doc in manifest_docs:
        for c in doc["spec"]["template"]["spec"]["containers"]:
            if c["image"] not in tags:
                found.append(f"{doc['metadata']['name']}: image {c['image']} is not the documented build's {sorted(tags)}")
    for tag in tags:
        if tag.rsplit(":", 1)[-1] != version:
            found.append(f"build tag {tag}: the version is not CMakeLists.txt's {version}")
    return found


def project_version() -> str:
    m = re.search(r"project\(mx2nv VERSION ([0-9.]+)", (REPO / "CMakeLists.txt").read_text())
    assert m
    return m.group(1)


def stages(dockerfile_text: str) -> list[str]:
    """The Dockerfile's stages (from each FROM to the next), comments and line continuations removed."""
    lines = [l for l in dockerfile_text.split("\n") if not l.lstrip().startswith("#")]
    text = re.sub(r"\\\n", " ", "\n".join(lines))
    return re.split(r"(?m)^FROM\s", text)[1:]


def apt_packages(stage: str) -> set[str]:
    out: set[str] = set()
    for m in re.finditer(r"apt-get install ((?:[\w.+:=-]+\s*)+)", stage):
        out |= {w for w in m.group(1).split() if not w.startswith("-")}
    return out


def setup_packages() -> set[str]:
    text = (REPO / "scripts" / "setup.sh").read_text()
    body = re.search(r"APT_PACKAGES=\((.*?)\)", text, re.DOTALL).group(1)
    return {w for line in body.split("\n") for w in line.split("#", 1)[0].split()}


def dockerfile_problems(dockerfile_text: str, cmake_text: str, setup: set[str]) -> list[str]:
    found = []
    parts = stages(dockerfile_text)
    if len(parts) != 2:
        return [f"expected a build stage and a runtime stage, found {len(parts)}"]
    build, runtime = parts
    if not build.startswith("debian:bookworm"):
        found.append("the build stage is not Debian bookworm, the release scripts/setup.sh's package names are for")
    for p in sorted(apt_packages(build) - setup):
        found.append(f"build stage installs {p}, which scripts/setup.sh does not")
    options = set(re.findall(r"option\((\w+)", cmake_text))
    for d in re.findall(r"-D(MX2NV_\w+)=", build):
        if d not in options:
            found.append(f"-D{d}: no such option in CMakeLists.txt")
    for target in re.findall(r"--target (\S+)", build):
        if not re.search(rf"add_executable\({re.escape(target)}\s", cmake_text):
            found.append(f"--target {target}: no such executable in CMakeLists.txt")
    if "COPY . /src" not in build or "cmake -S /src" not in build:
        found.append("the build stage does not build the copied repository")
    if not re.search(r"COPY --from=build /build/mx2nv /usr/local/bin/mx2nv", runtime):
        found.append("the runtime stage does not take the built binary")
    if 'ENTRYPOINT ["mx2nv"]' not in runtime:
        found.append("the entry point is not mx2nv (the manifest's args are mx2nv's)")
    return found


def linked_packages(binary: str) -> set[str]:
    """The Debian packages holding the shared libraries `binary` loads (ldd, dpkg -S)."""
    out = set()
    for line in subprocess.run(["ldd", binary], capture_output=True, text=True, check=True).stdout.split("\n"):
        m = re.search(r"=>\s*(/\S+)", line)
        if not m:
            continue
        path = os.path.realpath(m.group(1))
        owner = subprocess.run(["dpkg", "-S", path], capture_output=True, text=True)
        if owner.returncode != 0:  # merged /usr: dpkg may know it under the other prefix
            other = path.replace("/usr/lib/", "/lib/", 1) if path.startswith("/usr/lib/") else "/usr" + path
            owner = subprocess.run(["dpkg", "-S", other], capture_output=True, text=True)
        assert owner.returncode == 0, f"no Debian package holds {path}"
        out.add(owner.stdout.split(":", 1)[0].strip())
    return out


# Present in every Debian image (Essential: yes).
ESSENTIAL = {"libc6", "libgcc-s1"}


def test_every_image_is_the_one_the_dockerfile_builds():
    found = image_problems(documents(), MANIFEST.read_text(), DOCKERFILE.read_text(), project_version())
    assert not found, "\n".join(found)


def test_a_stale_or_unbuilt_image_is_refused():
    docs = documents()
    docs[1]["spec"]["template"]["spec"]["containers"][0]["image"] = "mx2nv:0.1.0"
    found = image_problems(docs, MANIFEST.read_text(), DOCKERFILE.read_text(), project_version())
    assert any("mx2nv-convert: image mx2nv:0.1.0" in f for f in found), found
    found = image_problems(documents(), MANIFEST.read_text(), DOCKERFILE.read_text(), "9.9.9")
    assert any("not CMakeLists.txt's 9.9.9" in f for f in found), found


def test_the_dockerfile_builds_mx2nv_with_the_projects_dependencies():
    found = dockerfile_problems(DOCKERFILE.read_text(), (REPO / "CMakeLists.txt").read_text(), setup_packages())
    assert not found, "\n".join(found)


@pytest.mark.parametrize("change, why", [
    (("libre2-dev", "libre2-dev libfoo-dev"), "installs libfoo-dev"),
    (("-DMX2NV_TESTS=OFF", "-DMX2NV_NO_SUCH=OFF"), "-DMX2NV_NO_SUCH"),
    (("--target mx2nv", "--target mx3nv"), "--target mx3nv"),
    (('ENTRYPOINT ["mx2nv"]', 'CMD ["mx2nv"]'), "entry point"),
    (("FROM debian:bookworm AS build", "FROM debian:trixie AS build"), "not Debian bookworm"),
])
def test_a_broken_dockerfile_is_refused(change, why):
    text = DOCKERFILE.read_text().replace(*change)
    found = dockerfile_problems(text, (REPO / "CMakeLists.txt").read_text(), setup_packages())
    assert any(why in f for f in found), found


@pytest.mark.skipif(not shutil.which("dpkg") or not shutil.which("ldd"), reason="needs Debian's dpkg and ldd")
def test_the_runtime_stage_installs_every_library_the_binary_links(mx2nv):
    runtime = stages(DOCKERFILE.read_text())[1]
    missing = linked_packages(mx2nv) - ESSENTIAL - apt_packages(runtime)
    assert not missing, f"the runtime stage lacks {sorted(missing)}, which build/mx2nv links"
