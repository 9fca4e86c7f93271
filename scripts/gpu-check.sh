#!/usr/bin/env bash
# On a machine with an NVIDIA GPU and vLLM 0.33.0 installed: convert a small
# K3-shaped MXFP4 checkpoint (with quiet experts) with mx2nv, load one MoE
# layer of the output through vLLM's real loader and NVFP4 MoE method, run it
# on every backend the GPU offers (auto-selected, Marlin forced, Humming on
# sm90) in fp16 and bf16, and print the max abs difference against the same
# layer computed in float32 from a dequantization of the MXFP4 source.
#
#   scripts/gpu-check.sh [PYTHON]     # PYTHON: an interpreter with vllm (default python3)
#
# Not part of test.sh or CI (no GPU there). README "How we know it is exact"
# records whether it has been run.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${1:-python3}
command -v nvidia-smi >/dev/null || { echo "gpu-check: no nvidia-smi: needs an NVIDIA GPU" >&2; exit 2; }
"$PY" -c "import vllm, sys; sys.exit(0 if vllm.__version__.startswith('0.33') else print('gpu-check: vllm', vllm.__version__, '(rules pinned to 0.33.0)'))" || true
[[ -x build/mx2nv ]] || MX2NV_SKIP_DEMO=1 scripts/setup.sh
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
quiet=language_model.model.layers.0.block_sparse_moe.experts.3.w2
build/mx2nv generate "$work/src" --layout k3 --layers 1 --experts 8 --hidden 1024 --intermediate 512 --shards 2 \
  --set-k-max "$quiet=-20" --set-span "$quiet=7" >/dev/null
build/mx2nv convert "$work/src" "$work/dst" >/dev/null
build/mx2nv gate "$work/dst" || true
"$PY" scripts/gpu_check.py "$work/src" "$work/dst"
