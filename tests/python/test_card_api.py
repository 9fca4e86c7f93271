"""mx2nv.card: the model card from the Python API, the same bytes as the
command line's, and its refusals as UsageError."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

import mx2nv
from conftest import generate

README = "---\nlicense: mit\nlibrary_name: transformers\nwidget:\n- text: hi\n---\n# Source\n"


def _carded_inputs(tmp_path: Path) -> tuple[Path, Path, mx2nv.Report]:
    src = generate(tmp_path / "src", "--layers", "2", "--experts", "4", "--hidden", "256", "--intermediate", "128",
                   "--shards", "2")
    (src / "README.md").write_text(README)
    dst = tmp_path / "dst"
    mx2nv.convert(src, dst, threads=2)
    report = mx2nv.verify(src, dst, threads=2, report=tmp_path / "v.json")
    return src, dst, report


def test_card_from_a_report_object_and_a_file(tmp_path: Path, mx2nv_command: str) -> None:
    src, dst, report = _carded_inputs(tmp_path)
    assert report.fingerprint is not None and report.fingerprint["scheme"] == "mx2nv-fingerprint/1"
    result = mx2nv.card(src, dst, verify_report=report, base_model="example-org/K3")
    assert isinstance(result, mx2nv.CardResult)
    assert result.path == dst / "README.md" and result.source_card == "README.source.md"
    assert (dst / "README.md").read_text(encoding="utf-8") == result.text
    assert result.front_matter == {"base_model": "example-org/K3", "base_model_relation": "quantized",
                                   "license": "mit", "library_name": "transformers",
                                   "tags": ["nvfp4", "compressed-tensors", "mx2nv"]}
    assert result.inherited == ("license", "library_name") and result.dropped == ("widget",)
    assert (dst / "README.source.md").read_text() == README
    # The command line writes the same card from the report file.
    subprocess.run([mx2nv_command, "card", str(src), str(dst), "--verify-report", str(tmp_path / "v.json"),
                    "--base-model", "example-org/K3"], check=True, capture_output=True)
    assert (dst / "README.md").read_text(encoding="utf-8") == result.text
    mx2nv.verify(src, dst, threads=2)


def test_card_refusals_are_usage_errors(tmp_path: Path) -> None:
    src, dst, report = _carded_inputs(tmp_path)
    with pytest.raises(mx2nv.UsageError):
        mx2nv.card(src, dst)
    with pytest.raises(mx2nv.UsageError):
        mx2nv.card(src, dst, verify_report=report, tp=0)
    with pytest.raises(mx2nv.UsageError, match="another DST"):
        mx2nv.card(src, tmp_path / "elsewhere", verify_report=report)
    (dst / "generation_config.json").write_text("{}\n")
    with pytest.raises(mx2nv.UsageError, match="DST changed since verify"):
        mx2nv.card(src, dst, verify_report=report)
    assert (dst / "README.md").read_text() == README


def test_card_options_given_empty_or_not_a_string(tmp_path: Path) -> None:
    """A given option is used or refused, never taken for "not given": "" is
    the usage error, a non-str (0 among them) a TypeError; nothing written."""
    src, dst, report = _carded_inputs(tmp_path)
    for name in ("base_model", "companion", "repo_id"):
        with pytest.raises(mx2nv.UsageError, match=name):
            mx2nv.card(src, dst, verify_report=report, **{name: ""})
        for value in (0, 1, False, b"org/name", ["org/name"]):
            with pytest.raises(TypeError, match=name):
                mx2nv.card(src, dst, verify_report=report, **{name: value})
    for name in ("verify_report", "gpu_check"):
        options = {"verify_report": report, name: ""}
        with pytest.raises(mx2nv.UsageError, match=name):
            mx2nv.card(src, dst, **options)
    with pytest.raises(TypeError, match="verify_report"):
        mx2nv.card(src, dst, verify_report=0)
    assert not (dst / ".mx2nv" / "card.json").exists()
    assert (dst / "README.md").read_text() == README
    # A value that is a repo id is used as given.
    result = mx2nv.card(src, dst, verify_report=report, base_model="0")
    assert result.front_matter["base_model"] == "0"
