"""Judge an NVFP4 output by the weights a runtime's own load path hands its
kernel: per MoE layer, every expert's tensors go through the runtime's code
(vllm_marlin.py / sglang_marlin.py / vllm_humming.py), the kernel decode
(marlin_kernel.py / humming_kernel.py) turns the result into weights, and
each weight must equal the MXFP4 source value exactly."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Callable

import torch

import marlin_kernel
from checkpoints import SUFFIX_GLOBAL, SUFFIX_PACKED, SUFFIX_SCALE, Checkpoint

EXPERT = re.compile(r"^(?P<layer>.*)\.(?P<expert>\d+)\.(?P<proj>w1|w2|w3|gate_proj|up_proj|down_proj)$")
ROLE = {"w1": "w1", "gate_proj": "w1", "w3": "w3", "up_proj": "w3", "w2": "w2", "down_proj": "w2"}


@dataclass
class MoeLayer:
    prefix: str
    experts: list[int]
    names: dict[tuple[int, str], str] = field(default_factory=dict)  # (expert, w1|w2|w3) -> module


def moe_layers(ck: Checkpoint) -> list[MoeLayer]:
    layers: dict[str, MoeLayer] = {}
    for m in ck.modules():
        hit = EXPERT.match(m)
        if not hit:
            continue
        layer = layers.setdefault(hit["layer"], MoeLayer(hit["layer"], []))
        e = int(hit["expert"])
        if e not in layer.experts:
            layer.experts.append(e)
        layer.names[(e, ROLE[hit["proj"]])] = m
    for layer in layers.values():
        layer.experts.sort()
    return list(layers.values())


def checkpoint_experts(ck: Checkpoint, layer: MoeLayer) -> dict[int, dict[str, dict[str, torch.Tensor]]]:
    """The tensors a runtime's expert loader receives, as stored."""
    return {e: {proj: {"weight_packed": ck.tensor(layer.names[(e, proj)] + SUFFIX_PACKED),
                       "weight_scale": ck.tensor(layer.names[(e, proj)] + SUFFIX_SCALE),
                       "weight_global_scale": ck.tensor(layer.names[(e, proj)] + SUFFIX_GLOBAL)}
                for proj in ("w1", "w2", "w3")}
            for e in layer.experts}


def kernel_weights(k, scale_order: Callable[[int, int], torch.Tensor], dtype: torch.dtype,
                   w13_global_in_dtype: bool = False) -> dict[str, torch.Tensor]:
    """Kernel inputs of one layer -> {"w1", "w3": [E, N, K], "w2": [E, K, N]}
    float64 weights (NaN where a value cannot be reproduced exactly).
    `w13_global_in_dtype`: the kernel applies w13's global to the output in
    the activation dtype (SGLang's MoE template, marlin_kernel.py), judged
    as the w2 fold."""
    experts, n13, _ = k.w13_packed.shape
    padded_n = n13 // 2
    order13 = scale_order(k.hidden, n13)
    s13 = torch.stack([marlin_kernel.unpermute_scales(k.w13_scale[e].view(torch.uint8), order13, n13)
                       for e in range(experts)])
    w13 = marlin_kernel.weights(k.w13_packed, s13, k.w13_global, dtype, fold_into_topk=w13_global_in_dtype)
    k2 = k.w2_packed.shape[2] * 2
    order2 = scale_order(k2, k.hidden)
    s2 = torch.stack([marlin_kernel.unpermute_scales(k.w2_scale[e].view(torch.uint8), order2, k.hidden)
                      for e in range(experts)])
    w2 = marlin_kernel.weights(k.w2_packed, s2, k.w2_global, dtype, fold_into_topk=True)
    n = k.intermediate
    return {"w1": w13[:, :n], "w3": w13[:, padded_n:padded_n + n], "w2": w2[:, :, :n]}


Loader = Callable[[dict, torch.dtype], object]  # experts -> kernel inputs
Decoder = Callable[[object, torch.dtype], dict]  # kernel inputs -> {"w1", "w3", "w2"} weights


def marlin_decoder(scale_order, w13_global_in_dtype: bool = False) -> Decoder:
    return lambda inputs, dtype: kernel_weights(inputs, scale_order, dtype, w13_global_in_dtype)


def judge(src: Checkpoint, dst: Checkpoint, load: Loader, decode: Decoder, dtype: torch.dtype, source_values) -> dict:
    """Every weight the runtime computes with against the MXFP4 source."""
    report = {"layers": 0, "values": 0, "mismatches": 0, "nonfinite": 0, "zeroed_groups": 0, "warnings": [], "bad": []}
    for layer in moe_layers(dst):
        inputs = load(checkpoint_experts(dst, layer), dtype)
        report["warnings"] += inputs.warnings
        got = decode(inputs, dtype)
        report["layers"] += 1
        for i, e in enumerate(layer.experts):
            for proj in ("w1", "w3", "w2"):
                module = layer.names[(e, proj)]
                want = source_values(src, module)
                have = got[proj][i]
                bad = int((have != want).sum())
                report["values"] += want.numel()
                report["mismatches"] += bad
                report["nonfinite"] += int((~torch.isfinite(have)).sum())
                # Active 32-groups of the source that the runtime turned into zeros.
                groups = lambda t: t.reshape(*t.shape[:-1], -1, 32)  # noqa: E731
                report["zeroed_groups"] += int(((groups(want) != 0).any(-1) & (groups(have) == 0).all(-1)).sum())
                if bad:
                    report["bad"].append(module)
    return report
