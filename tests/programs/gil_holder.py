"""A process posing as a rank that cannot answer a dump request: SIGUSR1 and the recorder's dump signal reset to
their default action from C (so either would kill it), then the GIL held in a C call. Writes `ready` to the file
named by argv[1]."""

import ctypes
import signal
import sys

libc = ctypes.CDLL(None)
libc.signal.restype = ctypes.c_void_p
for sig in (int(signal.SIGUSR1), int(signal.SIGRTMAX) - 3):  # SIGRTMAX - 3: blackbox's dump signal (protocol)
    libc.signal(sig, ctypes.c_void_p(0))  # SIG_DFL behind Python's back: no handler at all
with open(sys.argv[1], "w") as f:
    f.write("ready")
ctypes.PyDLL(None).sleep(600)  # PyDLL keeps the GIL across the call: the recorder's thread cannot run
