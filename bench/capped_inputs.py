"""Checkpoints at the metadata caps, for measuring peak memory (benchmark.py --capped).

mx2nv refuses an index or shard header past its caps (src/safetensors/index.hpp,
src/safetensors/header.hpp); below them, memory must stay within the 256 MiB goal
whatever the input. `mx2nv generate` covers "most modules" (K3 layout, many
experts); this script covers the other corners, built on a tiny generated
checkpoint (one MXFP4 module pair per shard) with pass-through tensors added:

  long-names   the index's name bytes at the cap, in long names (few tensors)
  full-shards  every shard at the per-header tensor cap, and the index's tensor
               count and name bytes near their caps

Tensors are 1-byte U8 [1], so the data is tiny and metadata is everything.
Plain Python (no safetensors package): a header is JSON after its length.
"""

from __future__ import annotations

import argparse
import json
import shutil
import struct
import subprocess
from pathlib import Path

INDEX = "model.safetensors.index.json"


def read_shard(path: Path) -> tuple[dict, bytes]:
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    return header, raw[8 + n:]


def write_shard(path: Path, entries: list[tuple[str, str, list[int], bytes]], metadata: dict | None) -> None:
    header: dict = {}
    if metadata is not None:
        header["__metadata__"] = metadata
    offset = 0
    for name, dtype, shape, data in entries:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with path.open("wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for _, _, _, data in entries:
            f.write(data)


def build(mx2nv: Path, out: Path, shards: int, per_shard: int, name_length: int) -> None:
    """A generated checkpoint of `shards` shards, each given `per_shard` pass-through
    tensors whose names are `name_length` bytes long."""
    shutil.rmtree(out, ignore_errors=True)
    subprocess.run([str(mx2nv), "generate", str(out), "--layout", "flat", "--layers", "1", "--experts",
                    str(shards), "--shards", str(shards), "--hidden", "64", "--intermediate", "32", "--seed", "7"],
                   check=True, stdout=subprocess.DEVNULL)
    index = json.loads((out / INDEX).read_text())
    files = sorted(set(index["weight_map"].values()))
    for s, file in enumerate(files):
        header, data = read_shard(out / file)
        metadata = header.pop("__metadata__", None)
        entries = []
        for name, info in sorted(header.items(), key=lambda kv: kv[1]["data_offsets"][0]):
            b, e = info["data_offsets"]
            entries.append((name, info["dtype"], info["shape"], data[b:e]))
        for i in range(per_shard):
            stem = f"extra.{s}.{i}."
            name = stem + "x" * max(0, name_length - len(stem))
            entries.append((name, "U8", [1], b"\x01"))
            index["weight_map"][name] = file
        write_shard(out / file, entries, metadata)
    index["weight_map"] = dict(sorted(index["weight_map"].items()))
    (out / INDEX).write_text(json.dumps(index, indent=2) + "\n")


CASES = {
    # The index's names at their cap (96 MiB) in 2,000-byte names: 49,800
    # tensors over 12 shards, each shard's names 8.3 MB (per-header cap 8 MiB).
    "long-names": dict(shards=12, per_shard=4_150, name_length=2_000),
    # 19 shards x 65,500 tensors (per-header cap 65,536, converted too) with
    # 75-byte names: 1.245M tensors and 93 MB of names, the index's caps
    # (1.25M, 96 MiB) nearly both reached, converted as well.
    "full-shards": dict(shards=19, per_shard=65_500, name_length=75),
}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mx2nv", type=Path, default=Path(__file__).resolve().parent.parent / "build" / "mx2nv")
    p.add_argument("--work", type=Path, required=True)
    p.add_argument("cases", nargs="*", default=list(CASES))
    args = p.parse_args()
    for case in args.cases:
        build(args.mx2nv, args.work / case, **CASES[case])
        print(args.work / case)


if __name__ == "__main__":
    main()
