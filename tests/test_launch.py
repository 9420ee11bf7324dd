"""What a rank's launcher and its pod tell it (probes/launch.py): the job's name, the same on
every node, and the Kubernetes namespace and pod a rank runs in."""

from __future__ import annotations

import os
import shutil
import subprocess
import time

import pytest

from loadertop.probes.launch import job_id, kubernetes_pod


def test_a_jobs_name_is_the_same_on_every_node():
    assert job_id({"TORCHELASTIC_RUN_ID": "exp7", "SLURM_JOB_ID": "9"}, "a", 1) == "run:exp7"
    assert job_id({"TORCHELASTIC_RUN_ID": "none", "SLURM_JOB_ID": "9"}, "a", 1) == "slurm:9"
    both = {"MASTER_ADDR": "10.0.0.5", "MASTER_PORT": "29500", "WORLD_SIZE": "16", "LOCAL_WORLD_SIZE": "8"}
    assert job_id(both, "node-a", 1) == job_id(both, "node-b", 2) == "10.0.0.5:29500"
    # Every node's single-node job has its own 127.0.0.1:29500: named with its host.
    one = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500", "WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "8"}
    assert job_id(one, "node-a", 1) != job_id(one, "node-b", 1)
    assert job_id({}, "node-a", 77) == "node-a/77"


def test_a_jobs_name_carries_its_owner_so_copying_its_environment_joins_nothing():
    # The fourth review: another user's process with a copy of TORCHELASTIC_RUN_ID and RANK
    # joined its series to the victim's job (19 duplicate series, its verdict turned).
    env = {"TORCHELASTIC_RUN_ID": "exp7", "RANK": "1"}
    victim, impostor = job_id(env, "a", 1, uid=0), job_id(env, "a", 2, uid=65534)
    assert victim == "run:exp7@uid0" and impostor == "run:exp7@uid65534"
    # In a pod: its namespace too (pods of many tenants run as uid 0).
    assert job_id(env, "a", 1, uid=0, namespace="research") == "run:exp7@research/uid0"
    assert job_id(env, "a", 1, uid=0, namespace="research") != job_id(env, "a", 1, uid=0, namespace="other")
    # The same owner on every node: one job across nodes still.
    assert job_id(env, "node-a", 1, uid=1000) == job_id(env, "node-b", 9, uid=1000)
    assert job_id({}, "a", 77, uid=1000) == "a/77"  # a job pid is this host's already


def test_a_rank_in_a_kubernetes_pod_is_named_by_its_namespace_and_pod(tmp_path):
    pid = 4242
    folder = tmp_path / str(pid) / "root" / "var/run/secrets/kubernetes.io/serviceaccount"
    folder.mkdir(parents=True)
    (folder / "namespace").write_text("vision-team\n")
    k8s = {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "HOSTNAME": "resnet-worker-3"}
    assert kubernetes_pod(k8s, pid, str(tmp_path)) == ("vision-team", "resnet-worker-3")
    # The downward API's names win; no service account mounted: the namespace is unknown.
    assert kubernetes_pod({**k8s, "POD_NAME": "p", "POD_NAMESPACE": "ns"}, pid, str(tmp_path)) == ("ns", "p")
    assert kubernetes_pod(k8s, 1, str(tmp_path)) == (None, "resnet-worker-3")
    assert kubernetes_pod({"HOSTNAME": "gpu-node-7"}, pid, str(tmp_path)) == (None, None)  # not in a pod


def _stat(comm: str):
    from loadertop.probes.procfs import Stat

    return Stat(pid=10, comm=comm, state="S", ppid=1, cpu_ticks=0, num_threads=1, start_ticks=1, rss_bytes=0,
                exit_code=None)


def test_a_launcher_is_torchrun_itself_never_a_shell_that_quotes_it():
    # The review's node agent served duplicate series: a `bash -c "torchrun ..."` wrapper was taken
    # for the launcher, and so the agent under it for a rank.
    from loadertop.probes.discovery import launches_ranks

    assert launches_ranks(_stat("pt_elastic"), [])
    assert launches_ranks(_stat("torchrun"), ["/usr/local/bin/torchrun", "--nproc_per_node=2", "train.py"])
    assert launches_ranks(_stat("python3"), ["/usr/bin/python3", "/usr/local/bin/torchrun", "train.py"])
    assert launches_ranks(_stat("python"), ["python", "-m", "torch.distributed.run", "train.py"])
    assert launches_ranks(_stat("python"), ["python", "-u", "-m", "torch.distributed.launch", "train.py"])
    assert not launches_ranks(_stat("bash"), ["bash", "-c", "torchrun --nproc_per_node=2 train.py"])
    assert not launches_ranks(_stat("python"), ["python", "train.py", "--note", "torchrun"])
    assert not launches_ranks(_stat("loadertop"), ["/usr/bin/python3", "/usr/local/bin/loadertop", "export", "--all"])


def test_loadertop_itself_is_no_job_but_its_demo_is():
    from loadertop.probes.discovery import runs_loadertop

    assert runs_loadertop(["/usr/local/bin/loadertop", "export", "--all"])
    assert runs_loadertop(["/usr/bin/python3", "/usr/local/bin/loadertop", "export", "--all"])
    assert runs_loadertop(["python", "-m", "loadertop", "snapshot", "12"])
    assert not runs_loadertop(["python", "-m", "loadertop.demo.job", "--workers", "1"])
    assert not runs_loadertop(["python", "train.py"])


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("runuser"), reason="needs root and runuser")
def test_another_users_copy_of_a_jobs_environment_is_another_job():
    # Two real processes with the same TORCHELASTIC_RUN_ID, one of them another user's: the
    # sampler names them two jobs, by the uid the kernel gives each.
    from loadertop.sampler import Sampler

    env = {**os.environ, "TORCHELASTIC_RUN_ID": "exp7", "WORLD_SIZE": "2", "MASTER_ADDR": "10.0.0.5",
           "MASTER_PORT": "29500"}
    mine = subprocess.Popen(["sleep", "60"], env={**env, "RANK": "0"})
    theirs = subprocess.Popen(["runuser", "-u", "nobody", "--", "sleep", "60"], env={**env, "RANK": "1"})
    sampler = None
    impostor: list[int] = []
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:  # runuser's child: the sleep itself, as nobody
            impostor = [int(p) for p in subprocess.run(["pgrep", "-u", "nobody", "-P", str(theirs.pid)],
                                                       capture_output=True, text=True).stdout.split()]
            if impostor:
                break
            time.sleep(0.05)
        assert impostor, "nobody's sleep did not start"
        sampler = Sampler([mine.pid, impostor[0]], interval_s=0.2)
        jobs = {t.pid: t.job for t in sampler.tick().trainers}
        assert jobs == {mine.pid: "run:exp7@uid0", impostor[0]: "run:exp7@uid65534"}, jobs
    finally:
        if sampler is not None:
            sampler.close()
        for pid in impostor:  # runuser's child outlives runuser killed
            try:
                os.kill(pid, 9)
            except ProcessLookupError:
                pass
        for p in (mine, theirs):
            p.kill()
            p.wait()
