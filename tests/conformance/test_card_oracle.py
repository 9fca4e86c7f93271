"""Self-test of card_oracle.py on the hand-written cards in card_examples/
(docs/reference/model-card.md §9). `mx2nv card` does not exist yet: these
tests check the oracle itself — that it accepts cards that follow the spec,
catches each kind of wrong card, reads SRC cards as huggingface_hub does, and
that the spec's YAML emission round-trips through huggingface_hub."""

from __future__ import annotations

import json
import logging
from dataclasses import replace
from pathlib import Path

import pytest
import yaml
from huggingface_hub import ModelCard

import card_oracle as co

EXAMPLES = Path(__file__).parent / "card_examples"
REV = "0123456789abcdef0123456789abcdef01234567"
COMPANIONS = ["README.md", "assets/LICENSE.txt", "generation_config.json", "tiktoken.model", "tokenizer_config.json"]

logging.getLogger("huggingface_hub").setLevel(logging.ERROR)  # "metadata block not found" on hostile cards


def _json(name: str) -> dict:
    return json.loads((EXAMPLES / name).read_text())


@pytest.fixture
def lossless() -> tuple[str, co.CardInputs]:
    inputs = co.CardInputs(kind="verify", report=_json("demo-verify-report.json"), gate=_json("demo-gate.json"),
                           source_readme=(EXAMPLES / "demo-source-README.md").read_bytes(), companions=COMPANIONS,
                           companion="example-org/K3-demo-NVFP4A16-requantized")
    return (EXAMPLES / "demo-lossless.md").read_text(encoding="utf-8"), inputs


@pytest.fixture
def requantized() -> tuple[str, co.CardInputs]:
    inputs = co.CardInputs(kind="requantize", report=_json("demo-requantize-report.json"),
                           gate=_json("demo-requantized-gate.json"),
                           source_readme=(EXAMPLES / "demo-source-README.md").read_bytes(), companions=COMPANIONS,
                           companion="example-org/K3-demo-NVFP4A16@89abcdef0123456789abcdef0123456789abcdef",
                           repo_id="example-org/K3-demo-NVFP4A16-requantized")
    return (EXAMPLES / "demo-requantized.md").read_text(encoding="utf-8"), inputs


# --- the examples follow the spec -------------------------------------------

def test_examples_pass_every_check(lossless, requantized):
    for name, (text, inputs) in (("demo-lossless.md", lossless), ("demo-requantized.md", requantized)):
        assert co.check_card(EXAMPLES / name, inputs) == [], name
        assert co.check_card(text, inputs) == [], name


def test_examples_through_huggingface_hub(lossless, requantized):
    card = ModelCard.load(EXAMPLES / "demo-lossless.md")
    assert card.data.base_model == "example-org/K3-demo-MXFP4"
    assert card.data["base_model_relation"] == "quantized"
    assert card.data.license_name == "d\u00e9mo-license"  # escaped as \xE9 in the ASCII front matter
    assert card.data.tags == ["nvfp4", "compressed-tensors", "mx2nv"]
    assert card.data.eval_results is None and "widget" not in card.data
    rq = ModelCard.load(EXAMPLES / "demo-requantized.md")
    assert rq.data.tags[-1] == "requantized"
    # huggingface_hub's own round trip of the front matter keeps every value.
    again = ModelCard(str(card))
    assert again.data.to_dict() == card.data.to_dict()


def test_tables_read_back_the_report_exactly(lossless, requantized):
    card = co.parse_card(lossless[0])
    verified = card.tables("Verified")[0].kv()
    report = lossless[1].report
    assert int(verified["Values compared"]) == report["values_compared"]
    assert float(verified["Max abs error"]) == report["max_abs_error"]
    fmt = card.tables("Format")[0].kv()
    assert co.ints_in(fmt["Tensor data size"]) == [report["target_tensor_bytes"], report["source_tensor_bytes"]]
    assert str(report["size_change_percent"]) in fmt["Size change"]
    rq = co.parse_card(requantized[0])
    rows = rq.tables("Error against the source")[0].kv()
    mods = requantized[1].report["requantized"]
    assert co.first_number(rows["Relative RMSE, worst"]) == max(m["relative_rmse"] for m in mods)
    assert co.first_number(rows["Cosine, worst"]) == min(m["cosine"] for m in mods)
    assert co.code_spans(rows["Cosine, worst"]) == ["language_model.model.layers.1.block_sparse_moe.experts.3.w1"]


# --- the oracle catches wrong cards -----------------------------------------

TAMPERS_LOSSLESS = {
    "a value off by one": ("| Values compared | 6291456 |", "| Values compared | 6291457 |"),
    "a rounded count": ("| Values compared | 6291456 |", "| Values compared | 6.3 M |"),
    "a rounded percentage": ("| Size change | +4.9815 % |", "| Size change | +4.98 % |"),
    "a sign lost": ("| Size change | +4.9815 % |", "| Size change | 4.9815 % |"),
    "max abs error as int": ("| Max abs error | 0.0 |", "| Max abs error | 0 |"),
    "mismatches decorated": ("| Mismatches | 0 |", "| Mismatches | 0 (none) |"),
    "packed identical wrong": ("48 of 48 modules", "47 of 48 modules"),
    "tag missing": ('- "mx2nv"\n', ""),
    "relation wrong": ('base_model_relation: "quantized"', 'base_model_relation: "finetune"'),
    "unquoted scalar": ('license: "other"', "license: other"),
    "dropped key kept": ('tags:\n', 'widget:\n- "hi"\ntags:\n'),
    "license not inherited": ('license: "other"\n', ""),
    "raw non-ascii in front matter": ('"d\\xE9mo-license"', '"d\u00e9mo-license"'),
    "dashes in body": ("## License\n", "---\n\n## License\n"),
    "verdict flipped": ("| vllm | 0.33.0 | humming | bf16 | 1 | RUN | — |", "| vllm | 0.33.0 | humming | bf16 | 1 | BLOCKED | — |"),
    "tp cell changed": ("| 16 | ok | ok | `intermediate per partition 16 % 64 != 0 (scheme :225-229)` |",
                        "| 16 | ok | ok | ok |"),
    "load command dropped": ('python -m sglang.launch_server --model-path "$MODEL" --tp-size 1 --dtype float16\n', ""),
    "needless --quantization": ('--dtype bfloat16\nvllm', '--dtype bfloat16 --quantization compressed-tensors\nvllm'),
    "local path leaked": ("DST: this repository.", "DST: /home/alice/k3-demo-nvfp4."),
    "companion link": ("(https://huggingface.co/example-org/K3-demo-NVFP4A16-requantized)",
                       "(https://huggingface.co/example-org/other)"),
    "dropped keys not listed": (" Not carried over: `base_model`, `extra_gated_prompt`, `model-index`, `note`, `tags`, `widget`.", ""),
    "sections swapped": ("## Source card", "## Source-card"),
    "window wrong": ("| Window | `marlin` |\n| Over-span", "| Window | `e4m3` |\n| Over-span"),
    "revision wrong": (f"at revision `{REV}` |", "at revision `main` |"),
    "no GPU claim softened": ("- No GPU has run this checkpoint.\n", ""),
    "license file missing": ("[assets/LICENSE.txt](assets/LICENSE.txt)", "the license"),
    "crlf": ("\n", "\r\n"),
}


@pytest.mark.parametrize("name", sorted(TAMPERS_LOSSLESS))
def test_tampered_lossless_card_is_caught(lossless, name):
    text, inputs = lossless
    old, new = TAMPERS_LOSSLESS[name]
    assert old in text, f"tamper {name}: {old!r} not in the example"
    tampered = text.replace(old, new)
    try:
        problems = co.check_card(tampered, inputs)
    except Exception as e:  # a card huggingface_hub or the table reader cannot even take is caught too
        problems = [f"{type(e).__name__}: {e}"]
    assert problems, name


TAMPERS_REQUANTIZED = {
    "median is a mean": ("| Relative RMSE, median | 0.021328315973167495 |", "| Relative RMSE, median | 0.02133 |"),
    "worst module wrong": ("| Cosine, worst | 0.9997402685235218 (`language_model.model.layers.1.block_sparse_moe.experts.3.w1`) |",
                           "| Cosine, worst | 0.9997402685235218 (`language_model.model.layers.0.block_sparse_moe.experts.3.w1`) |"),
    "marlin count": ("0 of 48 modules (0 blocks", "1 of 48 modules (7 blocks"),
    "lossy tag missing": ('- "requantized"\n', ""),
    "exactness claimed": ("| Weights | FP4 (E2M1), two per byte, requantized (lossy) |",
                          "| Weights | FP4 (E2M1), two per byte: the source's packed bytes, unchanged |"),
    "revision not pinned": ("at revision `89abcdef0123456789abcdef0123456789abcdef`.", "."),
    "error caveat missing": ("- The error table measures stored weights against the MXFP4 values, not model outputs.\n", ""),
}


@pytest.mark.parametrize("name", sorted(TAMPERS_REQUANTIZED))
def test_tampered_requantized_card_is_caught(requantized, name):
    text, inputs = requantized
    old, new = TAMPERS_REQUANTIZED[name]
    assert old in text, f"tamper {name}: {old!r} not in the example"
    assert co.check_card(text.replace(old, new), inputs), name


def test_wrong_inputs_are_caught(lossless):
    text, inputs = lossless
    assert co.check_card(text, replace(inputs, tp=2))  # gate asked at another TP
    assert co.check_card(text, replace(inputs, companion=None))  # section without the option
    assert co.check_card(text, replace(inputs, trust_remote_code=True))  # the flag is missing
    other = json.loads(json.dumps(inputs.report))
    other["counts"]["passthrough_tensors"] += 1
    assert co.check_card(text, replace(inputs, report=other))
    convert = json.loads(json.dumps(inputs.report))
    convert["command"] = "convert"
    assert co.check_card(text, replace(inputs, convert_report=convert)) == []
    convert["target_tensor_bytes"] -= 16
    assert co.check_card(text, replace(inputs, convert_report=convert))


# --- parser helpers ------------------------------------------------------------

def test_split_row_reads_escaped_pipes_like_cmark_gfm():
    assert co.split_row(r"| a | `x \| y` | b\\|c |") == ["a", "`x | y`", "b\\|c"]
    assert co.split_row("| 1 | ok |") == ["1", "ok"]


@pytest.mark.parametrize("text", ["plain", "a`b", "``x``", "`lead", "trail`", " spaced ", "a|b", "a\x01b\u2028c",
                                  "<script>alert(1)</script>", "*em* _u_"])
def test_md_code_reads_back(text):
    span = co.md_code(text, in_table=True)
    cell = co.split_row(f"| {span} |")[0]
    assert co.code_spans(cell) == [co.printable_escape(text)]


def test_numbers_and_medians():
    assert co.number_text(6291456) == "6291456"
    assert co.number_text(0.0) == "0.0"
    assert co.number_text(1e-05) == "1e-05"
    assert co.number_text("inf") == "inf"
    assert co.percent_text(4.9815) == "+4.9815 %"
    assert co.percent_text(-1.5) == "-1.5 %"
    assert co.percent_text(0.0) == "+0.0 %"
    assert co.lower_median([3, 1, 2, 4]) == 2
    assert co.lower_median([0.5, "inf", 0.25]) == 0.5
    assert co.first_number("0.023 (`m.1.w1`)") == 0.023
    assert co.ints_in("32 FP32 global scales (a gate/up pair shares one)") == [32]


def test_base_model_inference():
    root = "/home/u/.cache/huggingface/hub"
    assert co.infer_base_model(f"{root}/models--org--Name-1.5/snapshots/{REV}") == ("org/Name-1.5", REV)
    assert co.infer_base_model(f"{root}/models--gpt2/snapshots/{REV}") == ("gpt2", REV)
    assert co.infer_base_model(f"{root}/models--org--Name/snapshots/{REV}/") == ("org/Name", REV)
    for bad in (f"{root}/models--org--Name/snapshots/main",  # not a commit
                f"{root}/models--a--b--c/snapshots/{REV}",  # three parts
                f"{root}/models--org--Name/snapshots/{REV}/sub",  # below the snapshot
                f"{root}/datasets--org--Name/snapshots/{REV}",
                f"{root}/models--org--.hidden/snapshots/{REV}",
                f"{root}/models--org--n\xe9/snapshots/{REV}",
                "/data/k3-mxfp4"):
        assert co.infer_base_model(bad) == (None, None), bad
    assert co.parse_companion("o/n@" + REV) == ("o/n", REV)
    for bad in ("o/n@main", "o/n@" + REV.upper(), "o--n", "a/b/c", "o/n.git"):
        with pytest.raises(ValueError):
            co.parse_companion(bad)


# --- YAML emission (§4) -------------------------------------------------------

HOSTILE_STRINGS = ["plain", "-lead", ":colon", "#hash", "---", "...", "a\nb", "\x00\x01\x7f\x85\xa0",
                   "\u2028\u2029\ufeff", "\u65e5\u672c\U0001F389", "'sq'", '"dq"', "back\\slash", "  spaces  ",
                   "yes", "no", "on", "null", "~", "1e3", "0x1F", "1:20", "2024-01-01", "@at", "`bt", "%pct", "!bang",
                   "&amp", "*star", "{x}", "[y]", "|", ">", "\t tab", "\x1b[31m", "\ud7ff\ue000\ufffd\U0010ffff",
                   "? key", "- item", "a: b", "a #c"]


def test_yaml_quote_round_trips_through_huggingface_hub():
    for s in HOSTILE_STRINGS:
        data = {"license_name": s, "language": [s, "en"], "tags": list(co.BASE_TAGS)}
        text = co.emit_front_matter(data) + "\n# body\n"
        assert text.isascii()
        card = ModelCard(text)
        assert card.data.license_name == s and card.data.language == [s, "en"], repr(s)
        assert yaml.safe_load(text.split("---\n")[1]) == data
        assert co.check_emission(text) == [], repr(s)


def test_front_matter_never_ends_early_or_is_empty():
    text = co.emit_front_matter({"tags": ["---"]}) + "\nbody\n"
    assert ModelCard(text).data.tags == ["---"]
    assert co.check_emission("---\n---\n\nbody\n")  # an empty block does not match the Hub regex


# --- SRC cards, hostile ones included (§3) -------------------------------------

@pytest.mark.parametrize("name", sorted(co.hostile_source_cards()))
def test_hostile_source_cards(name):
    case = co.hostile_source_cards()[name]
    card = co.read_source_card(case.readme)
    if case.usable:
        assert card.problem is None, card.problem
        assert card.inherited == dict(case.inherited)
        assert tuple(card.not_inherited) == case.not_inherited
        # The invariant: what is inherited is what huggingface_hub reads.
        read = co.metadata_as_huggingface_hub_reads_it(case.readme) or {}
        assert {k: read[k] for k in card.inherited} == card.inherited
    else:
        assert card.problem and case.problem.lower() in card.problem.lower(), card.problem
        assert co.problem_phrase(card.problem)
        assert card.inherited == {} and card.not_inherited == []
    # Whatever SRC holds, the card's front matter built from it parses back exactly.
    inputs = co.CardInputs(kind="verify", report={"provenance": {"source": f"/c/models--o--n/snapshots/{REV}"}},
                           gate={}, source_readme=case.readme)
    want = co.expected_front_matter(inputs)
    text = co.emit_front_matter(want) + "\n# x\n"
    assert co.check_emission(text) == []
    parsed = co.parse_card(text)
    assert parsed.data == want
    assert parsed.model_card.data.tags == list(co.BASE_TAGS)


def test_unusable_cases_that_huggingface_hub_refuses_too():
    """Where the spec gives up because huggingface_hub itself raises (not the deliberate caps)."""
    raising = ["broken_yaml", "unterminated_quote", "tab_indentation", "raw_control_char", "raw_nel",
               "dashes_inside_quoted_value", "front_matter_list", "front_matter_scalar", "python_tag", "custom_tag",
               "non_utf8_body", "non_utf8_front_matter"]
    cases = co.hostile_source_cards()
    for name in raising:
        with pytest.raises(Exception):
            co.metadata_as_huggingface_hub_reads_it(cases[name].readme)
            ModelCard(cases[name].readme.decode("utf-8-sig"))


def test_source_card_of_the_example():
    card = co.read_source_card((EXAMPLES / "demo-source-README.md").read_bytes())
    assert card.problem is None
    assert list(card.inherited) == ["license", "license_name", "license_link", "library_name", "pipeline_tag",
                                    "language"]
    assert card.dropped == ["base_model", "extra_gated_prompt", "model-index", "note", "tags", "widget"]
    assert card.gated == ["extra_gated_prompt"]
    assert co.read_source_card(None).exists is False


def test_card_record_is_deterministic():
    a = co.card_record(b"card", report_bytes=b"{}", evidence="verify", tool_version="0.1.0", source_readme=b"src")
    assert a == co.card_record(b"card", report_bytes=b"{}", evidence="verify", tool_version="0.1.0",
                               source_readme=b"src")
    assert a["source_card"] == "README.source.md" and "/" not in json.dumps(a).replace("mx2nv-card/1", "")


def test_trust_remote_code_rule(tmp_path):
    (tmp_path / "config.json").write_text('{"model_type": "kimi_k3"}')
    assert not co.needs_trust_remote_code(tmp_path)
    (tmp_path / "tokenizer_config.json").write_text('{"auto_map": {"AutoTokenizer": ["t.T", null]}}')
    assert co.needs_trust_remote_code(tmp_path)


def _without_inherited(text: str, source_card: str, license_text: str, keep_source_bullet: bool) -> str:
    """The lossless example as the spec writes it when nothing is inherited."""
    head, rest = text.split('tags:\n', 1)
    head = head.split('base_model_relation: "quantized"\n')[0] + 'base_model_relation: "quantized"\n'
    text = head + "tags:\n" + rest
    start = text.index("## Source card\n")
    end = text.index("## How it was made\n")
    text = text[:start] + "## Source card\n\n" + source_card + "\n\n" + text[end:]
    start = text.index("## License\n")
    text = text[:start] + "## License\n\n" + license_text + "\n"
    if not keep_source_bullet:
        text = text.replace("- The source card (README.source.md) is the source author's text.\n", "")
    return text


def test_examples_without_inherited_fields(lossless):
    text, inputs = lossless
    broken = co.hostile_source_cards()["dashes_inside_quoted_value"].readme
    unusable = _without_inherited(
        text,
        "The source's own card is kept unchanged as [README.source.md](README.source.md), but its metadata could "
        "not be read (`front matter is not valid YAML (line 1, column 15: unterminated quoted scalar)`); nothing "
        "was inherited.",
        "The source's card declares no license mx2nv could read. License files kept unchanged: "
        "[assets/LICENSE.txt](assets/LICENSE.txt). The source's card: [README.source.md](README.source.md).",
        keep_source_bullet=True)
    assert co.check_card(unusable, replace(inputs, source_readme=broken)) == []
    assert co.check_card(unusable, inputs)  # the example's own SRC card would have been inherited
    absent = _without_inherited(
        text, "The source has no README.md; nothing was inherited.",
        "The source's card declares no license mx2nv could read. License files kept unchanged: "
        "[assets/LICENSE.txt](assets/LICENSE.txt).", keep_source_bullet=False)
    companions = [c for c in COMPANIONS if c != "README.md"]
    assert co.check_card(absent, replace(inputs, source_readme=None, companions=companions)) == []
    assert co.check_card(absent.replace("nothing was inherited.", "nothing was inherited. See "
                                        "[README.source.md](README.source.md)."),
                         replace(inputs, source_readme=None, companions=companions))


def test_refusal_material(tmp_path):
    good = _json("demo-verify-report.json")
    bad = co.refused_reports(good)
    assert all(r != good for r in bad.values())
    assert bad["other_target"]["provenance"]["target"] != good["provenance"]["target"]
    # The mutators work on a small checkpoint-shaped directory.
    d = tmp_path / "dst"
    (d / "assets").mkdir(parents=True)
    (d / "config.json").write_text('{"a": 1}')
    (d / "model.safetensors").write_bytes(b"\x08" + b"\0" * 7 + b'{"x": 1}' + b"\0" * 8)
    (d / "README.md").write_text("card")
    (d / "assets" / "LICENSE.txt").write_text("license")
    (d / ".mx2nv").mkdir()
    (d / ".mx2nv" / "card.json").write_text("{}")
    assert co.companions_of(d) == ["README.md", "assets/LICENSE.txt"]
    for name, change in co.change_after_verify(d).items():
        before = {p: (p.stat().st_size, p.stat().st_ctime_ns, p.stat().st_ino, p.read_bytes())
                  for p in d.rglob("*") if p.is_file()}
        change(d)
        after = {p: (p.stat().st_size, p.stat().st_ctime_ns, p.stat().st_ino, p.read_bytes())
                 for p in d.rglob("*") if p.is_file()}
        assert before != after, name
    readme = co.write_source_readme(tmp_path, "bom")
    assert (tmp_path / "README.md").read_bytes() == readme
