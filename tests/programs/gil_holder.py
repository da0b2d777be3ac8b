"""A process posing as a rank that cannot answer a dump request: SIGUSR1 reset to its default action from C
(so a SIGUSR1 would kill it), then the GIL held in a C call. Writes `ready` to the file named by argv[1]."""

import ctypes
import signal
import sys

libc = ctypes.CDLL(None)
libc.signal.restype = ctypes.c_void_p
libc.signal(int(signal.SIGUSR1), ctypes.c_void_p(0))  # SIG_DFL behind Python's back: no handler at all
with open(sys.argv[1], "w") as f:
    f.write("ready")
ctypes.PyDLL(None).sleep(600)  # PyDLL keeps the GIL across the call: the recorder's thread cannot run
