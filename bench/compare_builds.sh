#!/usr/bin/env bash
# Outputs unchanged? Runs the same commands with two mx2nv builds on small
# generated checkpoints (every command, the over-span choices, the planned
# path, verify in parts, gate, compare, card) and compares every output file
# and stdout byte for byte, with times and the work folder's path masked.
#
#   bench/compare_builds.sh OLD_BUILD/mx2nv NEW_BUILD/mx2nv [WORK_DIR]
#
# Fingerprints, recorded SRC mtimes and the card's report hash are masked
# (they follow the files' identities and times, not the build).
# Prints each differing file and "N files, M differ"; exits 0 when none differ.
set -u
A=$(realpath "$1"); B=$(realpath "$2"); W=${3:-/tmp/mx2nv-compare-builds}
rm -rf "$W"; mkdir -p "$W"
for side in a b; do
  bin=$A; [[ $side == b ]] && bin=$B
  d=$W/$side; mkdir -p "$d"; cd "$d" || exit 4
  run() { "$bin" "$@" >> "$d/stdout.txt" 2>> "$d/stderr.txt"; echo "rc=$? $*" >> "$d/stdout.txt"; }
  run generate src --layers 3 --experts 4 --hidden 256 --intermediate 128 --shards 3 --seed 7
  run generate flat --layout flat --layers 2 --experts 4 --hidden 256 --intermediate 128 --shards 2 --seed 3
  run generate wide --layers 2 --experts 4 --hidden 256 --intermediate 128 --shards 2 --span 19 --seed 5
  run generate nan --layers 1 --experts 2 --hidden 128 --intermediate 64 --nan-scale language_model.model.layers.0.block_sparse_moe.experts.0.w1
  run convert --threads 1 src dst --report conv.json --html conv.html
  run verify --threads 1 src dst --report ver.json --html ver.html
  run convert --threads 1 flat fdst --report fconv.json
  run verify --threads 1 flat fdst --report fver.json
  run inspect --threads 1 wide --json
  run inspect --threads 1 src --html insp.html
  run convert --threads 1 wide wref --report wref.json
  run convert --threads 1 wide wbf --overspan bf16 --report wbf.json
  run convert --threads 1 wide wrq --overspan requantize --report wrq.json --html wrq.html
  run verify --threads 1 wide wrq --report wrqv.json
  run convert --threads 1 nan ndst --report nconv.json
  run plan --threads 1 src pdst --report plan.json
  run convert --plan pdst/.mx2nv/plan.json --shards 0/2 --report s0.json
  run convert --plan pdst/.mx2nv/plan.json --shards 1/2 --report s1.json
  run convert --plan pdst/.mx2nv/plan.json --finalize --report fin.json
  run verify --threads 1 src pdst --shards 0/2 --report v0.json
  run verify --threads 1 src pdst --shards 1/2 --report v1.json
  run verify --merge v0.json v1.json --report merged.json
  run requantize --threads 1 src rq --report rq.json
  run gate dst --ask-runtimes never --json
  run gate dst --ask-runtimes never
  run gate fdst --ask-runtimes never --python x
  run convert src dst
  run verify --merge v0.json v0.json
  run compare --threads 1 src dst --json --html cmp.html
  run compare --threads 1 wide wrq --report cmprq.json
  run verify --threads 1 src dst --report card-verify.json
  run card src dst --verify-report card-verify.json
done
cd "$W" || exit 4
python3 - "$W" <<'PY'
import os,re,sys
W=sys.argv[1]
def norm(b):
    t=b.decode('utf-8','replace')
    t=re.sub(r'"seconds": ?[0-9.e+-]+','"seconds":X',t)
    t=re.sub(r'[0-9]+\.[0-9]+ s\b','X s',t)
    t=re.sub(r'"(started|finished|time|date|created)[a-z_]*": ?"[^"]*"','"T":X',t)
    t=re.sub(r'seconds</[a-z]+><[a-z]+>[^<]*','seconds X',t)
    t=t.replace(W+'/a',W+'/X').replace(W+'/b',W+'/X')
    # what depends on the files' identities and times, not on the build:
    # fingerprints (mtime, ctime, inode), SRC mtimes DST records, and the
    # card's hash of a report that holds a fingerprint
    t=re.sub(r'xxh3-128:[0-9a-f]{32}','xxh3-128:X',t)
    t=re.sub(r'"source_mtime_ns": ?[0-9]+','"source_mtime_ns":X',t)
    t=re.sub(r'"report_sha256": ?"[0-9a-f]{64}"','"report_sha256":X',t)
    return t
diff=0; n=0
for root,ds,fs in os.walk(W+'/a'):
    for f in fs:
        pa=os.path.join(root,f); pb=pa.replace(W+'/a',W+'/b',1); n+=1
        if not os.path.exists(pb): print('missing in b',pb); diff+=1; continue
        a=open(pa,'rb').read(); b=open(pb,'rb').read()
        if a!=b and norm(a)!=norm(b): print('DIFF',pa[len(W)+3:]); diff+=1
for root,ds,fs in os.walk(W+'/b'):
    for f in fs:
        if not os.path.exists(os.path.join(root,f).replace(W+'/b',W+'/a',1)): print('missing in a',f); diff+=1
print(n,'files,',diff,'differ')
sys.exit(1 if diff else 0)
PY
