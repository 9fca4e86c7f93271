"""The peer: MXFP4 -> NVFP4A16 written the way a user would script it with
torch + safetensors: load each shard whole, compute, save each shard whole.
Two passes (the first finds every module's k_max over active groups, which
gate/up sharing needs across shards). Same transcode rules as mx2nv (the
config rewrite is simplified); used only as the baseline of bench/benchmark.py.

usage: naive_transcoder.py SRC DST
"""

import json
import re
import shutil
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

E4M3_POW2 = {e: (e + 7) << 3 if e >= -6 else 1 << (e + 9) for e in range(-9, 9)}


def shards(src: Path) -> list[str]:
    index = src / "model.safetensors.index.json"
    if index.exists():
        return sorted(set(json.loads(index.read_text())["weight_map"].values()))
    return ["model.safetensors"]


def active_groups(packed: torch.Tensor) -> torch.Tensor:
    codes = torch.stack([packed & 0x0F, packed >> 4], dim=-1).reshape(packed.shape[0], -1)
    return ((codes & 0x7) != 0).reshape(packed.shape[0], -1, 32).any(dim=-1)


def partner(name: str) -> str:
    for a, b in ((".w1", ".w3"), (".w3", ".w1"), (".gate_proj", ".up_proj"), (".up_proj", ".gate_proj")):
        if name.endswith(a):
            return name[: -len(a)] + b
    return name


def main(src: Path, dst: Path) -> None:
    k_max: dict[str, int] = {}
    active: dict[str, torch.Tensor] = {}
    scales: dict[str, torch.Tensor] = {}
    for shard in shards(src):  # a module's packed and scale tensors may sit in different shards
        tensors = load_file(src / shard)
        for name, t in tensors.items():
            if name.endswith(".weight_packed"):
                active[name[: -len(".weight_packed")]] = active_groups(t)
            elif name.endswith(".weight_scale"):
                scales[name[: -len(".weight_scale")]] = t.to(torch.int32) - 127
    for m, act in active.items():
        if act.any():
            k_max[m] = int(scales[m][act].max())
    dst.mkdir(parents=True)
    index = {"metadata": {"total_size": 0}, "weight_map": {}}
    for shard in shards(src):
        tensors = load_file(src / shard)
        out = {}
        for name, t in tensors.items():
            if not name.endswith(".weight_scale"):
                out[name] = t
                continue
            m = name[: -len(".weight_scale")]
            top = max(k_max.get(m, -1000), k_max.get(partner(m), -1000))
            mexp = top - 8 if top > -1000 else 0
            k = t.to(torch.int32) - 127 - mexp
            act = active[m]
            if top > -1000 and bool((k[act] < -6).any()):
                raise SystemExit(f"{m}: over span")
            lut = torch.zeros(512, dtype=torch.uint8)
            for e, byte in E4M3_POW2.items():
                lut[e + 256] = byte
            new = lut[(k + 256).clamp(0, 511)] if top > -1000 else torch.zeros_like(t)
            out[name] = new.repeat_interleave(2, dim=1).view(torch.float8_e4m3fn)
            out[m + ".weight_global_scale"] = torch.tensor([2.0 ** (-mexp)], dtype=torch.float32)
        save_file(out, dst / shard, metadata={"format": "pt"})
        for name, t in out.items():
            index["weight_map"][name] = shard
            index["metadata"]["total_size"] += t.numel() * t.element_size()
    if (src / "model.safetensors.index.json").exists():
        (dst / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    config = json.loads((src / "config.json").read_text())
    text = json.dumps(config)
    text = re.sub("mxfp4-pack-quantized", "nvfp4-pack-quantized", text)
    (dst / "config.json").write_text(text)
    for f in src.rglob("*"):
        rel = f.relative_to(src)
        if f.is_file() and not str(rel).endswith(".safetensors") and rel.name not in ("config.json", "model.safetensors.index.json"):
            (dst / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(f, dst / rel)


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
