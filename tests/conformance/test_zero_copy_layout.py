"""The zero-copy layout (README "Zero-copy output") read by the ecosystem's
own code: every unchanged tensor at its source offset modulo 4096, the header
padded with trailing spaces beyond the reference writer's 8 bytes, tensors in
a data order that is not the header order -- and still loaded by safetensors
(its Rust validator: contiguous offsets, no gaps), torch (through
safetensors.torch, from a file and from bytes) and compressed-tensors'
NVFP4 decompressor, with every value as in the source."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import safetensors
import safetensors.torch
import torch

from checkpoints import SUFFIX_GLOBAL, SUFFIX_SCALE, open_checkpoint
from conftest import mx2nv
from test_compressed_tensors import decompress_all

BLOCK = 4096


def raw_header(path: Path) -> tuple[int, str, dict]:
    data = path.read_bytes()
    n = int.from_bytes(data[:8], "little")
    text = data[8 : 8 + n].decode("utf-8")
    return n, text, json.loads(text)


@pytest.fixture(scope="module")
def aligned_pair(built, tmp_path_factory):
    """A K3-shaped checkpoint whose scales are whole blocks (as in real MoE
    shapes) and its conversion."""
    root = tmp_path_factory.mktemp("zero-copy")
    mx2nv("generate", root / "src", "--layers", "2", "--experts", "4", "--hidden", "512", "--intermediate", "256",
          "--shards", "3")
    mx2nv("convert", root / "src", root / "dst")
    return root / "src", root / "dst"


def same_bytes(x: torch.Tensor, y: torch.Tensor) -> bool:
    """Bit-exact, NaN payloads included (the fixture's BF16 tensors are random bits)."""
    return (x.dtype == y.dtype and x.shape == y.shape
            and torch.equal(x.reshape(-1).view(torch.uint8), y.reshape(-1).view(torch.uint8)))


def shards(root: Path) -> list[Path]:
    return sorted(root.glob("*.safetensors"))


def test_unchanged_tensors_keep_their_source_offset_modulo_the_block(aligned_pair):
    src, dst = aligned_pair
    checked = 0
    for s_path in shards(src):
        d_path = dst / s_path.name
        sn, _, sh = raw_header(s_path)
        dn, _, dh = raw_header(d_path)
        for name, info in sh.items():
            if name == "__metadata__" or name.endswith(SUFFIX_SCALE):
                continue
            source_at = 8 + sn + info["data_offsets"][0]
            target_at = 8 + dn + dh[name]["data_offsets"][0]
            assert source_at % BLOCK == target_at % BLOCK, name
            checked += 1
    assert checked >= 40  # 2 layers x 4 experts x 3 packed, plus pass-through tensors


def test_header_is_json_then_spaces_only_and_offsets_tile_the_data(aligned_pair):
    _, dst = aligned_pair
    padded_beyond_eight = 0
    for path in shards(dst):
        n, text, header = raw_header(path)
        body = text.rstrip(" ")
        assert body.endswith("}") and json.loads(body) == header
        assert len(text) - len(body) < BLOCK
        padded_beyond_eight += len(text) - len(body) >= 8
        spans = sorted(tuple(v["data_offsets"]) for k, v in header.items() if k != "__metadata__")
        assert spans[0][0] == 0
        assert all(a[1] == b[0] for a, b in zip(spans, spans[1:]))
        assert 8 + n + spans[-1][1] == path.stat().st_size
        # The data order is not the header order (scales moved after the codes).
        order = [k for k in header if k != "__metadata__"]
        by_offset = sorted(order, key=lambda k: header[k]["data_offsets"][0])
        assert order != by_offset
    assert padded_beyond_eight > 0  # the padding really exceeds the reference writer's


def test_safetensors_and_torch_load_every_tensor_as_in_the_source(aligned_pair):
    src, dst = aligned_pair
    for s_path in shards(src):
        d_path = dst / s_path.name
        a = safetensors.torch.load_file(s_path)
        b = safetensors.torch.load_file(d_path)
        from_bytes = safetensors.torch.load(d_path.read_bytes())
        with safetensors.safe_open(d_path, framework="numpy") as f:
            as_numpy = {k: f.get_tensor(k) for k in f.keys() if str(b[k].dtype) == "torch.uint8"}
        for name, value in a.items():
            if name.endswith(SUFFIX_SCALE):
                continue  # retyped; checked by value through compressed-tensors below
            assert same_bytes(value, b[name]), name
            assert same_bytes(b[name], from_bytes[name]), name
            if name in as_numpy:
                assert np.array_equal(value.numpy(), as_numpy[name]), name
        extra = set(b) - set(a)
        assert extra and all(n.endswith(SUFFIX_GLOBAL) for n in extra)


def test_compressed_tensors_decompresses_identical_weights(aligned_pair):
    src, dst = aligned_pair
    assert decompress_all(open_checkpoint(src), open_checkpoint(dst)) == []


def test_copy_modes_give_byte_identical_files(aligned_pair, tmp_path):
    src, dst = aligned_pair
    mx2nv("convert", src, tmp_path / "copied", "--copy", "copy")
    for path in sorted(dst.rglob("*")):
        if path.is_file():
            assert path.read_bytes() == (tmp_path / "copied" / path.relative_to(dst)).read_bytes(), path.name


def test_safetensors_version_is_the_one_tested():
    assert safetensors.__version__ == "0.8.0"
