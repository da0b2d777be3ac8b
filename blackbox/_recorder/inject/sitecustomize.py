"""blackbox: start the rank recorder in the rank processes of a job run under `blackbox run`, then run the
sitecustomize this file shadows. Stdlib only; this folder is first on the job's PYTHONPATH, so nothing
else may live in it. Env names mirror blackbox/_recorder/protocol.py (a test keeps them equal)."""

import os
import sys

_RUN_DIR = "BLACKBOX_RECORD_DIR"
_RECORDER = "BLACKBOX_RECORDER"
_DISABLE = "BLACKBOX_DISABLE"
# A task that srun started (a job step: a batch script has no SLURM_STEP_ID) takes its rank from Slurm when
# the job has not set RANK: one task per GPU, as Megatron-LM, NeMo and Lightning start them.
_SLURM_STEP = "SLURM_STEP_ID"
_SLURM_RANK = ("SLURM_PROCID", "SLURM_LOCALID", "SLURM_STEP_NUM_TASKS", "SLURM_NTASKS")
# Command lines of launchers: they start ranks and are never ranks themselves.
_LAUNCHER_MODULES = ("torch.distributed.run", "torch.distributed.launch")
_LAUNCHER_SCRIPTS = ("torchrun", "accelerate", "deepspeed", "composer")
_VALUE_OPTIONS = ("-W", "-X", "--check-hash-based-pycs")  # interpreter options whose value is the next word


def _blackbox_is_launcher() -> bool:
    argv = getattr(sys, "orig_argv", None)
    if argv is None:  # Python 3.9
        try:
            with open("/proc/self/cmdline", "rb") as f:
                argv = [a.decode("utf-8", "replace") for a in f.read().split(b"\0") if a]
        except OSError:
            argv = list(sys.argv)
    skip = False
    for i, arg in enumerate(argv[1:], 1):
        if skip:  # the value of an interpreter option (`-W ignore`, `-X dev`)
            skip = False
            continue
        if arg == "-m" and i + 1 < len(argv):
            return argv[i + 1] in _LAUNCHER_MODULES or argv[i + 1].split(".")[0] in _LAUNCHER_SCRIPTS
        if arg in _VALUE_OPTIONS:
            skip = True
            continue
        if arg == "-c":
            return False
        if not arg.startswith("-"):
            return os.path.basename(arg) in _LAUNCHER_SCRIPTS
    return False


def _blackbox_slurm_rank(env: "os._Environ[str]") -> "tuple[int, int, int] | None":
    """(rank, local rank, world size) of a task of a Slurm job step, else None."""
    step = env.get(_SLURM_STEP, "")
    if not step.isdigit() or env.get(_SLURM_RANK[0]) is None or env.get(_SLURM_RANK[1]) is None:
        return None
    try:
        return int(env[_SLURM_RANK[0]]), int(env[_SLURM_RANK[1]]), int(env.get(_SLURM_RANK[2]) or env.get(
            _SLURM_RANK[3]) or 0)  # fmt: skip
    except ValueError:
        return None


def _blackbox_mode(env: "os._Environ[str]") -> "str | None":
    """'rank', 'slurm', 'single', 'deferred' or None: whether this process records, decided from its environment
    alone. 'slurm': a task srun started, without RANK: its rank is SLURM_PROCID. 'deferred': a new interpreter
    started by a single-process or Slurm-task recorder (torch.multiprocessing.spawn, a multiprocessing 'spawn'
    child): it records as a rank only if it calls init_process_group."""
    if not env.get(_RUN_DIR) or env.get(_DISABLE) == "1":
        return None
    parent_pid, _, parent = env.get(_RECORDER, "").partition(":")  # "<pid>:<mode>:<rank>"
    parent_mode = parent.partition(":")[0]
    inherited = bool(parent_pid) and parent_pid != str(os.getpid())
    if not inherited and _blackbox_is_launcher():
        # torchrun is the launcher even where an outer launcher or a job template left RANK in its environment.
        return None
    if env.get("RANK") is not None and env.get("LOCAL_RANK") is not None:
        # A child of an active rank (DataLoader worker, helper) inherits RANK: it is not a second rank.
        # A child of a single-process recorder that has RANK was started by a launcher we did not know.
        return None if inherited and parent_mode == "rank" else "rank"
    if inherited:
        return "deferred" if parent_mode in ("single", "slurm") else None
    return "slurm" if _blackbox_slurm_rank(env) is not None else "single"


def _blackbox_load(name: str, path: str, package_dir: "str | None" = None) -> object:
    """Import a module from a file under `name`, with the frozen bootstrap only (importlib.util costs ms)."""
    from importlib._bootstrap import module_from_spec
    from importlib._bootstrap_external import spec_from_file_location

    locations = [package_dir] if package_dir is not None else None
    spec = spec_from_file_location(name, path, submodule_search_locations=locations)
    if spec is None or spec.loader is None:
        raise ImportError("cannot load %s" % path)
    module = module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


def _blackbox_activate(mode: str, env: "os._Environ[str]") -> None:
    run_dir = env[_RUN_DIR]
    try:
        pkg_dir = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        name = "_blackbox_recorder"
        if name not in sys.modules:
            _blackbox_load(name, os.path.join(pkg_dir, "__init__.py"), pkg_dir)
        recorder = sys.modules.get(name + ".recorder") or _blackbox_load(
            name + ".recorder", os.path.join(pkg_dir, "recorder.py")
        )
        if mode == "deferred":
            recorder.defer(run_dir)  # type: ignore[attr-defined]
            return
        if mode == "rank":
            rank, local_rank = int(env["RANK"]), int(env["LOCAL_RANK"])
            world_size = int(env.get("WORLD_SIZE", "0") or 0)
        elif mode == "slurm":
            rank, local_rank, world_size = _blackbox_slurm_rank(env) or (0, 0, 1)
        else:
            rank, local_rank, world_size = 0, 0, 1
        recorder.activate(run_dir, rank, local_rank, world_size, mode)  # type: ignore[attr-defined]
    except Exception as exc:  # the job must start whatever happens here
        try:
            with open(os.path.join(run_dir, "bootstrap-errors.log"), "a") as f:
                f.write("pid %d: the recorder could not start: %r\n" % (os.getpid(), exc))
        except Exception:
            pass


def _blackbox_chain() -> None:
    """Run the sitecustomize that this one shadows, as `sitecustomize`, exactly as site would have."""
    from importlib._bootstrap import module_from_spec
    from importlib._bootstrap_external import PathFinder

    here = os.path.dirname(os.path.abspath(__file__))
    path = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = PathFinder.find_spec("sitecustomize", path)
    if spec is None or spec.loader is None:
        return
    module = module_from_spec(spec)
    sys.modules["sitecustomize"] = module
    spec.loader.exec_module(module)


_blackbox_env = os.environ
_blackbox_m: "str | None" = None
try:
    _blackbox_m = _blackbox_mode(_blackbox_env)
except Exception:
    pass
if _blackbox_m is not None:
    _blackbox_activate(_blackbox_m, _blackbox_env)
_blackbox_chain()
