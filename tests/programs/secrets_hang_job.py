"""A 2-rank gloo job that handles credentials carelessly, then hangs: rank 0 prints the credentials it holds in its
environment, reads from its YAML config and finds where tools keep them (~/.netrc, the Hugging Face token file), in
the shapes real output has (a `wandb login` line, a `.netrc` entry, `mysql -pX`, a JSON log line, a URL, a YAML
block, base64 and URL-encoded forms, a private key line by line, a password split across two writes), among ML
look-alikes that must survive; it annotates a token through blackbox's API; rank 1 stops at step 3 while rank 0
waits in all_reduce (`secrets_job.py` is the one-process job that raises instead).
Usage: torchrun --nproc-per-node 2 secrets_hang_job.py --config FILE --key-file FILE --marker-dir DIR"""

import argparse
import base64
import json
import os
import sys
import time
import urllib.parse

import torch
import torch.distributed as dist

import blackbox

LOOKALIKES = [
    "Basic sanity check passed", "Using basic attention implementation", "mkdir -p checkpoints/run1",
    "pytest -p no:cacheprovider", "top-1 token: 'Paris'", "vocab: {'<pad>': 0, 'token': 2}",
    "Expected signature: forward(...)", "session: 3/5", "--session 2", "WANDB_SESSION=2",
    "PASSWORD_STORE_CLIP_TIME=45", "GOOGLE_APPLICATION_CREDENTIALS=/etc/gcp/sa.json", "DESKTOP_SESSION=ubuntu",
    "saving to /home/ubuntu/checkpoints/step_1000.pt", "tokenizer: gpt2", "max_tokens: 4096 eos_token_id=2",
    "token_type_ids: [0, 0, 1] key_dim: 64 use_auth_token=True", "TOKENIZER_NAME=meta-llama/Llama-3-8B",
    "num_key_value_heads: 8", "pad_token: <pad>", "ValueError: key.pem starts with -----BEGIN PRIVATE KEY----- only",
]  # fmt: skip


def say(*parts: str, sep: str = " ") -> None:
    print(*parts, sep=sep, flush=True)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--config", required=True)
    p.add_argument("--key-file", required=True)
    p.add_argument("--marker-dir", required=True)
    args = p.parse_args()
    with open(args.config) as f:
        config = f.read()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    env = os.environ
    if rank == 0:
        home = os.path.expanduser("~")
        with open(os.path.join(home, ".cache", "huggingface", "token")) as f:
            stored_hf = f.read().strip()
        with open(os.path.join(home, ".netrc")) as f:
            netrc_pw = f.read().split("password")[1].split()[0]
        say("config loaded:")
        say(config)
        say(*LOOKALIKES, sep="\n")
        say(f"wandb login {env['WANDB_API_KEY']}")
        say(f"machine api.wandb.ai login user password {netrc_pw}")
        say(f"mysql -uroot -p{env['DB_PASSWORD']} -h db")
        say(f"aws configure set aws_secret_access_key {env['AWS_SECRET_ACCESS_KEY']}")
        say(f"AWS_ACCESS_KEY_ID={env['AWS_ACCESS_KEY_ID']}")
        say(json.dumps({"level": "info", "msg": f'connect(password="{env["DB_PASSWORD"]}")'}))
        say(f"GET https://api.example.com/v1/models?key={env['KAGGLE_KEY']}")
        say(f'requests.get(url, auth=("trainer", "{env["DB_PASSWORD"]}"))')
        say(f"Authorization: Bearer {env['SERVICE_BEARER']}")
        say(f"hf token from the cache: {stored_hf}")
        say("the same, encoded:", base64.b64encode(stored_hf.encode()).decode(), urllib.parse.quote(env["DB_PASSWORD"]))
        say(f"slurm: SLURM_JWT={env['SLURM_JWT']}")
        sys.stdout.write("password=" + env["SPLIT_SECRET"][:6])  # one secret, two writes
        sys.stdout.flush()
        time.sleep(0.3)
        sys.stdout.write(env["SPLIT_SECRET"][6:] + "\n")
        sys.stdout.flush()
        with open(args.key_file) as f:
            for line in f.read().splitlines():  # a private key, one write per line
                say(line)
                time.sleep(0.02)
        say("after the key")
        blackbox.annotate(tokenizer="gpt2", pad_token="<pad>", hf_token=env["HF_TOKEN"])
        blackbox.log_metrics(step=1, tokens_per_sec=51234.5, max_tokens=4096)
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(1, 100000):
        if rank == 1 and step == 3:
            open(os.path.join(args.marker_dir, "rank1.hanging"), "w").close()
            while True:
                time.sleep(3600)
        loss = model(torch.randn(4, 8)).sum()
        opt.zero_grad()
        loss.backward()
        for prm in model.parameters():
            dist.all_reduce(prm.grad)
        opt.step()
        time.sleep(0.3)  # the liveness thread writes the annotations and metrics
    return 0


if __name__ == "__main__":
    sys.exit(main())
