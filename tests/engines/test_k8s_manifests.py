"""The Kubernetes recipe (examples/k8s/convert-job.yaml) against the
Kubernetes API schema (kubernetes-validate's bundled OpenAPI schemas, strict:
unknown fields are errors), since no cluster runs here, plus the semantics the
recipe relies on: an Indexed Job whose completions match the N in --shards
I/N, per-index retries, and every step running a real mx2nv command line."""

from __future__ import annotations

import os
import re
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
