"""What only the ModelOpt writer (convert --format modelopt) refuses: a
tensor that already bears a name the layout gives a module, and an
unquantized module no exclude entry can name without also naming the routed
experts (a wildcard in its name, or a name that is part of an expert layer's).
Then hostile ModelOpt DSTs for verify and gate. (Every case of cases.json is
replayed against the ModelOpt writer too, in test_corpus.py.)"""

from __future__ import annotations

import json
import shutil

import pytest

from test_corpus import INDEX, MODULE, base, rename_tensor, run, shard_of  # noqa: F401


def other_tensor(ck) -> str:
    """A pass-through tensor in the shard of MODULE's scale."""
    header = json.loads((shard_of(ck, MODULE + ".weight_scale").read_bytes()[8:]).split(b"}}", 1)[0] + b"}}")
    return next(k for k in header if k != "__metadata__" and ".experts." not in k)


@pytest.mark.parametrize("new_name, message", [
    (MODULE + ".weight", "exists beside a quantized module"),
    ("language_model.model.layers.0.self_attn.o*_proj.weight", "pattern character"),
    ("x|experts.weight", "pattern character"),  # SGLang would read it as a regular expression matching "experts"
    ("language_model.model.layers.0.(mlp).weight", "pattern character"),
    ("experts.weight", "would match its exclude entry"),
    ("language_model.model.layers.0.block_sparse_moe.experts_bias.weight", "would match its exclude entry"),
])
def test_what_only_the_modelopt_layout_cannot_hold(base, tmp_path, new_name, message):
    ck = tmp_path / "src"
    shutil.copytree(base, ck, symlinks=True)
    rename_tensor(ck, other_tensor(ck), new_name)
    r = run("convert", "--format", "modelopt", ck, tmp_path / "mo")
    assert r.returncode == 3, r.stdout + r.stderr
    assert message in r.stderr, r.stderr
    assert not (tmp_path / "mo").exists()
    # The default layout names them as they are.
    assert run("convert", ck, tmp_path / "ct").returncode == 0


def test_a_second_level_scale_beside_a_module_is_refused_in_both_layouts(base, tmp_path):
    ck = tmp_path / "src"
    shutil.copytree(base, ck, symlinks=True)
    rename_tensor(ck, other_tensor(ck), MODULE + ".weight_scale_2")
    for options in ([], ["--format", "modelopt"]):
        r = run("convert", *options, ck, tmp_path / "dst")
        assert r.returncode == 3, r.stdout + r.stderr
        assert "already has" in r.stderr


def test_an_unknown_format_is_a_usage_error(base, tmp_path):
    r = run("convert", "--format", "modelop", base, tmp_path / "dst")
    assert r.returncode == 2
    assert "modelopt" in r.stderr
    assert not (tmp_path / "dst").exists()


@pytest.fixture
def modelopt_dst(base, tmp_path):
    dst = tmp_path / "mo"
    assert run("convert", "--format", "modelopt", base, dst).returncode == 0
    return dst


def edit_config(dst, fn) -> None:
    config = json.loads((dst / "config.json").read_text())
    for holder in (config, config["text_config"]):
        fn(holder["quantization_config"])
    (dst / "config.json").write_text(json.dumps(config, indent=2))


@pytest.mark.parametrize("edit, difference", [
    (lambda qc: qc.__setitem__("quant_algo", "NVFP4"), "quant_algo"),
    (lambda qc: qc.__setitem__("quantization", {"quant_algo": "W4A16_NVFP4"}), "quantization"),
    (lambda qc: qc["ignore"].append(MODULE), "ignore"),
    (lambda qc: qc.__setitem__("group_size", 32), "group_size"),
    (lambda qc: qc["config_groups"]["group_0"].__setitem__("input_activations", {"num_bits": 4}), "input_activations"),
    (lambda qc: qc.__setitem__("quantization", None), "quantization"),  # vLLM: "Expected 'quantization' to be a dictionary"
    (lambda qc: qc.__setitem__("producer", "modelopt"), "producer"),  # vLLM calls .get on it
    (lambda qc: qc.__setitem__("weight_scale_encoding", "csf"), "weight_scale_encoding"),
    (lambda qc: qc.__setitem__("group_size", 16.0), "group_size"),  # SGLang sizes tensors with hidden // group_size
    (lambda qc: qc["config_groups"]["group_0"]["weights"].__setitem__("strategy", "group"), "strategy"),
])
def test_verify_names_what_is_wrong_with_a_modelopt_config(base, modelopt_dst, edit, difference):
    edit_config(modelopt_dst, edit)
    r = run("verify", base, modelopt_dst)
    assert r.returncode == 1, r.stdout + r.stderr
    assert difference in r.stderr, r.stderr


def test_gate_blocks_an_exclude_list_that_reaches_the_experts(modelopt_dst):
    assert "*experts*" not in run("gate", modelopt_dst, "--runtime", "all", "--dtype", "bf16").stdout
    edit_config(modelopt_dst, lambda qc: qc["ignore"].append("*experts*"))
    for runtime in ("vllm", "sglang"):
        r = run("gate", modelopt_dst, "--runtime", runtime, "--dtype", "bf16")
        assert r.returncode == 1, r.stdout + r.stderr
        assert "BLOCKED" in r.stdout and "*experts*" in r.stdout, r.stdout


@pytest.mark.parametrize("edit", [
    lambda qc: qc.__setitem__("ignore", None),          # vLLM: "exclude_modules must be a list"
    lambda qc: qc.__setitem__("ignore", "0"),           # a string, not a list of names
    lambda qc: qc["ignore"].append({"a": 1}),           # not a name
    lambda qc: qc.__setitem__("group_size", 16.0),
    lambda qc: (qc.pop("group_size"), qc["config_groups"]["group_0"]["weights"].__setitem__("group_size", 32)),
    lambda qc: qc.__setitem__("producer", "modelopt"),
    lambda qc: qc.__setitem__("weight_scale_encoding", "csf"),
], ids=["ignore-null", "ignore-string", "ignore-non-name", "group-size-float", "group-size-in-group",
        "producer-string", "weight-scale-encoding"])
def test_gate_blocks_a_config_the_runtimes_refuse_or_misread(modelopt_dst, edit):
    edit_config(modelopt_dst, edit)
    for runtime in ("vllm", "sglang"):
        r = run("gate", modelopt_dst, "--runtime", runtime, "--dtype", "bf16", "--ask-runtimes", "never")
        assert r.returncode == 1 and "scheme:" in r.stdout, r.stdout + r.stderr


def test_a_global_whose_reciprocal_is_no_normal_float_is_refused(tmp_path):
    """e4m3 takes any normal FP32 global; ModelOpt stores its reciprocal, which for 2^127 is subnormal."""
    src = tmp_path / "src"
    assert run("generate", src, "--layout", "flat", "--layers", "1", "--experts", "2", "--shards", "1",
               "--k-max", "-127", "--span", "3").returncode == 0
    r = run("convert", src, tmp_path / "mo", "--format", "modelopt", "--window", "e4m3")
    assert r.returncode == 1 and "weight_scale_2" in r.stdout, r.stdout + r.stderr
    assert not (tmp_path / "mo").exists()
    assert run("convert", src, tmp_path / "ct", "--window", "e4m3").returncode == 0


def test_a_requantized_multiplier_that_would_be_subnormal_is_refused(tmp_path):
    """ModelOpt's weight_scale_2 = amax / 2688 is subnormal for an amax below about 2^-114.6: runtimes flush
    it, so neither the lossy companion nor --overspan requantize writes it in the ModelOpt layout."""
    src = tmp_path / "src"
    assert run("generate", src, "--layout", "flat", "--layers", "1", "--experts", "2", "--shards", "1",
               "--k-max", "-127", "--span", "3").returncode == 0
    r = run("requantize", "--format", "modelopt", src, tmp_path / "rq")
    assert r.returncode == 3 and "weight_scale_2" in r.stderr, r.stdout + r.stderr
    assert not (tmp_path / "rq").exists()
    r = run("convert", "--format", "modelopt", "--window", "e4m3", "--overspan", "requantize", src, tmp_path / "mo")
    assert r.returncode == 1 and "no normal float" in r.stdout, r.stdout + r.stderr
    assert not (tmp_path / "mo").exists()
    assert run("requantize", src, tmp_path / "ct").returncode == 0  # compressed-tensors' recipe has its own floor

