"""Configuration in one place: every option's name, default, parser and help, resolved as
flag > BLACKBOX_* env var > TOML config file > default. Imports only the stdlib and blackbox.errors."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Callable, Optional, Union

from .errors import BlackboxError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

ENV_CONFIG = "BLACKBOX_CONFIG"
RUNS_DIR = "blackbox-runs"  # where `blackbox run` makes a run directory when --run-dir is not given
AUTO = "auto"


def working_directory() -> str:
    """The directory `blackbox run` was started in; one sentence when it no longer exists (removed under a shell that
    still stands in it), where every relative path and the run directory would otherwise fail later."""
    try:
        return os.getcwd()
    except FileNotFoundError:
        raise BlackboxError(
            "The working directory of `blackbox run` no longer exists: it was removed after the shell entered it.",
            hint="`cd` to a directory that exists and run the command again.",
        ) from None


def _seconds(value: Any) -> float:
    seconds = float(value)
    if not seconds > 0 or seconds != seconds or seconds == float("inf"):
        raise ValueError(value)
    return seconds


def _ratio_or_off(value: Any) -> float:
    """A factor above 1, or 0 for off."""
    number = float(value)
    if number != number or not (number == 0 or 1 < number < float("inf")):
        raise ValueError(value)
    return number


def _seconds_or_off(value: Any) -> float:
    number = float(value)
    if number != number or not 0 <= number < float("inf"):
        raise ValueError(value)
    return number


def _seconds_or_auto(value: Any) -> Union[float, str]:
    if isinstance(value, str) and value.strip().lower() == AUTO:
        return AUTO
    return _seconds(value)


def _on_stall(value: Any) -> str:
    text = str(value).strip().lower()
    if text not in ("kill", "keep"):
        raise ValueError(value)
    return text


def _count(value: Any) -> int:
    number = int(value)
    if number < 0 or number != float(value):
        raise ValueError(value)
    return number


def _flag(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off"):
        return False
    raise ValueError(value)


def _path(value: Any) -> str:
    text = str(value)
    if not text:
        raise ValueError(value)
    return os.path.expanduser(text)


def _text(value: Any) -> str:
    return str(value)


def _coord(value: Any) -> str:
    text = str(value).strip()
    if text and text.lower() != "off" and not (":" in text and text.rpartition(":")[2].isdigit()):
        raise ValueError(value)
    return text


def _port(value: Any) -> Union[int, str]:
    if isinstance(value, str) and value.strip().lower() == AUTO:
        return AUTO
    port = int(value)
    if not 0 < port < 65536 or port != float(value):
        raise ValueError(value)
    return port


def _url(value: Any) -> str:
    text = str(value)
    if text and not text.startswith(("http://", "https://")):
        raise ValueError(value)
    return text


STORAGE_SCHEMES = ("s3", "s3a", "gs", "gcs", "az", "abfs", "abfss", "file")  # blackbox.storage.urls.BACKENDS


def _storage(value: Any) -> str:
    """A storage URL (s3://bucket/prefix, gs://, az://, file://) or a directory on a shared filesystem."""
    text = str(value).strip()
    scheme, sep, rest = text.partition("://")
    if sep and scheme.lower() in STORAGE_SCHEMES and rest.strip("/"):
        return text.rstrip("/")
    if not text or sep:
        raise ValueError(value)
    return os.path.abspath(os.path.expanduser(text))


def _port_or_off(value: Any) -> int:
    port = int(value)
    if not 0 <= port < 65536 or port != float(value):
        raise ValueError(value)
    return port


@dataclass(frozen=True)
class Option:
    name: str  # attribute and config-file key
    parse: Callable[[Any], Any]
    default: Any
    expects: str  # for the error sentence: "a number of seconds"
    help: str

    @property
    def env(self) -> str:
        return "BLACKBOX_" + self.name.upper()

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")


RUN_OPTIONS: tuple[Option, ...] = (
    Option("run_dir", _path, None, "a directory path",
           "Where the run's console log, events, heartbeats and bundles go [default: ./blackbox-runs/RUN_ID]."),
    Option("stall_timeout", _seconds_or_auto, AUTO, "a number of seconds or `auto`",
           "Seconds in which nothing moves on any rank (no step, batch, forward call, Python stack change or I/O) "
           "before the job counts as stalled; `auto` = max(60 s, 5 x slowest step) once 5 steps are done."),
    Option("startup_timeout", _seconds, 1800.0, "a number of seconds",
           "Stall timeout before a rank's first step (with `auto`: before its 5th): start-up, data, compilation."),
    Option("first_batch_timeout", _seconds, 300.0, "a number of seconds",
           "Before its first step, a rank parked in `data` or `checkpoint` while another rank has already taken a "
           "batch is judged by this timeout, not the start-up one: its peers already wait for it."),
    Option("checkpoint_timeout", _seconds, 1800.0, "a number of seconds",
           "How long a rank in the `checkpoint` phase may keep working without a step (its peers waiting for it) "
           "before the endless-loop rule looks at it, when longer than --busy-timeout."),
    Option("eval_timeout", _seconds, 1800.0, "a number of seconds",
           "How long a rank in the `eval` phase may keep working without a step (its peers waiting for it) before "
           "the endless-loop rule looks at it, when longer than --busy-timeout."),
    Option("busy_timeout", _seconds, 1800.0, "a number of seconds",
           "The endless-loop rule: a rank that keeps moving (its Python stack, forward calls, I/O) but takes no "
           "step or batch for this long is collected as a `busy` incident (an endless loop, a retry storm)."),
    Option("on_busy", _on_stall, "keep", "`kill` or `keep`",
           "After collecting a `busy` incident: `keep` leaves the job running (it may still be working); `kill` "
           "ends it as after a stall."),
    Option("frozen_timeout", _seconds, 120.0, "a number of seconds",
           "Seconds a live rank's liveness thread may stay silent (GIL held, process stopped), with no I/O of its "
           "own and nothing moving on the other ranks, before it is a `frozen` hang (ended like a stall)."),
    Option("on_stall", _on_stall, "kill", "`kill` or `keep`",
           "After collecting a stall: `kill` ends the job so the scheduler can requeue it; `keep` leaves it "
           "running for a human to attach."),
    Option("poll_interval", _seconds, 1.0, "a number of seconds", "Seconds between two reads of the heartbeats."),
    Option("kill_grace", _seconds, 30.0, "a number of seconds",
           "Seconds between SIGTERM and SIGKILL when blackbox ends the job."),
    Option("dump_timeout", _seconds, 5.0, "a number of seconds",
           "Seconds a collection waits for the ranks' own dumps (stacks, flight recorder, memory snapshot)."),
    Option("collect_budget", _seconds, 60.0, "a number of seconds",
           "Seconds one whole collection may take; what is not done by then is marked in the manifest and skipped."),
    Option("grace_budget", _seconds, 15.0, "a number of seconds",
           "Seconds the collection may take on a SIGTERM from outside the job (a pod deleted, preempted or drained: "
           "the kubelet's grace period is 30 s by default), before blackbox passes the signal on; the job's own "
           "handler and the bundle's upload get the rest of the grace period."),
    Option("pyspy_native", _flag, False, "`true` or `false`",
           "Add native (C/C++) frames to the py-spy stacks (`py-spy dump --native`: about 1 s a process)."),
    Option("pyspy_locals", _flag, False, "`true` or `false`",
           "Add local variables to the py-spy stacks (values are redacted; they may still hold data)."),
    Option("gpu_idle_timeout", _seconds, 600.0, "a number of seconds",
           "Every GPU of the job at 0 % utilisation this long: supporting evidence of a stall, and a trigger of its "
           "own when no rank has a heartbeat (the recorder could not activate)."),
    Option("on_incident", _text, "", "a shell command",
           "Run this command after each bundle is written, with BLACKBOX_BUNDLE, BLACKBOX_RUN_ID, BLACKBOX_NODE, "
           "BLACKBOX_TRIGGER, BLACKBOX_CATEGORY, BLACKBOX_SUSPECTS and BLACKBOX_SUMMARY in its environment "
           "(60 s at most; its failure never touches the job)."),
    Option("notify_url", _url, "", "an http:// or https:// URL",
           "POST the verdict of each bundle as JSON to this webhook (10 s timeout, one retry; failures are logged)."),
    Option("status_interval", _seconds, 0.0, "a number of seconds",
           "Every this many seconds print a status line to stderr: each rank's step, steps/s and phase, and each "
           "GPU's temperature and utilisation (0: off)."),
    Option("straggler_factor", _ratio_or_off, 1.5, "a factor above 1, or 0 for off",
           "A rank whose own work per step (data, compute, checkpoint: the time it does not wait for the others in "
           "collectives or backward) is this many times the median of the others' for several windows in a row is "
           "a straggler: a `straggler` event and one line on stderr (0: off)."),
    Option("straggler_window", _seconds_or_off, 15.0, "a number of seconds, or 0 for off",
           "Seconds in one straggler window; a rank must be slow in 3 windows in a row to be named, and not slow "
           "in 2 to be cleared (0: off)."),
    Option("coord", _coord, "", "`HOST:PORT` or `off`",
           "Multi-node: where node 0's supervisor serves the coordination store (default: torchrun's rendezvous "
           "host, or the first host of the Slurm job); `off`: no coordination, each node alone."),
    Option("coord_port", _port, AUTO, "a port number (1-65535) or `auto`",
           "Multi-node: the coordination store's port, the same on every node; `auto` = torchrun's rendezvous or "
           "master port + 1000 (- 1000 above 64535)."),
    Option("coord_secret_file", _text, "", "a file path",
           "Multi-node: a file holding the job's secret (the same on every node; on Kubernetes a mounted Secret) "
           "that signs what nodes post to the coordination store; the secret itself may be given in "
           "BLACKBOX_COORD_SECRET instead. On Slurm, without either, node 0 creates one in the job's submit "
           "directory. Without a secret the store is unauthenticated (said once at start)."),
    Option("console_log_max", _count, 256, "a whole number of MiB",
           "console.log's bound: its first quarter keeps the head of the job's output, the rest the newest output "
           "(console.tail.log); what lies between is dropped and counted in the log (the terminal has all of it)."),
    Option("cuda_memory_history", _count, 0, "a whole number of entries",
           "Record this many CUDA allocation events per rank once CUDA is initialised, for memory snapshots "
           "(0: off; it costs GPU-side time)."),
    Option("upload", _storage, "", "a storage URL (s3://, gs://, az://, file://) or a directory",
           "Copy each bundle, as written (redacted), with a small incident record to shared storage: "
           "PREFIX/RUN_ID/NODE/; new incidents are checked against the records already there (`seen before`). "
           "Credentials come from the backend's usual sources (docs/storage.md)."),
    Option("upload_timeout", _seconds, 60.0, "a number of seconds",
           "Seconds one bundle's upload may take, retries included; the job's exit waits no longer for it."),
    Option("metrics_port", _port_or_off, 0, "a port number (0: off)",
           "Serve Prometheus metrics (per rank, per GPU, incident counters) on this port (docs/metrics.md)."),
    Option("metrics_addr", _text, "127.0.0.1", "an address", "The address the metrics port listens on."),
)  # fmt: skip


@dataclass(frozen=True)
class RunConfig:
    run_dir: Optional[str]
    stall_timeout: Union[float, str]
    startup_timeout: float
    first_batch_timeout: float
    checkpoint_timeout: float
    eval_timeout: float
    busy_timeout: float
    on_busy: str
    frozen_timeout: float
    on_stall: str
    poll_interval: float
    kill_grace: float
    dump_timeout: float
    collect_budget: float
    grace_budget: float
    pyspy_native: bool
    pyspy_locals: bool
    gpu_idle_timeout: float
    on_incident: str
    notify_url: str
    status_interval: float
    straggler_factor: float
    straggler_window: float
    coord: str
    coord_port: Union[int, str]
    coord_secret_file: str
    console_log_max: int
    cuda_memory_history: int
    upload: str
    upload_timeout: float
    metrics_port: int
    metrics_addr: str
    sources: Mapping[str, str]  # option name -> where its value came from (for the events log)


def _read_config_file(path: str) -> dict[str, Any]:
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except FileNotFoundError:
        raise BlackboxError(
            f"The config file `{path}` does not exist.",
            hint=f"Check the path given to --config or {ENV_CONFIG}.",
        ) from None
    except OSError as exc:
        raise BlackboxError(f"The config file `{path}` cannot be read: {exc.strerror}.") from None
    except tomllib.TOMLDecodeError as exc:
        raise BlackboxError(f"The config file `{path}` is not valid TOML: {exc}.") from None
    section = data.get("run", {})
    if not isinstance(section, dict):
        raise BlackboxError(f"The config file `{path}` has a `run` entry that is not a table.")
    known = {o.name for o in RUN_OPTIONS}
    unknown = sorted(set(section) - known)
    if unknown:
        raise BlackboxError(
            f"The config file `{path}` has unknown option(s) {', '.join(f'`{u}`' for u in unknown)} in [run].",
            hint="Known options: " + ", ".join(sorted(known)) + ".",
        )
    return section


def load_run_config(flags: Mapping[str, Any], env: Mapping[str, str], config_path: Optional[str] = None) -> RunConfig:
    """Resolve every run option: flag > env var > config file > default."""
    working_directory()  # relative paths are resolved against it
    path = config_path or env.get(ENV_CONFIG) or None
    file_values = _read_config_file(path) if path else {}
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for opt in RUN_OPTIONS:
        if flags.get(opt.name) is not None:
            raw, source, where = flags[opt.name], "flag", f"`{opt.flag}`"
        elif env.get(opt.env):
            raw, source, where = env[opt.env], "env", f"`{opt.env}`"
        elif opt.name in file_values:
            raw, source, where = file_values[opt.name], "file", f"`{opt.name}` in `{path}`"
        else:
            values[opt.name], sources[opt.name] = opt.default, "default"
            continue
        try:
            values[opt.name] = opt.parse(raw)
        except (ValueError, TypeError):
            raise BlackboxError(f"{where} must be {opt.expects}, not `{raw}`.") from None
        sources[opt.name] = source
    return RunConfig(sources=sources, **values)
