"""Sweeps on a Ray cluster (one local head for the module): the report of a sweep run as
Ray tasks equals the local one's; a run killed mid-way is resumed by its task and no other
run is lost; a stop passes its signal to the run, which saves; the runs get the driver's
XLA and JAX variables; bad input is one line, exit 2, no folder, as is a local folder on a
cluster of two nodes."""

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

import pytest

from jaxformer.cli import main
from jaxformer_lab import ray_cluster, sweep
from jaxformer_lab.sweep import ray_jobs
from tests.lab.sweep.test_sweep import BASE, ROOT, write_spec

ray = pytest.importorskip("ray")

# A stand-in for `python -m jaxformer train` (with a Python's #! line): it appends to
# calls.txt in the run's folder, writes there the variables it sees (probed), and a
# summary that depends on the run; in the run named in the file `hold` beside the
# sweep's folder, its first call waits (to be killed or stopped), saving on a stop
# signal, whose name it writes to `saved`.
FAKE = """
import json, os, pathlib, signal, sys, time, zlib
folder = pathlib.Path(sys.argv[sys.argv.index("--config") + 1]).parent
with open(folder / "calls.txt", "a") as calls:
    calls.write("call\\n")
probed = ("XLA_FLAGS", "JAXFORMER_PROBE", "CUDA_VISIBLE_DEVICES")
(folder / "env.json").write_text(json.dumps({k: os.environ.get(k) for k in probed}))
hold = folder.parents[2] / "hold"
if hold.exists() and str(folder).endswith(hold.read_text()) and len((folder / "calls.txt").read_text().split()) == 1:
    def save(signum, _):
        (folder / "saved").write_text(signal.Signals(signum).name)
        sys.exit(128 + signum)
    for stop in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(stop, save)
    (folder / "holding").write_text("x")
    time.sleep(120)
score = zlib.crc32(str(folder).split("sweep")[-1].encode()) % 100 / 100
(folder / "summary.json").write_text(json.dumps({"exact_match": score}))
print("fake run done")
"""


@pytest.fixture
def fake(tmp_path, monkeypatch):
    path = tmp_path / "fake_python"
    path.write_text(f"#!{sys.executable}\n{FAKE}")
    path.chmod(0o755)
    monkeypatch.setattr(ray_jobs, "WORKER_PYTHON", str(path))
    monkeypatch.setattr(sys, "executable", str(path))  # the local runs
    return path


def verdicts(out):
    results = json.loads((out / "results.json").read_text())
    return {k: v for k, v in results.items() if k != "out"}


def test_a_sweep_on_ray_reports_as_the_local_one(head, fake, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("JAXFORMER_PROBE", "the driver's")  # the head's workers lack it
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "7")  # Ray's to set, per task
    spec = write_spec(tmp_path, variants={"baseline": {}, "wide": {"d_ff": 64}})
    assert main(["sweep", str(spec), "--ray", head, "--out", str(tmp_path / "ray/sweep")]) == 0
    assert main(["sweep", str(spec), "--out", str(tmp_path / "local/sweep")]) == 0
    assert "[4/4]" in capsys.readouterr().out
    on_ray, local = verdicts(tmp_path / "ray/sweep"), verdicts(tmp_path / "local/sweep")
    assert on_ray == local and set(local["variants"]) == {"baseline", "wide"}
    task = json.loads((tmp_path / "ray/sweep/wide/seed1" / ray_jobs.TASK_FILE).read_text())
    assert task["pid"] > 0 and not (tmp_path / "local/sweep/wide/seed1/ray_task.json").exists()
    seen = json.loads((tmp_path / "ray/sweep/wide/seed1/env.json").read_text())
    assert seen["XLA_FLAGS"] == os.environ["XLA_FLAGS"] != ""  # the head's is ""
    assert seen["JAXFORMER_PROBE"] == "the driver's" and seen["CUDA_VISIBLE_DEVICES"] != "7"


def test_the_runs_get_the_drivers_xla_jax_and_jaxformer_variables():
    driver = dict(XLA_FLAGS="--a", XLA_PYTHON_CLIENT_MEM_FRACTION=".5", JAX_PLATFORMS="cpu")
    driver |= dict(JAXFORMER_PLUGINS="p", LIBTPU_INIT_ARGS="--b")
    others = dict(CUDA_VISIBLE_DEVICES="0", PATH="/bin", RAY_ADDRESS="x", XLA_X="y")
    assert ray_cluster.forwarded_env(driver | others) == driver


def when(path, timeout=60):
    deadline = time.time() + timeout
    while not path.exists():
        assert time.time() < deadline, f"{path} never appeared"
        time.sleep(0.1)


def main_stopped(argv: list[str], *ready) -> int:
    """`main(argv)`'s exit code, this process sent SIGTERM once every file in `ready` is
    there (what a held run writes as it starts to wait)."""

    def stop():
        for path in ready:
            when(path)
        os.kill(os.getpid(), signal.SIGTERM)

    stopper = threading.Thread(target=stop)
    stopper.start()
    try:
        return main(argv)
    finally:
        stopper.join()


def test_a_killed_run_is_resumed_by_its_task_and_no_other_run_is_lost(head, fake, tmp_path):
    spec = sweep.Spec.load(write_spec(tmp_path))
    held = spec.folder("sq", 0)
    (tmp_path / "hold").write_text("sq/seed0")

    def kill():
        when(held / "holding")
        os.kill(json.loads((held / ray_jobs.TASK_FILE).read_text())["pid"], signal.SIGKILL)

    killer = threading.Thread(target=kill)
    killer.start()
    cluster = ray_jobs.connect(head)
    try:
        lines = []
        results = sweep.run(spec, cluster=cluster, say=lines.append)
    finally:
        cluster.close()
        killer.join()
    assert all(r["runs"] == {0: "done", 1: "done"} for r in results["variants"].values())
    assert "killed by SIGKILL; resuming it (1 of 2)" in (held / "train.log").read_text()
    calls = {
        f.parent.name + f.parent.parent.name: f.read_text().count("call")
        for f in spec.out.glob("*/seed*/calls.txt")
    }
    assert sorted(calls.values()) == [1, 1, 1, 2] and calls["seed0sq"] == 2


def test_a_stop_passes_its_signal_to_the_run_on_ray(head, fake, tmp_path, capsys, monkeypatch):
    path = write_spec(tmp_path, variants={"baseline": {}}, seeds=1)
    monkeypatch.setattr(sys, "argv", ["jaxformer", "sweep", str(path), "--ray", head])
    held = tmp_path / "sweep/baseline/seed0"
    (tmp_path / "hold").write_text("baseline/seed0")
    assert main_stopped(sys.argv[1:], held / "holding") == 143
    out, err = capsys.readouterr()
    assert "[1/1] baseline seed 0: interrupted (resumes next time)" in out
    assert f"continue with jaxformer sweep {path} --ray {head}" in err.splitlines()[-1]
    assert (held / "saved").read_text() == "SIGTERM"  # as a local run gets it
    assert not (held / ray_cluster.STOP_FILE).exists()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def refused(capsys, tmp_path, *options, match):
    spec = write_spec(tmp_path, base=BASE)
    assert main(["sweep", str(spec), *options]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and match in err, err
    assert not (tmp_path / "sweep").exists()


def test_an_address_nobody_listens_on_is_one_line(tmp_path, capsys):
    address = f"127.0.0.1:{free_port()}"
    refused(capsys, tmp_path, "--ray", address, match=f"--ray {address}: no Ray cluster answers")
    refused(capsys, tmp_path, "--ray", "nowhere", match="give auto, local or HOST:PORT")
    refused(capsys, tmp_path, "--shared-storage", match="--shared-storage ask(s) for a Ray")


def test_ray_missing_is_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)
    refused(capsys, tmp_path, "--ray", "auto", match="pip install 'jaxformer-lab[ray]'")


def test_a_version_mismatch_is_one_line(tmp_path, capsys, monkeypatch):
    def mismatch(**_):
        raise RuntimeError("Version mismatch: The cluster was started with:\n    Ray: 2.0.0\n")

    monkeypatch.setattr(ray, "init", mismatch)
    refused(capsys, tmp_path, "--ray", "auto", match="runs another Ray or Python than this one")


QUIET = """
from jaxformer_lab import ray_cluster
ray = ray_cluster.join("local")
print(ray.get(ray.remote(lambda: "ran").remote()))
ray.shutdown()
"""


def test_a_head_started_here_says_nothing_and_keeps_rays_token(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "RAY_AUTH_MODE"}  # Ray's default
    env["HOME"] = str(tmp_path)  # where Ray keeps its token
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(ROOT / "lab")])
    done = subprocess.run([sys.executable, "-c", QUIET], env=env, capture_output=True, text=True)
    assert (done.returncode, done.stdout, done.stderr) == (0, "ran\n", "")
    assert (tmp_path / ".ray/auth_token").exists()


class TpuCluster:
    """Ray as a cluster of two TPU hosts (4 chips each) and a CPU node shows it."""

    def cluster_resources(self):
        return {"CPU": 40, "TPU": 8}

    def nodes(self):
        tpu_host = {"Alive": True, "Resources": {"CPU": 16, "TPU": 4}}
        return [tpu_host, tpu_host, {"Alive": True, "Resources": {"CPU": 8}}]


def test_a_run_asks_for_a_whole_tpu_host_where_the_cluster_has_tpus():
    needs = ray_cluster.run_needs(TpuCluster(), 1, None, None)
    assert needs == {"CPU": 1, "TPU": 4}
    assert ray_cluster.task_options(needs) == dict(num_cpus=1, num_gpus=0, resources={"TPU": 4})
    assert ray_cluster.run_needs(TpuCluster(), 2, 0, 1) == {"CPU": 2, "TPU": 1}
    cluster = ray_jobs.Cluster(TpuCluster(), "x:1", needs)
    assert cluster.slots() == 2 and cluster.accelerators == 4  # one run per host


def test_a_task_whose_own_code_raises_fails_naming_its_error(head, tmp_path):
    """Not "interrupted (resumes next time)", as a dead worker's task is."""
    ray = ray_cluster.join(head)
    try:

        @ray.remote(max_retries=0)
        def broken():
            raise ValueError("no such  thing")

        log = tmp_path / "train.log"
        assert ray_cluster.outcome(ray, broken.remote(), log) == ray_cluster.TASK_FAILED
        assert log.read_text() == "the Ray task failed: ValueError: no such thing\n"
    finally:
        ray.shutdown()


def test_a_cluster_without_a_runs_resources_is_one_line(head, tmp_path, capsys):
    refused(capsys, tmp_path, "--ray", head, "--ray-gpus", "1", match="asks for 1 GPU and no node")
    assert not ray.is_initialized()


def test_several_nodes_need_the_folder_on_shared_storage(tmp_path, monkeypatch):
    mounts = tmp_path / "mounts"
    mounts.write_text("/dev/sda1 / ext4 rw 0 0\nserver:/x /mnt/shared nfs4 rw 0 0\n")
    assert ray_cluster.mount_type(tmp_path / "mnt/a", mounts) == "ext4"
    assert ray_cluster.mount_type("/mnt/shared/sweeps/a", mounts) == "nfs4"
    ray_cluster.check_storage("/mnt/shared/sweeps/a", 3, False, str(mounts))
    ray_cluster.check_storage(tmp_path, 1, False, str(mounts))
    ray_cluster.check_storage(tmp_path, 3, True, str(mounts))
    with pytest.raises(ValueError, match="has 3 nodes and .* is on this machine's disk \\(ext4\\)"):
        ray_cluster.check_storage(tmp_path, 3, False, str(mounts))


TWO_NODES = """
import sys
from ray.cluster_utils import Cluster
cluster = Cluster(initialize_head=True, head_node_args=dict(num_cpus=1, include_dashboard=False))
cluster.add_node(num_cpus=1)
print(cluster.address, flush=True)
sys.stdin.read()
cluster.shutdown()
"""


@pytest.fixture
def two_nodes(monkeypatch):
    """A Ray cluster of two nodes on this machine, its files (and the address that
    `--ray auto` would read) in a short folder of its own (Ray's sockets live there); its
    address."""
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    with tempfile.TemporaryDirectory(dir="/tmp", ignore_cleanup_errors=True) as temp:
        env = dict(os.environ, RAY_TMPDIR=temp, XLA_FLAGS="")
        proc = subprocess.Popen(
            [sys.executable, "-c", TWO_NODES],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
        )
        try:
            address = proc.stdout.readline().decode().strip()
            assert address, "the two-node cluster did not start"
            yield address
        finally:
            proc.stdin.close()
            proc.wait(timeout=60)


def test_a_local_folder_on_two_nodes_is_one_line_before_any_folder(two_nodes, tmp_path, capsys):
    if (ray_cluster.mount_type(tmp_path) or "").startswith(ray_cluster.SHARED_FILESYSTEMS):
        pytest.skip(f"{tmp_path} is on shared storage here")
    refused(capsys, tmp_path, "--ray", two_nodes, match="the Ray cluster has 2 nodes and")
    out = tmp_path / "sweep"
    for hosts in ("2", "1"):  # spread, or packed on a node Ray picks
        argv = ["train", "ray", "--ray", two_nodes, "--hosts", hosts, "--", "--out", str(out)]
        assert main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "the Ray cluster has 2 nodes and" in err, err
        assert not out.exists()


def test_a_sweep_over_two_nodes_reports_as_the_local_one(two_nodes, fake, tmp_path, capsys):
    """Two Ray nodes (one CPU each) on this machine, whose disk both see: the runs go to
    both nodes, and the report is the local runner's."""
    spec = write_spec(tmp_path, variants={"baseline": {}, "wide": {"d_ff": 64}})
    out = tmp_path / "ray/sweep"
    argv = ["sweep", str(spec), "--ray", two_nodes, "--shared-storage", "--out", str(out)]
    assert main(argv) == 0
    assert main(["sweep", str(spec), "--out", str(tmp_path / "local/sweep")]) == 0
    assert verdicts(out) == verdicts(tmp_path / "local/sweep")
    tasks = [json.loads(p.read_text()) for p in out.glob(f"*/seed*/{ray_jobs.TASK_FILE}")]
    assert len(tasks) == 4 and len({t["ray_node"] for t in tasks}) == 2


@pytest.mark.slow  # eight short trainings
def test_real_runs_on_ray_give_the_local_figures_and_verdicts(head, tmp_path, monkeypatch):
    monkeypatch.setenv("XLA_FLAGS", "")  # each run (local, or on Ray: forwarded): one device
    path, results = write_spec(tmp_path), {}
    for where in ("ray", "local"):
        spec = sweep.Spec.load(path, out=str(tmp_path / where))
        cluster = ray_jobs.connect(head) if where == "ray" else None
        try:
            results[where] = sweep.run(spec, cluster=cluster, say=lambda line: None)
        finally:
            if cluster is not None:
                cluster.close()
    assert sweep.report.verdicts(results["ray"]) == sweep.report.verdicts(results["local"])
    for name, local in results["local"]["variants"].items():
        on_ray = results["ray"]["variants"][name]
        assert on_ray["runs"] == local["runs"] == {0: "done", 1: "done"}
        figure = on_ray["figures"]["eval_perplexity"]["values"]
        assert figure == local["figures"]["eval_perplexity"]["values"]
