"""mx2nv against the copy limit and a naive transcoder, side by side in one run.

Generates (once) a K3-shaped MXFP4 checkpoint with the real expert shapes
(w1/w3 [3072, 3584], w2 [3584, 3072]) of about 1 GiB, as 4 shards and as a
single shard of the same data, then times, with a warm page cache and
several repetitions (min and median):

  cp -r --reflink=never SRC X      the physical limit: the same bytes copied
  mx2nv convert / verify / inspect  at --threads 1 and 2
  naive_transcoder.py              torch + safetensors, whole shards in RAM

and prints ratios, GB/s and each command's peak RSS (wait4's ru_maxrss).
Timings here are noisy: read ratios measured in the same run, not absolutes.

Zero-copy section (--fs-images, needs root and loop devices; skipped with a
message otherwise): the same 4-shard input on a loop-mounted XFS
(mkfs.xfs -m reflink=1), btrfs and, for comparison, ext4 image (no reflinks), timing `cp -r --reflink=never`,
`cp -r` (coreutils' default --reflink=auto), `mx2nv convert` (--copy auto and
--copy copy) and `mx2nv verify`, each followed by sync so every row is durable,
and the disk space each output really adds (df before/after).

usage: python bench/benchmark.py [--reps N] [--experts N] [--work DIR]
                                 [--fs-images xfs,btrfs,ext4] [--fs-images-only]

With --k3-structure it instead measures metadata at Kimi K3's real scale: a
generated checkpoint with K3's structure and tiny tensors (96 shards, 92
layers x 896 experts, ~496k tensors, a ~60 MB index), rows for cp -r,
convert, verify, inspect, plan, planned steps (--shards 0/8 and 0/1),
finalize, verify --shards and --merge, gate (and gate --quick), requantize,
and the page sizes of inspect --html and convert --html, with peak RSS, and
the same commands of another build (--baseline PATH) side by side for a
before/after in one run (a row the other build refuses is shown as failed).

With --cold it measures verify and compare (beside --baseline if given)
against `cat` of both trees when nothing is cached: the 4-shard input (pick
--experts so SRC and its conversion together exceed --cold-cap-mib) and its
conversion, each run from dropped caches inside a memory cgroup capped at
--cold-cap-mib MiB (384 by default), then the same rows warm (everything
cached, no cap). Needs root.

With --capped it measures peak RSS of inspect, convert and verify (one run
each, beside --baseline if given) on the largest inputs the metadata caps
allow: K3's layout with 1,505 experts per layer (the most modules the index
caps admit once converted), and bench/capped_inputs.py's long-names (the
index's name bytes at the cap) and full-shards (every shard at the per-header
tensor cap, the index's tensor count near its cap). Reported, never asserted.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MX2NV = Path(os.environ.get("MX2NV", REPO / "build" / "mx2nv"))
NAIVE = REPO / "bench" / "naive_transcoder.py"


def run_measured(cmd: list[str], ok: tuple[int, ...] = (0,)) -> tuple[float, int, float]:
    """Wall seconds, peak RSS (MiB) and CPU seconds (user + sys) of one command
    that exits with one of `ok`."""
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    err = proc.stderr.read().decode() if proc.stderr else ""
    if os.waitstatus_to_exitcode(status) not in ok:
        raise SystemExit(f"{' '.join(cmd)} failed: {err}")
    return wall, usage.ru_maxrss // 1024, usage.ru_utime + usage.ru_stime


def tree_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def warm(path: Path) -> None:
    for f in sorted(path.rglob("*")):
        if f.is_file():
            with open(f, "rb") as fh:
                while fh.read(1 << 24):
                    pass


def warm_tree(path: Path) -> None:
    warm(path)  # for functions whose own `warm` names a table


def cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown CPU"


def settle() -> None:
    # Flush the previous run's dirty pages so they are not charged to the next one.
    subprocess.run(["sync"], check=True)


def generate(work: Path, experts: int, only: tuple[str, ...] = ("4-shard", "1-shard", "4-adv")) -> dict[str, Path]:
    """4-shard and 1-shard copies of the same data; plus an adversarial 4-shard
    variant whose all-zero groups carry scales far outside the window, which
    forces the planner to read packed bytes to prove those groups are zero."""
    out = {}
    for name, shards, extreme in (("4-shard", 4, "off"), ("1-shard", 1, "off"), ("4-adv", 4, "on")):
        if name not in only:
            continue
        path = work / f"src-{name}-{experts}e-{extreme}"
        if not (path / "config.json").exists():
            shutil.rmtree(path, ignore_errors=True)
            subprocess.run([str(MX2NV), "generate", str(path), "--layout", "k3", "--layers", "1", "--experts",
                            str(experts), "--hidden", "3584", "--intermediate", "3072", "--shards", str(shards),
                            "--span", "10", "--seed", "2026", "--extreme-zero-scales", extreme],
                           check=True, stdout=subprocess.DEVNULL)
        out[name] = path
    return out


def bench(work: Path, reps: int, experts: int) -> None:
    sources = generate(work, experts)
    python = sys.executable
    rows = []
    for label, src in sources.items():
        size = tree_bytes(src)
        reference = work / "reference-out"
        shutil.rmtree(reference, ignore_errors=True)
        subprocess.run([str(MX2NV), "convert", str(src), str(reference)], check=True, stdout=subprocess.DEVNULL)
        commands = {
            "cp -r --reflink=never": lambda o: ["cp", "-r", "--reflink=never", str(src), str(o)],
            # mx2nv fsyncs every file before it reports success; cp does not.
            "cp -r + sync (durable)": lambda o: ["sh", "-c", f"cp -r --reflink=never '{src}' '{o}' && sync"],
            "mx2nv convert --threads 1": lambda o: [str(MX2NV), "convert", "--threads", "1", str(src), str(o)],
            "mx2nv convert --threads 2": lambda o: [str(MX2NV), "convert", "--threads", "2", str(src), str(o)],
            "mx2nv verify --threads 1": lambda o: [str(MX2NV), "verify", "--threads", "1", str(src), str(reference)],
            "mx2nv verify --threads 2": lambda o: [str(MX2NV), "verify", "--threads", "2", str(src), str(reference)],
            "mx2nv inspect": lambda o: [str(MX2NV), "inspect", str(src)],
            "naive torch transcoder": lambda o: [python, str(NAIVE), str(src), str(o)],
        }
        results: dict[str, list[tuple[float, int, float]]] = {k: [] for k in commands}
        for rep in range(reps):
            for name, make in commands.items():
                if name.startswith("naive") and rep >= max(1, reps // 3):
                    continue  # slow; fewer repetitions
                out = work / "out"
                shutil.rmtree(out, ignore_errors=True)
                settle()
                warm(src)
                if "verify" in name:
                    warm(reference)
                results[name].append(run_measured(make(out)))
        shutil.rmtree(work / "out", ignore_errors=True)
        for name, samples in results.items():
            walls = [w for w, _, _ in samples]
            cpu = min(c for _, _, c in samples)
            rows.append((label, name, min(walls), statistics.median(walls), max(r for _, r, _ in samples), size,
                         len(walls), cpu))
    report(rows)


def report(rows) -> None:
    print(f"\nmachine: {platform.machine()}, {os.cpu_count()} cores, {platform.platform()}")
    print("GB/s = source bytes / min wall time; CPU s = min user+sys seconds of the command")
    print(f"| input | command | min s | median s | GB/s | CPU s | peak RSS MiB | n |")
    print(f"|---|---|---:|---:|---:|---:|---:|---:|")
    for label, name, lo, med, rss, size, n, cpu in rows:
        print(f"| {label} | {name} | {lo:.3f} | {med:.3f} | {size / lo / 1e9:.2f} | {cpu:.2f} | {rss} | {n} |")
    print("\nratios (min wall times, same run):")
    for label in dict.fromkeys(r[0] for r in rows):
        t = {r[1]: r[2] for r in rows if r[0] == label}
        size = next(r[5] for r in rows if r[0] == label)
        cp = t["cp -r --reflink=never"]
        durable = t["cp -r + sync (durable)"]
        best_convert = min(t["mx2nv convert --threads 1"], t["mx2nv convert --threads 2"])
        best_verify = min(t["mx2nv verify --threads 1"], t["mx2nv verify --threads 2"])
        print(f"  {label}: convert/cp {best_convert / cp:.2f} (--threads 1: {t['mx2nv convert --threads 1'] / cp:.2f}, "
              f"--threads 2: {t['mx2nv convert --threads 2'] / cp:.2f}); convert/(cp+sync) {best_convert / durable:.2f}; "
              f"verify/cp {best_verify / cp:.2f}; inspect/cp {t['mx2nv inspect'] / cp:.3f}; "
              f"naive/convert {t['naive torch transcoder'] / best_convert:.1f}; source {size / 2**30:.2f} GiB")


def used_bytes(path: Path) -> int:
    """Used bytes once the file system has settled: XFS frees deleted files'
    blocks in the background, so read until two readings agree."""
    last = None
    for _ in range(50):
        subprocess.run(["sync", "-f", str(path)], check=True)
        st = os.statvfs(path)
        used = (st.f_blocks - st.f_bfree) * st.f_frsize
        if used == last:
            return used
        last = used
        time.sleep(0.2)
    return last


def mount_image(work: Path, fs: str, size: int) -> Path | None:
    """A fresh loop-mounted file system of type `fs` under work; None (with a
    message) where this machine cannot make one."""
    mkfs = {"xfs": ["mkfs.xfs", "-q", "-f", "-m", "reflink=1"], "btrfs": ["mkfs.btrfs", "-q", "-f"],
            "ext4": ["mkfs.ext4", "-q", "-F"]}[fs]
    if shutil.which(mkfs[0]) is None:
        print(f"zero-copy bench: skipping {fs}: {mkfs[0]} not installed (scripts/setup.sh installs it)")
        return None
    image, mnt = work / f"{fs}.img", work / f"mnt-{fs}"
    subprocess.run(["umount", str(mnt)], stderr=subprocess.DEVNULL, check=False)
    image.unlink(missing_ok=True)
    mnt.mkdir(parents=True, exist_ok=True)
    with open(image, "wb") as f:
        f.truncate(size)
    ok = subprocess.run(mkfs + [str(image)], capture_output=True).returncode == 0 and subprocess.run(
        ["mount", "-o", "loop", str(image), str(mnt)], capture_output=True).returncode == 0
    if not ok:
        print(f"zero-copy bench: skipping {fs}: cannot make or loop-mount an image here (needs root)")
        image.unlink(missing_ok=True)
        return None
    return mnt


def bench_fs_images(work: Path, reps: int, experts: int, filesystems: list[str]) -> None:
    """Zero-copy rows: durable (command + sync) wall times and the disk space
    each output adds, on reflink-capable file systems."""
    source = generate(work, experts)["4-shard"]
    size = tree_bytes(source)
    rows = []
    for fs in filesystems:
        mnt = mount_image(work, fs, 4 * size + (1 << 30))
        if mnt is None:
            continue
        try:
            src = mnt / "src"
            subprocess.run(["cp", "-r", "--reflink=never", str(source), str(src)], check=True)
            reference = mnt / "reference"
            subprocess.run([str(MX2NV), "convert", str(src), str(reference)], check=True, stdout=subprocess.DEVNULL)
            commands = {
                "cp -r --reflink=never": lambda o: ["cp", "-r", "--reflink=never", str(src), str(o)],
                "cp -r (auto)": lambda o: ["cp", "-r", str(src), str(o)],
                "mx2nv convert": lambda o: [str(MX2NV), "convert", str(src), str(o)],
                "mx2nv convert --copy copy": lambda o: [str(MX2NV), "convert", "--copy", "copy", str(src), str(o)],
                "mx2nv verify": lambda o: [str(MX2NV), "verify", str(src), str(reference)],
            }
            results: dict[str, list[float]] = {k: [] for k in commands}
            added: dict[str, int] = {}
            for rep in range(reps):
                for name, make in commands.items():
                    out = mnt / "out"
                    shutil.rmtree(out, ignore_errors=True)
                    before = used_bytes(mnt)
                    warm(src)
                    if "verify" in name:
                        warm(reference)
                    cmd = make(out)
                    wall, _, _ = run_measured(["sh", "-c", " ".join(f"'{c}'" for c in cmd) + f" && sync -f '{mnt}'"])
                    results[name].append(wall)
                    if "verify" not in name:
                        added[name] = used_bytes(mnt) - before
            shutil.rmtree(mnt / "out", ignore_errors=True)
            for name, walls in results.items():
                rows.append((fs, name, min(walls), statistics.median(walls), added.get(name), len(walls)))
        finally:
            subprocess.run(["umount", str(mnt)], check=False)
            (work / f"{fs}.img").unlink(missing_ok=True)
    if not rows:
        return
    print(f"\nzero-copy: {size / 2**30:.2f} GiB K3-shaped source (4 shards); every command timed with a trailing sync")
    print("| file system | command | min s | median s | disk added / SRC size | n |")
    print("|---|---|---:|---:|---:|---:|")
    for fs, name, lo, med, add, n in rows:
        share = "" if add is None else f"{add / size:.3f}"
        print(f"| {fs} | {name} | {lo:.3f} | {med:.3f} | {share} | {n} |")
    print("\nratios (min wall times, same run):")
    for fs in dict.fromkeys(r[0] for r in rows):
        t = {r[1]: r[2] for r in rows if r[0] == fs}
        a = {r[1]: r[4] for r in rows if r[0] == fs}
        never = t["cp -r --reflink=never"]
        print(f"  {fs}: convert/cp-never {t['mx2nv convert'] / never:.3f}; cp-auto/cp-never "
              f"{t['cp -r (auto)'] / never:.3f}; convert --copy copy/cp-never {t['mx2nv convert --copy copy'] / never:.3f}; "
              f"verify/cp-never {t['mx2nv verify'] / never:.3f}; DST adds {a['mx2nv convert'] / size:.3f} x SRC "
              f"(--copy copy {a['mx2nv convert --copy copy'] / size:.3f}, cp-never {a['cp -r --reflink=never'] / size:.3f})")


# --- K3 structure: metadata at scale -----------------------------------------

K3_STRUCTURE = ["--layout", "k3", "--layers", "92", "--experts", "896", "--shards", "96", "--hidden", "64",
                "--intermediate", "32", "--seed", "2026"]


def k3_rows(exe: Path, name: str, src: Path, ref: Path, work: Path) -> list[tuple[str, object, list[str], Path | None]]:
    """The measured commands of one build at K3's structure, in order: (label,
    unmeasured setup, command, page whose size is reported). Steps of a plan
    start from a fresh plan each time, so every repetition does the same work."""
    pa, pb = work / "plan-a", work / "plan-b"
    plan_a, plan_b = pa / ".mx2nv" / "plan.json", pb / ".mx2nv" / "plan.json"
    parts = [work / "verify-part-0.json", work / "verify-part-1.json"]
    page = work / "page.html"

    def fresh(*paths: Path):
        def setup() -> None:
            for p in paths:
                shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink(missing_ok=True)
        return setup

    def planned_b() -> None:
        shutil.rmtree(pb, ignore_errors=True)
        subprocess.run([str(exe), "plan", str(src), str(pb)], check=True, stdout=subprocess.DEVNULL)

    def parts_made() -> None:
        for i, part in enumerate(parts):
            part.unlink(missing_ok=True)
            subprocess.run([str(exe), "verify", str(src), str(ref), "--shards", f"{i}/2", "--report", str(part)],
                           check=True, stdout=subprocess.DEVNULL)

    verify_report = work / "verify-report.json"

    def verified() -> None:  # a fresh report: card refuses one older than DST's files
        subprocess.run([str(exe), "verify", str(src), str(ref), "--report", str(verify_report)], check=True,
                       stdout=subprocess.DEVNULL)

    x = str(exe)
    return [
        (f"{name} convert", fresh(work / "out"), [x, "convert", str(src), str(work / "out")], None),
        (f"{name} verify", None, [x, "verify", str(src), str(ref)], None),
        (f"{name} inspect", None, [x, "inspect", str(src)], None),
        (f"{name} plan", fresh(pa), [x, "plan", str(src), str(pa)], None),
        (f"{name} convert --plan --shards 0/8", None, [x, "convert", "--plan", str(plan_a), "--shards", "0/8"], None),
        (f"{name} convert --plan --shards 0/1", planned_b, [x, "convert", "--plan", str(plan_b), "--shards", "0/1"],
         None),
        (f"{name} convert --plan --finalize", None, [x, "convert", "--plan", str(plan_b), "--finalize"], None),
        (f"{name} verify --shards 0/2", fresh(parts[0]),
         [x, "verify", str(src), str(ref), "--shards", "0/2", "--report", str(parts[0])], None),
        (f"{name} verify --merge", parts_made, [x, "verify", "--merge", *map(str, parts)], None),
        (f"{name} gate", None, [x, "gate", str(ref), "--ask-runtimes", "never"], None),
        (f"{name} gate --quick", None, [x, "gate", str(ref), "--ask-runtimes", "never", "--quick"], None),
        (f"{name} requantize", fresh(work / "out"), [x, "requantize", str(src), str(work / "out")], None),
        (f"{name} inspect --html", fresh(page), [x, "inspect", str(src), "--html", str(page)], page),
        (f"{name} convert --html", fresh(work / "out", page),
         [x, "convert", str(src), str(work / "out"), "--html", str(page)], page),
        (f"{name} compare", None, [x, "compare", str(src), str(ref)], None),
        (f"{name} compare --html", fresh(page), [x, "compare", str(src), str(ref), "--html", str(page)], page),
        (f"{name} card", verified, [x, "card", str(src), str(ref), "--verify-report", str(verify_report)], None),
    ]


def bench_k3_structure(work: Path, reps: int, baseline: Path | None) -> None:
    src = work / "src-k3-structure"
    if not (src / "config.json").exists():
        shutil.rmtree(src, ignore_errors=True)
        subprocess.run([str(MX2NV), "generate", str(src), *K3_STRUCTURE], check=True, stdout=subprocess.DEVNULL)
    size = tree_bytes(src)
    index_mb = (src / "model.safetensors.index.json").stat().st_size / 1e6
    builds = {"mx2nv": MX2NV} | ({"baseline": baseline} if baseline else {})
    rows: list[tuple[str, object, list[str], Path | None]] = [
        ("cp -r", lambda: shutil.rmtree(work / "out", ignore_errors=True), ["cp", "-r", str(src), str(work / "out")],
         None)]
    for name, exe in builds.items():
        ref = work / f"k3-structure-out-{name}"
        shutil.rmtree(ref, ignore_errors=True)
        subprocess.run([str(exe), "convert", str(src), str(ref)], check=True, stdout=subprocess.DEVNULL)
        rows += k3_rows(exe, name, src, ref, work / f"k3-{name}")
        (work / f"k3-{name}").mkdir(exist_ok=True)
    results: dict[str, list[tuple[float, int, float]]] = {label: [] for label, _, _, _ in rows}
    pages: dict[str, int] = {}
    failed: dict[str, str] = {}
    for _ in range(reps):
        for label, setup, cmd, page in rows:
            if label in failed:
                continue
            if setup:
                setup()
            settle()
            warm(src)
            try:
                # gate exits 1 for a BLOCKED verdict (K3's structure has tiny dims)
                results[label].append(run_measured(cmd, (0, 1) if " gate" in label else (0,)))
            except SystemExit as e:  # e.g. an older build without the option
                failed[label] = str(e).strip().splitlines()[-1][:120]
                continue
            if page:
                pages[label] = page.stat().st_size
    shutil.rmtree(work / "out", ignore_errors=True)
    print(f"\nK3 structure: {size / 2**20:.0f} MiB in 96 shards, index {index_mb:.0f} MB; "
          f"machine: {platform.machine()}, {os.cpu_count()} cores")
    print("| command | min s | median s | x cp -r | CPU s | peak RSS MiB | page MB | n |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    cp = min(w for w, _, _ in results["cp -r"])
    for label, samples in results.items():
        if not samples:
            print(f"| {label} | failed: {failed.get(label, '')} |")
            continue
        walls = [w for w, _, _ in samples]
        page_mb = f"{pages[label] / 1e6:.2f}" if label in pages else ""
        print(f"| {label} | {min(walls):.2f} | {statistics.median(walls):.2f} | {min(walls) / cp:.1f} | "
              f"{min(c for _, _, c in samples):.2f} | {max(r for _, r, _ in samples)} | {page_mb} | {len(walls)} |")


# --- capped inputs: memory at the metadata caps ------------------------------

CAPPED_MODULES = ["--layout", "k3", "--layers", "92", "--experts", "1505", "--shards", "96", "--hidden", "64",
                  "--intermediate", "32", "--seed", "2026"]


def index_stats(src: Path) -> tuple[int, int]:
    """Tensors and name bytes of an index, counted in a child process: a
    child's peak RSS starts from its parent's at fork, so this process stays small."""
    code = ("import json,sys; w=json.load(open(sys.argv[1]))['weight_map']; "
            "print(len(w), sum(len(k.encode()) for k in w))")
    out = subprocess.run([sys.executable, "-c", code, str(src / "model.safetensors.index.json")], check=True,
                         capture_output=True, text=True).stdout.split()
    return int(out[0]), int(out[1])


def bench_capped(work: Path, baseline: Path | None) -> None:
    inputs = {"most-modules": work / "capped-most-modules"}
    if not (inputs["most-modules"] / "config.json").exists():
        shutil.rmtree(inputs["most-modules"], ignore_errors=True)
        subprocess.run([str(MX2NV), "generate", str(inputs["most-modules"]), *CAPPED_MODULES], check=True,
                       stdout=subprocess.DEVNULL)
    for case in ("long-names", "full-shards"):  # built in a child process too (see index_stats)
        inputs[case] = work / f"capped-{case}"
        if not (inputs[case] / "config.json").exists():
            subprocess.run([sys.executable, str(Path(__file__).resolve().parent / "capped_inputs.py"), "--mx2nv",
                            str(MX2NV), "--work", str(work), case], check=True, stdout=subprocess.DEVNULL)
            shutil.rmtree(inputs[case], ignore_errors=True)
            (work / case).rename(inputs[case])
    builds = {"mx2nv": MX2NV} | ({"baseline": baseline} if baseline else {})
    print(f"\nCapped inputs (peak RSS MiB, one run each; machine: {platform.machine()}, {os.cpu_count()} cores)")
    print("| input | tensors | name bytes | build | inspect | convert | verify |")
    print("|---|---:|---:|---|---:|---:|---:|")
    for case, src in inputs.items():
        tensors, names = index_stats(src)
        for name, exe in builds.items():
            out = work / "out"
            rss = []
            try:
                rss.append(run_measured([str(exe), "inspect", str(src)])[1])
                shutil.rmtree(out, ignore_errors=True)
                rss.append(run_measured([str(exe), "convert", str(src), str(out)])[1])
                rss.append(run_measured([str(exe), "verify", str(src), str(out)])[1])
            except SystemExit as e:  # a build whose caps refuse the input
                rss += ["refused"] * (3 - len(rss))
                print(f"  ({name} on {case}: {str(e).strip().splitlines()[-1][:160]})")
            shutil.rmtree(out, ignore_errors=True)
            print(f"| {case} | {tensors} | {names} | {name} | " + " | ".join(str(r) for r in rss) + " |")


# --- cold cache, memory capped: reading larger than memory -------------------

def memory_cgroup(cap: int) -> tuple[Path, str] | None:
    """A memory cgroup capped at `cap` bytes (page cache included, so little
    of what a run reads stays cached) and the file that takes a pid, or None
    where none can be made. cgroup v2 (memory enabled in the root's
    subtree_control) or v1's memory hierarchy."""
    v2, v1 = Path("/sys/fs/cgroup"), Path("/sys/fs/cgroup/memory")
    candidates = []
    controllers = v2 / "cgroup.controllers"
    if controllers.exists() and "memory" in controllers.read_text().split():
        candidates.append((v2, "memory.max", "cgroup.procs"))
    if (v1 / "memory.limit_in_bytes").exists():
        candidates.append((v1, "memory.limit_in_bytes", "tasks"))
    for base, limit, procs in candidates:
        group = base / "mx2nv-bench"
        try:
            group.mkdir(exist_ok=True)
            (group / limit).write_text(str(cap))
            return group, procs
        except OSError:
            continue
    return None


def drop_caches() -> None:
    subprocess.run(["sync"], check=True)
    Path("/proc/sys/vm/drop_caches").write_text("3\n")


def run_capped(cmd: list[str], group: tuple[Path, str], ok: tuple[int, ...] = (0,)) -> tuple[float, int, float]:
    procs = group[0] / group[1]
    return run_measured(["sh", "-c", f'echo $$ > "{procs}" && exec "$@"', "sh", *cmd], ok)


def block_device(path: Path) -> str | None:
    """The /proc/diskstats name of the device holding `path` (a partition's
    own line), or None where it cannot be told (tmpfs, overlay)."""
    dev = os.stat(path).st_dev
    link = Path(f"/sys/dev/block/{os.major(dev)}:{os.minor(dev)}")
    return link.resolve().name if link.exists() else None


def disk_io(device: str | None) -> tuple[int, int, int, int]:
    """Read requests completed, bytes read, write requests completed and bytes
    written so far on `device` (/proc/diskstats)."""
    if device:
        for line in Path("/proc/diskstats").read_text().splitlines():
            f = line.split()
            if len(f) > 9 and f[2] == device:
                return int(f[3]), int(f[5]) * 512, int(f[7]), int(f[9]) * 512
    return 0, 0, 0, 0


def disk_reads(device: str | None) -> tuple[int, int]:
    """Read requests completed and bytes read so far on `device` (/proc/diskstats)."""
    return disk_io(device)[:2]


def io_table(disk: dict[str, list[tuple[int, int, int, int]]], size: int, of: str) -> None:
    """Medians of what each run asked of the disk: requests, MB and MB a request, read and written."""
    print(f"| command | read requests | MB read | MB a read | read / {of} | write requests | MB written | "
          f"MB a write | written / {of} |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for label, samples in disk.items():
        if not samples:
            continue
        n, b, wn, wb = (statistics.median(s[i] for s in samples) for i in range(4))
        print(f"| {label} | {n:.0f} | {b / 1e6:.0f} | {b / max(n, 1) / 1e6:.2f} | {b / size:.3f} | {wn:.0f} | "
              f"{wb / 1e6:.0f} | {wb / max(wn, 1) / 1e6:.2f} | {wb / size:.3f} |")


def durable(cmd: list[str]) -> list[str]:
    """`cmd` then `sync`, as one command: its time includes writing everything back."""
    return ["sh", "-c", '"$@" > /dev/null && sync', "sh", *cmd]


def bench_cold(work: Path, reps: int, experts: int, baseline: Path | None, cap_mib: int) -> None:
    """verify and compare against `cat` of both trees, and convert against a
    durable copy of SRC (`cp -r --reflink=never` + sync), each run from a
    dropped page cache inside a memory cgroup of `cap_mib` MiB (smaller than
    the two trees), so every byte comes from the disk and little stays cached."""
    if os.geteuid() != 0:
        print("cold: skipped (needs root to drop caches and make a memory cgroup)")
        return
    group = memory_cgroup(cap_mib << 20)
    if group is None:
        print("cold: skipped (no memory cgroup could be made)")
        return
    src = generate(work, experts, only=("4-shard",))["4-shard"]
    ref = work / f"cold-ref-{experts}e"
    if not (ref / ".mx2nv" / "finished.json").exists():
        shutil.rmtree(ref, ignore_errors=True)
        subprocess.run([str(MX2NV), "convert", str(src), str(ref)], check=True, stdout=subprocess.DEVNULL)
    files = sorted(str(f) for tree in (src, ref) for f in tree.rglob("*") if f.is_file())
    size = sum(Path(f).stat().st_size for f in files)
    src_size = tree_bytes(src)
    out = work / "cold-out"
    # (label, command, exit codes, writes `out`)
    rows = [("cat both trees", ["sh", "-c", 'cat "$@" > /dev/null', "sh", *files], (0,), False),
            # The same bytes as SRC written durably: the physical limit of convert.
            ("cp -r --reflink=never + sync", durable(["cp", "-r", "--reflink=never", str(src), str(out)]), (0,),
             True)]
    builds = {"mx2nv": MX2NV} | ({"baseline": baseline} if baseline else {})
    for name, exe in builds.items():
        rows += [(f"{name} verify", [str(exe), "verify", str(src), str(ref)], (0,), False),
                 (f"{name} compare", [str(exe), "compare", str(src), str(ref)], (0,), False),
                 # convert fsyncs every file itself; the trailing sync makes the row the copy's equal.
                 (f"{name} convert + sync", durable([str(exe), "convert", str(src), str(out)]), (0,), True)]
    # What each cold run asked of the disk: requests and bytes, read and
    # written, which show a pattern's request sizes and any bytes read twice.
    device = block_device(src)
    cold: dict[str, list[tuple[float, int, float]]] = {label: [] for label, *_ in rows}
    disk: dict[str, list[tuple[int, int, int, int]]] = {label: [] for label, *_ in rows}
    for _ in range(reps):
        for label, cmd, ok, writes in rows:
            if writes:
                shutil.rmtree(out, ignore_errors=True)
            drop_caches()
            before = disk_io(device)
            cold[label].append(run_capped(cmd, group, ok))
            after = disk_io(device)
            disk[label].append(tuple(a - b for a, b in zip(after, before)))
    # The same rows with everything cached and no cap: the warm case the
    # cold one must not cost.
    subprocess.run(rows[0][1], check=True)
    warm: dict[str, list[tuple[float, int, float]]] = {label: [] for label, *_ in rows}
    for _ in range(reps):
        for label, cmd, ok, writes in rows:
            if writes:
                shutil.rmtree(out, ignore_errors=True)
                settle()
                warm_tree(src)
            warm[label].append(run_measured(cmd, ok))
    shutil.rmtree(out, ignore_errors=True)
    print(f"\nBoth trees {size / 2**30:.2f} GiB (SRC {experts} experts of K3's shapes, {src_size / 2**30:.2f} GiB, "
          f"and its conversion); machine: {platform.machine()}, {os.cpu_count()} cores, {cpu_model()}")
    print("x cat: min wall / cat's min; x cp: min wall / (cp -r --reflink=never + sync)'s min; "
          "GB/s: both trees' bytes (SRC's for the writing rows) / min wall")
    for title, results in ((f"Cold cache, memory capped at {cap_mib} MiB", cold), ("Warm cache, no cap", warm)):
        print(f"\n{title}:")
        print("| command | min s | median s | x cat | x cp | GB/s | CPU s | peak RSS MiB | n |")
        print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
        cat = min(w for w, _, _ in results["cat both trees"])
        cp = min(w for w, _, _ in results["cp -r --reflink=never + sync"])
        for label, cmd, ok, writes in rows:
            samples = results[label]
            walls = [w for w, _, _ in samples]
            moved = src_size if writes else size
            print(f"| {label} | {min(walls):.2f} | {statistics.median(walls):.2f} | {min(walls) / cat:.2f} | "
                  f"{min(walls) / cp:.2f} | {moved / min(walls) / 1e9:.2f} | {min(c for _, _, c in samples):.2f} | "
                  f"{max(r for _, r, _ in samples)} | {len(walls)} |")
        for name in builds:
            lo = min(w for w, _, _ in results[f"{name} convert + sync"])
            med = statistics.median(w for w, _, _ in results[f"{name} convert + sync"])
            cp_med = statistics.median(w for w, _, _ in results["cp -r --reflink=never + sync"])
            print(f"  {name}: convert / durable copy {lo / cp:.2f} (min), {med / cp_med:.2f} (median)")
    if device:
        print(f"\nCold runs' disk requests on {device} (/proc/diskstats, medians; anything else using the disk "
              f"meanwhile counts; per both trees, {size / 1e6:.0f} MB):")
        io_table(disk, size, "both trees")


# --- one real K3 MoE layer: real shapes, real size ---------------------------

# Bytes of one K3 expert: w1 and w3 (packed [3072, 1792] and scales [3072, 112])
# and w2 (packed [3584, 1536] and scales [3584, 96]), all U8.
K3_EXPERT_BYTES = 2 * (3072 * 1792 + 3072 * 112) + (3584 * 1536 + 3584 * 96)
K3_LAYER_OTHER_BYTES = 8 << 20  # a bound on the layer's other tensors and files (2.5 MB generated)


def real_layer_need(experts: int) -> tuple[int, int]:
    """SRC's estimated bytes and the free bytes the run needs on --work's file
    system: SRC plus one output (convert writes ~1.06 x SRC) on it, then, with
    that SRC removed, an XFS image (a sparse file) holding SRC and one
    `cp --reflink=never` copy of it."""
    src = experts * K3_EXPERT_BYTES + K3_LAYER_OTHER_BYTES
    image = xfs_image_bytes(src)
    return src, max(src + int(1.07 * src), image) + (1 << 30)


def xfs_image_bytes(src: int) -> int:
    return int(2.08 * src) + (1 << 30)


def free_bytes(path: Path) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def count_clones(cmd: list[str], log: Path) -> dict[str, tuple[int, float]]:
    """Run `cmd` under strace (ioctl and copy_file_range calls, each timed; one
    log per thread, so no call is split) and return, per call kind, the number
    of calls and the seconds spent in them."""
    subprocess.run(["strace", "-ff", "-T", "-qq", "-e", "trace=ioctl,copy_file_range", "-o", str(log), *cmd],
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    calls: dict[str, tuple[int, float]] = {}
    for part in sorted(log.parent.glob(log.name + ".*")):
        for line in part.read_text(errors="replace").splitlines():
            if "FICLONERANGE" in line:
                kind = "FICLONERANGE"
            elif line.startswith("copy_file_range("):
                kind = "copy_file_range"
            elif line.startswith("ioctl("):
                kind = "other ioctl"
            else:
                continue
            t = float(line.rsplit("<", 1)[1].rstrip(">")) if line.endswith(">") else 0.0
            n, total = calls.get(kind, (0, 0.0))
            calls[kind] = (n + 1, total + t)
        part.unlink()
    return calls


def bench_real_layer(work: Path, reps: int, experts: int, shards: int, filesystems: list[str]) -> int:
    """One Kimi K3 MoE layer at its real shapes and size (896 experts, ~15.7 GB),
    from a cold page cache: mx2nv convert, verify and compare against cat,
    `cp -r --reflink=never` and a durable cp (+ sync), on the file system of
    --work (ext4 here) and on a loop-mounted XFS with reflinks, where the
    FICLONERANGE calls convert makes are counted and timed (a separate run
    under strace) and the disk space each output adds is measured. Everything
    it creates is removed afterwards, also on Ctrl-C or an error."""
    if os.geteuid() != 0:
        print("real-layer: needs root (to drop caches and loop-mount XFS)", file=sys.stderr)
        return 2
    est, need = real_layer_need(experts)
    have = free_bytes(work)
    print(f"real-layer: {experts} experts of K3's shapes in {shards} shard(s): SRC ~{est / 1e9:.1f} GB; "
          f"needs {need / 1e9:.1f} GB free under {work} (SRC and one output on it, then an XFS image of "
          f"{xfs_image_bytes(est) / 1e9:.1f} GB holding SRC and one copy), has {have / 1e9:.1f} GB", flush=True)
    if have < need:
        print(f"real-layer: refused: {need / 1e9:.1f} GB free needed under {work}, {have / 1e9:.1f} GB free "
              f"(try --real-layer-experts N for a smaller layer, or --work on a larger disk)", file=sys.stderr)
        return 2
    if "xfs" in filesystems and shutil.which("strace") is None:
        print("real-layer: strace not installed: the XFS clone calls will not be counted")
    base = work / "real-layer"
    shutil.rmtree(base, ignore_errors=True)
    base.mkdir()
    mnt = base / "mnt-xfs"
    results = []
    try:
        for fs in filesystems:
            if fs == "xfs":
                mounted = mount_image(base, "xfs", xfs_image_bytes(est))
                if mounted is None:
                    continue
                root = mounted
            else:
                root = base / "on-work"
                root.mkdir()
                fs = subprocess.run(["findmnt", "-n", "-o", "FSTYPE", "--target", str(root)], capture_output=True,
                                    text=True).stdout.strip() or "work"
            results.append(real_layer_rows(fs, root, reps, experts, shards))
            if root == mnt:
                shutil.rmtree(root / "src", ignore_errors=True)
                subprocess.run(["umount", str(mnt)], check=True)
                (base / "xfs.img").unlink()
            else:
                shutil.rmtree(root)
    finally:
        if mnt.is_mount():
            if subprocess.run(["umount", str(mnt)], capture_output=True).returncode != 0:
                subprocess.run(["umount", "-l", str(mnt)], check=False)
        shutil.rmtree(base, ignore_errors=True)
        print(f"real-layer: removed {base}", flush=True)
    print(f"\nmachine: {platform.machine()}, {os.cpu_count()} cores, {cpu_model()}, {platform.platform()}")
    for fs, size, gen_s, device, rows, added, clones, strace_wall in results:
        print(f"\nOne K3 MoE layer on {fs}: SRC {size / 1e9:.2f} GB ({size / 2**30:.2f} GiB), {experts} experts, "
              f"{shards} shard(s) (generated in {gen_s:.0f} s); every row from dropped caches; '+ sync' rows "
              f"include writing everything back")
        print("| command | min s | median s | x cat | x cp + sync | GB/s of SRC | CPU s | peak RSS MiB | "
              "disk added / SRC | n |")
        print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        walls = {label: [w for w, _, _ in s] for label, (s, _) in rows.items()}
        cat = min(walls["cat SRC"])
        cp = min(walls["cp -r --reflink=never + sync"])
        for label, (samples, _) in rows.items():
            w = walls[label]
            add = f"{added[label] / size:.3f}" if label in added else ""
            print(f"| {label} | {min(w):.2f} | {statistics.median(w):.2f} | {min(w) / cat:.2f} | {min(w) / cp:.2f} | "
                  f"{size / min(w) / 1e9:.2f} | {min(c for _, _, c in samples):.2f} | "
                  f"{max(r for _, r, _ in samples)} | {add} | {len(w)} |")
        t = {label: min(w) for label, w in walls.items()}
        print(f"ratios (min): convert+sync / cp+sync {t['mx2nv convert + sync'] / cp:.2f}; convert+sync / cp "
              f"{t['mx2nv convert + sync'] / t['cp -r --reflink=never']:.2f}; verify / cat "
              f"{t['mx2nv verify'] / cat:.2f}; compare / cat {t['mx2nv compare'] / cat:.2f}")
        if device:
            print(f"disk requests on {device} (/proc/diskstats, medians; anything else using the disk counts):")
            io_table({label: d for label, (_, d) in rows.items()}, size, "SRC")
        if clones is not None:
            print(f"mx2nv convert under strace (a separate run, not timed above; {strace_wall:.1f} s with strace):")
            for kind, (n, secs) in sorted(clones.items()):
                print(f"  {kind}: {n} calls, {secs:.3f} s in them, {secs / max(n, 1) * 1e6:.0f} us a call")
    return 0


def real_layer_rows(fs: str, root: Path, reps: int, experts: int, shards: int):
    """The rows of one file system: SRC generated under `root`, each command
    from dropped caches, each output removed after its row."""
    src, out = root / "src", root / "out"
    start = time.perf_counter()
    subprocess.run([str(MX2NV), "generate", str(src), "--layout", "k3", "--layers", "1", "--experts", str(experts),
                    "--hidden", "3584", "--intermediate", "3072", "--shards", str(shards), "--span", "10",
                    "--seed", "2026", "--extreme-zero-scales", "off"], check=True, stdout=subprocess.DEVNULL)
    gen_s = time.perf_counter() - start
    size = tree_bytes(src)
    files = sorted(str(f) for f in src.rglob("*") if f.is_file())
    device = block_device(src)
    x = str(MX2NV)
    # (label, command, writes `out`, keep `out` for the rows after it)
    commands = [
        ("cat SRC", ["sh", "-c", 'cat "$@" > /dev/null', "sh", *files], False, False),
        ("cp -r --reflink=never", ["cp", "-r", "--reflink=never", str(src), str(out)], True, False),
        ("cp -r --reflink=never + sync", durable(["cp", "-r", "--reflink=never", str(src), str(out)]), True, False),
    ]
    if root.name == "mnt-xfs":
        commands.append(("cp -r (reflink auto) + sync", durable(["cp", "-r", str(src), str(out)]), True, False))
    commands += [
        ("mx2nv convert + sync", durable([x, "convert", str(src), str(out)]), True, True),
        ("mx2nv verify", [x, "verify", str(src), str(out)], False, False),
        ("mx2nv compare", [x, "compare", str(src), str(out)], False, False),
    ]
    rows = {label: ([], []) for label, *_ in commands}
    added: dict[str, int] = {}
    for _ in range(reps):
        for label, cmd, writes, keep in commands:
            if writes:
                shutil.rmtree(out, ignore_errors=True)
            before_used = used_bytes(root) if writes else 0
            drop_caches()
            before = disk_io(device)
            rows[label][0].append(run_measured(cmd))
            after = disk_io(device)
            rows[label][1].append(tuple(a - b for a, b in zip(after, before)))
            if writes:
                added[label] = used_bytes(root) - before_used
            if writes and not keep:
                shutil.rmtree(out, ignore_errors=True)
            print(f"  {fs}: {label}: {rows[label][0][-1][0]:.2f} s", flush=True)
        shutil.rmtree(out, ignore_errors=True)
    clones, strace_wall = None, 0.0
    if root.name == "mnt-xfs" and shutil.which("strace"):
        drop_caches()
        start = time.perf_counter()
        clones = count_clones([x, "convert", str(src), str(out)], root.parent / "strace.log")
        strace_wall = time.perf_counter() - start
        shutil.rmtree(out, ignore_errors=True)
    return fs, size, gen_s, device, rows, added, clones, strace_wall


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--reps", type=int, help="repetitions (5; 1 with --real-layer)")
    p.add_argument("--experts", type=int, default=60, help="60 experts of the real K3 shapes is ~1 GiB")
    p.add_argument("--work", type=Path, default=REPO / "build" / "bench")
    p.add_argument("--fs-images", default="xfs,btrfs,ext4",
                   help="loop-mounted file systems for the zero-copy rows (comma-separated; empty: none)")
    p.add_argument("--fs-images-only", action="store_true", help="run only the zero-copy rows")
    p.add_argument("--k3-structure", action="store_true", help="metadata at K3's scale instead (see above)")
    p.add_argument("--baseline", type=Path, help="with --k3-structure/--capped: another mx2nv build to measure beside")
    p.add_argument("--capped", action="store_true", help="peak RSS on inputs at the metadata caps (see above)")
    p.add_argument("--cold", action="store_true", help="verify and compare from a cold cache, memory capped (see above)")
    p.add_argument("--cold-cap-mib", type=int, default=384, help="with --cold: the memory cgroup's limit")
    p.add_argument("--real-layer", action="store_true",
                   help="one K3 MoE layer at its real size (~15.7 GB), cold, on ext4 and XFS (see above)")
    p.add_argument("--real-layer-experts", type=int, default=896, help="with --real-layer: experts (K3: 896)")
    p.add_argument("--real-layer-shards", type=int, default=2, help="with --real-layer: shard files")
    p.add_argument("--real-layer-fs", default="work,xfs",
                   help="with --real-layer: where (work: --work's file system; xfs: a loop-mounted image)")
    args = p.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    if args.real_layer:
        sys.exit(bench_real_layer(args.work, args.reps or 1, args.real_layer_experts, args.real_layer_shards,
                                  [f for f in args.real_layer_fs.split(",") if f]))
    args.reps = args.reps or 5
    if args.k3_structure:
        bench_k3_structure(args.work, args.reps, args.baseline)
        return
    if args.capped:
        bench_capped(args.work, args.baseline)
        return
    if args.cold:
        bench_cold(args.work, args.reps, args.experts, args.baseline, args.cold_cap_mib)
        return
    if not args.fs_images_only:
        bench(args.work, args.reps, args.experts)
    filesystems = [f for f in args.fs_images.split(",") if f]
    if filesystems:
        bench_fs_images(args.work, args.reps, args.experts, filesystems)


if __name__ == "__main__":
    main()
