"""Oracle 2: compressed-tensors itself. Its pydantic models (which forbid
unknown keys, as vLLM relies on) accept the output's quantization_config,
vLLM's NVFP4A16 scheme test selects it, and its own MXFP4 and NVFP4
compressors decompress source and output to identical weights.

Validated against compressed-tensors 0.20.1 (pinned in requirements.txt)."""

import copy
import json

import compressed_tensors
import pydantic
import pytest
import torch
from compressed_tensors.compressors import MXFP4PackedCompressor, NVFP4PackedCompressor
from compressed_tensors.quantization import QuantizationArgs, QuantizationConfig

from checkpoints import SUFFIX_GLOBAL, SUFFIX_PACKED, SUFFIX_SCALE, open_checkpoint, patch_bytes, tensor_location
from conftest import ALL_CASES, mx2nv

TESTED_VERSION = "0.20.1"


def test_pinned_version():
    assert compressed_tensors.__version__ == TESTED_VERSION


def is_fp4a16_nvfp4(weights: QuantizationArgs, input_activations) -> bool:
    """vLLM's `_is_fp4a16_nvfp4` rule for picking CompressedTensorsW4A16Fp4 /
    the NVFP4 MoE method with use_a16 (formats.md section 2.1)."""
    return (
        weights is not None
        and input_activations is None
        and weights.strategy == "tensor_group"
        and weights.symmetric
        and weights.group_size == 16
        and weights.type == "float"
        and weights.num_bits == 4
    )


def group_for(config: QuantizationConfig):
    # Every generated checkpoint has one group targeting Linear.
    (scheme,) = config.config_groups.values()
    return scheme


def decompress_all(src, dst):
    s_cfg = QuantizationConfig.model_validate(src.quant_config)
    d_cfg = QuantizationConfig.model_validate(dst.quant_config)
    mismatched = []
    for m in src.modules():
        a = MXFP4PackedCompressor.decompress(
            {"weight_packed": src.tensor(m + SUFFIX_PACKED), "weight_scale": src.tensor(m + SUFFIX_SCALE)},
            group_for(s_cfg),
        )["weight"]
        b = NVFP4PackedCompressor.decompress(
            {
                "weight_packed": dst.tensor(m + SUFFIX_PACKED),
                "weight_scale": dst.tensor(m + SUFFIX_SCALE),
                "weight_global_scale": dst.tensor(m + SUFFIX_GLOBAL),
            },
            group_for(d_cfg),
        )["weight"]
        if not torch.equal(a, b):
            mismatched.append(m)
    return mismatched


@pytest.mark.parametrize("case", ALL_CASES)
def test_config_is_nvfp4a16_to_compressed_tensors_and_vllm(outputs, case):
    _, dst = outputs[case]
    cfg = QuantizationConfig.model_validate(open_checkpoint(dst).quant_config)
    assert cfg.format == "nvfp4-pack-quantized"
    assert cfg.quantization_status == "compressed"
    for scheme in cfg.config_groups.values():
        assert scheme.format == "nvfp4-pack-quantized"
        assert scheme.weights.scale_dtype == torch.float8_e4m3fn
        assert is_fp4a16_nvfp4(scheme.weights, scheme.input_activations)
        # NVFP4PackedCompressor, not MXFP4's, is the one that claims it.
        assert NVFP4PackedCompressor.can_compress(torch.nn.Linear, scheme)
        assert not MXFP4PackedCompressor.can_compress(torch.nn.Linear, scheme)


@pytest.mark.parametrize("case", ALL_CASES)
def test_compressors_decompress_to_identical_weights(outputs, case):
    src, dst = outputs[case]
    assert decompress_all(open_checkpoint(src), open_checkpoint(dst)) == []


def test_unknown_key_is_rejected_by_compressed_tensors(outputs):
    _, dst = outputs["k3"]
    qc = copy.deepcopy(open_checkpoint(dst).quant_config)
    next(iter(qc["config_groups"].values()))["weights"]["mx2nv_extra"] = 1
    with pytest.raises(pydantic.ValidationError):
        QuantizationConfig.model_validate(qc)


def test_decompression_fails_on_a_tampered_scale(outputs, broken_copy):
    src, dst = broken_copy("flat")
    ck = open_checkpoint(dst)
    m = ck.modules()[1]
    shard = dst / ck.weight_map[m + SUFFIX_SCALE]
    begin, _ = tensor_location(shard, m + SUFFIX_SCALE)
    patch_bytes(shard, begin, bytes([shard.read_bytes()[begin] - 8]))
    assert m in decompress_all(open_checkpoint(src), ck)
    # mx2nv's own verify agrees it is broken.
    assert mx2nv("verify", src, dst, check=False).returncode == 1


def test_source_config_is_mxfp4_to_compressed_tensors(outputs):
    src, _ = outputs["k3"]
    cfg = QuantizationConfig.model_validate(open_checkpoint(src).quant_config)
    scheme = group_for(cfg)
    assert MXFP4PackedCompressor.can_compress(torch.nn.Linear, scheme)
    assert json.loads((src / "config.json").read_text())["text_config"]["quantization_config"]["format"] == "mxfp4-pack-quantized"
