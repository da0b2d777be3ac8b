"""Where this node stands in a multi-node job: node rank, node count and the coordinator's address, read from
the torchrun command line blackbox wraps, torchrun's PET_* variables or Slurm's environment, or `--coord`.
Imports the stdlib, blackbox.errors and the host adapter (this machine's addresses)."""

from __future__ import annotations

import ipaddress
import re
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Optional

from ..adapters import host as host_adapter
from ..errors import BlackboxError

TORCHRUN_MASTER_PORT = 29500  # torchrun's defaults, when the command line names a host but no port
TORCHRUN_RDZV_PORT = 29400
PORT_OFFSET = 1000  # the coordinator listens on torchrun's port + 1000 (- 1000 above 64535): see the README

# torchrun options that take no value; every other option before the script takes one
_NO_VALUE = {"--standalone", "--no-python", "--no_python", "--run-path", "--run_path", "-m", "--module",
             "--virtual-local-rank", "--virtual_local_rank"}  # fmt: skip


@dataclass(frozen=True)
class Topology:
    nnodes: int
    node_rank: Optional[int]  # None: an elastic rendezvous assigns it; the host is found by address
    host: str  # the coordinator's address
    port: int
    hosting: bool  # this node's supervisor serves the store
    job_key: str  # what all nodes of this job agree on, and no other job shares: the store's namespace
    source: str  # how it was learned, for the events log

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def node_label(self) -> str:
        return f"node {self.node_rank}" if self.node_rank is not None else "this node"


def torchrun_args(argv: list[str]) -> Optional[dict[str, str]]:
    """The launcher options of a torchrun command line (`torchrun …`, `python -m torch.distributed.run …`),
    normalised to dashes, up to the training script; None when the command is not torchrun."""
    if not argv:
        return None
    name = argv[0].rsplit("/", 1)[-1]
    if name == "torchrun":
        rest = argv[1:]
    elif re.fullmatch(r"python[\d.]*", name) and argv[1:3] in (["-m", "torch.distributed.run"],
                                                               ["-m", "torch.distributed.launch"]):  # fmt: skip
        rest = argv[3:]
    else:
        return None
    found: dict[str, str] = {}
    i = 0
    while i < len(rest):
        token = rest[i]
        if not token.startswith("-") or token == "--":
            break
        key, eq, value = token.partition("=")
        key = "--" + key.lstrip("-").replace("_", "-") if key.startswith("--") else key
        if eq:
            found[key] = value
        elif token in _NO_VALUE or key in _NO_VALUE:
            found[key] = ""
        elif i + 1 < len(rest):
            found[key] = rest[i + 1]
            i += 1
        i += 1
    return found


def first_host(nodelist: str) -> Optional[str]:
    """The first host of a Slurm node list: `gpu[003-010,012],cpu1` -> `gpu003`."""
    m = re.match(r"\s*([^,\[\s]+)(?:\[([^\]]+)\])?", nodelist)
    if not m:
        return None
    prefix, ranges = m.group(1), m.group(2)
    if not ranges:
        return prefix
    first = ranges.split(",")[0].split("-")[0]
    return prefix + first


def _max_nodes(value: str) -> int:
    """`--nnodes 4` or the elastic `--nnodes 2:4` (the most nodes the job may have)."""
    return int(value.split(":")[-1])


def _split_endpoint(text: str, default_port: int) -> tuple[str, int]:
    text = text.strip()
    if text.startswith("["):  # [v6-address]:port
        host, _, rest = text[1:].partition("]")
        return host, int(rest[1:]) if rest.startswith(":") else default_port
    host, colon, port = text.rpartition(":")
    if not colon or (host.count(":") and not host.startswith("[")):  # no port, or a bare IPv6 address
        return text, default_port
    return host, int(port)


def derived_port(launcher_port: int) -> int:
    port = launcher_port + PORT_OFFSET
    return port if port <= 65535 else launcher_port - PORT_OFFSET


def is_local_address(host: str) -> bool:
    """Whether `host` names this machine (the c10d rendezvous host of an elastic job)."""
    try:
        wanted = {str(info[4][0]) for info in socket.getaddrinfo(host, None)}
    except OSError:
        return False
    if any(ipaddress.ip_address(str(a).split("%")[0]).is_loopback for a in wanted):
        return True
    mine: set[str] = set()
    for name in {socket.gethostname(), socket.getfqdn()}:
        try:
            mine |= {str(info[4][0]) for info in socket.getaddrinfo(name, None)}
        except OSError:
            continue
    mine |= set(host_adapter.ip_addresses())
    return bool(wanted & mine)


def topology(argv: list[str], env: Mapping[str, str], coord: str = "", coord_port: int = 0) -> Optional[Topology]:
    """This node's place in a multi-node job, or None for a single-node job (or `--coord off`). `coord`
    ("HOST:PORT") overrides the address; `coord_port` (0: derived) the port. Raises BlackboxError for a
    command line whose node options cannot be read (the supervisor says it and runs the job uncoordinated)."""
    if coord.strip().lower() == "off":
        return None
    args = torchrun_args(argv) or {}

    def opt(name: str) -> Optional[str]:
        value = args.get(name)
        if value is None:
            value = env.get("PET_" + name.lstrip("-").replace("-", "_").upper())
        return value

    try:
        nnodes_text, node_text = opt("--nnodes"), opt("--node-rank")
        source = "torchrun's options"
        if nnodes_text is None and env.get("SLURM_NNODES"):
            # one task a node (torchrun in each), or several (srun starts every rank): one supervisor a node either
            # way, the node's tasks share it (supervisor.node)
            nnodes_text = env.get("SLURM_STEP_NUM_NODES") or env.get("SLURM_NNODES")
            node_text, source = env.get("SLURM_NODEID"), "Slurm's environment"
        if opt("--standalone") is not None and not coord:
            return None
        nnodes = _max_nodes(nnodes_text) if nnodes_text else 1
        node_rank = int(node_text) if node_text not in (None, "") else None
    except ValueError:
        raise BlackboxError(
            f"Cannot read the job's node count and node rank (`--nnodes {args.get('--nnodes')}`, "
            f"`--node-rank {args.get('--node-rank')}`).",
            hint="Pass --coord off to run without multi-node coordination.",
        ) from None
    if nnodes <= 1 and not coord:
        return None
    endpoint, launcher_port = opt("--rdzv-endpoint"), TORCHRUN_RDZV_PORT
    if not endpoint and opt("--master-addr"):
        endpoint = f"{opt('--master-addr')}:{opt('--master-port') or TORCHRUN_MASTER_PORT}"
        launcher_port = TORCHRUN_MASTER_PORT
    nodelist = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST")
    if not endpoint and nodelist:
        first = first_host(nodelist)
        endpoint = f"{first}:{env.get('MASTER_PORT') or TORCHRUN_MASTER_PORT}" if first else None
        launcher_port = TORCHRUN_MASTER_PORT
    if not endpoint and env.get("MASTER_ADDR"):
        endpoint = f"{env['MASTER_ADDR']}:{env.get('MASTER_PORT') or TORCHRUN_MASTER_PORT}"
    try:
        if coord:
            host, port = _split_endpoint(coord, 0)
            source = "--coord"
            if not port:
                raise ValueError(coord)
        elif endpoint:
            host, lport = _split_endpoint(endpoint, launcher_port)
            port = coord_port or derived_port(lport)
        else:  # torchrun's own default rendezvous: 127.0.0.1 on its default master port
            host, port = "127.0.0.1", coord_port or derived_port(TORCHRUN_MASTER_PORT)
        if not 0 < port < 65536:
            raise ValueError(port)
    except ValueError:
        raise BlackboxError(
            f"Cannot read a coordinator address from `{coord or endpoint}`.",
            hint="--coord takes HOST:PORT, for example --coord node001:30500.",
        ) from None
    hosting = node_rank == 0 if node_rank is not None else is_local_address(host)
    parts = (env.get("SLURM_JOB_ID"), env.get("SLURM_STEP_ID"), opt("--rdzv-id"), endpoint)
    job_key = ":".join(p for p in parts if p) or f"{host}:{port}"
    return Topology(nnodes, node_rank, host, port, hosting, job_key, source)
