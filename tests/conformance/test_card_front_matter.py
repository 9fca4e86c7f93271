"""`mx2nv card` against PyYAML and huggingface_hub on many source front
matters (valid, invalid, and mutations of both): whenever yaml.safe_load or
huggingface_hub's ModelCard refuses SRC's card, no field is inherited;
whenever a field is inherited, its value is what safe_load gives. (mx2nv may
inherit less than PyYAML reads: its reader refuses what it does not
implement; it may never inherit something else.)"""

from __future__ import annotations

import logging
import random
import shutil
from pathlib import Path

import pytest
import yaml
from huggingface_hub import ModelCard

import card_oracle as co
from conftest import mx2nv

logging.getLogger("huggingface_hub").setLevel(logging.ERROR)

SMALL = ["--layers", "2", "--experts", "4", "--hidden", "256", "--intermediate", "128", "--shards", "2"]

BASES = [
    "license: mit\nlibrary_name: transformers",
    "license: other\nlicense_name: modified-mit\nlicense_link: LICENSE\nlibrary_name: transformers\n"
    "pipeline_tag: text-generation",
    "language:\n- en\n- zh\ndatasets:\n- c4\nlicense: apache-2.0",
    "language: [en, fr]\nlicense: 'mit'\ntags:\n- a\n- b",
    'license: "mit"\nwidget:\n- text: "Hello"\n  example_title: x\nextra_gated_fields:\n  Company: text\n'
    "  I agree: checkbox",
    "license: mit\ndescription: |\n  line one\n  line two\nlibrary_name: vllm",
    "license: mit\nnote: >-\n  folded\n  text\npipeline_tag: text-generation",
    "license: mit # comment\n# full comment\nlibrary_name: transformers  # c",
    "license: !!str mit\nlibrary_name: yes",
    "license: mit\nversion: 1.0\ncount: 12\nflag: true\nnothing: ~\nrelease: 1.2.3",
    "license:\n  mit\nlibrary_name: transformers",
    "datasets:\n  - a\n  - b\nlicense: mit",
    "license: mit\nnested:\n  deep:\n    - x: 1\n      y: [a, b]\n    - - p\n      - q",
    'license: "m\\u00efT"\nlicense_name: \'it\'\'s\'\nlibrary_name: "a # b"',
    "license: mit\nlanguage:\n  - en\n  -  de\n",
    "license: mit\nthumbnail: https://example.com/x.png\ninference: false",
    "library_name: transformers\nlicense: mit\nlicense: apache-2.0",
]

# The shapes of issue 31 and their relatives: what YAML refuses, and what
# mx2nv's reader does not implement.
SHAPES = [
    "widget: - x", "x: =", "x: <<", "x: }", "x: ]", "x: ,a", "x: @a", "x: `a", "x: %a", "x: a: b", "x: a:",
    "x: 'a", 'x: "a', "x: [a, b", "x: {a: b}", "x: &a b\ny: *a", "<<: {a: b}", "x: !!python/name:os.system",
    "x: !foo a", "x: 2023-02-30", "x: 2023-01-01", "x: 0x_", "x: 1_000", "? a\n: b", "- a", "x: |x\n  a",
    "x: |2\n  a", "x: |\n    a\n  b", "x: >\n  a\n b", "x: |-\n  a\n\n  b", "x: |\n\n     \n  a", "x: a\n# c\n  b",
    "x: a\n  b", "x:\n- a\n -b", " x: 1", "x: 1\n y: 2", "x:\n  - a\n  b: c", "x: 'a''b'", 'x: "\\x41"',
    'x: "\\q"', "x: a #b", "x: a#b", '"q": 1', "x: - ", "x: -", "x: ? a", "x: : a", "...", "x: 1\n...\ny: 2",
    "...\nx: 1", "%YAML 1.1", "x: \"a\" b", "x: [a, [b]]", "x: [a, 'b']", "x: [a, b] c", "x: [a,]", "x: []",
    "x:\n\ty: 1", "model-index: 5", "model-index:\n- name: x\n  results: []", "eval_results: x",
    "tags: 5", "tags: true", "self: x", "ignore_metadata_errors: true", "1: x", "yes: x", "x: !!str", "x: !!int 3",
    "x:\n  y:\n  z: 1", "x: |\n  a\n# c\n  b", "x: >+\n  a\n", "x: | # c\n  a", "x: |#c\n  a", "x: =a", "x: <<a",
    "x: ~", "x: null", "x: .inf", "x: -.5", "x: +1", "x: 0o7", "x: 12:30", "x: a\n\n  b",
]

TOKENS = [":", " ", "- ", "#", "'", '"', "[", "]", "{", "}", "|", ">", "&a ", "*a", "!", "\n", "\n  ", "  ",
          ",", "?", "%", "@", "...", "<<", "=", "\\", "0", "yes", "~", "`", "-", ": ", " #", "\n- ", "!!str "]


def _mutations(rng: random.Random, text: str) -> str:
    for _ in range(rng.randint(1, 3)):
        op = rng.randrange(4)
        if op == 0 or not text:
            at = rng.randint(0, len(text))
            text = text[:at] + rng.choice(TOKENS) + text[at:]
        elif op == 1:
            at = rng.randrange(len(text))
            text = text[:at] + text[at + 1:]
        elif op == 2:
            lines = text.split("\n")
            i = rng.randrange(len(lines))
            lines[i] = " " * rng.choice([1, 2, 4]) + lines[i]
            text = "\n".join(lines)
        else:
            lines = text.split("\n")
            i, j = rng.randrange(len(lines)), rng.randrange(len(lines))
            lines[i], lines[j] = lines[j], lines[i]
            text = "\n".join(lines)
    return text


def front_matters() -> list[str]:
    rng = random.Random(31)
    out = list(BASES)
    for shape in SHAPES:
        out.append(f"license: mit\nlibrary_name: transformers\n{shape}")
        out.append(f"{shape}\nlicense: mit")
    for _ in range(160):
        out.append(_mutations(rng, rng.choice(BASES + out[len(BASES):len(BASES) + 20])))
    return out


def expected(readme: str) -> dict | None:
    """What may be inherited: None when PyYAML or huggingface_hub refuses the card."""
    try:
        ModelCard(readme)
        data = co.metadata_as_huggingface_hub_reads_it(readme.encode("utf-8"))
    except Exception:  # noqa: BLE001 - any refusal of either reader
        return None
    return data or {}


@pytest.fixture(scope="module")
def tree(built, tmp_path_factory):
    root = tmp_path_factory.mktemp("card-yaml")
    src, dst = root / "src", root / "dst"
    mx2nv("generate", src, "--layout", "k3", *SMALL)
    (src / "README.md").write_text("# none\n")
    mx2nv("convert", src, dst)
    return root, src, dst


CASES = front_matters()
CHUNK = 40


@pytest.mark.parametrize("start", range(0, len(CASES), CHUNK))
def test_inherits_only_what_pyyaml_and_huggingface_hub_read(tree, start):
    root, src, dst = tree
    failures = []
    inherited_cases = 0
    for i, fm in enumerate(CASES[start:start + CHUNK], start):
        readme = f"---\n{fm}\n---\n# The source\n"
        (src / "README.md").write_text(readme, encoding="utf-8")
        (dst / "README.md").write_text(readme, encoding="utf-8")
        (dst / "README.source.md").unlink(missing_ok=True)
        (dst / ".mx2nv" / "card.json").unlink(missing_ok=True)
        report = root / "r.json"
        mx2nv("verify", src, dst, "--report", report)
        result = mx2nv("card", src, dst, "--verify-report", report, check=False)
        if result.returncode != 0:
            failures.append(f"case {i} {fm!r}: exit {result.returncode}: {result.stderr}")
            continue
        card = co.parse_card(dst / "README.md").data
        inherited = {k: v for k, v in card.items() if k in co.INHERITED_KEYS}
        want = expected(readme)
        inherited_cases += bool(inherited)
        if want is None:
            if inherited:
                failures.append(f"case {i} {fm!r}: YAML or huggingface_hub refuses it, card inherited {inherited}")
            continue
        for key, value in inherited.items():
            if want.get(key) != value:
                failures.append(f"case {i} {fm!r}: {key} inherited as {value!r}, safe_load gives {want.get(key)!r}")
    assert failures == []
    if start == 0:  # the valid bases: most of them inherit (the test is not vacuous)
        assert inherited_cases >= len(BASES) - 3


def test_the_issue_examples_inherit_nothing():
    """The shapes of issue 31 are refused by PyYAML: the cases above cover them."""
    for shape in ("widget: - x", "x: =", "x: <<", "x: }", "x: |x\n  a", "x: |\n    a\n  b", "x: a\n# c\n  b",
                  "x: 1\n...\ny: 2"):
        assert expected(f"---\nlicense: mit\n{shape}\n---\n") is None, shape
