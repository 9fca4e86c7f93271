"""Loader-level evidence: each pinned runtime's own model-class weight loading
(model_loaders.py) over every tensor of a converted checkpoint, per
architecture mx2nv writes, then (where everything loads) the runtime's own
post-load processing and the kernel decode, value for value against SRC.

Found with SGLang 0.5.23 + K3 (KimiK3ForConditionalGeneration) + a
compressed-tensors NVFP4A16 checkpoint: every `weight_packed` expert tensor is
renamed to `...weight` (models/kimi_k3.py:3209-3210), matches no parameter
(the scheme registers `w13_weight_packed`) and is skipped without a word; the
packed codes the kernel would read are never written. The tests below
document that (it is what makes gate's verdict BLOCKED) and tie gate to it.
"""

from __future__ import annotations

import json
import re
import shutil

import pytest
import torch

import model_loaders as ml
import runtime_judge
import sglang_marlin
import vllm_marlin
from checkpoints import SUFFIX_PACKED, SUFFIX_SCALE, open_checkpoint
from conftest import mx2nv
from oracles import mxfp4_values, u8

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
PACKED_EXPERT = re.compile(r"\.experts\.\d+\.[^.]+\.weight_packed$")
BACKEND = {"vllm": (vllm_marlin, runtime_judge.marlin_decoder(vllm_marlin.scale_order)),
           "sglang": (sglang_marlin, runtime_judge.marlin_decoder(sglang_marlin.scale_order, w13_global_in_dtype=True))}


@pytest.fixture(scope="module")
def reports(outputs):
    """(runtime, case, dtype) -> model_loaders.Report, computed once."""
    cache = {}

    def get(runtime: str, case: str, dtype: str) -> ml.Report:
        key = (runtime, case, dtype)
        if key not in cache:
            dst = outputs[case][1]
            chain = ml.CHAINS[(runtime, ml.model_class(dst))]
            cache[key] = ml.report(chain, dst, DTYPES[dtype])
        return cache[key]

    return get


def packed_expert_tensors(dst) -> list[str]:
    return sorted(n for n in open_checkpoint(dst).weight_map if PACKED_EXPERT.search(n))


def test_sglang_k3_skips_every_packed_expert_tensor(outputs, reports):
    """SGLang 0.5.23's K3 chain consumes every scale and global but no
    packed expert tensor, and writes no element of the packed parameters:
    the experts would run on torch.empty memory."""
    r = reports("sglang", "k3", "bf16")
    dst = outputs["k3"][1]
    assert r.architecture == "KimiK3ForConditionalGeneration" and r.model_class == "KimiK3ForConditionalGeneration"
    packed = packed_expert_tensors(dst)
    assert packed and sorted(r.unconsumed) == packed
    assert r.tensors == len(open_checkpoint(dst).weight_map)
    for name, count in r.unwritten.items():
        p = dict(r.runs[0].experts[name.rsplit(".", 1)[0]][0].named_parameters())[name.rsplit(".", 1)[1]]
        if name.endswith("_weight_packed"):
            assert count == p.numel(), name  # not one element came from the file
        else:
            assert count == 0, name


# (runtime, case, architecture mx2nv wrote): the chains that load every tensor.
LOADS_EVERYTHING = [("vllm", "k3", "KimiK3ForConditionalGeneration"),
                    ("vllm", "flat", "DeepseekV3ForCausalLM"),
                    ("sglang", "flat", "DeepseekV3ForCausalLM")]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("runtime", "case", "arch"), LOADS_EVERYTHING)
def test_loader_chain_loads_everything_and_decodes_exactly(outputs, reports, runtime, case, arch, dtype):
    r = reports(runtime, case, dtype)
    assert r.architecture == arch == r.model_class
    assert r.unconsumed == []
    assert r.routed_elements > 0 and not any(r.unwritten.values())
    assert_decodes_exactly(runtime, r, outputs[case][0], dtype)


def test_a_dropped_tensor_is_seen(outputs, reports, tmp_path):
    """The check itself: a checkpoint tensor the chain cannot place (an
    expert id past n_routed_experts, renamed in the index and shard header)
    is reported unconsumed by SGLang's DeepSeek chain, which skips names
    missing from params_dict, while the real experts still load."""
    src = outputs["flat"][1]
    dst = tmp_path / "renamed"
    shutil.copytree(src, dst)
    ck = open_checkpoint(dst)
    victim = next(n for n in ck.weight_map if n.endswith(".experts.3.up_proj.weight_scale"))
    renamed = victim.replace(".experts.3.", ".experts.9.")  # same length: header stays the same size
    shard = dst / ck.weight_map[victim]
    data = shard.read_bytes()
    assert data.count(victim.encode()) == 1
    shard.write_bytes(data.replace(victim.encode(), renamed.encode()))
    index = dst / "model.safetensors.index.json"
    index.write_text(index.read_text().replace(victim, renamed))
    r = ml.report(ml.sglang_deepseek, dst, torch.bfloat16)
    assert r.unconsumed == [renamed]
    unwritten = {k: v for k, v in r.unwritten.items() if v}
    layer = victim.split(".mlp.")[0]
    assert list(unwritten) == [f"{layer}.mlp.experts.w13_weight_scale"]  # expert 3's up-projection scales
    assert unwritten[f"{layer}.mlp.experts.w13_weight_scale"] == open_checkpoint(src).tensor(victim).numel()


def assert_decodes_exactly(runtime: str, r: ml.Report, src, dtype: str) -> None:
    """The loaded layers through the runtime's own post-load processing and
    the kernel decode: every weight equals SRC's MXFP4 value."""
    _, decode = BACKEND[runtime]
    s = open_checkpoint(src)
    run = r.runs[0]
    checked = 0
    for prefix, (layer, method) in run.experts.items():
        inputs = run.finish(layer, method, [])  # the post-load processing of DST's own quant method
        got = decode(inputs, DTYPES[dtype])
        for e in range(layer.w13_weight_scale.shape[0]):
            for proj in ("w1", "w3", "w2"):
                name = run.source_module(prefix, e, proj)
                want = torch.from_numpy(mxfp4_values(u8(s.tensor(name + SUFFIX_PACKED)), u8(s.tensor(name + SUFFIX_SCALE))))
                have = got[proj][e]
                assert torch.equal(have, want), (name, int((have != want).sum()))
                checked += want.numel()
    assert checked > 0


@pytest.mark.parametrize(("case", "dropping_today"), [("k3", {"sglang"}), ("flat", set())])
def test_gate_says_no_run_where_the_loader_chain_drops_tensors(outputs, reports, case, dropping_today):
    """gate must not say RUN for a runtime whose own loader chain left a
    checkpoint tensor unconsumed or an expert element unwritten."""
    dst = outputs[case][1]
    dropping = {rt for rt in ("vllm", "sglang") if not reports(rt, case, "bf16").loads_everything}
    assert dropping == dropping_today  # what the chains show (see above)
    gate = json.loads(mx2nv("gate", dst, "--runtime", "all", "--json", check=False).stdout)
    runs = [v for v in gate["verdicts"] if v["runtime"] in dropping and v["verdict"] == "RUN"]
    assert runs == [], [(v["runtime"], v["version"], v["backend"], v["dtype"], v["tp"]) for v in runs]
