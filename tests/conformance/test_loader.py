"""Oracle 5: walk the output the way transformers / vLLM's default loader
does (index -> weight_map -> shards): every tensor a K3 model expects is
reachable exactly once, nothing is orphaned, total_size is right."""

import json

import pytest

from checkpoints import INDEX, SUFFIX_GLOBAL, SUFFIX_PACKED, SUFFIX_SCALE, open_checkpoint, traverse
from conftest import ALL_CASES


@pytest.mark.parametrize("case", ALL_CASES)
def test_every_tensor_reachable_exactly_once(outputs, case):
    src, dst = outputs[case]
    walk = traverse(dst)
    assert walk["duplicates"] == []
    assert walk["unindexed"] == []
    assert walk["missing"] == []
    if walk["declared_total_size"] is not None:
        assert walk["declared_total_size"] == walk["total_bytes"]
    source = open_checkpoint(src)
    for name in source.weight_map:
        assert name in walk["tensors"], name
    for m in source.modules():
        for suffix in (SUFFIX_PACKED, SUFFIX_SCALE, SUFFIX_GLOBAL):
            assert m + suffix in walk["tensors"]
        # The global lives beside its scale.
        assert walk["tensors"][m + SUFFIX_GLOBAL] == walk["tensors"][m + SUFFIX_SCALE]


def test_k3_expert_names_as_a_k3_model_expects(outputs):
    _, dst = outputs["k3"]
    walk = traverse(dst)
    for layer in range(2):
        for expert in range(4):
            for proj in ("w1", "w2", "w3"):
                base = f"language_model.model.layers.{layer}.block_sparse_moe.experts.{expert}.{proj}"
                for suffix in (SUFFIX_PACKED, SUFFIX_SCALE, SUFFIX_GLOBAL):
                    assert base + suffix in walk["tensors"]
    assert "language_model.lm_head.weight" in walk["tensors"]


def test_traversal_fails_on_a_broken_index(outputs, broken_copy):
    _, dst = broken_copy("k3")
    index = json.loads((dst / INDEX).read_text())
    dropped = next(iter(index["weight_map"]))
    del index["weight_map"][dropped]
    index["weight_map"]["ghost.weight"] = next(iter(index["weight_map"].values()))
    index["metadata"]["total_size"] += 1
    (dst / INDEX).write_text(json.dumps(index))
    walk = traverse(dst)
    assert dropped in walk["unindexed"]
    assert walk["missing"] == ["ghost.weight"]
    assert walk["declared_total_size"] != walk["total_bytes"]
