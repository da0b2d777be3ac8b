"""What the rank side and the host side agree on: env names, the heartbeat layout, codes and versions.
Stdlib only, Python >= 3.9: this module is loaded inside the job's own interpreter."""

from __future__ import annotations

import struct

# --- environment -----------------------------------------------------------------------------------
ENV_RUN_DIR = "BLACKBOX_RECORD_DIR"  # set by the supervisor for the job: the run directory (activates the recorder)
ENV_RECORDER = "BLACKBOX_RECORDER"  # set by an active recorder for its children: "<pid>:<mode>"
ENV_LIVENESS_INTERVAL = "BLACKBOX_LIVENESS_INTERVAL"  # seconds between liveness bumps (default 0.5)
ENV_DISABLE = "BLACKBOX_DISABLE"  # "1": never activate (an escape hatch for users)

MODE_RANK = "rank"  # RANK and LOCAL_RANK were in the environment
MODE_SINGLE = "single"  # a single process without RANK, recorded as rank 0


# --- heartbeat layout (version 1) -----------------------------------------------------------------
# One page per rank, `ranks/<rank>/heartbeat`. The seqlocked block (progress, phase, collective, phase
# name) is written by the rank's main thread between two bumps of SEQ (odd = writing); fields outside
# it are single 8-byte stores with one writer each, so a reader never needs to retry for them.
HEARTBEAT_VERSION = 1
HEARTBEAT_SIZE = 4096
MAGIC = b"BBHB"

HEADER = struct.Struct("<4sII")  # magic, version, size
OFF_HEADER = 0
IDENT = struct.Struct("<qQiiiidd")  # pid, proc start ticks, rank, local rank, world size, mode, wall0, mono0
OFF_IDENT = 16
SEQ = struct.Struct("<Q")
OFF_SEQ = 64
PROGRESS = struct.Struct("<qddd")  # step, last progress (mono), last step duration, slowest step duration
OFF_PROGRESS = 72
PHASE = struct.Struct("<Qd")  # phase code, phase start (mono)
OFF_PHASE = 104
COLLECTIVE = struct.Struct("<Qq")  # op code of the last Python-visible collective, its sequence number
OFF_COLLECTIVE = 120
PHASE_NAME = struct.Struct("<32s")  # utf-8 name of a user phase, NUL padded
OFF_PHASE_NAME = 136
SEQLOCK_END = 168  # the seqlocked block is [OFF_PROGRESS, SEQLOCK_END)
WORD = struct.Struct("<Q")
OFF_STATE = 168  # state code, written by the rank
LIVENESS = struct.Struct("<Qd")  # counter, time (mono): bumped by the rank's daemon thread
OFF_LIVENESS = 176
OFF_DUMP_REQUEST = 192  # incremented by the supervisor to ask for a dump
OFF_DUMP_ACK = 200  # set by the rank to the last request it served
DATA = struct.Struct("<dQ")  # total seconds waited on data, batches delivered
OFF_DATA = 208

MODE_CODES = {MODE_RANK: 0, MODE_SINGLE: 1}

# --- states ------------------------------------------------------------------------------------------
STATE_STARTING = 0  # activated, no step yet
STATE_RUNNING = 1
STATE_EXITED = 2  # the interpreter ran its exit handlers (a normal exit or sys.exit)
STATE_EXCEPTION = 3  # an uncaught exception reached sys.excepthook
STATE_NAMES = ("starting", "running", "exited", "exception")

# --- phases ------------------------------------------------------------------------------------------
PHASE_STARTUP = 0
PHASE_COMPUTE = 1
PHASE_DATA = 2
PHASE_CHECKPOINT = 3
PHASE_COLLECTIVE = 4
PHASE_EVAL = 5
PHASE_CUSTOM = 15  # the name is in PHASE_NAME
PHASE_NAMES = {
    PHASE_STARTUP: "startup",
    PHASE_COMPUTE: "compute",
    PHASE_DATA: "data",
    PHASE_CHECKPOINT: "checkpoint",
    PHASE_COLLECTIVE: "collective",
    PHASE_EVAL: "eval",
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


def parse_proc_stat(text: str) -> tuple[str, int, int]:
    """(state letter, ppid, start time in clock ticks) from the text of /proc/PID/stat."""
    # The command name is in parentheses and may itself hold spaces or parentheses.
    rest = text[text.rindex(")") + 2 :].split()
    return rest[0], int(rest[1]), int(rest[19])
