"""A single-process job that ignores SIGINT and waits: only an escalation ends it."""

import os
import signal
import sys
import time

signal.signal(signal.SIGINT, signal.SIG_IGN)
open(sys.argv[1], "w").close()
while True:
    time.sleep(1)
    os.getpid()
