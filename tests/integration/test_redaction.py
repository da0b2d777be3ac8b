"""Secrets never reach disk, and the evidence around them is kept, end to end: a 2-rank job under `blackbox run`
that prints, holds in its environment, reads from its YAML config and finds in its user's credential stores the
usual credentials, then hangs; and a job full of ML look-alikes that logs metrics and annotations and dies. Every
form of every secret (raw, JSON-escaped, URL-encoded, base64) is absent from every bundle member and from every
file of the run directory; every look-alike is present."""

from __future__ import annotations

import base64
import json
import random
import string
import sys
import tarfile
from pathlib import Path
from urllib.parse import quote, quote_plus

from blackbox.bundle.reader import read_bundle
from tests.conftest import PROGRAMS, TORCHRUN, bundles, run_blackbox

SECRETS_JOB = str(PROGRAMS / "secrets_hang_job.py")
_RNG = random.Random(2025)


def rand(n: int, alphabet: str = string.ascii_letters + string.digits) -> str:
    return "".join(_RNG.choice(alphabet) for _ in range(n))


def forms(value: str) -> set[str]:
    """A secret as it may be written: raw, JSON-escaped, URL-encoded, base64."""
    return {value, json.dumps(value)[1:-1], json.dumps(value, ensure_ascii=False)[1:-1], quote(value, safe=""),
            quote_plus(value), base64.b64encode(value.encode()).decode()}  # fmt: skip


def everything_written(run_dir: Path) -> dict[str, bytes]:
    """Every file blackbox and the recorder wrote in the run directory, and every member of every bundle."""
    written = {str(p): p.read_bytes() for p in run_dir.rglob("*") if p.is_file()}
    for bundle in bundles(run_dir):
        with tarfile.open(bundle) as tar:
            for m in tar.getmembers():
                if m.isfile():
                    written[f"{bundle.name}:{m.name}"] = tar.extractfile(m).read()  # type: ignore[union-attr]
    return written


def assert_absent(written: dict[str, bytes], secrets: list[str]) -> None:
    for value in secrets:
        for form in forms(value):
            for name, data in written.items():
                assert form.encode() not in data, f"{value!r} as {form!r} reached {name}"


def test_a_hung_jobs_credentials_never_reach_disk_and_its_evidence_does(tmp_path: Path, run_dir: Path) -> None:
    # GIVEN a user whose tools keep credentials where they always do
    home = tmp_path / "home"
    netrc_pw, stored_hf = rand(40, "0123456789abcdef"), "hf_" + rand(34, string.ascii_letters)
    (home / ".cache" / "huggingface").mkdir(parents=True)
    (home / ".cache" / "huggingface" / "token").write_text(stored_hf + "\n")
    (home / ".netrc").write_text(f"machine api.wandb.ai\n  login user\n  password {netrc_pw}\n")
    # AND a job environment holding the usual credentials, and look-alikes around them
    env = {
        "HOME": str(home), "WANDB_API_KEY": rand(40, "0123456789abcdef"), "HF_TOKEN": "hf_" + rand(34),
        "AWS_ACCESS_KEY_ID": "AKIA" + rand(16, string.ascii_uppercase + "234567"),
        "AWS_SECRET_ACCESS_KEY": rand(40, string.ascii_letters + string.digits + "/+"),
        "KAGGLE_KEY": rand(32, "0123456789abcdef"),
        "DB_PASSWORD": rand(14, string.ascii_letters + string.digits + "!#%&") + "é",
        "SERVICE_BEARER": rand(36), "SLURM_JWT": "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJ0cmFpbmVyIn0." + rand(43),
        "SPLIT_SECRET": rand(18), "DESKTOP_SESSION": "ubuntu", "WANDB_SESSION": "2", "PASSWORD_STORE_CLIP_TIME": "45",
        "GOOGLE_APPLICATION_CREDENTIALS": "/etc/gcp/sa.json",
    }  # fmt: skip
    # AND a YAML config naming more of them
    config_secrets = {"wandb_key": rand(40, "0123456789abcdef"), "db": rand(20), "k8s": rand(32), "token": rand(40)}
    config = tmp_path / "train.yaml"
    config.write_text(
        "lr: 0.1\ntokenizer: gpt2\nmax_tokens: 4096\n"
        f"wandb:\n  project: llama-ft\n  key: {config_secrets['wandb_key']}\n"
        f"credentials:\n  username: trainer\n  password: {config_secrets['db']}\n  token: {config_secrets['token']}\n"
        f"env:\n- name: MLFLOW_TRACKING_TOKEN\n  value: {config_secrets['k8s']}\n"
        "- name: WANDB_PROJECT\n  value: llama-ft\n"
    )  # fmt: skip
    key_body = [rand(64, string.ascii_letters + string.digits + "+/") for _ in range(4)]
    key = tmp_path / "key.pem"
    key.write_text("\n".join(["-----BEGIN PRIVATE KEY-----", *key_body, "-----END PRIVATE KEY-----"]) + "\n")
    markers = tmp_path / "markers"
    markers.mkdir()
    # WHEN it runs under blackbox, and rank 1 hangs
    res = run_blackbox(["run", "--run-dir", str(run_dir), "--stall-timeout", "4", "--poll-interval", "0.5",
                        "--kill-grace", "5", "--", TORCHRUN, "--nproc-per-node", "2", "--standalone", SECRETS_JOB,
                        "--config", str(config), "--key-file", str(key), "--marker-dir", str(markers)],
                       tmp_path, timeout=180, **env)  # fmt: skip
    # THEN blackbox ended the stalled job and bundled it; the job's own output went to the terminal unchanged
    assert res.returncode == 86, res.stderr.decode()[-3000:]
    assert env["WANDB_API_KEY"].encode() in res.stdout
    (bundle,) = bundles(run_dir)
    # AND no form of any secret is anywhere blackbox or the recorder wrote
    secrets = [env[k] for k in ("WANDB_API_KEY", "HF_TOKEN", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "KAGGLE_KEY",
                                "DB_PASSWORD", "SERVICE_BEARER", "SLURM_JWT", "SPLIT_SECRET")]  # fmt: skip
    secrets += [netrc_pw, stored_hf, *config_secrets.values(), *key_body]
    written = everything_written(run_dir)
    assert any(name.endswith("console-tail.log") for name in written)
    assert_absent(written, secrets)
    # AND the evidence around them is kept: every look-alike, the crash context, the config's other values
    sys.path.insert(0, str(PROGRAMS))
    import secrets_hang_job

    files = read_bundle(str(bundle)).files
    for text in (files["console-tail.log"].decode(), (run_dir / "console.log").read_text()):
        for line in secrets_hang_job.LOOKALIKES:
            assert line in text, line
        assert "-----BEGIN PRIVATE KEY-----\n<redacted>\n-----END PRIVATE KEY-----\nafter the key" in text
        assert "  username: trainer" in text and "- name: WANDB_PROJECT\n  value: llama-ft" in text
    job_env = json.loads(files["node/env.json"])
    assert job_env["AWS_ACCESS_KEY_ID"] == "<redacted>" and job_env["DB_PASSWORD"] == "<redacted>"
    for name in (
        "DESKTOP_SESSION",
        "WANDB_SESSION",
        "PASSWORD_STORE_CLIP_TIME",
        "GOOGLE_APPLICATION_CREDENTIALS",
        "HOME",
    ):
        assert job_env[name] == env[name], name
    (config_copy,) = [data.decode() for name, data in files.items() if name.endswith("train.yaml")]
    assert "lr: 0.1\ntokenizer: gpt2\nmax_tokens: 4096\n" in config_copy and "project: llama-ft" in config_copy
    annotations = json.dumps(json.loads((run_dir / "ranks" / "0" / "annotations.json").read_text()))
    assert "gpt2" in annotations and "<pad>" in annotations


def test_look_alikes_survive_and_secrets_in_every_form_do_not(tmp_path: Path, run_dir: Path) -> None:
    # GIVEN a job printing ML look-alikes and a private key line by line, logging metrics and annotations, raising
    # with a password holding `"`, `\` and non-ASCII characters; its command line holds a password flag and a `-p`
    # that is not one, and blackbox posts to a Slack webhook
    key = ["b3BlbnNzaC1rZXktdjEAAAAABG5vbmU", "AAAAEbm9uZQAAAAAAAAABAAABlwAAAAd"]
    (tmp_path / "key").write_text("\n".join(["-----BEGIN OPENSSH PRIVATE KEY-----", *key,
                                             "-----END OPENSSH PRIVATE KEY-----"]))  # fmt: skip
    secrets = {"HF_TOKEN": "hf-annotated-value-0123", "SERVICE_PASSWORD": 'pä"ss\\wörd-1234'}
    hook = "https://hooks.slack.com/services/T0000AAAA/B0000BBBB/webhookpathsecret0123"
    res = run_blackbox(["run", "--run-dir", str(run_dir), "--notify-url", hook, "--", sys.executable,
                        str(PROGRAMS / "lookalikes_job.py"), "--db-password", "mysqlpass77", "--pass", "cli-pass-88",
                        "-p", "2"], tmp_path, KEY_FILE=str(tmp_path / "key"), **secrets)  # fmt: skip
    assert res.returncode == 1, res.stderr
    # THEN no form of any secret is anywhere blackbox wrote
    assert_absent(everything_written(run_dir), [*key, *secrets.values(), "webhookpathsecret0123", "mysqlpass77",
                                                "cli-pass-88"])  # fmt: skip
    # AND the look-alikes are intact, the records still parse, and the key's neighbours are kept
    sys.path.insert(0, str(PROGRAMS))
    console = (run_dir / "console.log").read_text()
    for line in [*_lookalikes(), "after the key"]:
        assert line in console, line
    metrics = json.loads((run_dir / "ranks" / "0" / "metrics.json").read_text())
    assert "51234.5" in json.dumps(metrics) and "tokens_per_sec" in json.dumps(metrics)
    annotations = json.loads((run_dir / "ranks" / "0" / "annotations.json").read_text())
    assert "gpt2" in json.dumps(annotations) and "<pad>" in json.dumps(annotations)
    for line in (run_dir / "ranks" / "0" / "exceptions.jsonl").read_text().splitlines():
        assert "login refused for password" in json.loads(line)["message"]
    start = next(json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines())
    assert start["event"] == "start" and start["config"]["notify_url"] == "https://hooks.slack.com/<redacted>"
    assert start["command"][-2:] == ["-p", "2"]  # a `-p` that names no password is kept


def _lookalikes() -> list[str]:
    source = (PROGRAMS / "lookalikes_job.py").read_text()
    namespace: dict[str, object] = {}
    exec(source.split("print(*LOOKALIKES")[0].split('"""', 2)[2], namespace)  # the list, not the job
    return list(namespace["LOOKALIKES"])  # type: ignore[call-overload]
