"""Oracle 3: vLLM's NVFP4A16 fused-MoE load path through Marlin, emulated on
the CPU (marlin.py). For marlin-window outputs every weight vLLM would use
equals the MXFP4 source in bf16 and fp16 modes; for an e4m3-window output
the emulation finds exactly the groups mx2nv inspect/verify predicted."""

import shutil

import numpy as np
import pytest
import torch

from checkpoints import SUFFIX_GLOBAL, SUFFIX_PACKED, SUFFIX_SCALE, open_checkpoint, patch_bytes, tensor_location
from conftest import MARLIN_WINDOW_CASES, mx2nv, report_of
from marlin import compare_with_source, moe_layers
from oracles import mxfp4_values, u8


def source_values(ck, module):
    return torch.from_numpy(mxfp4_values(u8(ck.tensor(module + SUFFIX_PACKED)), u8(ck.tensor(module + SUFFIX_SCALE))))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("case", MARLIN_WINDOW_CASES)
def test_marlin_window_output_is_exact_through_marlin(outputs, case, dtype):
    src, dst = outputs[case]
    report = compare_with_source(open_checkpoint(src), open_checkpoint(dst), dtype, source_values)
    assert report["layers"] > 0
    assert report["values"] > 0
    assert report["globals_differ"] == []
    assert report["zeroed_groups"] == 0
    assert report["mismatches"] == 0


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_e4m3_window_output_loses_exactly_the_predicted_groups(outputs, dtype):
    src, dst = outputs["wide_e4m3"]
    report = compare_with_source(open_checkpoint(src), open_checkpoint(dst), dtype, source_values)
    verify = report_of("verify", src, dst, "--window", "e4m3")
    inspect = mx2nv("inspect", src, "--window", "e4m3", "--json")
    import json

    predicted = json.loads(inspect.stdout)["outcomes"]["e4m3"]["marlin_zeroed_groups"]
    assert verify["result"] == "ok"
    assert report["zeroed_groups"] > 0
    assert report["zeroed_groups"] == verify["counts"]["marlin_zeroed_groups"] == predicted
    assert report["mismatches"] > 0  # those groups' values become zero at runtime
    # And mx2nv verify under the (default) marlin window calls the output a difference.
    assert report_of("verify", src, dst)["result"] == "mismatch"


def test_gate_up_global_mismatch_is_caught(outputs, tmp_path):
    """A hand-made NVFP4 output where w3 carries its own global (values still
    right in file-format terms): vLLM applies w1's global to w3, so the
    runtime weights are wrong, and mx2nv verify must refuse it."""
    src, good = outputs["k3"]
    dst = tmp_path / "mismatched-globals"
    shutil.copytree(good, dst)
    ck = open_checkpoint(dst)
    layer = moe_layers(ck)[0]
    up = layer.names[(layer.experts[0], "up")]
    # Halve w3's divisor and its block scales: CT's value = e2m1 * scale / divisor is unchanged.
    g_shard = dst / ck.weight_map[up + SUFFIX_GLOBAL]
    g_at, _ = tensor_location(g_shard, up + SUFFIX_GLOBAL)
    g = np.frombuffer(g_shard.read_bytes()[g_at : g_at + 4], dtype=np.float32)
    patch_bytes(g_shard, g_at, (g / 2).astype(np.float32).tobytes())
    s_shard = dst / ck.weight_map[up + SUFFIX_SCALE]
    s_at, s_end = tensor_location(s_shard, up + SUFFIX_SCALE)
    scales = torch.frombuffer(bytearray(s_shard.read_bytes()[s_at:s_end]), dtype=torch.uint8).view(torch.float8_e4m3fn)
    patch_bytes(s_shard, s_at, (scales.float() / 2).to(torch.float8_e4m3fn).view(torch.uint8).numpy().tobytes())

    from oracles import numerics

    assert numerics(open_checkpoint(src), open_checkpoint(dst))["mismatches"] == 0  # file-level values agree
    report = compare_with_source(open_checkpoint(src), open_checkpoint(dst), torch.bfloat16, source_values)
    assert report["globals_differ"] == [f"{layer.prefix}.{layer.experts[0]}"]
    assert report["mismatches"] > 0
    result = mx2nv("verify", src, dst, check=False)
    assert result.returncode == 1
    assert "vLLM applies the gate's to both" in result.stderr
