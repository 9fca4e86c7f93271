"""Oracle 1: numpy + ml_dtypes + safetensors decode both checkpoints and
compare every value of every module; packed and pass-through bytes equal."""

import numpy as np
import pytest
import torch

from checkpoints import SUFFIX_GLOBAL, SUFFIX_PACKED, SUFFIX_SCALE, open_checkpoint, patch_bytes, tensor_location
from conftest import ALL_CASES
from oracles import numerics


@pytest.mark.parametrize("case", ALL_CASES)
def test_every_value_is_identical(outputs, case):
    src, dst = outputs[case]
    report = numerics(open_checkpoint(src), open_checkpoint(dst))
    assert report["values"] > 0
    assert report["problems"] == []
    assert report["mismatches"] == 0
    assert report["max_abs_error"] == 0.0


def test_ml_dtypes_decoders_agree_with_the_format_tables():
    import ml_dtypes

    codes = np.arange(16, dtype=np.uint8)
    values = codes.view(ml_dtypes.float4_e2m1fn).astype(np.float64)
    assert list(values[:8]) == [0, 0.5, 1, 1.5, 2, 3, 4, 6]
    assert np.array_equal(values[8:], -values[:8])
    e8m0 = np.arange(255, dtype=np.uint8).view(ml_dtypes.float8_e8m0fnu).astype(np.float64)
    assert np.array_equal(e8m0, np.ldexp(1.0, np.arange(255) - 127))


def _first_module(dst):
    ck = open_checkpoint(dst)
    m = ck.modules()[0]
    return ck, m, dst / ck.weight_map[m + SUFFIX_SCALE]


def test_fails_on_a_changed_scale(outputs, broken_copy):
    src, dst = broken_copy("k3")
    ck, m, shard = _first_module(dst)
    begin, _ = tensor_location(shard, m + SUFFIX_SCALE)
    old = shard.read_bytes()[begin]
    patch_bytes(shard, begin, bytes([old + 8 if old < 0x70 else old - 8]))  # x2 or /2
    report = numerics(open_checkpoint(src), open_checkpoint(dst))
    assert report["mismatches"] > 0


def test_fails_on_a_changed_packed_byte(outputs, broken_copy):
    src, dst = broken_copy("k3")
    ck, m, _ = _first_module(dst)
    shard = dst / ck.weight_map[m + SUFFIX_PACKED]
    begin, _ = tensor_location(shard, m + SUFFIX_PACKED)
    patch_bytes(shard, begin + 3, bytes([shard.read_bytes()[begin + 3] ^ 0x08]))  # a sign flip
    report = numerics(open_checkpoint(src), open_checkpoint(dst))
    assert any("packed bytes differ" in p for p in report["problems"])


def test_fails_on_a_changed_global(outputs, broken_copy):
    src, dst = broken_copy("flat")
    ck, m, _ = _first_module(dst)
    shard = dst / ck.weight_map[m + SUFFIX_GLOBAL]
    begin, _ = tensor_location(shard, m + SUFFIX_GLOBAL)
    g = torch.frombuffer(bytearray(shard.read_bytes()[begin : begin + 4]), dtype=torch.float32)
    patch_bytes(shard, begin, (g * 2).numpy().tobytes())
    report = numerics(open_checkpoint(src), open_checkpoint(dst))
    assert report["mismatches"] > 0


def test_fails_on_a_changed_pass_through_tensor(outputs, broken_copy):
    src, dst = broken_copy("demo")
    ck = open_checkpoint(dst)
    name = next(n for n in ck.weight_map if n.endswith("embed_tokens.weight"))
    shard = dst / ck.weight_map[name]
    begin, _ = tensor_location(shard, name)
    patch_bytes(shard, begin, bytes([shard.read_bytes()[begin] ^ 1]))
    report = numerics(open_checkpoint(src), open_checkpoint(dst))
    assert any("pass-through" in p for p in report["problems"])
