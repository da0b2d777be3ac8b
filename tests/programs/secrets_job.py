"""A job that handles secrets carelessly: prints them, puts one in an exception, and fails.
Usage: secrets_job.py --config FILE. The secrets come from the environment and the config file."""

import argparse
import os
import sys

p = argparse.ArgumentParser()
p.add_argument("--config", required=True)
args = p.parse_args()
with open(args.config) as f:
    config = f.read()
print(f"config loaded: {len(config)} bytes")
print(f"Authorization: Bearer {os.environ['SERVICE_AUTH_BEARER']}")  # a header in a debug log
print(f"openai key {os.environ['SEED_OPENAI']}")  # a token format, whatever the variable's name
print(f"db password is {os.environ['DB_PASSWORD']}")  # the value of a credential-named variable
sys.stdout.flush()
raise RuntimeError(f"login failed for token {os.environ['HF_TOKEN']}")
