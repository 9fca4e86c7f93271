"""GPU check (driven by scripts/gpu-check.sh): one MoE layer of an mx2nv output
through vLLM's real code on a GPU, against float32 math on the MXFP4 source.

For each backend (what vLLM selects, Marlin forced, and Humming on sm90) and
activation dtype it builds the layer with vLLM's FusedMoEFactory and the
compressed-tensors config of the output, loads the experts with vLLM's own
load_weights, runs process_weights_after_loading and the forward pass, and
prints the max abs difference to the reference. Needs vllm 0.33.0 and a GPU.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from safetensors import safe_open

E2M1 = torch.tensor([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6], dtype=torch.float64)
TOKENS, TOP_K = 64, 2


def tensors(root: Path) -> dict[str, Path]:
    index = root / "model.safetensors.index.json"
    if index.exists():
        return {k: root / v for k, v in json.loads(index.read_text())["weight_map"].items()}
    with safe_open(root / "model.safetensors", "pt") as f:
        return {k: root / "model.safetensors" for k in f.keys()}


def get(where: dict[str, Path], name: str) -> torch.Tensor:
    with safe_open(where[name], "pt") as f:
        return f.get_tensor(name)


def mxfp4(where, module) -> torch.Tensor:
    packed, scale = get(where, module + ".weight_packed"), get(where, module + ".weight_scale").view(torch.uint8)
    codes = torch.stack([packed & 0xF, packed >> 4], -1).reshape(packed.shape[0], -1).long()
    return E2M1[codes] * torch.pow(2.0, scale.double() - 127).repeat_interleave(32, -1)


def quant_config(root: Path) -> dict:
    config = json.loads((root / "config.json").read_text())
    if "quantization_config" in config:
        return config["quantization_config"]
    return next(v["quantization_config"] for v in config.values() if isinstance(v, dict) and "quantization_config" in v)


def main() -> int:
    src, dst = Path(sys.argv[1]), Path(sys.argv[2])
    from vllm.config import KernelConfig, VllmConfig, set_current_vllm_config
    from vllm.distributed import init_distributed_environment, initialize_model_parallel
    from vllm.forward_context import set_forward_context
    from vllm.model_executor.layers.fused_moe.layer import FusedMoEFactory
    from vllm.model_executor.layers.quantization.compressed_tensors.compressed_tensors import CompressedTensorsConfig

    init_distributed_environment(world_size=1, rank=0, local_rank=0, distributed_init_method="tcp://127.0.0.1:29517")
    initialize_model_parallel(1, 1)
    s_where, d_where = tensors(src), tensors(dst)
    prefix = sorted({n.rsplit(".experts.", 1)[0] for n in d_where if ".experts." in n})[0]
    experts = sorted({int(n.split(".experts.")[1].split(".")[0]) for n in d_where if n.startswith(prefix + ".experts.")})
    w1 = [mxfp4(s_where, f"{prefix}.experts.{e}.w1") for e in experts]
    w3 = [mxfp4(s_where, f"{prefix}.experts.{e}.w3") for e in experts]
    w2 = [mxfp4(s_where, f"{prefix}.experts.{e}.w2") for e in experts]
    hidden, intermediate = w1[0].shape[1], w1[0].shape[0]
    weights = [(f"experts.{e}.{p}.{t}", get(d_where, f"{prefix}.experts.{e}.{p}.{t}"))
               for e in experts for p in ("w1", "w2", "w3") for t in ("weight_packed", "weight_scale", "weight_global_scale")]
    capability = torch.cuda.get_device_capability()
    backends = ["auto", "marlin"] + (["humming"] if capability == (9, 0) else [])
    gen = torch.Generator().manual_seed(0)
    x32 = torch.randn(TOKENS, hidden, generator=gen) * 0.5
    logits = torch.randn(TOKENS, len(experts), generator=gen)
    print(f"gpu-check: {torch.cuda.get_device_name()} sm{capability[0]}{capability[1]}, layer {prefix}: "
          f"{len(experts)} experts, hidden {hidden}, intermediate {intermediate}, {TOKENS} tokens, top-{TOP_K}")
    failures = 0
    for backend in backends:
        for dtype in (torch.float16, torch.bfloat16):
            x = x32.to(dtype)
            # Reference: float64 math on the MXFP4 values, softmax top-k routing renormalised.
            probs = torch.softmax(logits.double(), -1)
            top_w, top_i = probs.topk(TOP_K, -1)
            top_w = top_w / top_w.sum(-1, keepdim=True)
            xd = x.double()
            ref = torch.zeros(TOKENS, hidden, dtype=torch.float64)
            for t in range(TOKENS):
                for k in range(TOP_K):
                    e = int(top_i[t, k])
                    h = torch.nn.functional.silu(xd[t] @ w1[e].T) * (xd[t] @ w3[e].T)
                    ref[t] += top_w[t, k] * (h @ w2[e].T)
            try:
                config = VllmConfig(kernel_config=KernelConfig(moe_backend=backend))
                with set_current_vllm_config(config), torch.device("cuda"):
                    qc = CompressedTensorsConfig.from_config(quant_config(dst))
                    layer = FusedMoEFactory(num_experts=len(experts), top_k=TOP_K, hidden_size=hidden,
                                            intermediate_size=intermediate, params_dtype=dtype, quant_config=qc,
                                            prefix=prefix, ckpt_names=("w1", "w2", "w3"), renormalize=True,
                                            reduce_results=False)
                    list(layer.load_weights([(n, t.cuda()) for n, t in weights]))
                    experts_layer = layer.routed_experts
                    experts_layer.quant_method.process_weights_after_loading(experts_layer)
                    chosen = getattr(experts_layer.quant_method, "nvfp4_backend", backend)
                    with set_forward_context(None, config, num_tokens=TOKENS):
                        out = layer(x.cuda(), logits.cuda().to(dtype)).double().cpu()
            except Exception as e:  # report and go on: one backend failing must not hide the others
                print(f"  {backend:>8} {str(dtype)[6:]:>8}: ERROR {type(e).__name__}: {e}")
                failures += 1
                continue
            diff = (out - ref).abs().max().item()
            scale = ref.abs().max().item()
            print(f"  {backend:>8} -> {str(chosen):<28} {str(dtype)[6:]:>8}: max abs diff {diff:.3e} "
                  f"(reference max {scale:.3e}, relative {diff / scale:.2e})")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
