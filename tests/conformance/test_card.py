"""`mx2nv card` on real conversions, checked with huggingface_hub's own
ModelCard parser and the oracle of docs/reference/model-card.md
(card_oracle.py): every figure against the reports it came from, hostile SRC
cards, and the reports a card must refuse."""

from __future__ import annotations

import json
import logging
import re
import shutil
from pathlib import Path

import pytest

import card_oracle as co
from conftest import mx2nv

REV = "0123456789abcdef0123456789abcdef01234567"
SOURCE_README = (Path(__file__).parent / "card_examples" / "demo-source-README.md").read_bytes()
SMALL = ["--layers", "2", "--experts", "4", "--hidden", "256", "--intermediate", "128", "--shards", "2"]

logging.getLogger("huggingface_hub").setLevel(logging.ERROR)


def _snapshot(root: Path, readme: bytes | None) -> Path:
    """A generated MXFP4 checkpoint laid out as a hub-cache snapshot."""
    src = root / "hub" / "models--example-org--K3-demo-MXFP4" / "snapshots" / REV
    mx2nv("generate", src, "--layout", "k3", *SMALL)
    if readme is not None:
        (src / "README.md").write_bytes(readme)
    return src


def _convert_verify(src: Path, dst: Path, report: Path) -> dict:
    mx2nv("convert", src, dst)
    mx2nv("verify", src, dst, "--report", report)
    return json.loads(report.read_text())


def _inputs(src: Path, dst: Path, report: dict, **options) -> co.CardInputs:
    gate = json.loads(mx2nv("gate", dst, "--runtime", "all", "--dtype", "both", "--tp", str(options.get("tp", 1)),
                            "--ask-runtimes", "never", "--json", check=False).stdout)
    readme = src / "README.md"
    return co.CardInputs(kind="verify", report=report, gate=gate,
                         source_readme=readme.read_bytes() if readme.is_file() else None,
                         companions=co.companions_of(dst), trust_remote_code=co.needs_trust_remote_code(dst),
                         target_format=co.target_format_of(dst), **options)


@pytest.fixture(scope="module")
def carded(built, tmp_path_factory):
    root = tmp_path_factory.mktemp("card")
    src = _snapshot(root, SOURCE_README)
    dst, report_path = root / "dst", root / "verify-report.json"
    report = _convert_verify(src, dst, report_path)
    return src, dst, report_path, report


def test_card_parses_and_every_figure_matches(carded):
    src, dst, report_path, report = carded
    companion = "example-org/K3-demo-NVFP4A16-requantized"
    mx2nv("card", src, dst, "--verify-report", report_path, "--companion", companion)
    card = co.parse_card(dst / "README.md")
    problems = co.check_card(card, _inputs(src, dst, report, companion=companion))
    assert problems == []
    assert card.model_card.data.base_model == "example-org/K3-demo-MXFP4"
    assert (dst / "README.source.md").read_bytes() == SOURCE_README
    record = json.loads((dst / ".mx2nv" / "card.json").read_text())
    assert record == co.card_record((dst / "README.md").read_bytes(), report_bytes=report_path.read_bytes(),
                                    evidence="verify", tool_version=report["provenance"]["tool_version"],
                                    source_readme=SOURCE_README)
    # Same inputs, same bytes; verify still passes.
    first = (dst / "README.md").read_bytes()
    mx2nv("card", src, dst, "--verify-report", report_path, "--companion", companion)
    assert (dst / "README.md").read_bytes() == first
    mx2nv("verify", src, dst)


@pytest.mark.parametrize("layout", ["k3", "flat"])
def test_card_of_a_modelopt_destination(built, tmp_path, layout):
    """convert --format modelopt: the card names ModelOpt W4A16_NVFP4 (tag, Format row, summary, convert
    --format, SGLang's runner), every figure still the report's."""
    src = tmp_path / "src"
    mx2nv("generate", src, "--layout", layout, *SMALL)
    (src / "README.md").write_bytes(SOURCE_README)
    dst, report_path = tmp_path / "dst", tmp_path / "verify-report.json"
    mx2nv("convert", src, dst, "--format", "modelopt")
    mx2nv("verify", src, dst, "--report", report_path)
    report = json.loads(report_path.read_text())
    assert co.target_format_of(dst) == "modelopt"
    for options in ({}, dict(repo_id="me/demo-W4A16_NVFP4", tp=2, base_model="example-org/demo")):
        argv = [a for k, v in options.items() for a in (f"--{k.replace('_', '-')}", str(v))]
        mx2nv("card", src, dst, "--verify-report", report_path, *argv)
        card = co.parse_card(dst / "README.md")
        assert co.check_card(card, _inputs(src, dst, report, **options)) == []
        assert card.model_card.data.tags == ["nvfp4", "modelopt", "mx2nv"]
        assert "compressed-tensors NVFP4A16" not in card.text
    mx2nv("verify", src, dst)


def test_card_options(carded):
    src, dst, report_path, report = carded
    options = dict(base_model="other-org/K3", repo_id="me/K3-NVFP4A16", tp=8,
                   companion="me/K3-requantized@" + "ab" * 20)
    mx2nv("card", src, dst, "--verify-report", report_path, "--base-model", options["base_model"], "--repo-id",
          options["repo_id"], "--tp", "8", "--companion", options["companion"])
    assert co.check_card(dst / "README.md", _inputs(src, dst, report, **options)) == []


@pytest.mark.parametrize("case", sorted(co.refused_reports({"window": "marlin", "provenance": {"target": "x", "source": "y"},
                                                                "fingerprint": {}})))
def test_refused_reports(carded, tmp_path, case):
    src, dst, _, report = carded
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(co.refused_reports(report)[case]))
    before = (dst / "README.md").read_bytes()
    record = (dst / ".mx2nv" / "card.json").read_bytes() if (dst / ".mx2nv" / "card.json").exists() else None
    result = mx2nv("card", src, dst, "--verify-report", bad, check=False)
    assert result.returncode == 2, result.stderr
    assert (dst / "README.md").read_bytes() == before
    after = (dst / ".mx2nv" / "card.json").read_bytes() if (dst / ".mx2nv" / "card.json").exists() else None
    assert after == record


@pytest.mark.parametrize("change", sorted(co.change_after_verify(Path("."))))
def test_dst_changed_after_verify(built, tmp_path, change):
    src = _snapshot(tmp_path, SOURCE_README)
    dst, report = tmp_path / "dst", tmp_path / "r.json"
    _convert_verify(src, dst, report)
    co.change_after_verify(dst)[change](dst)
    result = mx2nv("card", src, dst, "--verify-report", report, check=False)
    assert result.returncode == 2, result.stderr
    assert not (dst / ".mx2nv" / "card.json").exists()
    assert (dst / "README.md").read_bytes() == SOURCE_README


@pytest.mark.parametrize("case", sorted(co.hostile_source_cards()))
def test_hostile_source_cards(built, tmp_path, case):
    hostile = co.hostile_source_cards()[case]
    src = _snapshot(tmp_path, hostile.readme)
    dst, report_path = tmp_path / "dst", tmp_path / "r.json"
    report = _convert_verify(src, dst, report_path)
    result = mx2nv("card", src, dst, "--verify-report", report_path)
    assert co.check_card(dst / "README.md", _inputs(src, dst, report)) == []
    got = co.parse_card(dst / "README.md").data
    assert {k: v for k, v in got.items() if k in co.INHERITED_KEYS} == dict(hostile.inherited)
    if not hostile.usable:
        assert hostile.problem in result.stderr
    assert (dst / "README.source.md").read_bytes() == hostile.readme
    mx2nv("verify", src, dst)


def test_resume_after_card(built, tmp_path):
    src = _snapshot(tmp_path, SOURCE_README)
    dst, report = tmp_path / "dst", tmp_path / "r.json"
    _convert_verify(src, dst, report)
    mx2nv("card", src, dst, "--verify-report", report)
    card = (dst / "README.md").read_bytes()
    out = mx2nv("convert", src, dst, "--resume")
    assert "already complete" in out.stdout + out.stderr
    assert (dst / "README.md").read_bytes() == card
    assert (dst / ".mx2nv" / "card.json").is_file()
    mx2nv("verify", src, dst)


def test_requantized_companion_card(built, tmp_path):
    src = _snapshot(tmp_path, SOURCE_README)
    rq, report_path = tmp_path / "rq", tmp_path / "requantize-report.json"
    mx2nv("requantize", src, rq, "--report", report_path)
    report = json.loads(report_path.read_text())
    lossless = "example-org/K3-demo-NVFP4A16@" + "89abcdef" * 5
    mx2nv("card", src, rq, "--requantize-report", report_path, "--companion", lossless)
    gate = json.loads(mx2nv("gate", rq, "--runtime", "all", "--dtype", "both", "--ask-runtimes", "never", "--json",
                            check=False).stdout)
    inputs = co.CardInputs(kind="requantize", report=report, gate=gate, source_readme=SOURCE_README,
                           companions=co.companions_of(rq), companion=lossless, target_format=co.target_format_of(rq))
    assert co.check_card(rq / "README.md", inputs) == []
    assert "requantized" in co.parse_card(rq / "README.md").model_card.data.tags
    # A requantize report cannot card a lossless DST, nor a verify report a requantized one.
    dst, verify_report = tmp_path / "dst", tmp_path / "v.json"
    _convert_verify(src, dst, verify_report)
    assert mx2nv("card", src, dst, "--requantize-report", report_path, check=False).returncode == 2
    assert mx2nv("card", src, rq, "--verify-report", verify_report, check=False).returncode == 2


def test_gpu_check_log_is_quoted_and_checked(carded, tmp_path):
    src, dst, report_path, report = carded
    # The shape of scripts/gpu-check.sh's output (scripts/gpu_check.py prints these lines); not a measurement.
    log = ("gpu-check: <GPU name> sm90, layer <prefix>: <experts> experts\n"
           "   marlin -> <method>   float16: max abs diff <d> \x1b[0m| `x`\n")
    good = tmp_path / "gpu-check.log"
    good.write_text(log)
    mx2nv("card", src, dst, "--verify-report", report_path, "--gpu-check", good)
    assert co.check_card(dst / "README.md", _inputs(src, dst, report, gpu_check=log)) == []
    before = (dst / "README.md").read_bytes()
    for bad in ("no such line\n", "gpu-check: x\n```\n", "gpu-check: x\n" * 201):
        path = tmp_path / "bad.log"
        path.write_text(bad)
        assert mx2nv("card", src, dst, "--verify-report", report_path, "--gpu-check", path, check=False).returncode == 2
        assert (dst / "README.md").read_bytes() == before


WIDE = "language_model.model.layers.1.block_sparse_moe.experts.2.w2"


@pytest.mark.parametrize("how", [("--overspan", "bf16"), ("--overspan", "requantize"), ("--window", "e4m3")])
def test_cards_of_other_conversions(built, tmp_path, how):
    src = tmp_path / "src"
    mx2nv("generate", src, "--layout", "k3", *SMALL, "--set-span", f"{WIDE}=16")
    (src / "README.md").write_bytes(SOURCE_README)
    dst, report_path = tmp_path / "dst", tmp_path / "verify-report.json"
    mx2nv("convert", src, dst, *how)
    window = ["--window", "e4m3"] if how[0] == "--window" else []
    mx2nv("verify", src, dst, *window, "--report", report_path)
    report = json.loads(report_path.read_text())
    mx2nv("card", src, dst, "--verify-report", report_path, "--base-model", "example-org/K3-demo-MXFP4")
    assert co.check_card(dst / "README.md", _inputs(src, dst, report, base_model="example-org/K3-demo-MXFP4")) == []
    mx2nv("verify", src, dst, *window)


def test_remote_code_tokenizer_adds_trust_remote_code(built, tmp_path):
    src = _snapshot(tmp_path, None)
    tokenizer = json.loads((src / "tokenizer_config.json").read_text())
    tokenizer["auto_map"] = {"AutoTokenizer": ["tokenization_kimi.TikTokenTokenizer", None]}
    (src / "tokenizer_config.json").write_text(json.dumps(tokenizer))
    dst, report_path = tmp_path / "dst", tmp_path / "r.json"
    report = _convert_verify(src, dst, report_path)
    mx2nv("card", src, dst, "--verify-report", report_path)
    inputs = _inputs(src, dst, report)
    assert inputs.trust_remote_code
    assert co.check_card(dst / "README.md", inputs) == []
    assert "--trust-remote-code" in (dst / "README.md").read_text()
    assert not (dst / "README.source.md").exists()


def test_merged_verify_report_is_evidence(built, tmp_path):
    src = _snapshot(tmp_path, SOURCE_README)
    dst = tmp_path / "dst"
    mx2nv("convert", src, dst)
    parts = []
    for i in range(2):
        parts.append(tmp_path / f"part{i}.json")
        mx2nv("verify", src, dst, "--shards", f"{i}/2", "--report", parts[-1])
    merged = tmp_path / "verify-report.json"
    mx2nv("verify", "--merge", *parts, "--report", merged)
    report = json.loads(merged.read_text())
    assert report["fingerprint"] == json.loads(parts[0].read_text())["fingerprint"]
    mx2nv("card", src, dst, "--verify-report", merged)
    assert co.check_card(dst / "README.md", _inputs(src, dst, report)) == []
    # A part alone proves only part: refused.
    assert mx2nv("card", src, dst, "--verify-report", parts[0], check=False).returncode == 2


QUIET = "language_model.model.layers.0.block_sparse_moe.experts.1.w2"


@pytest.mark.parametrize("generate", [[], ["--k-max", "-15", "--span", "6", "--set-k-max", f"{QUIET}=-20",
                                            "--set-span", f"{QUIET}=7", "--seed", "11"]], ids=["default", "quiet"])
def test_every_figure_is_an_independent_count(built, tmp_path, generate):
    """Issue 30: each figure on the card is a count of the two trees (numpy
    over SRC and DST), not only the report's. A figure the report does not
    compute must be left out, never printed as 0. (Globals raised and
    canonicalised zero groups are verify's from the lead's change: against a
    verify that does not compute them the comparison fails.)"""
    src = tmp_path / "src"
    mx2nv("generate", src, "--layout", "k3", *SMALL, *generate)
    dst, report_path = tmp_path / "dst", tmp_path / "verify-report.json"
    _convert_verify(src, dst, report_path)
    mx2nv("card", src, dst, "--verify-report", report_path)
    figures = co.card_figures(co.parse_card(dst / "README.md"))
    counts = co.independent_counts(src, dst)
    for always in ("modules", "values_compared", "mismatches", "packed_identical", "passthrough_tensors",
                   "companion_files", "shards", "scale_groups", "source_tensor_bytes", "target_tensor_bytes"):
        assert always in figures, always
    assert {k: counts[k] for k in figures} == figures


def _paths(value, prefix=()):
    """Every (path, leaf) of a JSON value."""
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _paths(v, prefix + (k,))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _paths(v, prefix + (i,))
    else:
        yield prefix, value


def _dotted(path) -> str:
    out = ""
    for p in path:
        out += f"[{p}]" if isinstance(p, int) else ("." if out else "") + p
    return out


# The fields a card reads, as the key paths verify and requantize reports
# write them ([] stands for every element).
READ_FIELDS = re.compile(
    r"^(window|provenance\.(source|tool_version)|values_compared|mismatches|source_tensor_bytes|target_tensor_bytes|"
    r"size_change_percent|max_abs_error|counts\.(modules|scale_groups|passthrough_tensors|companion_files|shards|"
    r"active_groups|zero_groups|canonicalised_zero_groups|marlin_zeroed_groups|raised_globals)|overspan\.choice|"
    r"overspan\.bf16_layers\[\d+\]\.(layer|size_cost_bytes|why\[\d+\])|"
    r"overspan\.resolved_over_span\[\d+\]\.(module|span|limit|groups_outside)|"
    r"requantized\[\d+\]\.(module|relative_rmse|cosine|marlin_zeroed_blocks))$")


@pytest.mark.parametrize("how", [("--overspan", "requantize"), ("--overspan", "bf16")])
def test_every_field_card_reads_refuses_every_wrong_type(built, tmp_path, how):
    """Issue 31: each field the card reads, set to each value of another
    type (a string for a number, a negative or fractional count, a boolean,
    a list, an object, null where a row cannot be left out): exit 2, the key
    path named, nothing written."""
    src = tmp_path / "src"
    mx2nv("generate", src, "--layout", "k3", *SMALL, "--set-span", f"{WIDE}=16")
    dst, report_path = tmp_path / "dst", tmp_path / "verify-report.json"
    mx2nv("convert", src, dst, *how)
    mx2nv("verify", src, dst, "--report", report_path)
    good = json.loads(report_path.read_text())
    fields = [(p, v) for p, v in _paths(good) if READ_FIELDS.match(_dotted(p))]
    assert len(fields) >= 20
    nullable = re.compile(r"^(values_compared|source_tensor_bytes|target_tensor_bytes|size_change_percent|"
                          r"max_abs_error|counts\..*)$")
    bad_path = tmp_path / "bad.json"
    tried = 0
    for path, value in fields:
        dotted = _dotted(path)
        null = [] if nullable.match(dotted) else [None]
        if re.search(r"(window|source|tool_version|choice|layer|module|why\[\d+\])$", dotted):
            wrong = [7, True, [], {}] + null
        elif re.search(r"(size_change_percent|cosine)$", dotted):  # a finite number
            wrong = ["big", "0", True, [], {}] + null
        elif re.search(r"(max_abs_error|relative_rmse)$", dotted):  # finite and not negative
            wrong = ["big", "0", -0.5, -1, True, [], {}] + null
        else:  # a count
            wrong = ["many", "0", -1, 1.5, True, [], {}] + null
        for w in wrong:
            report = json.loads(json.dumps(good))
            target = report
            for p in path[:-1]:
                target = target[p]
            target[path[-1]] = w
            bad_path.write_text(json.dumps(report))
            result = mx2nv("card", src, dst, "--verify-report", bad_path, check=False)
            assert result.returncode == 2, (dotted, w, result.stderr)
            assert dotted in result.stderr, (dotted, w, result.stderr)
            assert not (dst / ".mx2nv" / "card.json").exists()
            tried += 1
    assert tried > 100
    mx2nv("card", src, dst, "--verify-report", report_path)
