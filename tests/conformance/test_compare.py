"""`mx2nv compare SRC OTHER --json` against the independent oracle
(compare_oracle.py) on every kind of OTHER the test-side writers produce
(nvfp4_writers.py): mx2nv's own output, `mx2nv requantize` output, ModelOpt's
cast and calibrated exports, compressed-tensors with non-power-of-two
globals, missing / extra / unquantized modules, respelled names, and every
hostile kind (exit 3 naming the tensor). Small checkpoints; a minute.

    MX2NV=build/mx2nv .venv/bin/python -m pytest -q tests/conformance/test_compare.py
"""

from __future__ import annotations

import json
import math
import re
import shutil

import numpy as np
import pytest

import compare_oracle as co
import nvfp4_writers as nw
from conftest import MX2NV, mx2nv

K3 = "language_model.model.layers.{}.block_sparse_moe.experts.{}.{}"
COMMON = ["--hidden", "128", "--intermediate", "64", "--zero-percent", "10"]
EXACT_FIELDS = ("values", "exact_values", "max_abs_error", "packed_bytes", "packed_bytes_identical",
                "zero_sign_rewrites", "zero_sign_rewrite_bytes", co.BELOW)
TOTAL_COUNTS = ("modules_compared", "modules_exact", "modules_quantized", "modules_unquantized",
                "non_power_of_two_globals", "gate_up_pairs", "gate_up_pairs_globals_differ")
MODULE_EXACT = ("name", "other_name", "quantized", "layer", "expert", "projection", "global_scale",
                "global_power_of_two", "input_scale", "gate_up_globals_bit_equal")


@pytest.fixture(scope="module")
def trees(tmp_path_factory):
    if not MX2NV.exists():
        pytest.fail(f"{MX2NV} not built; run scripts/setup.sh")
    root = tmp_path_factory.mktemp("compare")
    mx2nv("generate", root / "k3", "--layout", "k3", "--layers", "2", "--experts", "3", "--shards", "2",
          "--extreme-zero-scales", "off", *COMMON)
    mx2nv("generate", root / "flat", "--layout", "flat", "--layers", "1", "--experts", "2", "--shards", "1",
          "--seed", "5", "--extreme-zero-scales", "off", *COMMON)
    # mx2nv generate's default: extreme scale bytes on some all-zero groups (ModelOpt's window moves).
    mx2nv("generate", root / "zeros", "--layout", "k3", "--layers", "1", "--experts", "2", "--shards", "1",
          "--seed", "9", "--hidden", "128", "--intermediate", "64", "--zero-percent", "20")
    return root


def made(trees, name, make):
    dst = trees / name
    if not dst.exists():
        make(dst)
    return dst


def run_compare(src, other, *extra):
    result = mx2nv("compare", src, other, "--json", "--threads", "2", *extra, check=False)
    assert result.returncode in (0, 1), result.stderr
    return json.loads(result.stdout), result.returncode


def close(a, b) -> bool:
    if a is None or b is None:
        return a is b
    if a == b:
        return True
    return math.isclose(a, b, rel_tol=1e-12, abs_tol=0.0)


def check_figures(mine: dict, want: dict, where: str):
    for k in EXACT_FIELDS:
        assert mine[k] == want[k], f"{where}: {k} {mine[k]} != {want[k]}"
    for k in ("rel_rmse", "cosine"):
        assert close(mine[k], want[k]), f"{where}: {k} {mine[k]} != {want[k]}"
        if want[k] in (0.0, 1.0):
            assert mine[k] == want[k], f"{where}: {k} must be exactly {want[k]}"


def check_against_oracle(src, other, *extra, modules=None):
    mine, rc = run_compare(src, other, *(extra + (("--modules", modules) if modules else ())))
    want = co.compare(src, other, modules)
    assert rc == want["exit_code"] == mine["exit_code"]
    for k in ("format", "activations", "missing_in_other", "extra_in_other", "unquantized_in_other"):
        assert mine[k] == want[k], k
    check_figures(mine["totals"], want["totals"], "totals")
    for k in TOTAL_COUNTS:
        assert mine["totals"][k] == want["totals"][k], k
    assert sorted(mine["projections"]) == sorted(want["projections"])
    for p, w in want["projections"].items():
        check_figures(mine["projections"][p], w, p)
        for k in TOTAL_COUNTS:
            assert mine["projections"][p][k] == w[k], (p, k)
    assert [m["name"] for m in mine["modules"]] == [m["name"] for m in want["modules"]]
    for m, w in zip(mine["modules"], want["modules"]):
        check_figures(m, w, m["name"])
        for k in MODULE_EXACT:
            assert m[k] == w[k], (m["name"], k, m[k], w[k])
    return mine


# ---------------------------------------------------------------- exact

@pytest.mark.parametrize("case", ["k3", "flat", "zeros"])
def test_mx2nv_own_output_is_exact_and_agrees_with_verify(trees, case):
    dst = made(trees, f"{case}-nv", lambda d: mx2nv("convert", trees / case, d))
    report = check_against_oracle(trees / case, dst)
    assert report["exit_code"] == 0 and report["totals"]["exact_values"] == report["totals"]["values"] > 0
    assert mx2nv("verify", trees / case, dst, check=False).returncode == 0


def test_requantize_output_matches_the_oracle_and_its_own_report(trees):
    rq_report = trees / "k3-rq.json"
    dst = made(trees, "k3-rq", lambda d: mx2nv("requantize", trees / "k3", d, "--threads", "1", "--report", rq_report))
    report = check_against_oracle(trees / "k3", dst)
    assert report["exit_code"] == 1 and report["totals"]["non_power_of_two_globals"] > 0
    assert mx2nv("verify", trees / "k3", dst, check=False).returncode == 1
    table = {row["module"]: row for row in json.loads(rq_report.read_text())["requantized"]}
    for r in report["modules"]:
        assert r["rel_rmse"] == pytest.approx(table[r["name"]]["relative_rmse"], rel=1e-9)


# ---------------------------------------------------------------- chunks

def test_modules_spanning_several_read_chunks(tmp_path):
    """Nine modules of 1536 x 112 groups (2.75 MB of codes): with 16 threads,
    nine workers (no more than modules) each read a module in two chunks of
    2 MiB less two pages (stream_chunk_bytes), a boundary inside a row; with
    one thread, in one. The figures are the oracle's either way (exact groups,
    zero-sign rewrites and requantized values alike), and verify finds a value
    changed past the first chunk at its row, group and element."""
    src = tmp_path / "src"
    mx2nv("generate", src, "--layout", "k3", "--layers", "1", "--experts", "3", "--shards", "1",
          "--hidden", "3584", "--intermediate", "1536", "--zero-percent", "10", "--extreme-zero-scales", "off")
    own, cast, rq = tmp_path / "own", tmp_path / "cast", tmp_path / "rq"
    mx2nv("convert", src, own)
    nw.write_modelopt_cast(src, cast)
    mx2nv("requantize", src, rq)
    for other in (own, cast, rq):
        want = co.compare(src, other)
        docs = []
        for threads in ("16", "1"):
            result = mx2nv("compare", src, other, "--json", "--threads", threads, check=False)
            assert result.returncode == want["exit_code"], result.stderr
            mine = json.loads(result.stdout)
            check_figures(mine["totals"], want["totals"], f"{other.name} totals")
            for m, w in zip(mine["modules"], want["modules"], strict=True):
                check_figures(m, w, m["name"])
            docs.append({k: v for k, v in mine.items() if k != "seconds"})
        assert docs[0] == docs[1], other.name

    w1 = K3.format(0, 0, "w1") + ".weight_packed"
    ref = next(r for f in sorted(own.glob("*.safetensors")) for n, r in co.read_header(f).items() if n == w1)
    group, byte = 140001, 3  # row 1250 (112 groups a row), group 1, past the first chunk; elements 6 and 7
    with open(ref.path, "r+b") as f:
        f.seek(ref.begin + group * 16 + byte)
        b = f.read(1)[0]
        f.seek(-1, 1)
        f.write(bytes([b ^ 0x01]))  # a different magnitude in the low nibble: a different value
    result = mx2nv("verify", src, own, "--threads", "16", check=False)
    assert result.returncode == 1
    assert f"row {group // 112} group {group % 112} element {2 * byte}:" in result.stdout + result.stderr


# ---------------------------------------------------------------- ModelOpt

@pytest.mark.parametrize("src", ["k3", "zeros"])
def test_modelopt_cast(trees, src):
    dst = made(trees, f"{src}-mo-cast", lambda d: nw.write_modelopt_cast(trees / src, d))
    report = check_against_oracle(trees / src, dst)
    assert report["format"] == "modelopt"
    if src == "k3":
        assert report["exit_code"] == 0 and report["totals"]["zero_sign_rewrites"] > 0


@pytest.mark.parametrize("mode,algo", [("dynamic", "NVFP4"), ("static", "NVFP4"), ("static_cast", "NVFP4"),
                                       ("dynamic", "W4A16_NVFP4")])
def test_modelopt_calibrated(trees, mode, algo):
    dst = made(trees, f"k3-mo-{mode}-{algo}",
               lambda d: nw.write_modelopt_calibrated(trees / "k3", d, mode=mode, algo=algo))
    check_against_oracle(trees / "k3", dst)


# ---------------------------------------------------------------- compressed-tensors

@pytest.mark.parametrize("w4a4", [False, True])
def test_compressed_tensors_non_power_of_two_globals(trees, w4a4):
    dst = made(trees, f"k3-ct-{int(w4a4)}",
               lambda d: nw.write_compressed_tensors(trees / "k3", d, w4a4=w4a4, global_factor=0.75))
    report = check_against_oracle(trees / "k3", dst)
    assert report["totals"]["gate_up_pairs_globals_differ"] > 0
    assert report["activations"] == ("A4" if w4a4 else "A16")


def test_compressed_tensors_flat_shared_gate_up(trees):
    dst = made(trees, "flat-ct", lambda d: nw.write_compressed_tensors(trees / "flat", d, share_gate_up=True))
    report = check_against_oracle(trees / "flat", dst)
    assert report["totals"]["gate_up_pairs_globals_differ"] == 0


# ---------------------------------------------------------------- names

@pytest.mark.parametrize("writer", [nw.write_modelopt_cast, nw.write_compressed_tensors])
def test_missing_extra_unquantized_and_modules_filter(trees, writer):
    keep, gone, extra = K3.format(1, 2, "w2"), K3.format(0, 1, "w1"), K3.format(1, 99, "w3")
    dst = made(trees, f"k3-names-{writer.__name__}",
               lambda d: writer(trees / "k3", d, unquantized=[keep], drop=[gone], extra={K3.format(1, 0, "w3"): extra}))
    report = check_against_oracle(trees / "k3", dst)
    assert report["missing_in_other"] == [gone] and report["extra_in_other"] == [extra]
    assert report["unquantized_in_other"] == [keep] and report["exit_code"] == 1
    check_against_oracle(trees / "k3", dst, modules=r"layers\.0\.")


def test_names_are_matched_across_spellings(trees):
    def respell(name: str) -> str:
        name = name.replace("language_model.model.", "model.language_model.").replace("block_sparse_moe", "mlp")
        return name.replace(".w1", ".gate_proj").replace(".w3", ".up_proj").replace(".w2", ".down_proj")

    dst = made(trees, "k3-respelled", lambda d: nw.write_modelopt_cast(trees / "k3", d, rename=respell))
    report = check_against_oracle(trees / "k3", dst)
    assert report["exit_code"] == 0 and report["missing_in_other"] == [] and report["extra_in_other"] == []


def test_report_file_holds_the_same_document(trees, tmp_path):
    dst = made(trees, "k3-nv", lambda d: mx2nv("convert", trees / "k3", d))
    out = tmp_path / "compare.json"
    result = mx2nv("compare", trees / "k3", dst, "--report", out, check=False)
    assert result.returncode == 0 and "EXACT" in result.stdout
    doc = json.loads(out.read_text())
    mine, _ = run_compare(trees / "k3", dst)
    doc.pop("seconds"), mine.pop("seconds")
    assert doc == mine


# ---------------------------------------------------------------- hostile

@pytest.mark.parametrize("base", ["ct", "mo-cast"])
@pytest.mark.parametrize("kind", nw.HOSTILE_KINDS)
def test_hostile_other_exits_3_naming_the_tensor(trees, base, kind):
    writer = nw.write_compressed_tensors if base == "ct" else nw.write_modelopt_cast
    valid = made(trees, f"k3-{base}-valid", lambda d: writer(trees / "k3", d))
    dst, target = nw.write_hostile(valid, trees / f"hostile-{base}-{kind}", kind)
    result = mx2nv("compare", trees / "k3", dst, "--json", check=False)
    assert result.returncode == 3, (result.returncode, result.stdout[-400:], result.stderr)
    assert target in result.stderr, result.stderr
    assert result.stdout == ""


# ---------------------------------------------------------------- unquantized dtypes

def _retype_unquantized(src_tree, dst, module, dtype, poison=None):
    """A copy of `src_tree` whose BF16 `module.weight` is stored as `dtype`
    (F16 or F32, the same numbers), optionally with one value made `poison`."""
    shutil.copytree(src_tree, dst)
    name = module + ".weight"
    other = nw.load_source(dst)
    shard = other.info[name][0]
    entries, meta = nw.read_entries(dst / shard)
    out = []
    for n, dt, shape, data in entries:
        if n == name:
            assert dt == "BF16"
            values = (np.frombuffer(data, "<u2").astype(np.uint32) << 16).view(np.float32)
            values = values.astype({"F16": "<f2", "F32": "<f4"}[dtype])
            if poison is not None:
                values = values.copy()
                values[3] = poison
            data, dt = values.tobytes(), dtype
        out.append((n, dt, shape, data))
    nw.write_safetensors(dst / shard, out, meta)  # the index's total_size is informational
    return dst


@pytest.mark.parametrize("dtype", ["F16", "F32"])
def test_unquantized_f16_and_f32_modules(trees, dtype):
    keep = K3.format(0, 0, "w2")
    base = made(trees, "k3-bf16-one", lambda d: nw.write_compressed_tensors(trees / "k3", d, unquantized=[keep]))
    dst = made(trees, f"k3-{dtype}-one", lambda d: _retype_unquantized(base, d, keep, dtype))
    report = check_against_oracle(trees / "k3", dst)
    assert report["unquantized_in_other"] == [keep]
    row = next(r for r in report["modules"] if r["name"] == keep)
    assert row["exact_values"] == row["values"] and not row["quantized"]


def test_unquantized_nan_exits_3_naming_the_tensor(trees):
    keep = K3.format(0, 0, "w2")
    base = made(trees, "k3-bf16-one", lambda d: nw.write_compressed_tensors(trees / "k3", d, unquantized=[keep]))
    dst = made(trees, "k3-F32-nan", lambda d: _retype_unquantized(base, d, keep, "F32", poison=float("nan")))
    with pytest.raises(co.InvalidInput):
        co.compare(trees / "k3", dst)
    result = mx2nv("compare", trees / "k3", dst, check=False)
    assert result.returncode == 3 and keep + ".weight" in result.stderr, result.stderr


def test_dense_page_names_the_worst_and_summarises_every_layer(tmp_path):
    """Over 4,096 modules a projection, the page draws each map as one image:
    it stays small whatever the module count, while the worst modules (the
    table's 500) are still shapes named in their titles, every module is in a
    run's title, and every layer has a searchable summary row."""
    src, other = tmp_path / "src", tmp_path / "rq"
    layers, experts = 3, 1400
    mx2nv("generate", src, "--layout", "k3", "--layers", layers, "--experts", experts, "--shards", "2",
          "--hidden", "32", "--intermediate", "32", "--seed", "11")
    mx2nv("requantize", src, other, "--threads", "2")
    page, report = tmp_path / "c.html", tmp_path / "c.json"
    result = mx2nv("compare", src, other, "--threads", "2", "--html", page, "--report", report, check=False)
    assert result.returncode == 1, result.stderr
    html = page.read_text()
    doc = json.loads(report.read_text())
    assert html.count('data-drawn="image"') == 3 and 'data-drawn="shapes"' not in html
    assert html.count("data:image/png;base64,") == 3
    # a shape per module would be over 100 bytes a module; the image is about one
    assert len(html.encode()) < 50 * len(doc["modules"])
    differing = [m for m in doc["modules"] if m["exact_values"] != m["values"]]
    worst = sorted(differing, key=lambda m: -(m["rel_rmse"] if m["rel_rmse"] is not None else math.inf))[:500]
    for m in worst:
        assert f"\n{m['name']}</title>" in html, m["name"]
    for layer in range(layers):  # one summary table per projection
        assert html.count(f"<tr><td>layer {layer}</td><td class=\"num\">{experts}</td>") == 3
    # the runs' titles cover every expert of every layer, once per projection
    runs = re.findall(r'class="run"><title>layer (\d+), (?:experts (\d+)-(\d+)|expert (\d+))', html)
    covered = {}
    for layer, a, b, single in runs:
        lo, hi = (int(single), int(single)) if single else (int(a), int(b))
        covered[int(layer)] = covered.get(int(layer), 0) + hi - lo + 1
    assert covered == {layer: 3 * experts for layer in range(layers)}
