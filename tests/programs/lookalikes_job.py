"""A job whose text is full of ML look-alikes and a few real secrets, each reaching disk a different way: printed
(a private key in separate writes, a key BEGIN with no body in an error message), logged as metrics and annotations
through blackbox's API, and raised in an exception whose message holds a password with a quote, a backslash and
non-ASCII characters.
Usage: lookalikes_job.py [ARGS...] (its arguments are only there to be recorded)."""

import os
import sys
import time

import blackbox

LOOKALIKES = [
    "tokenizer: gpt2", "max_tokens: 4096 eos_token_id=2 token_type_ids: [0, 0, 1] key_dim: 64 use_auth_token=True",
    "TOKENIZER_NAME=meta-llama/Llama-3-8B KEY_DIR=/data/imagenet --session-dir /tmp/sess",
    "Basic sanity check passed", "Using basic attention implementation", "mkdir -p checkpoints/run1",
    "pytest -p no:cacheprovider", "top-1 token: 'Paris'", "vocab: {'<pad>': 0, 'token': 2}",
    "Expected signature: forward(...)", "session: 3/5", "--session 2", "WANDB_SESSION=2", "PASSWORD_STORE_CLIP_TIME=45",
    "GOOGLE_APPLICATION_CREDENTIALS=/etc/gcp/sa.json", "DESKTOP_SESSION=ubuntu", "reading /home/ubuntu/data/train.bin",
    "ValueError: could not load -----BEGIN PRIVATE KEY----- from key.pem",
]  # fmt: skip
print(*LOOKALIKES, sep="\n")
sys.stdout.flush()
with open(os.environ["KEY_FILE"]) as f:
    key = f.read().splitlines()
for line in key:
    print(line, flush=True)
    time.sleep(0.05)  # separate writes, read by the supervisor one by one
print("after the key", flush=True)
blackbox.log_metrics(step=10, tokens_per_sec=51234.5, max_tokens=4096, loss=1.25)
blackbox.annotate(tokenizer="gpt2", pad_token="<pad>", hf_token=os.environ["HF_TOKEN"])
time.sleep(1.2)  # the liveness thread writes metrics and annotations
raise PermissionError(f"login refused for password {os.environ['SERVICE_PASSWORD']}")
