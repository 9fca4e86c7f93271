"""humming-kernels 0.1.19 (the version vLLM 0.34.0 pins), its own Python
imported from the released wheel (wheels.py) and run on the CPU.

The package's `__init__` loads its native launcher (a CUDA library), so the
package is entered through a shell module that only sets `__path__`; every
other module is the wheel's own file, imported as usual. Four modules and one
call are stubs, each unable to change a value:

  * `humming` (package shell): skips `__init__`, whose only effects are the
    version string and importing `humming.ops` / `humming.dtypes`.
  * `humming.device`: `current_device` and `DeviceInfo(...)` report sm90
    (H100/H200), the GPU on which vLLM 0.34.0 prefers Humming
    (vllm .../utils/humming/priority.py:11); not a PPU. They choose which of
    humming's code paths runs (LayerConfig flags), never a value.
  * `humming.ops`: `repack_weight` (a CUDA op) returns the codes in
    checkpoint order instead of the kernel's tile order; the kernel decode
    (humming_kernel.py) reads that order. A permutation of 4-bit codes moves
    values, it never changes one. The integer-weight helpers
    (`unpack_weight`, `pack_weight`, CUDA too) raise: FP4 weights never
    reach them (schema/humming.py:300-301 returns first).
  * `humming.utils.cubin.is_cubin_patch_enabled() -> False`: the patch only
    enables undocumented E3M4/E0M3 operands on sm100/sm120
    (config/mma.py:72-73), never on sm90.
  * `torch.cuda.device(None)` as schema/base.py sees it (:112, :299): a
    no-op context. On a GPU it keeps the current device for the conversion;
    CPU torch has no device to keep. Choosing a device never changes a value.

Nothing reached here touches `humming.jit`: the sm90 path returns before it
(config/config.py:140-146, :198).
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import sys
import types

import torch

from wheels import HUMMING, wheel_dir

SM90 = 90


class _Sm90:
    sm_version = SM90
    sm_major = 9
    is_ppu = False


def _not_for_fp4(*_args, **_kwargs):
    raise AssertionError("humming integer-weight helper reached with FP4 weights")


class _TorchWithoutDevices:
    """torch, except that selecting a CUDA device does nothing."""

    cuda = types.SimpleNamespace(device=lambda _device=None: contextlib.nullcontext())

    def __getattr__(self, name):
        return getattr(torch, name)


def _repack_in_checkpoint_order(inputs, *, is_weight_packed=True, **_kwargs):
    assert is_weight_packed
    return inputs.contiguous()


@functools.cache
def root():
    return wheel_dir(*HUMMING, suffixes=(".py", ".cuh"))


@functools.cache
def package() -> types.SimpleNamespace:
    """The wheel's modules the NVFP4 MoE path uses."""
    base = root() / "humming"
    shell = types.ModuleType("humming")
    shell.__path__ = [str(base)]
    sys.modules["humming"] = shell
    device = types.ModuleType("humming.device")
    device.current_device = _Sm90()
    device.DeviceInfo = lambda _device=None: _Sm90()
    sys.modules["humming.device"] = device
    ops = types.ModuleType("humming.ops")
    ops.repack_weight = _repack_in_checkpoint_order
    ops.unpack_weight = ops.pack_weight = _not_for_fp4
    sys.modules["humming.ops"] = ops
    shell.ops = ops
    cubin = types.ModuleType("humming.utils.cubin")
    cubin.is_cubin_patch_enabled = lambda: False
    sys.modules["humming.utils.cubin"] = cubin
    names = ["dtypes", "config", "config.enum", "schema", "schema.base", "schema.humming",
             "schema.compressed_tensors", "transform"]
    mods = {n: importlib.import_module(f"humming.{n}") for n in names}
    mods["schema.base"].torch = _TorchWithoutDevices()
    return types.SimpleNamespace(**{n.replace(".", "_"): m for n, m in mods.items()})


def source_line(rel: str, line: int) -> str:
    """One line of the wheel's own files (the kernel's .cuh included), for
    tests that check the facts the decode relies on are still there."""
    return (root() / "humming" / rel).read_text().splitlines()[line - 1]
