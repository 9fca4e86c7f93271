"""Oracle 4: a K3 Stable LatentMoE block run with expert weights from the
MXFP4 source and from the NVFP4 output as vLLM 0.34.0's own Marlin and Humming
load paths (run from the wheels, test_runtimes.py) hand them to the kernel:
bit-identical outputs, in both activation dtypes' load paths."""

import pytest
import torch

from checkpoints import SUFFIX_SCALE, open_checkpoint, patch_bytes, tensor_location
from k3_block import BlockWeights, forward, random_dense
from runtime_judge import checkpoint_experts, moe_layers
from test_runtimes import BACKENDS, source_values

VLLM_BACKENDS = ["vllm-marlin", "vllm-humming"]

TOKENS, TOP_K, FULL_HIDDEN, SHARED = 8, 2, 512, 192


def source_block(src, layer, dense, routed_norm):
    w13 = torch.stack([torch.cat([source_values(src, layer.names[(e, "w1")]),
                                  source_values(src, layer.names[(e, "w3")])]) for e in layer.experts])
    w2 = torch.stack([source_values(src, layer.names[(e, "w2")]) for e in layer.experts])
    return BlockWeights(dense["router"], dense["correction_bias"], dense["latent_down"], dense["latent_up"],
                        w13.float(), w2.float(), dense["routed_norm"] if routed_norm else None, dense["shared"])


def nvfp4_block(dst, layer, dense, routed_norm, dtype, backend):
    load, decode = BACKENDS[backend]
    w = decode(load(checkpoint_experts(dst, layer), dtype), dtype)
    w13 = torch.cat([w["w1"], w["w3"]], dim=1).float()
    return BlockWeights(dense["router"], dense["correction_bias"], dense["latent_down"], dense["latent_up"],
                        w13, w["w2"].float(), dense["routed_norm"] if routed_norm else None, dense["shared"])


def run_both(src_dir, dst_dir, dtype, backend, routed_norm=True):
    src, dst = open_checkpoint(src_dir), open_checkpoint(dst_dir)
    outs = []
    for layer in moe_layers(dst):
        latent = source_values(src, layer.names[(layer.experts[0], "w1")]).shape[1]
        dense = random_dense(len(layer.experts), FULL_HIDDEN, latent, SHARED, seed=len(outs))
        x = torch.randn(TOKENS, FULL_HIDDEN, generator=torch.Generator().manual_seed(99))
        a = forward(x, source_block(src, layer, dense, routed_norm), TOP_K)
        b = forward(x, nvfp4_block(dst, layer, dense, routed_norm, dtype, backend), TOP_K)
        outs.append((a, b))
    return outs


@pytest.mark.parametrize("routed_norm", [True, False], ids=["routed-norm", "no-norm"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("backend", VLLM_BACKENDS)
def test_block_outputs_are_bit_identical(outputs, backend, dtype, routed_norm):
    src, dst = outputs["k3"]
    pairs = run_both(src, dst, dtype, backend, routed_norm)
    assert pairs
    for a, b in pairs:
        assert torch.isfinite(a).all()
        assert a.abs().max() > 0
        assert torch.equal(a, b)


@pytest.mark.parametrize("backend", VLLM_BACKENDS)
def test_block_outputs_differ_for_a_broken_output(outputs, broken_copy, backend):
    src, dst = broken_copy("k3")
    ck = open_checkpoint(dst)
    layer = moe_layers(ck)[0]
    # Damage every expert's down-projection scales of layer 0 so routing cannot avoid them.
    for e in layer.experts:
        m = layer.names[(e, "w2")]
        shard = dst / ck.weight_map[m + SUFFIX_SCALE]
        begin, end = tensor_location(shard, m + SUFFIX_SCALE)
        data = bytearray(shard.read_bytes()[begin:end])
        for i in range(0, len(data), 2):
            data[i] = max(0, data[i] - 8)
        patch_bytes(shard, begin, bytes(data))
    a, b = run_both(src, dst, torch.bfloat16, backend)[0]
    assert not torch.equal(a, b)
