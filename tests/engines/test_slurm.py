"""The Slurm recipe (examples/slurm) for real: Debian's slurm-wlm and munge
started as a single-node cluster inside the test (slurmctld + slurmd on
localhost, private ports and state), the job array converts the shards, the
dependent finalize job writes the index, and the result is byte-identical to a
single-process convert. Then a finished array task is requeued (what
--requeue does after a node failure) and the DST does not change. Skipped with
the reason where the daemons cannot start (not root, packages missing)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
RECIPE = REPO / "examples" / "slurm" / "convert.sh"


@pytest.fixture(scope="module")
def mx2nv() -> str:
    # No conftest.py here: the suites run in one pytest session with
    # tests/conformance, whose modules import from their own conftest.
    return str(Path(os.environ.get("MX2NV", REPO / "build" / "mx2nv")).absolute())


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def files(root: Path) -> dict:
    return {p.relative_to(root): p.read_bytes() for p in root.rglob("*") if p.is_file()}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    for tool in ("slurmctld", "slurmd", "sbatch", "squeue", "scontrol", "munged"):
        if shutil.which(tool) is None and not Path("/usr/sbin", tool).exists():
            pytest.skip(f"Slurm test skipped: {tool} is not installed (apt-get install slurm-wlm munge)")
    if os.geteuid() != 0:
        pytest.skip("Slurm test skipped: slurmd must run as root to start jobs")
    if subprocess.run(["pgrep", "-x", "munged"], capture_output=True).returncode != 0:
        Path("/run/munge").mkdir(parents=True, exist_ok=True)
        shutil.chown("/run/munge", "munge", "munge")
        r = subprocess.run(["su", "-s", "/bin/sh", "munge", "-c", "/usr/sbin/munged"], capture_output=True, text=True)
        if r.returncode != 0:
            pytest.skip(f"Slurm test skipped: munged did not start: {r.stderr.strip()}")
    root = tmp_path_factory.mktemp("slurm")
    (root / "state").mkdir()
    (root / "spool").mkdir()
    cpus = os.cpu_count() or 1
    conf = root / "slurm.conf"
    conf.write_text(f"""ClusterName=mx2nvtest
SlurmctldHost=localhost
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
ReturnToService=2
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd.pid
SlurmctldPort={free_port()}
SlurmdPort={free_port()}
SlurmctldLogFile={root}/slurmctld.log
SlurmdLogFile={root}/slurmd.log
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
NodeName=localhost CPUs={cpus} RealMemory=1000 State=UNKNOWN
PartitionName=debug Nodes=localhost Default=YES MaxTime=INFINITE State=UP
""")
    env = dict(os.environ, SLURM_CONF=str(conf))
    subprocess.run(["slurmctld", "-f", str(conf)], env=env, check=False)
    subprocess.run(["slurmd", "-f", str(conf), "-N", "localhost"], env=env, check=False)
    try:
        deadline = time.time() + 30
        while time.time() < deadline:
            r = subprocess.run(["sinfo", "-h", "-o", "%t"], env=env, capture_output=True, text=True)
            if r.returncode == 0 and r.stdout.strip() in ("idle", "mix", "alloc"):
                break
            time.sleep(0.5)
        else:
            log = (root / "slurmctld.log").read_text() if (root / "slurmctld.log").exists() else ""
            pytest.skip(f"Slurm test skipped: the single-node cluster did not come up: {log[-500:]}")
        yield env, root
    finally:
        subprocess.run(["scontrol", "shutdown"], env=env, capture_output=True)
        for pid_file in ("slurmctld.pid", "slurmd.pid"):
            p = root / pid_file
            if p.exists():
                try:
                    os.kill(int(p.read_text().strip()), 15)
                except (ProcessLookupError, ValueError):
                    pass


def wait_for_queue(env, timeout=120):
    deadline = time.time() + timeout
    while time.time() < deadline:
        r = subprocess.run(["squeue", "-h"], env=env, capture_output=True, text=True)
        if r.returncode == 0 and not r.stdout.strip():
            return
        time.sleep(0.5)
    raise AssertionError("jobs did not finish: " + r.stdout)


def test_job_array_then_finalize_gives_the_single_process_bytes(cluster, mx2nv, tmp_path):
    env, root = cluster
    src, dst, ref = tmp_path / "src", tmp_path / "dst", tmp_path / "ref"
    subprocess.run([mx2nv, "generate", src, "--shards", "7", "--layers", "2", "--experts", "3",
                    "--hidden", "64", "--intermediate", "64"], check=True, capture_output=True)
    subprocess.run([mx2nv, "convert", src, ref], check=True, capture_output=True)
    out = subprocess.run([str(RECIPE), str(src), str(dst), "3", f"--chdir={tmp_path}", "--cpus-per-task=1"],
                         env=dict(env, MX2NV=mx2nv), capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    array = out.stdout.split("job array ")[1].split()[0]
    wait_for_queue(env)
    finals = list(tmp_path.glob("mx2nv-finalize-*.out"))
    assert finals and "finalized" in finals[0].read_text(), [p.read_text() for p in tmp_path.glob("*.out")]
    assert files(dst) == files(ref)

    # A node failure requeues a task that had finished: it runs again and
    # finds its shards done; DST stays the same.
    before = files(dst)
    r = subprocess.run(["scontrol", "requeue", f"{array}_1"], env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    # Slurm delays a requeued job's eligibility; let it start now.
    subprocess.run(["scontrol", "update", f"JobId={array}_1", "StartTime=now"], env=env, capture_output=True)
    wait_for_queue(env)
    outs = sorted(tmp_path.glob(f"mx2nv-shards-{array}_1.out"))
    assert outs and "already complete" in outs[0].read_text(), [p.read_text() for p in outs]
    assert files(dst) == before


def test_finalize_job_refuses_when_a_task_is_missing(cluster, mx2nv, tmp_path):
    env, root = cluster
    src, dst = tmp_path / "src", tmp_path / "dst"
    subprocess.run([mx2nv, "generate", src, "--shards", "4", "--layers", "1", "--experts", "2",
                    "--hidden", "64", "--intermediate", "64"], check=True, capture_output=True)
    subprocess.run([mx2nv, "plan", src, dst], check=True, capture_output=True)
    plan = dst / ".mx2nv" / "plan.json"
    # Only task 0 of 2 ran; finalize submitted on its own must fail and leave no index.
    subprocess.run([mx2nv, "convert", "--plan", plan, "--shards", "0/2"], check=True, capture_output=True)
    job = subprocess.run(["sbatch", "--parsable", f"--chdir={tmp_path}",
                          f"--export=ALL,MX2NV={mx2nv},MX2NV_PLAN={plan}",
                          str(REPO / "examples" / "slurm" / "finalize.sbatch")],
                         env=env, capture_output=True, text=True)
    assert job.returncode == 0, job.stderr
    wait_for_queue(env)
    log = next(tmp_path.glob("mx2nv-finalize-*.out")).read_text()
    assert "shards are not finished" in log, log
    assert not (dst / "model.safetensors.index.json").exists()
