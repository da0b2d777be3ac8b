"""A rank that prints numbered lines, one every INTERVAL seconds, then `done`: its output is checked line by
line. Usage: chatty_ranks.py LINES INTERVAL"""

import os
import sys
import time

rank = os.environ.get("RANK", "0")
lines, interval = int(sys.argv[1]), float(sys.argv[2])
for i in range(lines):
    print(f"rank {rank} line {i}", flush=True)
    time.sleep(interval)
print(f"rank {rank} done", flush=True)
