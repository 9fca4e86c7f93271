"""Reading checkpoints with the `safetensors` package and walking them the way
Hugging Face loaders do (index -> weight_map -> shards). Nothing here uses
mx2nv's code; it is the independent side of every comparison."""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open

INDEX = "model.safetensors.index.json"
SUFFIX_PACKED = ".weight_packed"
SUFFIX_SCALE = ".weight_scale"
SUFFIX_GLOBAL = ".weight_global_scale"


@dataclass
class Checkpoint:
    root: Path
    config: dict
    weight_map: dict[str, str]  # tensor -> shard file
    index: dict | None

    @property
    def quant_config(self) -> dict:
        if "quantization_config" in self.config:
            return self.config["quantization_config"]
        for value in self.config.values():
            if isinstance(value, dict) and "quantization_config" in value:
                return value["quantization_config"]
        raise KeyError("quantization_config")

    def tensor(self, name: str) -> torch.Tensor:
        with safe_open(self.root / self.weight_map[name], framework="pt") as f:
            return f.get_tensor(name)

    def modules(self) -> list[str]:
        return sorted(n[: -len(SUFFIX_PACKED)] for n in self.weight_map if n.endswith(SUFFIX_PACKED))


def open_checkpoint(root: Path) -> Checkpoint:
    root = Path(root)
    config = json.loads((root / "config.json").read_text())
    index_path = root / INDEX
    if index_path.exists():
        index = json.loads(index_path.read_text())
        weight_map = dict(index["weight_map"])
    else:
        index = None
        with safe_open(root / "model.safetensors", framework="pt") as f:
            weight_map = {k: "model.safetensors" for k in f.keys()}
    return Checkpoint(root, config, weight_map, index)


def traverse(root: Path) -> dict:
    """Walk like transformers/vLLM's default loader: every shard the index
    names, every tensor in it. Returns what a loader would find."""
    ck = open_checkpoint(root)
    seen: dict[str, str] = {}
    duplicates: list[str] = []
    unindexed: list[str] = []
    total = 0
    for shard in sorted(set(ck.weight_map.values())):
        with safe_open(ck.root / shard, framework="pt") as f:
            for name in f.keys():
                if name in seen:
                    duplicates.append(name)
                seen[name] = shard
                if ck.weight_map.get(name) != shard:
                    unindexed.append(name)
                t = f.get_slice(name)
                numel = 1
                for d in t.get_shape():
                    numel *= d
                total += numel * {"U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E8M0": 1, "BF16": 2, "F16": 2, "F32": 4,
                                  "I32": 4, "I64": 8, "F64": 8}[t.get_dtype()]
    missing = sorted(set(ck.weight_map) - set(seen))
    return {
        "tensors": seen,
        "duplicates": duplicates,
        "unindexed": unindexed,
        "missing": missing,
        "total_bytes": total,
        "declared_total_size": (ck.index or {}).get("metadata", {}).get("total_size"),
    }


def tensor_location(path: Path, name: str) -> tuple[int, int]:
    """Absolute [begin, end) of a tensor's bytes in a shard, from its header."""
    raw = Path(path).read_bytes()[:8]
    n = int.from_bytes(raw, "little")
    header = json.loads(Path(path).read_bytes()[8 : 8 + n])
    b, e = header[name]["data_offsets"]
    return 8 + n + b, 8 + n + e


def patch_bytes(path: Path, offset: int, data: bytes) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(data)


def variant(outputs, tmp_path: Path, change) -> Path:
    """The k3 output with its quantization_config changed by `change(qc, group)`."""
    _, good = outputs["k3"]
    dst = tmp_path / "variant"
    shutil.copytree(good, dst)
    config = json.loads((dst / "config.json").read_text())
    qc = config["text_config"]["quantization_config"]
    (group,) = qc["config_groups"].values()
    change(qc, group)
    (dst / "config.json").write_text(json.dumps(config))
    return dst
