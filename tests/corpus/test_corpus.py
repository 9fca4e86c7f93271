"""Replays the hostile-input corpus (cases.json) against the built CLI."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

HERE = Path(__file__).parent
REPO = HERE.parents[1]
MX2NV = Path(os.environ.get("MX2NV", REPO / "build" / "mx2nv")).absolute()
CORPUS = json.loads((HERE / "cases.json").read_text())
MODULE = CORPUS["module"]
SHARD0 = "model-00001-of-00002.safetensors"
INDEX = "model.safetensors.index.json"


def run(*args) -> subprocess.CompletedProcess:
    return subprocess.run([str(MX2NV), *map(str, args)], capture_output=True, text=True)


@pytest.fixture(scope="session")
def base(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("corpus") / "base"
    r = run("generate", root, "--layout", "k3", "--shards", "2", "--layers", "1", "--experts", "2",
            "--hidden", "64", "--intermediate", "64")
    assert r.returncode == 0, r.stderr
    return root


# --- reading and rewriting shards --------------------------------------------

def read_shard(path: Path) -> tuple[dict, bytes]:
    raw = path.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    return json.loads(raw[8 : 8 + n]), raw[8 + n :]


def write_shard(path: Path, header: dict | str | bytes, data: bytes) -> None:
    if isinstance(header, dict):
        header = json.dumps(header, separators=(",", ":"))
    blob = header.encode() if isinstance(header, str) else header
    path.write_bytes(len(blob).to_bytes(8, "little") + blob + data)


def shard_of(ck: Path, tensor: str) -> Path:
    return ck / json.loads((ck / INDEX).read_text())["weight_map"][tensor]


def edit_index(ck: Path, fn) -> None:
    index = json.loads((ck / INDEX).read_text())
    fn(index)
    (ck / INDEX).write_text(json.dumps(index, indent=2))


def rename_tensor(ck: Path, old: str, new: str) -> None:
    path = shard_of(ck, old)
    header, data = read_shard(path)
    header = {(new if k == old else k): v for k, v in header.items()}
    write_shard(path, header, data)

    def fix(index):
        index["weight_map"][new] = index["weight_map"].pop(old)

    edit_index(ck, fix)


def edit_tensor(ck: Path, name: str, fn) -> None:
    path = shard_of(ck, name)
    header, data = read_shard(path)
    fn(header[name])
    write_shard(path, header, data)


def config_path(config: dict, keys: list[str]):
    node = config
    for k in keys[:-1]:
        node = node[k]
    return node, keys[-1]


def mutate(ck: Path, do: dict) -> None:
    (op, arg), = [(k, v) for k, v in do.items() if k != "data"]
    shard0 = ck / SHARD0
    if op == "header_length":
        raw = bytearray(shard0.read_bytes())
        raw[:8] = int(arg).to_bytes(8, "little")
        shard0.write_bytes(bytes(raw))
    elif op == "shard_raw":
        shard0.write_bytes(arg.encode())
    elif op == "shard_header":
        write_shard(shard0, arg, bytes(do["data"]))
    elif op == "shard_header_hex":
        write_shard(shard0, bytes.fromhex(arg), bytes(do["data"]))
    elif op == "shard_header_nesting":
        write_shard(shard0, '{"__metadata__":' + "[" * arg + "]" * arg + "}", b"")
    elif op == "append":
        shard0.write_bytes(shard0.read_bytes() + b"\0" * arg)
    elif op == "truncate":
        shard0.write_bytes(shard0.read_bytes()[:-arg])
    elif op == "index_set":
        edit_index(ck, lambda i: i["weight_map"].__setitem__(arg[0], arg[1]))
    elif op == "index_delete":
        edit_index(ck, lambda i: i["weight_map"].pop(arg))
    elif op == "index_duplicate_key":
        text = (ck / INDEX).read_text()
        shard = json.loads(text)["weight_map"][arg]
        (ck / INDEX).write_text(text.replace('"weight_map": {', f'"weight_map": {{"{arg}": "{shard}",', 1))
    elif op == "index_raw":
        (ck / INDEX).write_text(arg)
    elif op == "remove":
        (ck / arg).unlink()
    elif op == "config_raw":
        (ck / "config.json").write_text(arg)
    elif op in ("config_delete", "config_set", "config_copy_qc_to_top"):
        config = json.loads((ck / "config.json").read_text())
        if op == "config_delete":
            node, key = config_path(config, arg)
            del node[key]
        elif op == "config_set":
            node, key = config_path(config, arg[0])
            node[key] = arg[1]
        else:
            config["quantization_config"] = config["text_config"]["quantization_config"]
        (ck / "config.json").write_text(json.dumps(config, indent=2))
    elif op == "rename_tensor":
        rename_tensor(ck, MODULE + arg[0], MODULE + arg[1])
    elif op == "retype_tensor":
        edit_tensor(ck, MODULE + arg[0], lambda t: t.__setitem__("dtype", arg[1]))
    elif op == "reshape_tensor":
        def reshape(t):
            n, c = t["shape"]
            t["shape"] = [n // 2, 2 * c] if arg[1] == "half_rows" else [n * c // 8, 8]
        edit_tensor(ck, MODULE + arg[0], reshape)
    elif op == "rename_other_tensor":
        path = shard_of(ck, MODULE + ".weight_scale")
        header, _ = read_shard(path)
        other = next(k for k in header if k != "__metadata__" and not k.startswith(MODULE.rsplit(".", 1)[0]))
        rename_tensor(ck, other, MODULE + arg[0])
    elif op == "scale_byte":
        name = MODULE + ".weight_scale"
        path = shard_of(ck, name)
        raw = bytearray(path.read_bytes())
        n = int.from_bytes(raw[:8], "little")
        begin, end = json.loads(raw[8 : 8 + n])[name]["data_offsets"]
        at = 8 + n + (begin + arg[0] if arg[0] >= 0 else end + arg[0])
        raw[at] = arg[1]
        path.write_bytes(bytes(raw))
    elif op == "insert_bytes":  # [target, "start" | "end", hex]: raw bytes into a JSON document
        target, where, blob = arg[0], arg[1], bytes.fromhex(arg[2])
        if target == "shard_header":
            raw = shard0.read_bytes()
            n = int.from_bytes(raw[:8], "little")
            header = raw[8 : 8 + n]
            write_shard(shard0, blob + header if where == "start" else header + blob, raw[8 + n :])
        else:
            path = ck / {"index": INDEX, "config": "config.json"}[target]
            text = path.read_bytes()
            path.write_bytes(blob + text if where == "start" else text + blob)
    elif op == "rename_module":  # both tensors of MODULE get module name `arg`
        for suffix in (".weight_packed", ".weight_scale"):
            rename_tensor(ck, MODULE + suffix, arg + suffix)
    elif op == "add_file":
        (ck / arg[0]).parent.mkdir(parents=True, exist_ok=True)
        (ck / arg[0]).write_text(arg[1])
    elif op == "fifo":
        (ck / arg).unlink()
        os.mkfifo(ck / arg)
    elif op == "directory":
        (ck / arg).unlink()
        (ck / arg).mkdir()
    elif op == "dangling_symlink":
        (ck / arg).symlink_to(ck / "does-not-exist")
    else:
        raise AssertionError(f"unknown mutation {op}")


@pytest.mark.parametrize("case", CORPUS["cases"], ids=[c["name"] for c in CORPUS["cases"]])
def test_hostile_input_is_refused(base, tmp_path, case):
    ck = tmp_path / "src"
    shutil.copytree(base, ck, symlinks=True)
    mutate(ck, case["do"])
    dst = tmp_path / "dst"
    r = run("convert", ck, dst)
    assert r.returncode == case["exit"], r.stdout + r.stderr
    assert case["message"] in r.stderr, r.stderr
    assert not dst.exists()
    i = run("inspect", ck)
    assert i.returncode == case["exit"], i.stdout + i.stderr
    assert case["message"] in i.stderr
    # The ModelOpt writer (convert --format modelopt) refuses it alike, leaving nothing at DST.
    mo = tmp_path / "mo"
    r = run("convert", "--format", "modelopt", ck, mo)
    assert r.returncode == case["exit"], r.stdout + r.stderr
    assert case["message"] in r.stderr, r.stderr
    assert not mo.exists()
    # So does the lossy writer in that layout (requantize --format modelopt, ModelOpt's own quantizer).
    rq = tmp_path / "rq"
    r = run("requantize", "--format", "modelopt", ck, rq)
    assert r.returncode == case["exit"], r.stdout + r.stderr
    assert case["message"] in r.stderr, r.stderr
    assert not rq.exists()


def test_corpus_is_large_enough():
    assert len(CORPUS["cases"]) >= 30
    assert len({c["name"] for c in CORPUS["cases"]}) == len(CORPUS["cases"])


def test_unmutated_base_converts(base, tmp_path):
    assert run("convert", base, tmp_path / "dst").returncode == 0
