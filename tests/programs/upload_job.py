"""A 2-rank DDP job (gloo, CPU) whose rank 0 uploads a checkpoint to S3 with s3fs over plain HTTP (the endpoint in
AWS_ENDPOINT_URL; the credentials in AWS_*) after BB_STEPS steps, while rank 1 waits at a barrier. s3fs sends with
send(): /proc/PID/io does not count those bytes.

    torchrun --standalone --nproc-per-node 2 tests/programs/upload_job.py MODE

Modes: thread (a thread of its own uploads with s3fs; the main thread waits for its future, then a barrier), exit
(training is over: a non-daemon thread uploads with botocore while the interpreter exits; rank 1 exits 0)."""

import os
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

import s3fs
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

MODE = sys.argv[1]
STEPS = int(os.environ.get("BB_STEPS", "6"))
SIZE = int(os.environ.get("BB_UPLOAD_BYTES", str(6 << 20)))
KEY = os.environ["BB_UPLOAD_KEY"]

# BB_PG_TIMEOUT_S: the timeout a team sets in its own init_process_group (the hang benchmark's PyTorch contender)
pg_timeout = os.environ.get("BB_PG_TIMEOUT_S")
dist.init_process_group("gloo", **({"timeout": timedelta(seconds=float(pg_timeout))} if pg_timeout else {}))
rank = dist.get_rank()
model = DistributedDataParallel(torch.nn.Linear(16, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for _ in range(STEPS):
    loss = model(torch.randn(8, 16)).sum()
    opt.zero_grad()
    loss.backward()
    opt.step()
    time.sleep(0.2)


def upload() -> None:
    """With s3fs (an asyncio loop of its own, as the main thread waits for it)."""
    # s3fs gives up on an answer after 15 s, counted while the body is still being sent: a slow link needs longer
    fs = s3fs.S3FileSystem(skip_instance_cache=True, config_kwargs={"read_timeout": 300})
    print(f"rank {rank}: pausing to upload {SIZE} bytes", flush=True)  # (the hang benchmark's onset)
    started = time.monotonic()
    fs.pipe(KEY, os.urandom(SIZE))
    print(f"rank {rank}: uploaded {SIZE} bytes in {time.monotonic() - started:.0f} s", flush=True)


def upload_at_exit() -> None:
    """With botocore's client, as boto3's put_object does (s3fs cannot start once the interpreter exits: its loop's
    executor refuses new work)."""
    import botocore.session

    client = botocore.session.get_session().create_client("s3", endpoint_url=os.environ["AWS_ENDPOINT_URL"])
    bucket, key = KEY.split("/", 1)
    print(f"rank {rank}: pausing to upload {SIZE} bytes", flush=True)  # (the hang benchmark's onset)
    started = time.monotonic()
    client.put_object(Bucket=bucket, Key=key, Body=os.urandom(SIZE))
    print(f"rank {rank}: uploaded {SIZE} bytes in {time.monotonic() - started:.0f} s", flush=True)


if MODE == "thread":
    if rank == 0:
        with ThreadPoolExecutor(1) as pool:
            pool.submit(upload).result()
    dist.barrier()
    dist.destroy_process_group()
elif MODE == "exit":
    dist.destroy_process_group()
    if rank == 0:
        threading.Thread(target=upload_at_exit, name="last-checkpoint").start()  # not a daemon: exit waits for it
    print(f"rank {rank}: training done", flush=True)
else:
    raise SystemExit(f"unknown mode {MODE}")
