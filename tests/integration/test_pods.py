"""The PyTorchJob manifest's own container (configs/kubernetes/pytorchjob.yaml), run in pods made of Linux namespaces
(tests/pods.py: blackbox as each pod's PID 1, no CAP_SYS_PTRACE, a seccomp filter refusing ptrace and
process_vm_readv, the operator's variables, `MASTER_ADDR` a name only the pods resolve) with the suite's S3 server on
the host outside them (issue 49's proof): a two-pod job whose pod-1 rank hangs leaves both pods' bundles in storage
and one merged verdict naming the rank and its pod, the gallery's verdict; `kubectl exec … blackbox collect` gets
every rank's stack without ptrace; a pod's orphans are reaped; a pod deleted with a 10 s grace has its bundle in
storage before the SIGKILL, recorded as a preemption."""

from __future__ import annotations

import json
import re
import subprocess
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
import yaml

from tests.conftest import BIN, ROOT, job_env, wait_for
from tests.integration.services import BUCKET, KEY_ID, SECRET, S3Server, seaweed_s3
from tests.integration.test_multinode import report
from tests.pods import Pods, in_pod_pid, unavailable

pytestmark = pytest.mark.xdist_group("pods")  # one bridge, one S3 server for the module
JOB = "blackbox-demo"  # the manifest's metadata.name: the operator names the pods and their services after it
PODS = [f"{JOB}-master-0", f"{JOB}-worker-0"]
ENDPOINT_NAME = "minio.storage.svc"  # the manifest's in-cluster S3 endpoint's host: the pods resolve it to the host
GALLERY = json.loads((ROOT / "scripts" / "scenarios" / "scenarios.json").read_text())
VAR = re.compile(r"\$\((\w+)\)")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Pods, S3Server]]:
    why = unavailable()
    if why:
        pytest.skip(f"pods cannot be made here: {why}")
    root = tmp_path_factory.mktemp("pods")
    with Pods(root, PODS, (ENDPOINT_NAME,)) as pods, seaweed_s3(root / "s3", ip=pods.host_ip) as s3:
        yield pods, s3


def container() -> dict[str, Any]:
    doc = yaml.safe_load((ROOT / "configs" / "kubernetes" / "pytorchjob.yaml").read_text())
    spec: dict[str, Any] = doc["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]
    return spec


def pod_env(pods: Pods, s3: S3Server, index: int, world: int, secrets: dict[str, str]) -> dict[str, str]:
    """The container's environment in pod `index`: what the operator sets (PyTorchJob: the master's service name and
    port, the pods' count and this pod's index), the manifest's own variables (the Secrets' values resolved) and the
    image's (its Python on PATH); the pod's disk holds blackbox's home."""
    port = s3.endpoint.rsplit(":", 1)[1]
    env = job_env(MASTER_ADDR=PODS[0], MASTER_PORT="23456", WORLD_SIZE=str(world), RANK=str(index),
                  PYTHONUNBUFFERED="1", KUBERNETES_SERVICE_HOST="10.96.0.1", HOSTNAME=PODS[index],
                  BLACKBOX_HOME=str(pods.pods[PODS[index]].workdir / "home"))  # fmt: skip
    for k in [k for k in env if k.startswith("AWS_")]:
        del env[k]
    for var in container()["env"]:
        if "value" in var:  # the in-cluster endpoint: its name as the manifest has it, at the test server's port
            env[var["name"]] = re.sub(r":\d+$", f":{port}", var["value"]).replace("minio.storage.svc", ENDPOINT_NAME)
        else:
            ref = var["valueFrom"]["secretKeyRef"]
            env[var["name"]] = secrets[f"{ref['name']}/{ref['key']}"]
    return env


def command(env: dict[str, str], scenario: list[str], options: list[str]) -> list[str]:
    """The manifest's command, as the kubelet expands it, with the test's bucket, this gallery row's scenario and
    the short timeouts the rule under test needs: the image's `scripts/` is the repository's."""
    argv = [VAR.sub(lambda m: env[m.group(1)], str(a)) for a in container()["command"]]
    argv = [f"s3://{BUCKET}/blackbox/" if a.startswith("s3://") else a for a in argv]
    script = argv.index("scripts/scenarios/train.py")
    return [argv[0], argv[1], *options, *argv[2 : script + 1], *scenario]


def start_job(pods: Pods, s3: S3Server, tmp_path: Path, scenario: list[str], options: list[str],
              names: list[str] = PODS, **extra: str) -> dict[str, Any]:  # fmt: skip
    """The job's pods, started as the operator starts them (the Secrets mounted where the manifest mounts them);
    `extra`: the scenario's own variables."""
    coord = tmp_path / "secret-blackbox-coord"
    coord.mkdir(exist_ok=True)
    (coord / "secret").write_text("c0ord-" + "5" * 40)
    secrets = {"blackbox-s3/access-key": KEY_ID, "blackbox-s3/secret-key": SECRET}
    mount = container()["volumeMounts"][0]["mountPath"]
    procs = {}
    for i, name in enumerate(names):
        workdir = pods.pods[name].workdir
        (workdir / "scripts").unlink(missing_ok=True)
        (workdir / "scripts").symlink_to(ROOT / "scripts")  # the image's code
        env = {**pod_env(pods, s3, i, len(names), secrets), "PATH": f"{BIN}:/usr/bin:/bin", **extra}
        argv = command(env, scenario, options)
        with (workdir / "stdout").open("w") as out, (workdir / "stderr").open("w") as err:
            procs[name] = pods.start(name, argv, env, {mount: coord}, stdout=out, stderr=err)
    return procs


def stderr(pods: Pods, name: str) -> str:
    return (pods.pods[name].workdir / "stderr").read_text()


def uploaded(text: str) -> list[str]:
    return [line.split(": ", 2)[2] for line in text.splitlines() if line.startswith("blackbox: bundle uploaded: ")]


def expected(row: str) -> dict[str, Any]:
    """The gallery row's verdict, for a job of two pods of two ranks whose bad rank is pod 1's second (rank 3)."""
    verdict = dict(GALLERY[row]["verdict"])
    verdict["suspect_ranks"] = [3]
    return verdict


@pytest.mark.timeout(300)
@pytest.mark.parametrize("row", ["data-hang", "ddp-stopped"])
def test_a_two_pod_job_whose_pod_1_rank_hangs_is_one_verdict_read_from_storage(
    cluster: tuple[Pods, S3Server], tmp_path: Path, row: str
) -> None:
    pods, s3 = cluster
    # GIVEN the manifest's two pods, the gallery row's failure on pod 1's second rank (rank 3)
    scenario = [str(a) for a in GALLERY[row]["args"]]
    scenario[1] = "3"
    procs = start_job(pods, s3, tmp_path, scenario, ["--stall-timeout", "6", "--poll-interval", "0.5",
                                                     "--kill-grace", "5"])  # fmt: skip
    # WHEN it runs to its end
    codes = {name: proc.wait(240) for name, proc in procs.items()}
    # THEN both pods' jobs were ended, each after uploading its bundle to the job's prefix in storage
    errs = {name: stderr(pods, name) for name in PODS}
    assert codes == dict.fromkeys(PODS, 86), errs
    # (each waited for the other's evidence before ending its part: ended at once, one pod's ranks close their
    # sockets under the other's collection, whose waiting rank then raises "connection closed" into its bundle)
    assert all("waiting 8 s for the other 1 node(s) to take their evidence" in e for e in errs.values()), errs
    urls = {name: uploaded(errs[name]) for name in PODS}
    assert all(len(u) == 1 for u in urls.values()), errs
    prefixes = {u[0].rsplit("/", 2)[0] for u in urls.values()}
    assert len(prefixes) == 1, urls
    (run_url,) = prefixes
    for pod in pods.pods.values():  # the pods' disks are gone with them
        for run in (pod.workdir / "blackbox-runs").glob("*"):
            for bundle in (run / "bundles").glob("*"):
                bundle.unlink()
    # AND one report of the job's prefix, from outside the pods, merges them: the gallery's verdict, naming the
    # rank and its pod
    with pytest.MonkeyPatch.context() as mp:
        for k, v in s3.env().items():
            mp.setenv(k, v)
        merged = report(run_url)  # type: ignore[arg-type]
    verdict = {k: merged["verdict"][k] for k in expected(row)}
    assert verdict == expected(row), (merged["verdict"], [f["text"] for f in merged["findings"]])
    assert sorted(r["rank"] for r in merged["ranks"]) == [0, 1, 2, 3]
    hosts = {r["rank"]: r["node"] for r in merged["ranks"]}
    assert hosts == {0: PODS[0], 1: PODS[0], 2: PODS[1], 3: PODS[1]}, hosts
    assert f"rank 3 on {PODS[1]}" in " ".join(merged["next_actions"]).lower(), merged["next_actions"]
    # AND without ptrace every rank has its stack — read by py-spy without suspending it, and its own dump — and
    # the refusal is said once per pod, with the fix, and in the report
    assert all(e["stack"] and e["complete"] for e in merged["evidence"]), merged["evidence"]
    for name in PODS:
        assert errs[name].count("py-spy may not suspend the ranks here (ptrace refused)") == 1, errs[name]
    texts = [f["text"] for f in merged["findings"]]
    assert any(t.startswith("stacks from outside (py-spy) ") and "could not be suspended (ptrace refused)" in t
               for t in texts), texts  # fmt: skip


def zombies_in(pid1: int) -> list[int]:
    """The zombies of the PID namespace whose first process is `pid1` (host pids)."""
    target = Path(f"/proc/{pid1}/ns/pid").readlink()
    out = []
    for p in psutil.process_iter(["status"]):
        try:
            if Path(f"/proc/{p.pid}/ns/pid").readlink() == target and p.info["status"] == psutil.STATUS_ZOMBIE:
                out.append(p.pid)
        except OSError:
            pass
    return out


GRACE_S = 10.0  # the pod's terminationGracePeriodSeconds, short here


@pytest.mark.timeout(300)
def test_in_a_pod_kubectl_exec_collects_without_ptrace_orphans_are_reaped_and_a_deletion_is_a_preemption(
    cluster: tuple[Pods, S3Server], tmp_path: Path
) -> None:
    pods, s3 = cluster
    master = PODS[0]
    # GIVEN one pod of the manifest's job (a job of one pod), its two ranks stepping steadily
    pod = pods.pods[master]
    runs = pod.workdir / "blackbox-runs"
    earlier = set(runs.glob("*"))  # the pod's disk holds the module's earlier jobs' runs
    job = start_job(pods, s3, tmp_path, ["steady", "1"], [], names=[master], BB_STEPS="5000")
    proc = job[master]
    wait_for(
        lambda: any((run / "ranks" / "1" / "heartbeat").exists() for run in set(runs.glob("*")) - earlier),
        120,
        "the ranks to start",
    )
    pid1 = pod.pid1()
    ranks = [p for p in psutil.Process(pid1).children(recursive=True) if "train.py" in " ".join(p.cmdline())
             and p.environ().get("LOCAL_RANK") is not None]  # fmt: skip
    assert len(ranks) == 2, ranks
    env = job_env(PATH=f"{BIN}:/usr/bin:/bin")
    # WHEN `kubectl exec POD -- blackbox collect PID` names a rank as the pod numbers it
    res = pods.exec(master, ["blackbox", "collect", str(in_pod_pid(ranks[0].pid))], env)
    # THEN the pod's `blackbox run` (its PID 1) collected: every rank's stack, without ptrace
    assert res.returncode == 0, res.stderr
    assert "runs under `blackbox run` (pid 1): asking it to collect" in res.stderr, res.stderr
    (run,) = set(runs.glob("*")) - earlier
    (bundle,) = (run / "bundles").glob("*-manual.tar.gz")
    with tarfile.open(bundle) as tar:
        member = tar.extractfile("manifest.json")
        assert member is not None
        manifest = json.load(member)
    evidence = manifest["collection"]["evidence"]
    assert sorted(evidence) == ["0", "1"] and all(e["stack"] for e in evidence.values()), evidence
    (pyspy,) = [s for s in manifest["steps"] if s["name"] == "py-spy"]
    assert "could not be suspended (ptrace refused)" in pyspy["detail"], pyspy
    # WHEN processes that `kubectl exec` starts leave orphans in the pod
    res = pods.exec(master, ["sh", "-c", "for i in 1 2 3 4 5 6; do sleep 0.3 & done"], env)
    assert res.returncode == 0, res.stderr
    # THEN the pod's PID 1 reaps them: no zombie is left
    time.sleep(2)
    assert not zombies_in(pid1)
    # WHEN the pod is deleted: the kubelet's SIGTERM to PID 1, and SIGKILL GRACE_S later (the manifest's own grace
    # budget, 15 s, is what blackbox may take at most; its collection takes far less)
    psutil.Process(pid1).terminate()
    sigterm = time.time()
    try:
        proc.wait(GRACE_S)
        killed = False
    except subprocess.TimeoutExpired:
        killed = True
        pods.kill(master)
    # THEN its bundle was in storage before the SIGKILL, recorded as a preemption
    events = [json.loads(line) for line in (run / "events.jsonl").read_text().splitlines() if line.strip()]
    (written,) = [e for e in events if e["event"] == "bundle" and e["trigger"] == "signal"]
    (upload,) = [e for e in events if e["event"] == "upload" and e["bundle"] == written["path"]]
    assert upload["ok"] is True and float(upload["t"]) - sigterm < GRACE_S, (upload, stderr(pods, master)[-3000:])
    assert s3.fs().exists(upload["url"].removeprefix("s3://")), upload
    (preemption,) = [e for e in events if e["event"] == "preemption"]
    assert preemption["cause"] == "the pod is being deleted, preempted or drained (Kubernetes)", preemption
    assert not [e for e in events if e["event"] in ("stall", "rank_death", "exception") and not e.get("expected")]
    assert not killed, stderr(pods, master)[-3000:]
