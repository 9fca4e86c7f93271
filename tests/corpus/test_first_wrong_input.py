"""The first wrong input a new user gives gets plain words, the path concerned
(shell-quoted, as they would type it) and the command to run next, with the
documented exit code (2 usage, 3 invalid input; 4 where the system refuses
to create DST), for every command that takes a
checkpoint: convert, inspect, plan, requantize, verify, compare, card, gate.

Every case is a class of inputs, written here from scratch: an NVFP4 checkpoint
(mx2nv's own output, and a ModelOpt export with and without its config in
config.json), gpt-oss's `quant_method: mxfp4` layout (single file and sharded,
its config and tensor names as transformers' integrations/mxfp4.py and the
gpt-oss checkpoints have them), an unquantized BF16 checkpoint (flat and with
K3's nested text_config), MXFP4 where NVFP4 is expected, files for folders and
folders for files, missing paths, and a conversion killed part way or planned
and not finished. Paths hold a space and a quote, so the commands the messages
suggest must quote them to run."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import time
from pathlib import Path

import pytest

HERE = Path(__file__).parent
REPO = HERE.parents[1]
MX2NV = Path(os.environ.get("MX2NV", REPO / "build" / "mx2nv")).absolute()

USAGE, INVALID, IO = 2, 3, 4
SOURCE_COMMANDS = ["convert", "inspect", "plan", "requantize", "verify", "compare", "card"]
CONVERTING = ["convert", "inspect", "plan", "requantize"]  # read SRC to write (or plan) its NVFP4 form
TARGET_COMMANDS = ["verify", "compare", "card", "gate"]     # read a converted checkpoint


def run(*args, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([str(MX2NV), *map(str, args)], capture_output=True, text=True, cwd=cwd, timeout=300)


def argv(command: str, src: Path, dst: Path, report: Path) -> list:
    """The command line of `command` with SRC (gate: its CHECKPOINT) and DST/OTHER."""
    if command == "inspect":
        return ["inspect", src]
    if command == "gate":
        return ["gate", src, "--ask-runtimes", "never"]
    if command == "card":
        return ["card", src, dst, "--verify-report", report]
    return [command, src, dst]


def check(r: subprocess.CompletedProcess, code: int, path: Path, *fragments: str) -> str:
    """Exit code, no internal error, the path shell-quoted, a runnable command in
    backquotes, and the fragments; returns the message."""
    message = r.stderr
    assert r.returncode == code, (r.returncode, message, r.stdout)
    assert "internal error" not in message, message
    assert quoted(path) in message, (quoted(path), message)
    assert "`" in message, message  # a command to run next
    for f in fragments:
        assert f in message, (f, message)
    return message


def quoted(path: Path) -> str:
    """The path as one shell word, the way mx2nv quotes it (a quote inside
    single quotes is written '\\''); the commands are checked by shlex below."""
    text = str(path)
    if shlex.quote(text) == text:
        return text
    return "'" + text.replace("'", "'\\''") + "'"


def suggested(message: str) -> list[list[str]]:
    """The commands a message suggests, split as a POSIX shell splits them."""
    parts = message.split("`")
    return [shlex.split(parts[i]) for i in range(1, len(parts), 2)]


# --- fixtures written from scratch -------------------------------------------

def save(path: Path, tensors: dict) -> None:
    from safetensors.torch import save_file

    save_file(tensors, str(path))


def write_json(path: Path, value: dict) -> None:
    path.write_text(json.dumps(value, indent=2))


def write_sharded(root: Path, shards: list[dict]) -> None:
    weight_map = {}
    n = len(shards)
    for i, tensors in enumerate(shards):
        name = f"model-{i + 1:05d}-of-{n:05d}.safetensors"
        save(root / name, tensors)
        weight_map.update({t: name for t in tensors})
    write_json(root / "model.safetensors.index.json", {"metadata": {}, "weight_map": weight_map})


def gpt_oss(root: Path, sharded: bool, quant_config: bool = True) -> Path:
    """gpt-oss's layout: per layer, the experts stacked in 3-D tensors
    `experts.gate_up_proj_blocks` [E, 2I, H/32, 16] and `_scales` [E, 2I, H/32]
    (U8), `down_proj_*` likewise, BF16 biases; config quant_method "mxfp4"."""
    import torch

    root.mkdir(parents=True)
    experts, hidden, inter = 4, 64, 64
    layers = []
    for layer in range(2):
        p = f"model.layers.{layer}.mlp."
        layers.append({
            p + "experts.gate_up_proj_blocks": torch.randint(0, 255, (experts, 2 * inter, hidden // 32, 16), dtype=torch.uint8),
            p + "experts.gate_up_proj_scales": torch.full((experts, 2 * inter, hidden // 32), 127, dtype=torch.uint8),
            p + "experts.gate_up_proj_bias": torch.zeros(experts, 2 * inter, dtype=torch.bfloat16),
            p + "experts.down_proj_blocks": torch.randint(0, 255, (experts, hidden, inter // 32, 16), dtype=torch.uint8),
            p + "experts.down_proj_scales": torch.full((experts, hidden, inter // 32), 127, dtype=torch.uint8),
            p + "experts.down_proj_bias": torch.zeros(experts, hidden, dtype=torch.bfloat16),
            p + "router.weight": torch.zeros(experts, hidden, dtype=torch.bfloat16),
            p + "router.bias": torch.zeros(experts, dtype=torch.bfloat16),
        })
    layers[0]["model.embed_tokens.weight"] = torch.zeros(32, hidden, dtype=torch.bfloat16)
    if sharded:
        write_sharded(root, layers)
    else:
        save(root / "model.safetensors", {k: v for shard in layers for k, v in shard.items()})
    config = {
        "architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss", "hidden_size": hidden,
        "intermediate_size": inter, "num_hidden_layers": 2, "num_local_experts": experts,
        "num_experts_per_tok": 2, "experts_per_token": 2,
        "quantization_config": {
            "modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router",
                                       "model.embed_tokens", "lm_head"],
            "quant_method": "mxfp4"}}
    if not quant_config:  # the blocks alone say what it is
        del config["quantization_config"]
    write_json(root / "config.json", config)
    return root


def unquantized(root: Path, nested: bool) -> Path:
    """A BF16 MoE checkpoint: per-expert projections, no quantization_config."""
    import torch

    root.mkdir(parents=True)
    tensors = {f"model.layers.0.mlp.experts.{e}.{proj}.weight": torch.ones(64, 64, dtype=torch.bfloat16)
               for e in range(2) for proj in ("gate_proj", "up_proj", "down_proj")}
    write_sharded(root, [dict(list(tensors.items())[:3]), dict(list(tensors.items())[3:])])
    text = {"model_type": "deepseek_v3", "hidden_size": 64, "n_routed_experts": 2, "torch_dtype": "bfloat16"}
    write_json(root / "config.json", {"model_type": "kimi_k3", "text_config": text} if nested else text)
    return root


def modelopt(root: Path, in_config: bool) -> Path:
    """ModelOpt's NVFP4 export: U8 `weight`, F8_E4M3 `weight_scale` per 16,
    F32 scalar `weight_scale_2`; hf_quant_config.json, and the converted
    quantization_config in config.json when `in_config`."""
    import torch

    root.mkdir(parents=True)
    tensors = {}
    for e in range(2):
        for proj in ("gate_proj", "up_proj", "down_proj"):
            p = f"model.layers.0.mlp.experts.{e}.{proj}."
            tensors[p + "weight"] = torch.zeros(64, 32, dtype=torch.uint8)
            tensors[p + "weight_scale"] = torch.ones(64, 4, dtype=torch.float32).to(torch.float8_e4m3fn)
            tensors[p + "weight_scale_2"] = torch.tensor(1.0, dtype=torch.float32)
    save(root / "model.safetensors", tensors)
    quant = {"quant_algo": "NVFP4", "kv_cache_quant_algo": None, "group_size": 16, "exclude_modules": ["lm_head"]}
    write_json(root / "hf_quant_config.json", {"producer": {"name": "modelopt", "version": "0.45.0"},
                                               "quantization": quant})
    config = {"model_type": "deepseek_v3", "hidden_size": 64}
    if in_config:
        config["quantization_config"] = {"quant_method": "modelopt", **quant}
    write_json(root / "config.json", config)
    return root


@pytest.fixture(scope="session")
def place(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("first") / "my models" / "it's here"


@pytest.fixture(scope="session")
def mxfp4(place) -> Path:
    src = place / "k3 mxfp4"
    r = run("generate", src, "--layout", "k3", "--shards", "2", "--layers", "1", "--experts", "2",
            "--hidden", "64", "--intermediate", "64")
    assert r.returncode == 0, r.stderr
    return src


@pytest.fixture(scope="session")
def nvfp4(place, mxfp4) -> Path:
    dst = place / "k3 nvfp4"
    r = run("convert", mxfp4, dst)
    assert r.returncode == 0, r.stderr
    return dst


@pytest.fixture(scope="session")
def report(place) -> Path:
    """Any file: the checks of SRC and DST come before the report is read."""
    path = place / "verify report.json"
    path.write_text("{}")
    return path


@pytest.fixture(scope="session")
def wrong(place, nvfp4) -> dict[str, Path]:
    return {
        "nvfp4 compressed-tensors": nvfp4,
        "nvfp4 modelopt": modelopt(place / "modelopt nvfp4", in_config=True),
        "nvfp4 modelopt hf_quant_config only": modelopt(place / "modelopt bare", in_config=False),
        "gpt-oss": gpt_oss(place / "gpt-oss", sharded=False),
        "gpt-oss sharded": gpt_oss(place / "gpt-oss sharded", sharded=True),
        "gpt-oss without its quantization_config": gpt_oss(place / "gpt-oss bare", sharded=False, quant_config=False),
        "unquantized": unquantized(place / "bf16", nested=False),
        "unquantized nested": unquantized(place / "bf16 nested", nested=True),
    }


# --- SRC of the wrong kind ---------------------------------------------------

NVFP4_KINDS = ["nvfp4 compressed-tensors", "nvfp4 modelopt", "nvfp4 modelopt hf_quant_config only"]


@pytest.mark.parametrize("kind", NVFP4_KINDS)
@pytest.mark.parametrize("command", SOURCE_COMMANDS)
def test_an_nvfp4_source_is_already_nvfp4(command, kind, wrong, nvfp4, place, report) -> None:
    src = wrong[kind]
    dst = place / "out" / f"{command} {kind}"
    dst.parent.mkdir(exist_ok=True)
    message = check(run(*argv(command, src, nvfp4 if command in TARGET_COMMANDS else dst, report)), INVALID, src,
                    "already NVFP4", "nothing to convert")
    assert ["mx2nv", "gate", str(src)] in suggested(message)
    assert not dst.exists()


@pytest.mark.parametrize("command", ["verify", "compare", "card"])
def test_swapped_source_and_target_are_named(command, mxfp4, nvfp4, report) -> None:
    message = check(run(*argv(command, nvfp4, mxfp4, report)), INVALID, nvfp4, "swapped")
    swapped = [command, str(mxfp4), str(nvfp4)]
    assert any(c[1:4] == swapped for c in suggested(message)), message


@pytest.mark.parametrize("kind", ["gpt-oss", "gpt-oss sharded", "gpt-oss without its quantization_config"])
@pytest.mark.parametrize("command", SOURCE_COMMANDS + ["gate"])
def test_gpt_oss_mxfp4_is_not_supported_and_says_why(command, kind, wrong, nvfp4, place, report) -> None:
    src = wrong[kind]
    dst = place / "out" / f"{command} {kind}"
    dst.parent.mkdir(exist_ok=True)
    message = check(run(*argv(command, src, nvfp4 if command in TARGET_COMMANDS else dst, report)), INVALID, src,
                    "gpt-oss", "does not support", "gate_up_proj_blocks", "mxfp4-pack-quantized",
                    "quant_method \"mxfp4\"" if "without" not in kind else "no quantization_config")
    assert not dst.exists()
    assert "Traceback" not in message


@pytest.mark.parametrize("kind", ["unquantized", "unquantized nested"])
@pytest.mark.parametrize("command", SOURCE_COMMANDS + ["gate"])
def test_an_unquantized_checkpoint_is_named_as_such(command, kind, wrong, nvfp4, place, report) -> None:
    src = wrong[kind]
    dst = place / "out" / f"{command} {kind}"
    dst.parent.mkdir(exist_ok=True)
    check(run(*argv(command, src, nvfp4 if command in TARGET_COMMANDS else dst, report)), INVALID, src,
          "is not quantized", "no quantization_config")
    assert not dst.exists()


def test_an_mxfp4_checkpoint_given_to_gate_is_sent_to_convert(mxfp4) -> None:
    message = check(run("gate", mxfp4, "--ask-runtimes", "never"), INVALID, mxfp4,
                    "this is MXFP4", "convert it first")
    commands = suggested(message)
    assert commands[0][:3] == ["mx2nv", "convert", str(mxfp4)] and len(commands[0]) == 4, commands
    assert commands[1] == ["mx2nv", "gate", commands[0][3]], commands


@pytest.mark.parametrize("command", ["verify", "compare", "card"])
def test_an_mxfp4_target_is_refused_in_plain_words(command, mxfp4, place, report) -> None:
    copy = place / "another mxfp4"
    if not copy.exists():
        assert run("generate", copy, "--layout", "k3", "--shards", "2", "--layers", "1", "--experts", "2",
                   "--hidden", "64", "--intermediate", "64").returncode == 0
    check(run(*argv(command, mxfp4, copy, report)), INVALID, copy, "is MXFP4", "not NVFP4")


# --- files for folders, folders for files, missing paths ---------------------

@pytest.mark.parametrize("command", SOURCE_COMMANDS + ["gate"])
def test_a_file_given_as_src(command, mxfp4, nvfp4, place, report) -> None:
    file = mxfp4 / "config.json"
    dst = place / "out" / f"{command} from a file"
    dst.parent.mkdir(exist_ok=True)
    message = check(run(*argv(command, file, nvfp4 if command in TARGET_COMMANDS else dst, report)), USAGE, file,
                    "is a file, not a folder")
    # The folder that holds it is the checkpoint: the suggested command names it.
    assert any(str(mxfp4) in c for c in suggested(message)), message
    assert not dst.exists()


@pytest.mark.parametrize("command", ["verify", "compare", "card"])
def test_a_file_given_as_dst(command, mxfp4, nvfp4, report) -> None:
    file = nvfp4 / "config.json"
    check(run(*argv(command, mxfp4, file, report)), USAGE, file, "is a file, not a folder")


@pytest.mark.parametrize("command", ["convert", "plan", "requantize"])
def test_a_file_given_as_new_dst(command, mxfp4, report) -> None:
    check(run(*argv(command, mxfp4, report, report)), USAGE, report, "is a file, not a folder")
    assert report.read_text() == "{}"


@pytest.mark.parametrize("command", SOURCE_COMMANDS + ["gate"])
def test_a_missing_src(command, nvfp4, place, report) -> None:
    src = place / "no such" / "checkpoint"
    dst = place / "out" / f"{command} from nothing"
    dst.parent.mkdir(exist_ok=True)
    message = check(run(*argv(command, src, nvfp4 if command in TARGET_COMMANDS else dst, report)), USAGE, src,
                    "does not exist")
    # The next step lists the nearest folder that exists.
    assert ["ls", str(place)] in suggested(message), message


@pytest.mark.parametrize("command", ["verify", "compare"])  # card: its report's rules speak first
def test_a_missing_dst(command, mxfp4, place, report) -> None:
    dst = place / "not converted yet"
    check(run(*argv(command, mxfp4, dst, report)), USAGE, dst, "does not exist")


@pytest.mark.parametrize("command", ["convert", "plan", "requantize"])
def test_a_missing_parent_of_dst(command, mxfp4, place, report) -> None:
    parent = place / "no such folder"
    dst = parent / "nvfp4"
    # Exit 4: creating DST is what the system refuses (tests/e2e/safety_test.cpp).
    message = check(run(*argv(command, mxfp4, dst, report)), IO, dst, "does not exist")
    assert ["mkdir", "-p", str(parent)] in suggested(message), message
    assert not parent.exists()


@pytest.mark.parametrize("option", ["--verify-report", "--requantize-report", "--gpu-check"])
def test_card_input_files_missing_or_folders(option, mxfp4, nvfp4, place, report) -> None:
    missing = place / "no such report.json"
    evidence = [] if option != "--gpu-check" else ["--verify-report", report]
    check(run("card", mxfp4, nvfp4, option, missing, *evidence), USAGE, missing, "does not exist")
    check(run("card", mxfp4, nvfp4, option, place, *evidence), USAGE, place, "is a folder", "takes a file")


def test_plan_option_given_a_folder_points_at_the_plan(mxfp4, place) -> None:
    dst = place / "planned for --plan"
    assert run("plan", mxfp4, dst).returncode == 0
    plan = dst / ".mx2nv" / "plan.json"
    message = check(run("convert", "--plan", dst, "--shards", "0/1"), USAGE, dst, "is a folder")
    assert quoted(plan) in message
    other = place / "an empty folder"
    other.mkdir(exist_ok=True)
    check(run("convert", "--plan", other, "--finalize"), USAGE, other, "is a folder", "takes a file")


@pytest.mark.parametrize("command,option", [("convert", "--report"), ("plan", "--report"), ("verify", "--report"),
                                            ("requantize", "--report"), ("compare", "--report"),
                                            ("verify", "--html"), ("plan", "--plan-out")])
def test_a_folder_given_for_an_output_file(command, option, mxfp4, nvfp4, place) -> None:
    folder = place / "reports here"
    folder.mkdir(exist_ok=True)
    target = nvfp4 if command in TARGET_COMMANDS else place / "out" / f"{command} {option}"
    r = run(command, mxfp4, target, option, folder)
    assert r.returncode == USAGE, r.stderr
    assert "is a directory" in r.stderr and "takes a file" in r.stderr and "internal error" not in r.stderr


# --- conversions not finished ------------------------------------------------

@pytest.fixture(scope="session")
def killed(place) -> tuple[Path, Path]:
    """A DST whose convert was killed (SIGKILL) once it had started writing."""
    src = place / "bigger mxfp4"
    assert run("generate", src, "--layers", "4", "--experts", "8", "--hidden", "1024", "--intermediate", "512",
               "--shards", "8").returncode == 0
    for attempt in range(5):
        dst = place / f"killed {attempt}"
        p = subprocess.Popen([str(MX2NV), "convert", "--threads", "1", str(src), str(dst)],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 60
        while not (dst / ".mx2nv").exists() and p.poll() is None and time.monotonic() < deadline:
            time.sleep(0.001)
        p.send_signal(signal.SIGKILL)
        p.wait()
        if not (dst / "model.safetensors.index.json").exists():
            return src, dst
    pytest.fail("every convert finished before it could be killed")


def make_planned(mxfp4: Path, dst: Path) -> Path:
    """A planned conversion with one of its two shards converted."""
    assert run("plan", mxfp4, dst).returncode == 0
    r = run("convert", "--plan", dst / ".mx2nv" / "plan.json", "--shard", "0")
    assert r.returncode == 0, r.stderr
    return dst


@pytest.fixture(scope="session")
def planned(place, mxfp4) -> Path:
    return make_planned(mxfp4, place / "planned")


@pytest.mark.parametrize("command", TARGET_COMMANDS)
def test_an_interrupted_convert_says_resume_with_the_real_paths(command, killed, report) -> None:
    src, dst = killed
    args = argv(command, dst if command == "gate" else src, dst, report)
    message = check(run(*args), INVALID, dst, "unfinished conversion", "--resume")
    resume = [c for c in suggested(message) if c[:2] == ["mx2nv", "convert"]]
    assert resume, message
    if command == "gate":  # gate is given no SRC: the placeholder says which
        assert resume[0] == ["mx2nv", "convert", "SRC", str(dst), "--resume"], resume
    else:
        assert resume[0] == ["mx2nv", "convert", str(src), str(dst), "--resume"], resume


def test_the_resume_a_message_suggests_finishes_the_conversion(killed, place) -> None:
    src, dst = killed
    message = run("verify", src, dst).stderr
    command = suggested(message)[0]
    copy = place / "resumed copy"
    subprocess.run(["cp", "-a", str(dst), str(copy)], check=True)
    command = [str(MX2NV) if w == "mx2nv" else (str(copy) if w == str(dst) else w) for w in command]
    assert subprocess.run(command, capture_output=True).returncode == 0
    assert run("verify", src, copy).returncode == 0


@pytest.mark.parametrize("command", TARGET_COMMANDS)
def test_an_unfinished_planned_conversion_names_its_steps(command, planned, mxfp4, report) -> None:
    args = argv(command, planned if command == "gate" else mxfp4, planned, report)
    message = check(run(*args), INVALID, planned, "unfinished conversion")
    plan = str(planned / ".mx2nv" / "plan.json")
    commands = suggested(message)
    assert ["mx2nv", "convert", "--plan", plan, "--shards", "0/1"] in commands, commands
    assert ["mx2nv", "convert", "--plan", plan, "--finalize"] in commands, commands


def test_the_planned_steps_a_message_suggests_finish_the_conversion(mxfp4, place) -> None:
    planned = make_planned(mxfp4, place / "planned, then finished")
    message = run("verify", mxfp4, planned).stderr
    for command in suggested(message):
        assert run(*command[1:]).returncode == 0, command
    assert run("verify", mxfp4, planned).returncode == 0
