"""The ready-made manifests (configs/kubernetes/): every field is one the operator defines (PyTorchJob against the
training operator's own Python models, TrainJob against Trainer's, a Volcano Job's pods against Kubernetes' and its
own fields against the names its CRD defines), blackbox's command line is one `blackbox run` accepts, and with the
variables each operator sets, blackbox finds the coordination store where the manifest opens its port, signs with the
mounted Secret and collects within the pod's grace period."""

from __future__ import annotations

import json
import re
import types
import typing
from typing import Any

import pytest
import yaml  # the operators' models below too: dev dependencies that `make test` installs, never skipped

from blackbox.coord.topology import topology
from tests.conftest import ROOT

DIR = ROOT / "configs" / "kubernetes"
VAR = re.compile(r"\$\((\w+)\)")  # the kubelet's expansion of a container's variables in its command


def load(name: str) -> dict[str, Any]:
    """The manifest as plain data (its YAML anchors copied, so that a change to one pod's template is to that one)."""
    doc = json.loads(json.dumps(yaml.safe_load((DIR / name).read_text())))
    assert isinstance(doc, dict)
    return doc


# --- the operators' fields --------------------------------------------------------------------------------------
def swagger_unknown(value: Any, kind: str, path: str) -> list[str]:
    """The paths in `value` that the OpenAPI-generated model `kind` (Kubernetes', the training operator's) does not
    define, or whose value is not of the field's type."""
    if kind.startswith("list["):
        if not isinstance(value, list):
            return [f"{path}: not a list"]
        return [p for i, v in enumerate(value) for p in swagger_unknown(v, kind[5:-1], f"{path}[{i}]")]
    if kind.startswith("dict("):
        if not isinstance(value, dict):
            return [f"{path}: not a mapping"]
        inner = kind[5:-1].split(", ", 1)[1]
        return [p for k, v in value.items() for p in swagger_unknown(v, inner, f"{path}.{k}")]
    primitive = {"str": str, "int": int, "bool": bool, "float": (int, float), "object": object}
    if kind in primitive:
        ok = isinstance(value, primitive[kind]) and not (kind == "int" and isinstance(value, bool))
        return [] if ok else [f"{path}: not {kind}"]
    from kubeflow.training import models as kubeflow_models
    from kubernetes.client import models as k8s_models

    model = getattr(k8s_models, kind, None) or getattr(kubeflow_models, kind)
    if not isinstance(value, dict):
        return [f"{path}: not a {kind}"]
    fields = {json: attr for attr, json in model.attribute_map.items()}
    out = []
    for key, v in value.items():
        if key not in fields:
            out.append(f"{path}.{key}: not a field of {kind}")
        else:
            out.extend(swagger_unknown(v, model.openapi_types[fields[key]], f"{path}.{key}"))
    return out


def pydantic_unknown(value: Any, annotation: Any, path: str) -> list[str]:
    """The paths in `value` that the pydantic model `annotation` (Trainer's API) does not define."""
    from pydantic import BaseModel

    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        return pydantic_unknown(value, args[0], path)
    if origin is list:
        return [p for i, v in enumerate(value) for p in pydantic_unknown(v, args[0], f"{path}[{i}]")]
    if origin is dict:
        return [p for k, v in value.items() for p in pydantic_unknown(v, args[1], f"{path}.{k}")]
    if not (isinstance(annotation, type) and issubclass(annotation, BaseModel)):
        return []  # a scalar: its type is the model's own check (model_validate below)
    fields = {(f.alias or name): f for name, f in annotation.model_fields.items()}
    out = []
    for key, v in value.items():
        if key not in fields:
            out.append(f"{path}.{key}: not a field of {annotation.__name__}")
        else:
            out.extend(pydantic_unknown(v, fields[key].annotation, f"{path}.{key}"))
    return out


# Volcano publishes no Python models: its Job's own fields as its CRD defines them (volcano-sh/volcano,
# config/crd/volcano/bases/batch.volcano.sh_jobs.yaml, the v1alpha1 schema), the pods' against Kubernetes' models
VOLCANO_SPEC = {"maxRetry", "minAvailable", "minSuccess", "networkTopology", "plugins", "policies",
                "priorityClassName", "queue", "runningEstimate", "schedulerName", "tasks"}  # fmt: skip
VOLCANO_TASK = {"dependsOn", "maxRetry", "minAvailable", "name", "partitionPolicy", "policies", "replicas", "template"}
VOLCANO_POLICY = {"action", "event", "events", "exitCode", "timeout"}
VOLCANO_EVENTS = {"*", "PodPending", "PodRunning", "PodFailed", "PodEvicted", "Unknown", "TaskCompleted", "OutOfSync",
                  "CommandIssued", "JobUpdated", "TaskFailed"}  # fmt: skip


def volcano_unknown(doc: dict[str, Any]) -> list[str]:
    spec = doc["spec"]
    out = [f"spec.{k}" for k in spec if k not in VOLCANO_SPEC]
    out += [f"spec.plugins.{k}: not a list of strings" for k, v in spec.get("plugins", {}).items()
            if not (isinstance(v, list) and all(isinstance(a, str) for a in v))]  # fmt: skip
    policies = [(f"spec.policies[{i}]", p) for i, p in enumerate(spec.get("policies", []))]
    for i, task in enumerate(spec["tasks"]):
        out += [f"spec.tasks[{i}].{k}" for k in task if k not in VOLCANO_TASK]
        out += swagger_unknown(task["template"], "V1PodTemplateSpec", f"spec.tasks[{i}].template")
        policies += [(f"spec.tasks[{i}].policies[{j}]", p) for j, p in enumerate(task.get("policies", []))]
    for where, policy in policies:
        out += [f"{where}.{k}" for k in policy if k not in VOLCANO_POLICY]
        out += [f"{where}.event: {policy['event']}" for _ in [0] if policy.get("event") not in VOLCANO_EVENTS]
    return out


def test_every_field_of_the_pytorchjob_is_one_the_training_operator_defines() -> None:
    doc = load("pytorchjob.yaml")
    assert (doc["apiVersion"], doc["kind"]) == ("kubeflow.org/v1", "PyTorchJob")
    assert swagger_unknown(doc, "KubeflowOrgV1PyTorchJob", "") == []
    # AND the operator's own conventions: its container is `pytorch`, its rendezvous port `pytorchjob-port`
    for spec in doc["spec"]["pytorchReplicaSpecs"].values():
        (container,) = spec["template"]["spec"]["containers"]
        assert container["name"] == "pytorch" and "pytorchjob-port" in {p["name"] for p in container["ports"]}
    # AND the check is no rubber stamp: a misspelt field is named
    doc["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["terminationGracePeriod"] = 60
    assert swagger_unknown(doc, "KubeflowOrgV1PyTorchJob", "") == [
        ".spec.pytorchReplicaSpecs.Worker.template.spec.terminationGracePeriod: not a field of V1PodSpec"
    ]


def test_every_field_of_the_trainjob_is_one_trainer_defines() -> None:
    from kubeflow_trainer_api import models as api

    doc = load("trainjob.yaml")
    assert (doc["apiVersion"], doc["kind"]) == ("trainer.kubeflow.org/v1alpha1", "TrainJob")
    assert pydantic_unknown(doc, api.TrainerV1alpha1TrainJob, "") == []
    job = api.TrainerV1alpha1TrainJob.model_validate(doc)  # the values' types (strict ints and strings)
    assert job.spec is not None and job.spec.trainer is not None and job.spec.trainer.num_nodes == 2
    doc["spec"]["trainer"]["numProcsPerNode"] = 2
    assert pydantic_unknown(doc, api.TrainerV1alpha1TrainJob, "") == [
        ".spec.trainer.numProcsPerNode: not a field of TrainerV1alpha1Trainer"
    ]


def test_every_field_of_the_volcano_job_is_one_its_crd_or_kubernetes_defines() -> None:
    doc = load("volcano-job.yaml")
    assert (doc["apiVersion"], doc["kind"]) == ("batch.volcano.sh/v1alpha1", "Job")
    assert volcano_unknown(doc) == []
    doc["spec"]["tasks"][1]["replica"] = 1
    doc["spec"]["tasks"][0]["template"]["spec"]["containers"][0]["volumeMount"] = []
    assert volcano_unknown(doc) == ["spec.tasks[0].template.spec.containers[0].volumeMount: not a field of V1Container",
                                    "spec.tasks[1].replica"]  # fmt: skip


# --- blackbox in each --------------------------------------------------------------------------------------------
# What each operator sets in the container of pod 1 (the worker), from its source: training-operator
# pkg/controller.v1/pytorch/envvar.go (MASTER_ADDR, MASTER_PORT, WORLD_SIZE, RANK), Volcano's pytorch plugin
# (pkg/controllers/job/plugins/distributed-framework/pytorch: MASTER_ADDR <job>-master-0.<job>), Trainer's torch
# plugin (PET_*)
OPERATOR_ENV = {
    "pytorchjob.yaml": {"MASTER_ADDR": "blackbox-demo-master-0", "MASTER_PORT": "23456", "WORLD_SIZE": "2",
                        "RANK": "1"},
    "volcano-job.yaml": {"MASTER_ADDR": "blackbox-demo-master-0.blackbox-demo", "MASTER_PORT": "23456",
                         "WORLD_SIZE": "2", "RANK": "1"},
    "trainjob.yaml": {"PET_NNODES": "2", "PET_NPROC_PER_NODE": "2", "PET_NODE_RANK": "1",
                      "PET_MASTER_ADDR": "blackbox-demo-node-0-0.blackbox-demo", "PET_MASTER_PORT": "29400"},
}  # fmt: skip


def expand(text: str, env: dict[str, str]) -> str:
    return VAR.sub(lambda m: env[m.group(1)], text)


def pods(name: str) -> list[dict[str, Any]]:
    """Each pod spec of the manifest, with blackbox's container (the first)."""
    doc = load(name)
    spec = doc["spec"]
    if name == "pytorchjob.yaml":
        return [r["template"]["spec"] for r in spec["pytorchReplicaSpecs"].values()]
    if name == "volcano-job.yaml":
        return [t["template"]["spec"] for t in spec["tasks"]]
    (patch,) = spec["runtimePatches"]
    (node,) = patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]
    pod = node["template"]["spec"]["template"]["spec"]
    trainer = spec["trainer"]  # the trainer's command and env go to the runtime's `node` container
    return [{**pod, "containers": [{**pod["containers"][0], "command": trainer["command"], "env": trainer["env"]}]}]


@pytest.mark.parametrize("name", sorted(OPERATOR_ENV))
def test_blackbox_in_each_manifest_coordinates_signs_and_collects_within_the_grace_period(name: str) -> None:
    from blackbox.cli.collect import collect
    from blackbox.cli.run import run

    for pod in pods(name):
        container = pod["containers"][0]
        command = container["command"]
        env = {**OPERATOR_ENV[name], **{e["name"]: e.get("value", "") for e in container.get("env", [])}}
        # GIVEN the command as the kubelet expands it: every $(VAR) is one the operator or the container sets
        assert {v for c in command for v in VAR.findall(c)} <= set(env), command
        argv = [expand(c, env) for c in command]
        # THEN `blackbox run` accepts every option before `--` (an unknown one would land in the job's command)
        assert argv[:2] == ["blackbox", "run"]
        job = argv[argv.index("--") + 1 :]
        ctx = run.make_context("run", argv[2:])
        assert list(ctx.params["command"]) == job, ctx.params
        # AND it finds node 1 of 2 and the coordination store on the master, at torchrun's port + 1000 — a port the
        # manifest opens where the operator's headless service does not list it
        topo = topology(job, env)
        assert topo is not None and (topo.nnodes, topo.node_rank, topo.hosting) == (2, 1, False), topo
        master = env.get("MASTER_ADDR") or env["PET_MASTER_ADDR"]
        port = int(env.get("MASTER_PORT") or env["PET_MASTER_PORT"]) + 1000
        assert (topo.host, topo.port) == (master, port)
        if name != "trainjob.yaml":  # (JobSet's headless service lists no ports: each pod's are reachable)
            assert {"name": "blackbox-coord", "containerPort": port} in container["ports"]
        # AND it signs with the Secret every pod mounts, and reads the S3 credentials from a Secret, not the manifest
        secret_file = ctx.params["coord_secret_file"]
        (mount,) = [m for m in container["volumeMounts"] if secret_file.startswith(m["mountPath"] + "/")]
        (volume,) = [v for v in pod["volumes"] if v["name"] == mount["name"]]
        assert volume["secret"]["secretName"] == "blackbox-coord" and mount["readOnly"] is True
        credentials = {e["name"]: e for e in container["env"] if e["name"].startswith("AWS_") and "KEY" in e["name"]}
        assert set(credentials) == {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"}
        assert all("secretKeyRef" in e["valueFrom"] and "value" not in e for e in credentials.values())
        # AND its collection on the kubelet's SIGTERM fits the pod's grace period, with room for the job's own
        # handling and the upload
        assert float(ctx.params["grace_budget"]) * 2 <= pod["terminationGracePeriodSeconds"], (ctx.params, pod)
        # AND where the operator lets a manifest say it, a preStop hook asks that same `blackbox run` (PID 1) for the
        # preemption's evidence before the kubelet's SIGTERM, with options `blackbox collect` accepts
        if name != "trainjob.yaml":  # (Trainer's container patch has no `lifecycle`: docs/kubernetes.md)
            hook = container["lifecycle"]["preStop"]["exec"]["command"]
            assert hook[:2] == ["blackbox", "collect"], hook
            params = collect.make_context("collect", hook[2:]).params
            assert params["preemption"] is True and params["pid"] == 1, params
            # (the hook's wait and the SIGTERM's own handling after it both fit in the grace period)
            assert params["budget"] + float(ctx.params["grace_budget"]) * 2 <= pod["terminationGracePeriodSeconds"]


def test_the_docs_name_every_manifest() -> None:
    text = (ROOT / "docs" / "kubernetes.md").read_text()
    assert {p.name for p in DIR.glob("*.yaml")} == {"pytorchjob.yaml", "trainjob.yaml", "volcano-job.yaml"}
    assert all(f"configs/kubernetes/{p.name}" in text for p in DIR.glob("*.yaml"))
