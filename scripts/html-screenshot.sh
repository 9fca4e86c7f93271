#!/usr/bin/env bash
# Regenerates docs/html-report.png, the README's picture of the HTML report:
# a small K3-shaped checkpoint with one module beyond every window (refused)
# and one beyond Marlin's (constrained), inspected under --window e4m3 with
# --html, photographed by Debian's headless Chromium. Needs build/mx2nv.
set -euo pipefail
cd "$(dirname "$0")/.."
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
module=language_model.model.layers
build/mx2nv generate "$work/model-mxfp4" --layers 6 --experts 24 --hidden 256 --intermediate 128 --shards 2 \
  --set-span "$module.2.block_sparse_moe.experts.5.w1=20" \
  --set-span "$module.4.block_sparse_moe.experts.17.w2=16" >/dev/null
# Exits 1: one module is refused, which is what the picture shows.
(cd "$work" && "$OLDPWD/build/mx2nv" inspect model-mxfp4 --window e4m3 --html report.html >/dev/null) || true
browser=$(command -v chromium-headless-shell || command -v chromium)
"$browser" --headless --no-sandbox --disable-gpu --hide-scrollbars --window-size=960,1000 \
  --screenshot="$work/shot.png" "file://$work/report.html" 2>/dev/null
mkdir -p docs
cp "$work/shot.png" docs/html-report.png
echo "wrote docs/html-report.png ($(stat -c %s docs/html-report.png) bytes)"
