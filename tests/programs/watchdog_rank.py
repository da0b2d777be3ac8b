"""A process posing as an NCCL rank whose Python cannot run: a 1-rank gloo group whose flight recorder holds three
all_reduces; the debug pipe torch's NCCL watchdog makes (`<TORCH_NCCL_DEBUG_INFO_PIPE_FILE>0.pipe`, held open for
reading) and a child playing that C++ thread, which needs no GIL: when a byte comes, it writes this process's
flight-recorder dump (the real one, taken before) where torch would (`<TORCH_*_TEMP_FILE>0`). Then SIGUSR1 and the
recorder's dump signal reset to their default action from C, and the GIL held in a C call. Writes `ready` to the file
named by argv[1]; argv[2] is the group's rendezvous file. This machine has no GPU, hence no NCCL: the child stands in
for the one thread of torch's that it lacks."""

import ctypes
import os
import signal
import sys
import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo", init_method=f"file://{sys.argv[2]}", rank=0, world_size=1)
t = torch.ones(4)
for _ in range(3):
    dist.all_reduce(t)
record = torch._C._distributed_c10d._dump_fr_trace()
target = (os.environ.get("TORCH_FR_DUMP_TEMP_FILE") or os.environ["TORCH_NCCL_DEBUG_INFO_TEMP_FILE"]) + "0"
pipe = os.environ["TORCH_NCCL_DEBUG_INFO_PIPE_FILE"] + "0.pipe"
os.mkfifo(pipe, 0o600)
fd = os.open(pipe, os.O_RDONLY | os.O_NONBLOCK)  # as torch's DumpPipe opens it

if os.fork() == 0:  # the watchdog
    ctypes.CDLL(None).prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG: it goes with the rank
    while True:  # as torch's watchdog polls its pipe: a read now and then
        time.sleep(0.2)
        try:
            asked = os.read(fd, 64)
        except BlockingIOError:
            continue
        if asked:
            with open(target, "wb") as f:
                f.write(record)

libc = ctypes.CDLL(None)
libc.signal.restype = ctypes.c_void_p
for sig in (int(signal.SIGUSR1), int(signal.SIGRTMAX) - 3):  # SIGRTMAX - 3: blackbox's dump signal (protocol)
    libc.signal(sig, ctypes.c_void_p(0))
with open(sys.argv[1], "w") as f:
    f.write("ready")
ctypes.PyDLL(None).sleep(600)  # PyDLL keeps the GIL across the call: the recorder's thread cannot run
