"""The test-side NVFP4 writers (nvfp4_writers.py) and the compare oracle
(compare_oracle.py) checked against each other, against mx2nv's own outputs
and against compressed-tensors' decompressor: the ground `mx2nv compare` will
be tested on. Small checkpoints; seconds.

    MX2NV=build/mx2nv .venv/bin/python -m pytest -q tests/conformance/test_nvfp4_writers.py
"""

from __future__ import annotations

import json

import ml_dtypes
import numpy as np
import pytest
import torch
from compressed_tensors.compressors import NVFP4PackedCompressor
from compressed_tensors.quantization import QuantizationConfig

import compare_oracle as co
import nvfp4_writers as nw
from conftest import MX2NV, mx2nv

K3 = "language_model.model.layers.{}.block_sparse_moe.experts.{}.{}"
WIDE = K3.format(0, 1, "w2")        # span 21: beyond ModelOpt's 18-exponent window
RAISED_UP = K3.format(0, 0, "w3")   # top exponent -3: its gate (w1) gets scale_2 from it
COMMON = ["--hidden", "128", "--intermediate", "64", "--extreme-zero-scales", "off", "--zero-percent", "10"]


@pytest.fixture(scope="module")
def trees(tmp_path_factory):
    if not MX2NV.exists():
        pytest.fail(f"{MX2NV} not built; run scripts/setup.sh")
    root = tmp_path_factory.mktemp("nvfp4-writers")
    mx2nv("generate", root / "k3", "--layout", "k3", "--layers", "2", "--experts", "3", "--shards", "2", *COMMON)
    mx2nv("convert", root / "k3", root / "k3-nv")
    mx2nv("generate", root / "flat", "--layout", "flat", "--layers", "1", "--experts", "2", "--shards", "1",
          "--seed", "5", *COMMON)
    mx2nv("convert", root / "flat", root / "flat-nv")
    mx2nv("generate", root / "wide", "--layout", "k3", "--layers", "1", "--experts", "2", "--shards", "1", "--seed", "3",
          "--set-span", f"{WIDE}=21", "--set-k-max", f"{RAISED_UP}=-3", *COMMON)
    # mx2nv generate's default: a quarter of the all-zero groups carry extreme scale bytes.
    mx2nv("generate", root / "zeros", "--layout", "k3", "--layers", "1", "--experts", "2", "--shards", "1",
          "--seed", "9", "--hidden", "128", "--intermediate", "64", "--zero-percent", "20")
    mx2nv("convert", root / "zeros", root / "zeros-nv")
    return root


def run(trees, name, writer, src="k3", **kw):
    dst = trees / f"{src}-{name}"
    if not dst.exists():
        writer(trees / src, dst, **kw)
    return dst


def by_name(report):
    return {r["name"]: r for r in report["modules"]}


def negative_zero_nibbles(src: nw.Source, m: str) -> int:
    return int((nw.codes_of(src.packed(m)) == 8).sum())


def in_modelopt_window(src: nw.Source, m: str) -> bool:
    """Every non-zero block of m within 17 exponents of the gate/up-shared k_max."""
    k_max = nw.mxfp4_kmax(src.scale(m))
    p = nw.partner(m)
    if p is not None:
        k_max = max(k_max, nw.mxfp4_kmax(src.scale(p)))
    e = src.scale(m).astype(int)
    active = (nw.codes_of(src.packed(m)) & 7).reshape(e.shape[0], e.shape[1], 32).any(axis=-1)
    return bool(((e - 127 >= k_max - 17) | ~active).all())


def independent_below(other: nw.Source, m: str, packed_suffix: str) -> int:
    """Active blocks whose E4M3 scale is below 2^-6, decoded by ml_dtypes."""
    info = other.info[m + ".weight_scale"]
    scale = np.frombuffer(other.raw(m + ".weight_scale"), np.uint8).reshape(info[2])
    s = np.abs(scale.view(ml_dtypes.float8_e4m3fn).astype(np.float64))
    packed = np.frombuffer(other.raw(m + packed_suffix), np.uint8).reshape(other.info[m + packed_suffix][2])
    active = (nw.codes_of(packed) & 7).reshape(s.shape[0], s.shape[1], 16).any(axis=-1)
    return int(((s > 0) & (s < 2.0**-6) & active).sum())


# ---------------------------------------------------------------- exact: mx2nv's own output

@pytest.mark.parametrize("case", ["k3", "flat"])
def test_oracle_says_exact_on_mx2nv_convert(trees, case):
    report = co.compare(trees / case, trees / f"{case}-nv")
    t = report["totals"]
    assert report["format"] == "compressed-tensors" and report["activations"] == "A16"
    assert report["exit_code"] == 0 and report["missing_in_other"] == [] and report["extra_in_other"] == []
    assert t["exact_values"] == t["values"] > 0
    assert (t["max_abs_error"], t["rel_rmse"], t["cosine"]) == (0.0, 0.0, 1.0)
    assert t["packed_bytes_identical"] == t["packed_bytes"] and t["zero_sign_rewrites"] == 0
    assert t["non_power_of_two_globals"] == 0 and t["gate_up_pairs_globals_differ"] == 0
    assert t["modules_exact"] == t["modules_compared"] == len(nw.load_source(trees / case).modules)
    assert mx2nv("verify", trees / case, trees / f"{case}-nv", check=False).returncode == 0


def test_cli_exit_codes(trees, capsys):
    assert co.main([str(trees / "k3"), str(trees / "k3-nv")]) == 0
    assert json.loads(capsys.readouterr().out)["exit_code"] == 0
    assert co.main([str(trees / "k3"), str(run(trees, "ct", nw.write_compressed_tensors))]) == 1
    bad, _ = nw.write_hostile(trees / "k3-nv", trees / "k3-nv-nan", "global_nan")
    assert co.main([str(trees / "k3"), str(bad)]) == 3


# ---------------------------------------------------------------- ModelOpt

def test_modelopt_cast_rewrites_negative_zeros_and_nothing_else(trees):
    dst = run(trees, "mo-cast", nw.write_modelopt_cast)
    src = nw.load_source(trees / "k3")
    report = co.compare(trees / "k3", dst)
    assert report["format"] == "modelopt" and report["activations"] == "A4"
    hf = json.loads((dst / "hf_quant_config.json").read_text())
    assert hf["quantization"]["quant_algo"] == "MIXED_PRECISION"
    assert json.loads((dst / "config.json").read_text())["quantization_config"]["quant_method"] == "modelopt_mixed"
    rows = by_name(report)
    for m in src.modules:
        r = rows[m]
        assert in_modelopt_window(src, m), m
        assert r["exact_values"] == r["values"], m
        assert r["zero_sign_rewrites"] == negative_zero_nibbles(src, m), m
        assert r["packed_bytes_identical"] + r["zero_sign_rewrite_bytes"] == r["packed_bytes"], m
        assert r["global_power_of_two"] and r["input_scale"] == 1.0
        assert r["gate_up_globals_bit_equal"] in (None, True)
    t = report["totals"]
    assert t["zero_sign_rewrites"] > 0
    assert report["exit_code"] == 0  # -0 and +0 are the same value


def test_modelopt_cast_clamps_beyond_its_window(trees):
    dst = run(trees, "mo-cast", nw.write_modelopt_cast, src="wide")
    src, other = nw.load_source(trees / "wide"), nw.load_source(dst)
    report = co.compare(trees / "wide", dst)
    rows = by_name(report)
    assert report["exit_code"] == 1
    gate, up = rows[K3.format(0, 0, "w1")], rows[RAISED_UP]
    assert gate["gate_up_globals_bit_equal"] is True and gate["global_scale"] == up["global_scale"] == 2.0 ** -11
    assert not in_modelopt_window(src, WIDE)
    assert rows[WIDE]["exact_values"] < rows[WIDE]["values"] and rows[WIDE]["rel_rmse"] > 0
    for m in src.modules:
        assert rows[m][co.BELOW] == independent_below(other, m, ".weight"), m
        if in_modelopt_window(src, m):
            assert rows[m]["exact_values"] == rows[m]["values"], m
    assert rows[WIDE][co.BELOW] > 0


def test_modelopt_cast_k_max_counts_all_zero_blocks(trees):
    """ModelOpt's k_max skips only scale byte 0: an all-zero group with a large
    exponent moves the window, and real blocks fall out of it; mx2nv is exact."""
    src = nw.load_source(trees / "zeros")
    shifted = [m for m in src.modules if not in_modelopt_window(src, m)]
    assert shifted
    assert co.compare(trees / "zeros", trees / "zeros-nv")["exit_code"] == 0
    rows = by_name(co.compare(trees / "zeros", run(trees, "mo-cast", nw.write_modelopt_cast, src="zeros")))
    assert all(rows[m]["exact_values"] < rows[m]["values"] for m in shifted)


@pytest.mark.parametrize("mode", ["dynamic", "static", "static_cast"])
def test_modelopt_calibrated_quantizer(trees, mode):
    dst = run(trees, f"mo-{mode}", nw.write_modelopt_calibrated, mode=mode)
    src = nw.load_source(trees / "k3")
    report = co.compare(trees / "k3", dst)
    t = report["totals"]
    assert report["format"] == "modelopt" and report["activations"] == "A4"
    assert json.loads((dst / "hf_quant_config.json").read_text())["quantization"]["quant_algo"] == "NVFP4"
    assert json.loads((dst / "config.json").read_text())["quantization_config"]["quant_method"] == "modelopt"
    assert t["modules_compared"] == len(src.modules) and t["gate_up_pairs_globals_differ"] == 0
    assert t["gate_up_pairs"] == 6
    if mode == "static_cast":  # the closed form again, through the static export
        assert t["exact_values"] == t["values"] and t["non_power_of_two_globals"] == 0
    else:  # requantized from data: amax/2688 globals, a few percent of error
        assert t["non_power_of_two_globals"] == t["modules_quantized"]
        assert 0 < t["rel_rmse"] < 0.1 and t["cosine"] > 0.99
    for r in report["modules"]:
        assert r["input_scale"] is not None and r["input_scale"] > 0


def test_modelopt_w4a16_has_no_input_scale(trees):
    dst = run(trees, "mo-w4a16", nw.write_modelopt_calibrated, algo="W4A16_NVFP4")
    report = co.compare(trees / "k3", dst)
    assert report["activations"] == "A16"
    assert json.loads((dst / "hf_quant_config.json").read_text())["quantization"]["quant_algo"] == "W4A16_NVFP4"
    assert not any(n.endswith(".input_scale") for n in nw.load_source(dst).info)


def test_modelopt_values_decode_as_e2m1_times_scale_times_scale2(trees):
    """The oracle's ModelOpt decoding against ml_dtypes, module by module."""
    dst = run(trees, "mo-dynamic", nw.write_modelopt_calibrated, mode="dynamic")
    src, other = nw.load_source(trees / "k3"), nw.load_source(dst)
    rows = by_name(co.compare(trees / "k3", dst))
    for m in src.modules:
        w = np.frombuffer(other.raw(m + ".weight"), np.uint8).reshape(other.info[m + ".weight"][2])
        s = np.frombuffer(other.raw(m + ".weight_scale"), np.uint8).reshape(other.info[m + ".weight_scale"][2])
        g = float(np.frombuffer(other.raw(m + ".weight_scale_2"), np.float32)[0])
        codes = nw.codes_of(w)
        o = codes.view(ml_dtypes.float4_e2m1fn).astype(np.float64) * np.repeat(
            s.view(ml_dtypes.float8_e4m3fn).astype(np.float64), 16, axis=1) * g
        x = nw.decoded_f64(src.packed(m), src.scale(m))
        assert rows[m]["exact_values"] == int((o == x).sum()), m
        assert rows[m]["max_abs_error"] == float(np.abs(o - x).max()), m
        assert rows[m]["rel_rmse"] == pytest.approx(np.sqrt(np.sum((o - x) ** 2) / np.sum(x**2)), rel=1e-12)
        assert rows[m]["cosine"] == pytest.approx(np.sum(o * x) / np.sqrt(np.sum(o**2) * np.sum(x**2)), rel=1e-12)
        assert rows[m]["global_scale"] == g


# ---------------------------------------------------------------- compressed-tensors

@pytest.mark.parametrize("w4a4", [False, True])
def test_compressed_tensors_writer(trees, w4a4):
    dst = run(trees, f"ct-{int(w4a4)}", nw.write_compressed_tensors, w4a4=w4a4, global_factor=0.75 if w4a4 else 1.0)
    report = co.compare(trees / "k3", dst)
    t = report["totals"]
    assert report["format"] == "compressed-tensors" and report["activations"] == ("A4" if w4a4 else "A16")
    assert t["non_power_of_two_globals"] == t["modules_quantized"] == t["modules_compared"]
    assert t["gate_up_pairs"] == 6 and t["gate_up_pairs_globals_differ"] > 0  # each module its own global
    assert 0 < t["rel_rmse"] < 0.1 and t["cosine"] > 0.99 and report["exit_code"] == 1
    # compressed-tensors validates the config and decodes the tensors as the oracle does.
    other = nw.load_source(dst)
    qc = nw.quant_config_location(other.config)["quantization_config"]
    scheme = QuantizationConfig.model_validate(qc).config_groups["group_0"]
    assert (scheme.input_activations is not None) == w4a4
    rows = by_name(report)
    src = nw.load_source(trees / "k3")
    for m in src.modules:
        tensors = {}
        for suffix in ("weight_packed", "weight_scale", "weight_global_scale"):
            dtype, shape = other.info[f"{m}.{suffix}"][1:]
            raw = np.frombuffer(other.raw(f"{m}.{suffix}"), np.uint8).copy()
            tt = torch.from_numpy(raw)
            tt = tt.view({"U8": torch.uint8, "F8_E4M3": torch.float8_e4m3fn, "F32": torch.float32}[dtype])
            tensors[suffix] = tt.reshape(shape)
        w = NVFP4PackedCompressor.decompress(tensors, scheme)["weight"].to(torch.float64).numpy()
        g = float(tensors["weight_global_scale"][0])
        codes = nw.codes_of(tensors["weight_packed"].numpy())
        mine = co.e2m1_decode(codes) * np.repeat(co.e4m3_decode(tensors["weight_scale"].view(torch.uint8).numpy()),
                                                 16, axis=1) / g
        np.testing.assert_allclose(w, mine, rtol=2 * torch.finfo(torch.bfloat16).eps, atol=0)
        assert rows[m]["global_scale"] == g and rows[m]["zero_sign_rewrites"] == 0
        assert (rows[m]["input_scale"] is not None) == w4a4


def test_oracle_agrees_with_the_requantize_report(trees):
    dst, report_path = trees / "k3-rq", trees / "k3-rq.json"
    if not dst.exists():
        mx2nv("requantize", trees / "k3", dst, "--threads", "1", "--report", report_path)
    table = {row["module"]: row for row in json.loads(report_path.read_text())["requantized"]}
    report = co.compare(trees / "k3", dst)
    for r in report["modules"]:
        row = table[r["name"]]
        assert r["values"] == row["values"] and r["global_scale"] == row["global_scale"]
        assert r["rel_rmse"] == pytest.approx(row["relative_rmse"], rel=1e-9)
        assert r["cosine"] == pytest.approx(row["cosine"], rel=1e-12)
        assert r["max_abs_error"] == pytest.approx(row["max_abs_error"], rel=1e-12)
        assert r["gate_up_globals_bit_equal"] in (None, True)


# ---------------------------------------------------------------- names

def test_unquantized_missing_and_extra_modules_are_named(trees):
    src = nw.load_source(trees / "k3")
    keep_bf16, gone = K3.format(1, 2, "w2"), K3.format(0, 1, "w1")
    extra = K3.format(1, 99, "w3")
    for writer in (nw.write_modelopt_cast, nw.write_compressed_tensors):
        dst = trees / f"k3-names-{writer.__name__}"
        writer(trees / "k3", dst, unquantized=[keep_bf16], drop=[gone], extra={K3.format(1, 0, "w3"): extra})
        report = co.compare(trees / "k3", dst)
        assert report["missing_in_other"] == [gone] and report["extra_in_other"] == [extra]
        assert report["unquantized_in_other"] == [keep_bf16]
        r = by_name(report)[keep_bf16]
        assert not r["quantized"] and r["exact_values"] == r["values"] and r["packed_bytes"] == 0
        assert report["totals"]["modules_compared"] == len(src.modules) - 1
        assert report["exit_code"] == 1
        # --modules narrows both sides.
        narrowed = co.compare(trees / "k3", dst, modules=r"layers\.0\.")
        assert narrowed["extra_in_other"] == [] and narrowed["missing_in_other"] == [gone]


def test_names_are_matched_across_spellings(trees):
    def respell(name: str) -> str:
        name = name.replace("language_model.model.", "model.language_model.").replace("block_sparse_moe", "mlp")
        return name.replace(".w1", ".gate_proj").replace(".w3", ".up_proj").replace(".w2", ".down_proj")

    dst = trees / "k3-respelled"
    nw.write_modelopt_cast(trees / "k3", dst, rename=respell)
    report = co.compare(trees / "k3", dst)
    assert report["missing_in_other"] == [] and report["extra_in_other"] == [] and report["exit_code"] == 0
    assert all(r["other_name"] == respell(r["name"]) for r in report["modules"])


# ---------------------------------------------------------------- hostile

@pytest.mark.parametrize("base", ["ct", "mo-cast"])
@pytest.mark.parametrize("kind", nw.HOSTILE_KINDS)
def test_hostile_other_is_refused_naming_the_tensor(trees, base, kind):
    writer = nw.write_compressed_tensors if base == "ct" else nw.write_modelopt_cast
    valid = run(trees, base, writer)
    dst, target = nw.write_hostile(valid, trees / f"hostile-{base}-{kind}", kind)
    with pytest.raises(co.InvalidInput) as e:
        co.compare(trees / "k3", dst)
    assert target in str(e.value)
