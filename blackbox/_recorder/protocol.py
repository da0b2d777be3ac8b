"""What the rank side and the host side agree on: env names, the heartbeat layout, codes and versions.
Stdlib only, Python >= 3.9: this module is loaded inside the job's own interpreter."""

from __future__ import annotations

import struct

# --- environment -----------------------------------------------------------------------------------
ENV_RUN_DIR = "BLACKBOX_RECORD_DIR"  # set by the supervisor for the job: the run directory (activates the recorder)
ENV_RUN_ID = "BLACKBOX_RUN_ID"  # set by the supervisor for the job: its run id
ENV_RECORDER = "BLACKBOX_RECORDER"  # set by an active recorder for its children: "<pid>:<mode>:<rank>"
ENV_LIVENESS_INTERVAL = "BLACKBOX_LIVENESS_INTERVAL"  # seconds between liveness bumps (default 0.5)
ENV_STRIDE = "BLACKBOX_STRIDE"  # a loop of short steps times its data and backward on one step in this many at most
ENV_DISABLE = "BLACKBOX_DISABLE"  # "1": never activate (an escape hatch for users)
ENV_CUDA_MEMORY_HISTORY = "BLACKBOX_CUDA_MEMORY_HISTORY"  # entries of CUDA memory history to keep (unset: off)
ENV_FR_DIR = "BLACKBOX_FR_DIR"  # where flight-recorder dumps go; the recorder sets torch's own variables from it
FR_ENTRIES = "2000"  # flight-recorder ring size when the user has not chosen one
FR_PREFIX = "fr_trace_"  # flight-recorder dumps: <run dir>/flight_recorder/<FR_PREFIX><rank>, as torch's analyzer reads

# --- the run directory, as both sides name it ----------------------------------------------------------
FR_DIR = "flight_recorder"  # <run dir>/flight_recorder/: the ranks' flight-recorder dumps
RANKS_DIR = "ranks"  # <run dir>/ranks/<rank>/: each rank's own directory, written by its recorder
CONSOLE_LOG = "console.log"  # <run dir>/: the job's output (the supervisor's tee), then console.tail.log
EVENTS_LOG = "events.jsonl"  # <run dir>/: the supervisor's event log
BUNDLES_DIR = "bundles"  # <run dir>/bundles/: the bundles of the run
NODES_FILE = "nodes.json"  # <run dir>/: the other nodes of a multi-node job, as the coordination knows them
COLLECT_REQUEST = "collect-request.json"  # <run dir>/: what `blackbox collect` asks the supervisor beside SIGUSR1
# in a rank's directory ("%d": a number, the dump request or the count)
RANK_HEARTBEAT = "heartbeat"  # the mapped page (layout below)
RANK_LOG = "recorder.log"  # hooks that failed and were switched off
RANK_EVENTS = "recorder-events.jsonl"  # what the recorder itself did (stepped aside, …)
RANK_ANNOTATIONS = "annotations.json"  # blackbox.annotate()
RANK_METRICS = "metrics.json"  # blackbox.log_metrics(), the newest entries
RANK_THREADS = "threads.json"  # thread id -> name, for faulthandler's dumps (which print ids only)
RANK_MOVER = "mover.json"  # the thread of its own a waiting main thread is as alive as: tid, name, its bytes then
RANK_LOADER = "loader.json"  # the DataLoader iterator in use and its workers
RANK_INFO = "rank.json"  # pid, versions of the job's own torch, the torchelastic error file's path
RANK_EXCEPTIONS = "exceptions.jsonl"  # uncaught exceptions, one per line
RANK_OOM = "oom.jsonl"  # CUDA out-of-memory errors, with the last batch
RANK_FATAL = "fatal.txt"  # faulthandler on SIGSEGV/SIGABRT/SIGBUS/SIGFPE
RANK_SIGTERM = "sigterm.txt"  # faulthandler on SIGTERM (the launcher's teardown)
RANK_STACKS = "stacks-%d.txt"  # faulthandler on the dump signal or SIGUSR1, one file per dump
RANK_PYDUMP = "pydump-%d.json"  # the Python-side dump for dump request %d
RANK_FR_JSON = "fr_trace.json"  # the flight recorder's JSON dump
RANK_MEMORY_SNAPSHOT = "memory-snapshot-%d.pickle"  # CUDA memory snapshot for dump request %d
RANK_OOM_SNAPSHOT = "memory-snapshot-oom-%d.pickle"  # ... at the %d-th out-of-memory error
RANK_ERROR = "error.json"  # an error file a job points TORCHELASTIC_ERROR_FILE at in its rank directory
RANK_SINGLE_CLAIM = "single.pid"  # rank 0's claim by a process without RANK (MODE_SINGLE)

MODE_RANK = "rank"  # RANK and LOCAL_RANK were in the environment
MODE_SINGLE = "single"  # a single process without RANK, recorded as rank 0
MODE_SLURM = "slurm"  # a task srun started, without RANK: SLURM_PROCID, SLURM_LOCALID, SLURM_STEP_NUM_TASKS


# --- heartbeat layout (version 5; a reader reads 1-4 too: 1 has no time ledger, 1-2 no motion, 1-3 no ring) -------
# One page per rank, `ranks/<rank>/heartbeat`, little-endian. After the header every field is one aligned
# 8-byte word, stored with a single machine store (memoryview casts; `struct.pack_into` would first zero
# the bytes it writes). Fields that change together form a group with a version word at both ends: the
# writer stores start version, fields, end version in that order; the reader loads end, fields, start and
# retries while they differ (0 is never a valid version). No lock, no syscall. Word indices below.
HEARTBEAT_VERSION = 5
HEARTBEAT_SIZE = 4096
MAGIC = b"BBHB"

HEADER = struct.Struct("<4sII")  # magic, version, size
OFF_HEADER = 0
IDENT = struct.Struct("<qQiiiidd")  # pid, proc start ticks, rank, local rank, world size, mode, wall0, mono0
OFF_IDENT = 16  # written once, before the file is renamed into place
# progress group: version, step, last progress (mono s), last step duration, slowest step duration, version
W_PROGRESS = 8  # words 8..13
W_STEP, W_LAST_PROGRESS, W_LAST_DT, W_SLOWEST_DT, W_PROGRESS_END = 9, 10, 11, 12, 13
# phase group: version, phase code, phase start (mono s), last collective op, its sequence, name (4 words), version
W_PHASE = 14  # words 14..23
W_PHASE_CODE, W_PHASE_START, W_OP, W_OP_SEQ, W_PHASE_NAME, W_PHASE_END = 15, 16, 17, 18, 19, 23
PHASE_NAME_BYTES = 32
W_STATE = 24  # state code, written by the rank
W_LIVENESS, W_LIVENESS_TIME = 25, 26  # counter and time (mono s): bumped by the rank's daemon thread
W_DUMP_REQUEST = 27  # incremented by the supervisor to ask for a dump
W_DUMP_ACK = 28  # set by the rank to the last request it served
W_DATA_WAIT, W_BATCHES = 29, 30  # total seconds waited on data, batches delivered
# the time ledger (version 2): the seconds this rank spent in each phase, one double per LEDGER_PHASES, summed at
# each phase edge by the thread that runs the job's loop (the time in the current phase, since its start, is not
# in it yet: a reader adds it). Each word is one store; a reader takes differences between its readings.
W_LEDGER = 32  # words 32..39
LEDGER_PHASES = ("startup", "compute", "data", "checkpoint", "collective", "eval", "backward", "other")
WAITING_PHASES = ("collective", "backward")  # where a rank waits for its peers (DDP and FSDP wait in backward)
# motion group (version 3), written by the liveness thread alone: progress that is not a step. Version, forward calls
# counted (module calls, by a global forward pre-hook the thread installs only during a pause), when that count last
# changed (mono s), how many times the main thread's Python stack was seen to change between two samples, when it
# last did (mono s), the forward counter's mode (FORWARDS_*), version.
W_MOTION = 40  # words 40..46
W_FORWARDS, W_FORWARDS_TIME, W_STACK_CHANGES, W_STACK_TIME, W_FORWARD_MODE, W_MOTION_END = 41, 42, 43, 44, 45, 46
FORWARDS_IDLE = 0  # no pause: nothing installed (steps and batches say enough, at no cost)
FORWARDS_COUNTING = 1  # a pause: the hook counts module calls
FORWARDS_OFF = 2  # never installed: torch.compile is in use (a hook would change what it compiles), or it failed
FORWARD_MODES = ("idle", "counting", "off")
# What the main thread waits for, as the liveness thread last saw it: one word after the motion group, one store
# (a layout-3 page of an older recorder leaves it 0). A thread of its own (a join, a future, a queue, an event); a
# timer it wakes from to check, in a loop (a lock file, a store key, a marker file, `Popen.poll`); or a timer it
# sleeps on. The supervisor then follows the rank's worker processes too: what such a wait may be waiting for.
W_WAITING = 47
WAIT_NONE, WAIT_THREAD, WAIT_POLL, WAIT_SLEEP = 0, 1, 2, 3
WAIT_NAMES = ("", "thread", "poll", "sleep")
# Where the rank is in joining its default process group: one word after the waiting word, one store, written by the
# thread that calls init_process_group (a page of a recorder before it leaves 0). 0: not yet called (or the job never
# calls it); 1: inside it (the rendezvous, gloo's full mesh, NCCL's bootstrap), waiting for the others to arrive;
# 2: joined (it returned). Who has not joined while others wait there is what `blackbox status` names.
W_JOIN = 48
JOIN_NOT_YET, JOIN_JOINING, JOIN_JOINED = 0, 1, 2
JOIN_NAMES = ("", "joining", "joined")
# The ring (version 4; 5 adds torch's count): the rank's last RING_ENTRIES phase edges, so that a rank that cannot
# answer (stopped, the GIL held, killed) still says what it last did: each write of the phase group also writes one
# entry — the phase entered, the collective op and its sequence (a collective entered; the next entry says it was
# left), torch's own count of the collectives the rank had issued on its default group as it crossed the edge
# (ProcessGroup._get_sequence_number_for_group: the flight recorder's collective_seq_id of the newest; it counts
# DDP's and FSDP's collectives, which torch issues from C++ and no Python wrapper sees; 0 before the group exists
# or where torch cannot say), when, at which step. Entry n (from 1) lives in slot (n - 1) % RING_ENTRIES,
# RING_WORDS words: n, code | op << 8 | step << 16, the op's sequence, torch's count, start (mono s, a double), n
# again — written by one struct pack in that order (RING_ENTRY); a reader loads the last word first, then the
# fields, then the first, and keeps an entry only when both numbers are the one its slot can hold (a torn,
# overwritten or empty slot is dropped), then orders them by n. Written by the thread that writes the phase group,
# no lock, no syscall. A layout-4 page has RING_WORDS_4 words an entry, without torch's count.
W_RING = 64  # words 64..(64 + RING_WORDS * RING_ENTRIES - 1)
RING_WORDS = 6
RING_WORDS_4 = 5
RING_ENTRIES = 64
RING_ENTRY = struct.Struct("<QQQQdQ")

MODE_CODES = {MODE_RANK: 0, MODE_SINGLE: 1, MODE_SLURM: 2}

# --- states ------------------------------------------------------------------------------------------
STATE_STARTING = 0  # activated, no step yet
STATE_RUNNING = 1
STATE_EXITED = 2  # the interpreter ran its exit handlers (a normal exit or sys.exit)
STATE_EXCEPTION = 3  # an uncaught exception reached sys.excepthook
STATE_NAMES = ("starting", "running", "exited", "exception")

# --- the dump signal -----------------------------------------------------------------------------------
# blackbox's automated dumps never fire a job's own handler (many jobs catch SIGUSR1 to checkpoint before a Slurm
# preemption): a rank registers faulthandler, unchained, on this real-time signal, which nothing else registers;
# the collector sends it only to a process whose SigCgt shows it. SIGUSR1 stays the user's manual "dump now".
DUMP_SIGNAL_FROM_MAX = 3  # SIGRTMAX - 3


def dump_signal() -> int:
    import signal

    return int(signal.SIGRTMAX) - DUMP_SIGNAL_FROM_MAX


# --- phases ------------------------------------------------------------------------------------------
PHASE_STARTUP = 0
PHASE_COMPUTE = 1
PHASE_DATA = 2
PHASE_CHECKPOINT = 3
PHASE_COLLECTIVE = 4
PHASE_EVAL = 5
PHASE_BACKWARD = 6  # inside autograd's backward (under DDP and FSDP the gradient collectives wait there)
PHASE_CUSTOM = 15  # the name is in PHASE_NAME
PHASE_NAMES = {
    PHASE_STARTUP: "startup",
    PHASE_COMPUTE: "compute",
    PHASE_DATA: "data",
    PHASE_CHECKPOINT: "checkpoint",
    PHASE_COLLECTIVE: "collective",
    PHASE_EVAL: "eval",
    PHASE_BACKWARD: "backward",
}
PHASE_CODES = {name: code for code, name in PHASE_NAMES.items()}

# Python-visible torch.distributed collectives the recorder wraps; the index is the op code.
COLLECTIVE_OPS = (
    "none",
    "all_reduce",
    "all_gather",
    "all_gather_into_tensor",
    "all_gather_object",
    "all_to_all",
    "all_to_all_single",
    "barrier",
    "broadcast",
    "broadcast_object_list",
    "gather",
    "gather_object",
    "reduce",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "scatter",
    "scatter_object_list",
    "send",
    "recv",
    "isend",
    "irecv",
    "monitored_barrier",
)


def ledger_slot(code: int) -> int:
    """The time ledger's word for a phase code: its own for the known phases, the last (`other`) for a custom one."""
    return code if 0 <= code < len(LEDGER_PHASES) - 1 else len(LEDGER_PHASES) - 1


def time_spent(ledger: tuple[float, ...] | list[float], phase: str, elapsed: float) -> dict[str, float]:
    """Seconds in each phase of LEDGER_PHASES: the ledger's words, with `elapsed` (the current phase's time since it
    began, which the ledger does not hold yet) added to the current phase (`other` for a custom one)."""
    out = dict(zip(LEDGER_PHASES, ledger))
    out[phase if phase in out else LEDGER_PHASES[-1]] += max(0.0, elapsed)
    return out


def parse_proc_stat(text: str) -> tuple[str, int, int]:
    """(state letter, ppid, start time in clock ticks) from the text of /proc/PID/stat."""
    # The command name is in parentheses and may itself hold spaces or parentheses.
    rest = text[text.rindex(")") + 2 :].split()
    return rest[0], int(rest[1]), int(rest[19])
