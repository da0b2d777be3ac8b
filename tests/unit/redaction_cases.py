"""The redaction corpus: secrets a training job really holds, each in the place it reaches disk from (free text and
console lines, command lines, environments, config files, records, writes split across a stream), and the ML
look-alikes around them that must come out unchanged. Shapes follow the tools' own docs (W&B, Hugging Face, MLflow,
AWS, GCP, Azure, Kubernetes, Slurm, PyTorch and NCCL logs); the values are made up, random where real ones are."""

from __future__ import annotations

import base64
import json
import random
import string
from dataclasses import dataclass
from typing import Any

_RNG = random.Random(25)


def rand(n: int, alphabet: str = string.ascii_letters + string.digits) -> str:
    return "".join(_RNG.choice(alphabet) for _ in range(n))


HEX = "0123456789abcdef"
B64 = string.ascii_letters + string.digits + "+/"


@dataclass(frozen=True)
class Case:
    path: str  # text | argv | env | config | record | stream
    given: Any  # str; list of words; dict; str; JSON-able data; list of writes
    secrets: tuple[str, ...] = ()  # what must be gone (a look-alike has none: it must come out unchanged)
    shape: str = ""  # what it is, for the table

    @property
    def label(self) -> str:
        return f"{self.path}: {self.shape or str(self.given)[:60]}"


# --- values ----------------------------------------------------------------------------------------------------
WANDB = rand(40, HEX)
WANDB2 = rand(40, HEX)
HF = "hf_" + rand(34, string.ascii_letters)
GHP = "ghp_" + rand(36)
GLPAT = "glpat-" + rand(20)
AKIA = "AKIA" + rand(16, string.ascii_uppercase + "234567")
ASIA = "ASIA" + rand(16, string.ascii_uppercase + "234567")
AWS_SECRET = rand(40, B64)
AWS_SESSION = "IQoJb3JpZ2luX2VjE" + rand(180, B64)
OPENAI = "sk-proj-" + rand(48) + "T3BlbkFJ" + rand(48)
ANTHROPIC = "sk-ant-api03-" + rand(93, string.ascii_letters + string.digits + "-_") + "AA"
STRIPE = "sk_live_" + rand(24)
SLACK = "xoxb-" + rand(12, string.digits) + "-" + rand(13, string.digits) + "-" + rand(24)
SLACK_HOOK = "https://hooks.slack.com/services/T" + rand(8, string.ascii_uppercase) + "/B" + rand(8) + "/" + rand(24)


def jwt() -> str:
    head = base64.urlsafe_b64encode(b'{"alg":"HS256","typ":"JWT"}').decode().rstrip("=")
    body = base64.urlsafe_b64encode(json.dumps({"sub": rand(8), "exp": 1924992000}).encode()).decode().rstrip("=")
    return f"{head}.{body}.{rand(43, string.ascii_letters + string.digits + '-_')}"


JWT = jwt()
SLURM_JWT = jwt()
K8S_SA_TOKEN = jwt()
AIZA = "AIza" + rand(35, string.ascii_letters + string.digits + "-_")
YA29 = "ya29.a0" + rand(120, string.ascii_letters + string.digits + "-_")
GOOG_REFRESH = "1//0g" + rand(60, string.ascii_letters + string.digits + "-_")
GOCSPX = "GOCSPX-" + rand(28, string.ascii_letters + string.digits + "-_")
DAPI = "dapi" + rand(32, HEX)
KAGGLE = rand(32, HEX)
B2_KEY = "K005" + rand(27)
B2_KEY_ID = "005" + rand(22, HEX)
FERNET = base64.urlsafe_b64encode(bytes(_RNG.randrange(256) for _ in range(32))).decode()
AZURE_KEY = base64.b64encode(bytes(_RNG.randrange(256) for _ in range(64))).decode()
AZURE_SIG = rand(43, B64).replace("+", "%2B").replace("/", "%2F") + "%3D"
AZURE_CLIENT_SECRET = rand(3) + "8Q~" + rand(34, string.ascii_letters + string.digits + "_~.-")
AZURE_CLIENT_ID = "6f2d1a3b-" + rand(4, HEX) + "-4" + rand(3, HEX) + "-a" + rand(3, HEX) + "-" + rand(12, HEX)
NEPTUNE = base64.b64encode(json.dumps({"api_address": "https://app.neptune.ai", "api_url": "https://app.neptune.ai",
                                       "api_key": rand(36)}).encode()).decode()  # fmt: skip
COMET = rand(25)
REPLICATE = "r8_" + rand(37)
GROQ = "gsk_" + rand(52)
NPM = "npm_" + rand(36)
PYPI = "pypi-AgEIcHlwaS5vcmc" + rand(120, string.ascii_letters + string.digits + "-_")
DOCKER_PAT = "dckr_pat_" + rand(27, string.ascii_letters + string.digits + "-_")
MLFLOW_SECRET = rand(32)
K8S_TOKEN = rand(40)


def pw(n: int = 16) -> str:
    return rand(n, string.ascii_letters + string.digits + "-_!#%")


PWS = [pw() for _ in range(200)]
P = iter(PWS)


def nxt() -> str:
    return next(P)


PEM_BODY = [rand(64, B64) for _ in range(5)] + [rand(24, B64) + "=="]
PEM = "-----BEGIN PRIVATE KEY-----\n" + "\n".join(PEM_BODY) + "\n-----END PRIVATE KEY-----\n"
SSH_BODY = [rand(70, B64) for _ in range(4)] + [rand(12, B64) + "="]
OPENSSH = "-----BEGIN OPENSSH PRIVATE KEY-----\n" + "\n".join(SSH_BODY) + "\n-----END OPENSSH PRIVATE KEY-----\n"
CLIENT_KEY_DATA = base64.b64encode(("-----BEGIN RSA PRIVATE KEY-----\n" + "\n".join(PEM_BODY[:3])).encode()).decode()
BASIC = base64.b64encode(b"trainer:" + nxt().encode()).decode()

# --- secrets ---------------------------------------------------------------------------------------------------
SECRET_TEXT = [
    (f"wandb login {WANDB}", (WANDB,), "wandb login KEY"),
    (f"$ wandb login --relogin --host https://wandb.example.com {WANDB2}", (WANDB2,), "wandb login --host H KEY"),
    (f"machine api.wandb.ai login user password {WANDB}", (WANDB,), ".netrc, one line"),
    (f"machine api.wandb.ai\n  login user\n  password {WANDB2}\n", (WANDB2,), ".netrc, over lines"),
    (f"mysql -uroot -p{(v := nxt())} -h db train", (v,), "mysql -pSECRET"),
    (f"mysql -u root -p {(v := nxt())} -h db", (v,), "mysql -p SECRET"),
    (f"mysqldump --user=trainer --password={(v := nxt())} runs > runs.sql", (v,), "mysqldump --password="),
    (f"aws configure set aws_secret_access_key {AWS_SECRET}", (AWS_SECRET,), "aws configure set"),
    (f"aws configure set aws_access_key_id {AKIA}", (AKIA,), "aws configure set (id)"),
    (f"Charging with {STRIPE}", (STRIPE,), "bare Stripe key"),
    (f"KAGGLE_KEY={KAGGLE}", (KAGGLE,), "KAGGLE_KEY="),
    (f"export B2_APPLICATION_KEY={B2_KEY}", (B2_KEY,), "B2_APPLICATION_KEY"),
    (f"FERNET_KEY={FERNET}", (FERNET,), "FERNET_KEY"),
    (f"wandb:\n  project: llama-ft\n  key: {WANDB}\n", (WANDB,), "YAML wandb: key:"),
    (f'[wandb]\nproject = "llama-ft"\nkey = "{WANDB2}"\n', (WANDB2,), "TOML [wandb] key ="),
    (
        f"env:\n- name: WANDB_API_KEY\n  value: {WANDB}\n- name: WANDB_PROJECT\n  value: llama-ft\n",
        (WANDB,),
        "Kubernetes env list",
    ),
    (f"    client-key-data: {CLIENT_KEY_DATA}", (CLIENT_KEY_DATA,), "kubeconfig client-key-data"),
    (
        f"GET https://maps.googleapis.com/maps/api/geocode/json?address=Paris&key={(v := rand(32))}",
        (v,),
        "?key= in a URL",
    ),
    (f'r = requests.get(url, auth=("trainer", "{(v := nxt())}"))', (v,), "auth= tuple"),
    (
        json.dumps({"level": "info", "msg": f'connect(host="db", password="{(v := nxt())}")'}),
        (v,),
        "password= in a JSON log line",
    ),
    (f"db.internal:5432:runs:trainer:{(v := nxt())}", (v,), ".pgpass line"),
    (
        f"credentials:\n  username: trainer\n  password: {(v := nxt())}\n  token: {(w := rand(40))}\n",
        (v, w),
        "credentials: block printed",
    ),
    (f"AWS_ACCESS_KEY_ID={AKIA}", (AKIA,), "AWS key id"),
    (f"Using key {ASIA} with secret {AWS_SECRET}", (ASIA, AWS_SECRET), "AWS id with its secret"),
    (f"Authorization: Bearer {JWT}", (JWT,), "Authorization: Bearer"),
    (f"curl -H 'Authorization: token {GHP}' https://api.github.com/user", (GHP,), "curl -H Authorization: token"),
    (f'curl -H "X-Api-Key: {(v := rand(32))}" https://api.example.com/v1', (v,), "X-Api-Key header"),
    (f"curl -u alice:{(v := nxt())} https://mlflow.internal/api", (v,), "curl -u user:pw"),
    (f"git clone https://oauth2:{GLPAT}@gitlab.com/team/repo.git", (GLPAT,), "token in URL userinfo"),
    (f"git clone https://{GHP}@github.com/org/repo", (GHP,), "token as URL user"),
    (f"engine = create_engine('postgresql://trainer:{(v := nxt())}@db:5432/runs')", (v,), "password in a DB URL"),
    (f"mongodb+srv://ml:{(v := nxt())}@cluster0.abcde.mongodb.net/?retryWrites=true", (v,), "mongodb+srv URL"),
    (f"cache at redis://:{(v := nxt())}@cache:6379/0", (v,), "redis://:pw@"),
    (f"HF_TOKEN={HF}", (HF,), "HF_TOKEN="),
    (f"huggingface-cli login --token {HF} --add-to-git-credential", (HF,), "huggingface-cli login --token"),
    (f"hf auth login --token {(v := rand(40))}", (v,), "hf auth login --token"),
    (f"OPENAI_API_KEY={OPENAI}", (OPENAI,), "OpenAI key"),
    (f'client = anthropic.Anthropic(api_key="{ANTHROPIC}")', (ANTHROPIC,), "Anthropic key in code"),
    (f"slack: posting with {SLACK}", (SLACK,), "Slack bot token"),
    (f"posting to {SLACK_HOOK}", (SLACK_HOOK.rsplit("/", 3)[-1],), "Slack webhook URL"),
    (f"SLURM_JWT={SLURM_JWT}", (SLURM_JWT,), "Slurm JWT (scontrol token)"),
    (f"MLFLOW_TRACKING_PASSWORD={(v := nxt())}", (v,), "MLFLOW_TRACKING_PASSWORD"),
    (f"MLFLOW_TRACKING_TOKEN={DAPI}", (DAPI,), "MLflow token (Databricks)"),
    (f'export MLFLOW_FLASK_SERVER_SECRET_KEY="{MLFLOW_SECRET}"', (MLFLOW_SECRET,), "MLflow server secret key"),
    (
        f"https://examplebucket.s3.amazonaws.com/test.txt?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential={AKIA}"
        f"%2F20130721%2Fus-east-1%2Fs3%2Faws4_request&X-Amz-Date=20130721T201207Z&X-Amz-Expires=86400&X-Amz-Security-"
        f"Token={AWS_SESSION[:80]}&X-Amz-SignedHeaders=host&X-Amz-Signature={(v := rand(64, HEX))}",
        (AKIA, AWS_SESSION[:80], v),
        "S3 presigned URL",
    ),
    (
        f"DefaultEndpointsProtocol=https;AccountName=mldata;AccountKey={AZURE_KEY};EndpointSuffix=core.windows.net",
        (AZURE_KEY,),
        "Azure connection string",
    ),
    (
        "https://mldata.blob.core.windows.net/ckpt/model.pt?sv=2022-11-02&ss=b&srt=o&sp=r&"
        f"se=2030-01-01&sig={AZURE_SIG}",
        (AZURE_SIG,),
        "Azure SAS URL",
    ),
    (
        '  "private_key": "-----BEGIN PRIVATE KEY-----\\n' + "\\n".join(PEM_BODY) + '\\n-----END PRIVATE KEY-----\\n",',
        tuple(PEM_BODY[:3]),
        "GCP service-account private_key",
    ),
    (f'  "private_key_id": "{(v := rand(40, HEX))}",', (v,), "GCP private_key_id"),
    (f"google.auth: using access token {YA29}", (YA29,), "Google OAuth access token"),
    (f"refresh_token {GOOG_REFRESH}", (GOOG_REFRESH,), "Google refresh token"),
    (f"client_secret={GOCSPX}", (GOCSPX,), "Google client secret"),
    ("printing key file:\n" + PEM, tuple(PEM_BODY), "PEM private key"),
    (OPENSSH, tuple(SSH_BODY), "OpenSSH private key"),
    (
        "-----BEGIN RSA PRIVATE KEY-----\nProc-Type: 4,ENCRYPTED\nDEK-Info: AES-128-CBC,3F2A9C1B7E8D4F6A\n\n"
        + "\n".join(PEM_BODY[:3])
        + "\n-----END RSA PRIVATE KEY-----",
        tuple(PEM_BODY[:3]),
        "encrypted PEM key",
    ),
    (
        f"jwt.exceptions.ExpiredSignatureError: Signature has expired: {K8S_SA_TOKEN}",
        (K8S_SA_TOKEN,),
        "a JWT in an error",
    ),
    (f"Cookie: session={(v := rand(32))}; csrftoken={(w := rand(32))}", (v, w), "Cookie header"),
    (f"Set-Cookie: sessionid={(v := rand(32))}; Path=/; HttpOnly", (v,), "Set-Cookie header"),
    (f"docker login -u trainer -p {(v := nxt())} registry.example.com", (v,), "docker login -p"),
    (f"sshpass -p '{(v := nxt())}' ssh trainer@login-node", (v,), "sshpass -p"),
    (f"redis-cli -h cache -a {(v := nxt())} ping", (v,), "redis-cli -a"),
    (f"openssl enc -aes-256-cbc -pass pass:{(v := nxt())} -in ckpt.pt -out ckpt.enc", (v,), "openssl -pass pass:"),
    (f"7z x data.7z -p{(v := nxt())} -o/data", (v,), "7z -pSECRET"),
    (f"smbclient //nas/share -U trainer%{(v := nxt())}", (v,), "smbclient -U user%pw"),
    (f"ldapsearch -x -D cn=admin,dc=example,dc=org -w {(v := nxt())} -b dc=example,dc=org", (v,), "ldapsearch -w"),
    (f"PGPASSWORD={(v := nxt())} psql -h db -U trainer runs", (v,), "PGPASSWORD= psql"),
    (f'os.environ["WANDB_API_KEY"] = "{WANDB}"', (WANDB,), "os.environ[...] = literal"),
    (f'os.environ.setdefault("COMET_API_KEY", "{COMET}")', (COMET,), "setdefault(name, literal)"),
    (f'wandb.login(key="{WANDB2}")', (WANDB2,), "wandb.login(key=...)"),
    (f'login(token="{(v := rand(37))}")', (v,), "huggingface_hub.login(token=...)"),
    (f'auth = aiohttp.BasicAuth("trainer", "{(v := nxt())}")', (v,), "aiohttp.BasicAuth"),
    (f'server.login("alerts@example.com", "{(v := nxt())}")', (v,), "smtplib login"),
    (f'{{"name": "WANDB_API_KEY", "value": "{WANDB}"}}', (WANDB,), "env entry as JSON"),
    (f"npm config set //registry.npmjs.org/:_authToken {NPM}", (NPM,), "npm _authToken"),
    (f"setenv WANDB_API_KEY {WANDB2}", (WANDB2,), "csh setenv"),
    (f"Authorization: Basic {BASIC}", (BASIC,), "Authorization: Basic"),
    (f"proxy: sending Basic {BASIC} to the registry", (BASIC,), "bare Basic credential"),
    (f"    token: {K8S_TOKEN}", (K8S_TOKEN,), "kubeconfig token:"),
    (f'      "auth": "{BASIC}"', (BASIC,), "Docker config auth"),
    (f"NEPTUNE_API_TOKEN={NEPTUNE}", (NEPTUNE,), "Neptune token"),
    (f"REPLICATE_API_TOKEN={REPLICATE}", (REPLICATE,), "Replicate token"),
    (f"groq: {GROQ}", (GROQ,), "Groq key"),
    (f"export AWS_SESSION_TOKEN={AWS_SESSION}", (AWS_SESSION,), "AWS session token"),
    (f"aws_secret_access_key = {AWS_SECRET}", (AWS_SECRET,), "~/.aws/credentials line"),
    (f'{{"username": "trainer", "password": "{(v := nxt())}"}}', (v,), '"password": in JSON'),
    ("password: correct horse battery staple", ("horse battery staple",), "a passphrase"),
    ('passphrase = "ten thousand hungry pelicans"', ("hungry pelicans",), "passphrase ="),
    (f"--db-password {(v := nxt())}", (v,), "--db-password VALUE"),
    (f"--api-key={(v := rand(32))}", (v,), "--api-key=VALUE"),
    (f"python train.py --hf_token {(v := rand(32))} --lr 1e-4", (v,), "--hf_token VALUE"),
    (f"MYSQL_PWD={(v := nxt())}", (v,), "MYSQL_PWD="),
    (f"DB_PASS={(v := nxt())}", (v,), "DB_PASS="),
    (f"SMTP_PASSWORD='{(v := nxt())}'", (v,), "SMTP_PASSWORD='...'"),
    (
        f"client_id: {(w := AZURE_CLIENT_ID)}\nclient_secret: {AZURE_CLIENT_SECRET}\n",
        (w, AZURE_CLIENT_SECRET),
        "client_id beside client_secret",
    ),
    (f"AZURE_CLIENT_SECRET={AZURE_CLIENT_SECRET}", (AZURE_CLIENT_SECRET,), "Azure AD client secret"),
    (f"docker login -u trainer --password-stdin <<< {DOCKER_PAT}", (DOCKER_PAT,), "Docker Hub PAT"),
    (f"twine upload -u __token__ -p {PYPI} dist/*", (PYPI,), "PyPI token"),
    (f"DATABRICKS_TOKEN={DAPI}", (DAPI,), "Databricks token"),
    (f"kubectl create secret generic db --from-literal=password='{(v := nxt())}'", (v,), "kubectl --from-literal"),
    (f"kubectl config set-credentials trainer --token={(v := rand(40))}", (v,), "kubectl set-credentials --token"),
    (
        f"apiVersion: v1\nkind: Secret\nmetadata:\n  name: db\ntype: Opaque\ndata:\n  password: "
        f"{(v := base64.b64encode(nxt().encode()).decode())}\n",
        (v,),
        "Kubernetes Secret manifest",
    ),
    (
        f"Traceback (most recent call last):\nValueError: invalid api_key '{(v := rand(32))}'",
        (v,),
        "api_key in an error",
    ),
    (f"HfHubHTTPError: 401 Client Error for url (token: {HF})", (HF,), "token in an exception"),
    (f"'Authorization': 'Bearer {(v := rand(40))}'", (v,), "Authorization in a dict repr"),
    (f"headers={{'Authorization': 'token {GHP}'}}", (GHP,), "GitHub token in headers"),
    (f"GITHUB_TOKEN={GHP}", (GHP,), "GITHUB_TOKEN"),
    (f"CI_JOB_TOKEN={(v := rand(20))}", (v,), "CI_JOB_TOKEN"),
    (f"WANDB_API_KEY={WANDB}", (WANDB,), "WANDB_API_KEY= in text"),
    (
        f"[default]\naws_access_key_id = {AKIA}\naws_secret_access_key = {AWS_SECRET}\n",
        (AKIA, AWS_SECRET),
        "~/.aws/credentials printed",
    ),
    (f"sentry_sdk.init(dsn='https://{(v := rand(32, HEX))}@o123.ingest.sentry.io/456')", (v,), "Sentry DSN"),
    (f"signing with secret_key={(v := rand(50))}", (v,), "secret_key="),
    (f"session_token: {(v := rand(64))}", (v,), "session_token:"),
    (
        "[rank0]:-----BEGIN PRIVATE KEY-----\n"
        + "".join(f"[rank0]:{line}\n" for line in PEM_BODY)
        + "[rank0]:-----END PRIVATE KEY-----\n",
        tuple(PEM_BODY),
        "a key printed under torchrun's rank prefix",
    ),
    (f'openai.api_key = "{OPENAI}"', (OPENAI,), "openai.api_key ="),
    (
        f's3 = boto3.client("s3", aws_access_key_id="{AKIA}", aws_secret_access_key="{AWS_SECRET}")',
        (AKIA, AWS_SECRET),
        "boto3.client(...) keys",
    ),
    (
        f'fs = s3fs.S3FileSystem(key="{(w := rand(20, string.ascii_uppercase + string.digits))}",'
        f' secret="{(v := rand(40))}")',
        (w, v),
        "s3fs key=, secret=",
    ),
    (
        f'storage_options={{"account_name": "mldata", "account_key": "{AZURE_KEY}"}}',
        (AZURE_KEY,),
        "fsspec storage_options",
    ),
    (f'conn = psycopg2.connect(dbname="runs", user="trainer", password="{(v := nxt())}")', (v,), "psycopg2.connect"),
    (
        f'mlflow.set_tracking_uri("https://trainer:{(v := nxt())}@mlflow.internal")',
        (v,),
        "tracking URI with a password",
    ),
    (f"args: Namespace(lr=0.001, hf_token='{(v := rand(34))}', seed=42)", (v,), "argparse Namespace"),
    (f"-e WANDB_API_KEY={WANDB} -e HF_TOKEN={HF}", (WANDB, HF), "docker run -e"),
    (f"    http://127.0.0.1:8888/lab?token={(v := rand(48, HEX))}", (v,), "Jupyter server token"),
    (f"origin\thttps://trainer:{GHP}@github.com/org/repo.git (fetch)", (GHP,), "git remote -v"),
    (
        f"pip install --extra-index-url https://__token__:{(v := rand(40))}@pypi.example.com/simple pkg",
        (v,),
        "pip --extra-index-url with a token",
    ),
    (f"X-Auth-Token: {(v := rand(40))}", (v,), "X-Auth-Token header"),
    (f"Proxy-Authorization: Basic {BASIC}", (BASIC,), "Proxy-Authorization"),
    (
        f'{{"Credentials": {{"AccessKeyId": "{ASIA}", "SecretAccessKey": "{AWS_SECRET}", "SessionToken": '
        f'"{AWS_SESSION[:60]}", "Expiration": "2030-01-01T00:00:00Z"}}}}',
        (ASIA, AWS_SECRET, AWS_SESSION[:60]),
        "aws sts get-session-token output",
    ),
    (
        f'api {{ credentials {{ "access_key" = '
        f'"{(w := rand(20, string.ascii_uppercase + string.digits))}", "secret_key" = '
        f'"{(v := rand(40))}" }} }}',
        (w, v),
        "clearml.conf credentials",
    ),
    (f"MINIO_ROOT_PASSWORD={(v := nxt())}", (v,), "MINIO_ROOT_PASSWORD"),
    (f"CLEARML_API_SECRET_KEY={(v := rand(40))}", (v,), "CLEARML_API_SECRET_KEY"),
    (f"PRIVATE-TOKEN: {GLPAT}", (GLPAT,), "GitLab PRIVATE-TOKEN header"),
    (f"export COHERE_API_KEY={(v := rand(40))}", (v,), "COHERE_API_KEY"),
    (f"os.environ['MISTRAL_API_KEY']='{(v := rand(32))}'", (v,), "os.environ[...]='...'"),
    (f"together.api_key = '{(v := rand(64, HEX))}'", (v,), "module.api_key ="),
    (f"[2024-05-01 12:00:00] INFO Using HF token {HF}", (HF,), "HF token in a log line"),
    (f"wandb: WARNING API key {WANDB} is invalid", (WANDB,), "API key in a W&B warning"),
    (f"trainer = Trainer(args, hub_token='{(v := rand(34))}')", (v,), "hub_token= keyword"),
    (f"--hub_token {HF}", (HF,), "--hub_token"),
    (f"mysql+pymysql://root:{(v := nxt())}@10.0.0.5:3306/exp", (v,), "SQLAlchemy URL"),
    (f"amqp://guest:{(v := nxt())}@rabbit:5672//", (v,), "AMQP URL"),
    (f"s3cmd --access_key={AKIA} --secret_key={AWS_SECRET}", (AKIA, AWS_SECRET), "s3cmd keys"),
    (f"AWS credentials: ('{AKIA}', '{AWS_SECRET}')", (AKIA, AWS_SECRET), "AWS credentials tuple"),
    (f"Bearer {(v := '4f3a9c1b-7e8d-4f6a-9b0c-' + rand(12, HEX))}", (v,), "bare Bearer UUID"),
    (f"x-api-key: {(v := rand(20))}", (v,), "x-api-key header"),
    (f"GH_TOKEN=github_pat_11{(v := rand(80, string.ascii_letters + string.digits + '_'))}", (v,), "fine-grained PAT"),
    (f"  - --set=secrets.wandbKey={WANDB}", (WANDB,), "helm --set secrets.wandbKey"),
    (f"helm install x --set auth.password={(v := nxt())}", (v,), "helm --set auth.password"),
    (f"spark.hadoop.fs.s3a.secret.key={AWS_SECRET}", (AWS_SECRET,), "Spark s3a secret.key"),
    (f"fs.azure.account.key.mldata.blob.core.windows.net={AZURE_KEY}", (AZURE_KEY,), "Hadoop Azure account key"),
    (f"ENV WANDB_API_KEY {WANDB}", (WANDB,), "Dockerfile ENV"),
    (f"password        {(v := rand(12))}", (v,), "password, spaces, value"),
    (f"login: trainer / password: {(v := nxt())}", (v,), "login / password on one line"),
    (f"'api-key': '{(v := rand(20))}'", (v,), "'api-key': in a dict"),
    (f"<password>{(v := nxt())}</password>", (v,), "XML element"),
    (f'<add key="ApiKey" value="{(v := rand(20))}" />', (v,), ".NET appSettings"),
    (f'token := "{(v := rand(20))}"', (v,), "Go assignment"),
    (f'$env:OPENAI_API_KEY = "{OPENAI}"', (OPENAI,), "PowerShell env"),
    (f"NGC_CLI_API_KEY=nvapi-{(v := rand(40))}", (v,), "NGC key"),
    (f"ngc config set: apikey = {(v := rand(36))}", (v,), "apikey ="),
    (f"Using secret: {(v := rand(20))}", (v,), "secret: in prose"),
    (f"the token is {(v := rand(20))}", (v,), "token is VALUE"),
    (f"bot = telegram.Bot(token='123456789:{(v := rand(35))}')", (v,), "Telegram bot token"),
    (f"Webhook: https://discord.com/api/webhooks/123456789012345678/{(v := rand(40))}", (v,), "Discord webhook"),
    # the second held-out round, kept as written
    ("ray start --head --redis-password=5241590000000000", ("5241590000000000",), "held-out round 2"),
    ("RAY_REDIS_PASSWORD=Zt3mQ9wL2pX8", ("Zt3mQ9wL2pX8",), "held-out round 2"),
    (
        "vllm serve meta-llama/Llama-3-8B --api-key token-abc123XYZ789def",
        ("token-abc123XYZ789def",),
        "held-out round 2",
    ),
    ("VLLM_API_KEY=abcdef0123456789ABCDEF", ("abcdef0123456789ABCDEF",), "held-out round 2"),
    (
        "lightning run app --secret WANDB_API_KEY=0123456789abcdef0123456789abcdef01234567",
        ("0123456789abcdef0123456789abcdef01234567",),
        "held-out round 2",
    ),
    ("comet_ml.init(api_key='Ab3dEf6hIj9kLm2nOp5qRs8tU')", ("Ab3dEf6hIj9kLm2nOp5qRs8tU",), "held-out round 2"),
    (
        'Experiment(api_key="Ab3dEf6hIj9kLm2nOp5qRs8tU", project_name="x")',
        ("Ab3dEf6hIj9kLm2nOp5qRs8tU",),
        "held-out round 2",
    ),
    (
        "neptune.init_run(project='ws/proj', "
        "api_token='eyJhcGlfYWRkcmVzcyI6Imh0dHBzOi8vYXBwLm5lcHR1bmUuYWkiLCJhcGlfa2V5IjoiYWJjIn0=')",
        ("eyJhcGlfYWRkcmVzcyI6Imh0dHBzOi8vYXBwLm5lcHR1bmUuYWkiLCJhcGlfa2V5IjoiYWJjIn0=",),
        "held-out round 2",
    ),
    (
        "clearml-init: access_key=GK4PRTVT3706T25K6BA1 secret_key=ZxYwVuTsRqPoNmLkJiHgFeDcBa9876543210abcdEF",
        ("ZxYwVuTsRqPoNmLkJiHgFeDcBa9876543210abcdEF",),
        "held-out round 2",
    ),
    (
        "Authorization: AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/"
        "s3/aws4_request, SignedHeaders=host;range;x-amz-date, "
        "Signature=fe5f80f77d5fa3beca038a248ff027d0445342fe2855ddc963176630326f1024",
        ("fe5f80f77d5fa3beca038a248ff027d0445342fe2855ddc963176630326f1024",),
        "held-out round 2",
    ),
    (
        "wandb.init(settings=wandb.Settings(api_key='0123456789abcdef0123456789abcdef01234567'))",
        ("0123456789abcdef0123456789abcdef01234567",),
        "held-out round 2",
    ),
    (
        "kubectl create secret docker-registry regcred --docker-server=r.io --docker-username=u "
        "--docker-password=Qw3rTy9!x",
        ("Qw3rTy9!x",),
        "held-out round 2",
    ),
    (
        "gcloud auth activate-service-account --key-file=/tmp/sa.json && "
        "echo 'ya29.c.b0AXv0zTPabcdefghijklmnopqrstuvwxyz0123456789'",
        ("ya29.c.b0AXv0zTPabcdefghijklmnopqrstuvwxyz0123456789",),
        "held-out round 2",
    ),
    (
        'Got response: {"access_token":"Zm9vYmFyYmF6cXV4MTIzNDU2Nzg5","token_type":"Bearer","expires_in":3599}',
        ("Zm9vYmFyYmF6cXV4MTIzNDU2Nzg5",),
        "held-out round 2",
    ),
    (
        "refresh_token=1//0gLq3pQ7rS9tU2vW4xY6zA8bC0dE1fG3hI5jK7lM9nO",
        ("1//0gLq3pQ7rS9tU2vW4xY6zA8bC0dE1fG3hI5jK7lM9nO",),
        "held-out round 2",
    ),
    (
        "export AZURE_OPENAI_API_KEY=0a1b2c3d4e5f60718293a4b5c6d7e8f9",
        ("0a1b2c3d4e5f60718293a4b5c6d7e8f9",),
        "held-out round 2",
    ),
    (
        "HUGGINGFACEHUB_API_TOKEN=hf_AbCdEfGhIjKlMnOpQrStUvWxYzAbCdEfGh",
        ("hf_AbCdEfGhIjKlMnOpQrStUvWxYzAbCdEfGh",),
        "held-out round 2",
    ),
    (
        "2024-05-01 12:00:01,123 - DEBUG - urllib3: https://user:p4ssW0rd!@artifactory.example.com:443 "
        '"GET /api HTTP/1.1" 200',
        ("p4ssW0rd!",),
        "held-out round 2",
    ),
    (
        "mc alias set myminio http://minio:9000 minioadmin Sup3rS3cretPassw0rd",
        ("Sup3rS3cretPassw0rd",),
        "held-out round 2",
    ),
    (
        "DVC remote: dvc remote modify --local myremote secret_access_key 'wJalrXUtnFEMI/K7MDENG/bPxRfiCYzz9KEYabcd'",
        ("wJalrXUtnFEMI/K7MDENG/bPxRfiCYzz9KEYabcd",),
        "held-out round 2",
    ),
    (
        '[remote "storage"]\n    url = s3://bucket/dvc\n    access_key_id = AKIAJ7Q2XYZ3ABCD4EFG\n '
        "   secret_access_key = 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\n",
        ("wJalrXUtnFEMI/K7MDENG/bPxRfiCYzz9KEYabcd",),
        "held-out round 2",
    ),
    ("webhook_secret: whsec_AbCdEf0123456789GhIjKlMnOpQr", ("whsec_AbCdEf0123456789GhIjKlMnOpQr",), "held-out round 2"),
    (
        "SECRET_KEY = 'django-insecure-7#x!k2$w9@z5^q3&m8*p1(r4)t6_y0+v'",
        ("django-insecure-7#x!k2$w9@z5^q3&m8*p1(r4)t6_y0+v",),
        "held-out round 2",
    ),
    (
        "encryption_key: !!binary |\n  R0lGODlhDAAMAIQAAP//9/X17unp5WZmZgAAAOfn515eXvPz7Y6OjuDg4J+fn5\n",
        ("R0lGODlhDAAMAIQAAP//9/X17unp5WZmZgAAAOfn515eXvPz7Y6OjuDg4J+fn5",),
        "held-out round 2",
    ),
    (
        '  --docker-password "$(aws ecr get-login-password)" but literal: --docker-password=Zx9kQ2mL7pW4',
        ("Zx9kQ2mL7pW4",),
        "held-out round 2",
    ),
]

SECRET_ENV = [
    ({"WANDB_API_KEY": WANDB}, (WANDB,)),
    ({"HF_TOKEN": HF}, (HF,)),
    ({"HUGGING_FACE_HUB_TOKEN": (v := rand(37))}, (v,)),
    ({"AWS_ACCESS_KEY_ID": AKIA, "AWS_SECRET_ACCESS_KEY": AWS_SECRET}, (AKIA, AWS_SECRET)),
    ({"AWS_SESSION_TOKEN": AWS_SESSION}, (AWS_SESSION,)),
    ({"KAGGLE_USERNAME": "trainer", "KAGGLE_KEY": KAGGLE}, (KAGGLE,)),
    ({"B2_APPLICATION_KEY_ID": B2_KEY_ID, "B2_APPLICATION_KEY": B2_KEY}, (B2_KEY_ID, B2_KEY)),
    ({"FERNET_KEY": FERNET}, (FERNET,)),
    ({"MLFLOW_TRACKING_USERNAME": "trainer", "MLFLOW_TRACKING_PASSWORD": (v := nxt())}, (v,)),
    ({"MLFLOW_TRACKING_TOKEN": DAPI}, (DAPI,)),
    ({"DATABRICKS_TOKEN": DAPI}, (DAPI,)),
    ({"NEPTUNE_API_TOKEN": NEPTUNE}, (NEPTUNE,)),
    ({"COMET_API_KEY": COMET}, (COMET,)),
    ({"OPENAI_API_KEY": OPENAI}, (OPENAI,)),
    ({"ANTHROPIC_API_KEY": ANTHROPIC}, (ANTHROPIC,)),
    (
        {"AZURE_CLIENT_ID": AZURE_CLIENT_ID, "AZURE_CLIENT_SECRET": AZURE_CLIENT_SECRET, "AZURE_TENANT_ID": "common"},
        (AZURE_CLIENT_ID, AZURE_CLIENT_SECRET),
    ),
    (
        {"AZURE_STORAGE_CONNECTION_STRING": f"DefaultEndpointsProtocol=https;AccountName=x;AccountKey={AZURE_KEY}"},
        (AZURE_KEY,),
    ),
    ({"GOOGLE_API_KEY": AIZA}, (AIZA,)),
    ({"SLURM_JWT": SLURM_JWT}, (SLURM_JWT,)),
    ({"PGPASSWORD": (v := nxt())}, (v,)),
    ({"MYSQL_PWD": (v := nxt())}, (v,)),
    ({"REDIS_URL": f"redis://:{(v := nxt())}@cache:6379/0"}, (v,)),
    ({"DATABASE_URL": f"postgresql://trainer:{(v := nxt())}@db:5432/runs"}, (v,)),
    ({"SENTRY_DSN": f"https://{(v := rand(32, HEX))}@o1.ingest.sentry.io/1"}, (v,)),
    ({"SLACK_WEBHOOK_URL": SLACK_HOOK}, (SLACK_HOOK,)),
    ({"GITHUB_TOKEN": GHP}, (GHP,)),
    ({"CI_JOB_TOKEN": (v := rand(20))}, (v,)),
    ({"NGC_API_KEY": (v := rand(84))}, (v,)),
    ({"DOCKER_PASSWORD": (v := nxt())}, (v,)),
    ({"PLAIN_NAMED": GHP}, (GHP,)),
    ({"REPLICATE_API_TOKEN": REPLICATE}, (REPLICATE,)),
    ({"GROQ_API_KEY": GROQ}, (GROQ,)),
    ({"PINECONE_API_KEY": (v := "pcsk_" + rand(60))}, (v,)),
    ({"SERVICE_AUTH_BEARER": (v := rand(30))}, (v,)),
]

SECRET_ARGV = [
    (["wandb", "login", WANDB], (WANDB,)),
    (["wandb", "login", "--relogin", "--host", "https://wandb.example.com", WANDB2], (WANDB2,)),
    (["mysql", "-uroot", f"-p{(v := nxt())}"], (v,)),
    (["mysql", "-u", "root", "-p", (v := nxt()), "runs"], (v,)),
    (["python", "train.py", "--hf-token", (v := rand(32))], (v,)),
    (["python", "train.py", "--wandb_api_key", WANDB], (WANDB,)),
    (["torchrun", "--nproc-per-node", "8", "train.py", f"--api-key={(v := rand(32))}"], (v,)),
    (["aws", "configure", "set", "aws_secret_access_key", AWS_SECRET], (AWS_SECRET,)),
    (["docker", "login", "-u", "trainer", "-p", (v := nxt()), "registry.example.com"], (v,)),
    (["sshpass", "-p", (v := nxt()), "ssh", "login-node"], (v,)),
    (["curl", "-u", f"alice:{(v := nxt())}", "https://mlflow.internal"], (v,)),
    (["git", "clone", f"https://trainer:{(v := nxt())}@git.example.com/ml/repo.git"], (v,)),
    (["huggingface-cli", "login", "--token", HF], (HF,)),
    (["redis-cli", "-a", (v := nxt()), "ping"], (v,)),
    (["openssl", "enc", "-aes-256-cbc", "-pass", f"pass:{(v := nxt())}"], (v,)),
    (["python", "train.py", "--token", (v := rand(40))], (v,)),
    (["python", "-m", "trainer", "--password", (v := nxt())], (v,)),
    (["env", f"WANDB_API_KEY={WANDB}", "python", "train.py"], (WANDB,)),
    (["bash", "-c", f"mysql -p{(v := nxt())} -e 'select 1'"], (v,)),
    (["python", "train.py", f"--db-url=postgresql://u:{(v := nxt())}@db/runs"], (v,)),
    (["python", "train.py", "--openai-api-key", OPENAI], (OPENAI,)),
]

SECRET_CONFIG = [
    (f"model: llama-3-8b\nwandb:\n  project: llama-ft\n  api_key: {WANDB}\nhf_token: {HF}\n", (WANDB, HF)),
    (
        f"optimizer:\n  lr: 3e-4\ncredentials:\n  aws_access_key_id: {AKIA}\n  aws_secret_access_key: {AWS_SECRET}\n",
        (AKIA, AWS_SECRET),
    ),
    (f'[tracking]\nuri = "https://mlflow.internal"\npassword = "{(v := nxt())}"\n', (v,)),
    (
        f"[default]\naws_access_key_id = {AKIA}\naws_secret_access_key = {AWS_SECRET}\naws_session_token = "
        f"{AWS_SESSION}\nregion = us-east-1\n",
        (AKIA, AWS_SECRET, AWS_SESSION),
    ),
    (f"WANDB_API_KEY={WANDB}\nHF_TOKEN={HF}\nDATA_DIR=/data\n", (WANDB, HF)),
    (
        json.dumps(
            {
                "type": "service_account",
                "project_id": "ml-prod",
                "private_key_id": (v := rand(40, HEX)),
                "private_key": PEM,
                "client_email": "trainer@ml-prod.iam.gserviceaccount.com",
                "client_id": "104932712938749871234",
            },
            indent=2,
        ),
        (v, *PEM_BODY),
    ),
    (
        f"apiVersion: v1\nkind: Config\nusers:\n- name: trainer\n  user:\n    client-certificate-data: LS0tLS1CRUdJTiBD"
        f"RVJUSUZJQ0FURS0tLS0t\n    client-key-data: {CLIENT_KEY_DATA}\n- name: sa\n  user:\n "
        f"   token: {K8S_SA_TOKEN}\n",
        (CLIENT_KEY_DATA, K8S_SA_TOKEN),
    ),
    (json.dumps({"auths": {"registry.example.com": {"auth": BASIC}}, "credsStore": "desktop"}), (BASIC,)),
    (
        f"machine api.wandb.ai\n  login user\n  password {WANDB}\nmachine huggingface.co\n  login trainer\n"
        f"  password {HF}\n",
        (WANDB, HF),
    ),
    (f"[DEFAULT]\nhost = https://dbc-1234.cloud.databricks.com\ntoken = {DAPI}\n", (DAPI,)),
    (
        f"apiVersion: v1\nkind: Pod\nspec:\n  containers:\n  - name: trainer\n    env:\n    - name: WANDB_API_KEY\n"
        f'      value: {WANDB}\n    - name: HF_TOKEN\n      value: "{HF}"\n',
        (WANDB, HF),
    ),
    (
        f"defaults:\n  - _self_\nlogger:\n  _target_: lightning.pytorch.loggers.WandbLogger\n  api_key: {WANDB}\n",
        (WANDB,),
    ),
    (f"private_key: |\n  {PEM_BODY[0]}\n  {PEM_BODY[1]}\nbatch_size: 8\n", PEM_BODY[:2]),
    (f"api_keys:\n  - {(v := rand(32))}\n  - {(w := rand(32))}\nmodel: gpt2\n", (v, w)),
    (f'name = "run"\npassword = """\n{(v := nxt())}\n"""\nbatch_size = 8\n', (v,)),
    (
        f"storage:\n  s3:\n    endpoint: https://s3.example.com\n    secret_key: {(v := rand(40))}\n"
        f"    access_key: {(w := rand(20, string.ascii_uppercase + string.digits))}\n",
        (v, w),
    ),
    (f"[client]\nuser = trainer\npassword = {(v := nxt())}\n", (v,)),
    (f"[distutils]\nindex-servers = pypi\n[pypi]\nusername = __token__\npassword = {PYPI}\n", (PYPI,)),
    (f"//registry.npmjs.org/:_authToken={NPM}\n", (NPM,)),
    (f"github.com:\n  user: trainer\n  oauth_token: {(v := 'gho_' + rand(36))}\n  git_protocol: https\n", (v,)),
    (json.dumps({"username": "trainer", "key": KAGGLE}), (KAGGLE,)),
    (
        json.dumps(
            {
                "client_id": (w := rand(20)),
                "client_secret": (v := rand(32)),
                "refresh_token": GOOG_REFRESH,
                "type": "authorized_user",
            }
        ),
        (w, v, GOOG_REFRESH),
    ),
]

SECRET_RECORDS = [
    ({"password": 'pw"with\\quote-' + (v := rand(8))}, (v,)),
    ({"hf_token": (v := rand(32))}, (v,)),
    ({"argv": ["train.py", "--hf-token", (v := rand(32))]}, (v,)),
    ({"message": f"failed with token={(v := rand(12))}"}, (v,)),
    ({"env": {"WANDB_API_KEY": WANDB, "HOME": "/root"}}, (WANDB,)),
    ({"name": "WANDB_API_KEY", "value": WANDB2}, (WANDB2,)),
    ({"client_id": (w := rand(20)), "client_secret": (v := rand(32))}, (w, v)),
    ({"headers": {"Authorization": f"Bearer {(v := rand(40))}"}}, (v,)),
    ({"url": f"https://trainer:{(v := nxt())}@mlflow.internal/api"}, (v,)),
    ({"locals": {"api_key": (v := rand(32)), "step": 10}}, (v,)),
    ({"config": {"credentials": {"user": "alice", "refresh": (v := rand(24))}}}, (v,)),
    ({"args": {"key": WANDB}}, (WANDB,)),
    ({"exception": f"PermissionError: login refused for password {(v := nxt())}", "kwargs": {"password": v}}, (v,)),
]

SECRET_STREAM = [  # writes as the console log receives them
    (["password=hun", "ter2-" + (v := rand(10)) + "\n"], ("hunter2-" + v,)),
    ([f"Authorization: Bearer {JWT[:20]}", f"{JWT[20:]}\n"], (JWT,)),
    ([f"wandb login {WANDB[:12]}", f"{WANDB[12:]}\n"], (WANDB,)),
    ([f"AWS_SECRET_ACCESS_KEY={AWS_SECRET[:10]}", f"{AWS_SECRET[10:]}\nstep 1\n"], (AWS_SECRET,)),
    ([f"export HF_TOKEN={HF[:9]}", f"{HF[9:]}\n"], (HF,)),
    (["machine api.wandb.ai\n", "  login user\n", f"  password {WANDB2}\n"], (WANDB2,)),
    (
        [
            "-----BEGIN OPENSSH PRIVATE KEY-----\n",
            *[line + "\n" for line in SSH_BODY],
            "-----END OPENSSH PRIVATE KEY-----\nstep 1 loss 2.0\n",
        ],
        tuple(SSH_BODY),
    ),
    (
        [
            "-----BEGIN PRIVATE KEY-----\n" + PEM_BODY[0] + "\n",
            PEM_BODY[1] + "\n",
            "Traceback (most recent call last):\n",
        ],
        PEM_BODY[:2],
    ),
    (["env:\n- name: WANDB_API_KEY\n", f"  value: {WANDB}\n"], (WANDB,)),
    (["credentials:\n", "  username: trainer\n", f"  password: {(v := nxt())}\n", "step 1\n"], (v,)),
    ([f"mysql -uroot -p{(v := nxt())[:6]}", f"{v[6:]}\n"], (v,)),
    ([f"cache at redis://:{(v := nxt())[:5]}", f"{v[5:]}@cache:6379\n"], (v,)),
]

# --- look-alikes -----------------------------------------------------------------------------------------------
LOOKALIKE_TEXT = [
    # the 24
    "Basic sanity check passed",
    "Using basic attention implementation",
    "mkdir -p checkpoints/run1",
    "pytest -p no:cacheprovider",
    "top-1 token: 'Paris'",
    "vocab: {'<pad>': 0, 'token': 2}",
    "Expected signature: forward(...)",
    "session: 3/5",
    "--session 2",
    "WANDB_SESSION=2",
    "PASSWORD_STORE_CLIP_TIME=45",
    "GOOGLE_APPLICATION_CREDENTIALS=/etc/gcp/sa.json",
    "DESKTOP_SESSION=ubuntu",
    "saving to /home/ubuntu/checkpoints/step_1000.pt",
    # tokenizers and models
    "tokenizer: gpt2",
    "max_tokens: 4096",
    "eos_token_id=2",
    "token_type_ids: [0, 0, 1]",
    "tokens_per_sec: 1234.5",
    '{"step": 10, "tokens_per_sec": 51234.2, "loss": 1.25}',
    "key_dim: 64",
    "num_key_value_heads: 8",
    "past_key_values=None",
    "key_padding_mask: true",
    "--session-dir /tmp/sess",
    "use_auth_token=True",
    "AuthenticationError: Incorrect label shape",
    "TOKENIZER_NAME=meta-llama/Llama-3-8B",
    "KEY_DIR=/data/imagenet",
    "MAX_TOKENS=2048",
    "pad_token: <pad>",
    'eos_token: "</s>"',
    "bos_token=<|begin_of_text|>",
    "mask_token: [MASK]",
    "keys: [a, b]",
    "monkey: george",
    "passes: 3",
    "bypass_cache: true",
    "compass=north",
    "secretary: bob",
    "SSH_AUTH_SOCK=/tmp/ssh-agent.sock",
    "Authentication failed for user bob",
    "token budget exhausted at step 10",
    "mkdir -p /tmp/out",
    "ssh -p 2222 host",
    "token_budget: 100000",
    "GOOGLE_APPLICATION_CREDENTIALS_PATH=/etc/creds.json",
    "Special tokens have been added in the vocabulary, make sure the associated word embeddings are fine-tuned.",
    "Setting `pad_token_id` to `eos_token_id`:128001 for open-end generation.",
    "The attention mask and the pad token id were not set.",
    "Token indices sequence length is longer than the specified maximum sequence length for this model (1025 > 1024).",
    "max_new_tokens=256, temperature=0.7, top_p=0.9",
    "{'loss': 1.2345, 'grad_norm': 0.98, 'learning_rate': 2e-05, 'epoch': 0.5}",
    "{'eval_loss': 1.1, 'eval_runtime': 12.3, 'eval_samples_per_second': 81.2}",
    "num_key_value_heads: 8, head_dim: 128, rope_theta: 500000.0",
    "key_states = self.k_proj(hidden_states)",
    "query_key_value.weight: torch.Size([12288, 4096])",
    "use_cache=True is incompatible with gradient checkpointing. Setting use_cache=False.",
    "decoder_start_token_id: 0",
    "forced_bos_token_id: 2",
    "bos_token: <s>",
    "unk_token = '<unk>'",
    "<|begin_of_text|><|start_header_id|>user<|end_header_id|>",
    "sequence: [CLS] hello world [SEP]",
    "self.key = nn.Linear(d_model, d_k)",
    "keys = torch.randn(4, 16, 64)",
    "rng_key = jax.random.PRNGKey(0)",
    "key, subkey = jax.random.split(key)",
    "cache_key: llama-3-8b-bf16-seq4096",
    "text_key: input",
    "label_key: labels",
    "sort_key: length",
    "--sort-key length",
    "--key input_ids",
    "run_name: gallant-sun-7",
    "tokens: 1,048,576",
    "tokens/s: 51234.5",
    "throughput: 3.1k tokens/s/gpu",
    "pass@1: 0.42",
    "n_passes=2",
    "Epoch 3 passed validation",
    "signature = inspect.signature(model.forward)",
    "def forward(self, hidden_states, attention_mask=None, past_key_value=None):",
    "model.layers.0.self_attn.k_proj.weight",
    "Loading checkpoint shards: 100%|##########| 4/4 [00:12<00:00, 3.01s/it]",
    "Token is valid (permission: write).",
    "Your token has been saved to /home/ubuntu/.cache/huggingface/token",
    "Enter your token (input will not be visible):",
    "Login successful",
    "To login, `huggingface_hub` requires a token generated from https://huggingface.co/settings/tokens .",
    "/home/ubuntu/.cache/huggingface/hub/models--meta-llama--Llama-3.1-8B/snapshots/"
    "0e9e39f249a16976918f6564b8830bc894c89659/config.json",
    "tokenizer_config.json: 100%|##########| 50.5k/50.5k",
    # W&B, MLflow
    "wandb: Currently logged in as: alice (team-ml). Use `wandb login --relogin` to force relogin",
    "wandb: Tracking run with wandb version 0.17.0",
    "wandb: Run data is saved locally in /home/ubuntu/wandb/run-20240501_120000-3kx9q2ab",
    "wandb: View run at https://wandb.ai/team-ml/llama-ft/runs/3kx9q2ab",
    "wandb: Syncing run glorious-sky-42",
    'wandb.init(project="llama-ft", entity="team-ml", config=cfg)',
    "--use_wandb True",
    'mlflow.start_run(experiment_id="12345")',
    'mlflow.log_param("learning_rate", 0.01)',
    "MLFLOW_TRACKING_URI=http://mlflow.internal:5000",
    "MLFLOW_EXPERIMENT_NAME=/Shared/my-experiment",
    "Run ID: 3f2a9c1b7e8d4f6a9b0c1d2e3f4a5b6c",
    "mlflow.log_artifact('checkpoints/step-1000/model.safetensors')",
    "mlflow server --app-name basic-auth",
    # AWS, GCP, Azure
    "X-Amz-Algorithm=AWS4-HMAC-SHA256",
    "X-Amz-Date=20130721T201207Z",
    "X-Amz-Expires=86400&X-Amz-SignedHeaders=host",
    "s3://my-bucket/checkpoints/run-42/step_1000.pt",
    "An error occurred (AccessDenied) when calling the GetObject operation: Access Denied",
    "botocore.exceptions.NoCredentialsError: Unable to locate credentials",
    "Found credentials in environment variables.",
    "Found credentials in shared credentials file: ~/.aws/credentials",
    'ETag: "d41d8cd98f00b204e9800998ecf8427e"',
    "x-amz-request-id: 4442587FB7D0A2F9",
    "AWS_ROLE_ARN=arn:aws:iam::123456789012:role/trainer",
    "gcloud auth application-default login",
    "Credentials saved to file: [/home/ubuntu/.config/gcloud/application_default_credentials.json]",
    '"type": "service_account",',
    '"client_email": "trainer@my-project.iam.gserviceaccount.com",',
    '"token_uri": "https://oauth2.googleapis.com/token",',
    '"auth_uri": "https://accounts.google.com/o/oauth2/auth",',
    "gs://my-bucket/data/shard-00001-of-01024.tfrecord",
    "https://mldata.blob.core.windows.net/ckpt/model.pt",
    # Kubernetes, Slurm
    "kubectl get secret test-secret -o yaml",
    "serviceAccountName: trainer",
    "SLURM_JOB_ID=123456",
    "SLURM_JOB_NODELIST=gpu-[001-004]",
    "SLURM_STEP_GPUS=0,1,2,3",
    "srun --mpi=pmix --gpus-per-task=1 python train.py",
    "AuthAltTypes=auth/jwt",
    "AuthAltParameters=jwt_key=/var/spool/slurm/statesave/jwt_hs256.key",
    "dd if=/dev/random of=/var/spool/slurm/statesave/jwt_hs256.key bs=32 count=1",
    "sbatch: Submitted batch job 4242",
    "slurmstepd: error: *** JOB 4242 ON gpu-001 CANCELLED AT 2024-05-01T12:00:00 DUE TO TIME LIMIT ***",
    # PyTorch, NCCL, shells
    "NCCL INFO Bootstrap : Using eth0:10.0.0.1<0>",
    "NCCL INFO NET/IB : Using [0]mlx5_0:1/IB ; OOB eth0:10.0.0.1<0>",
    "[rank1]:[E501 12:00:00.123456 ProcessGroupNCCL.cpp:616] [Rank 1] Watchdog caught collective operation timeout: "
    "WorkNCCL(SeqNum=42, OpType=ALLREDUCE, NumelIn=1048576, NumelOut=1048576, Timeout(ms)=600000) ran for 600013 "
    "milliseconds before timing out.",
    "MASTER_ADDR=10.0.0.1 MASTER_PORT=29500",
    "key_padding_mask shape: torch.Size([8, 512])",
    "attn_mask = key_padding_mask[:, None, None, :]",
    "sha256:9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08",
    "docker run -p 8888:8888 -v /data:/data pytorch/pytorch",
    "docker pull nvcr.io/nvidia/pytorch:24.05-py3",
    "zip -r ckpt.zip checkpoints/",
    "unzip -q data.zip -d /data",
    "7z x data.7z -o/data",
    "mysql -u root -p",
    "mysql -h db -P 3306 -u trainer",
    "redis-cli -h cache -p 6379 ping",
    "openssl rand -hex 32",
    "mongosh --port 27017",
    "git config --global credential.helper store",
    "git clone https://github.com/pytorch/examples.git",
    "git@github.com:org/repo.git",
    "python -u train.py",
    "scp -P 2222 ckpt.pt host:/data",
    "rsync -avzP checkpoints/ host:/backup/",
    "PasswordAuthentication no",
    "auth: none",
    "auth_type: basic",
    "Authorization: required",
    "401 Unauthorized: Invalid authentication credentials",
    "session 3 of 5 done",
    "Session closed",
    "Bearer token expired; refreshing",
    "-----BEGIN CERTIFICATE-----",
    "-----BEGIN PUBLIC KEY-----",
    "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGq4 trainer@login-node",
    "The key fingerprint is SHA256:47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU.",
    "ValueError: could not load -----BEGIN PRIVATE KEY----- from key.pem: bad base64",
    "secret_sauce_enabled: true",
    "hash: 9f86d081",
    "Unable to open password file /etc/mlflow/pw (No such file)",
    # code, as tracebacks and py-spy show it
    "    api_key = get_api_key()",
    "    password = args.password",
    "    token = tokenizer.encode(text)",
    '    headers = {"Authorization": f"Bearer {token}"}',
    '    secret_key = os.environ.get("SECRET_KEY")',
    "    self.api_key = api_key",
    "    if token is None:",
    '    token_ids = tokenizer(batch["text"])',
    "    for key, value in state_dict.items():",
    "    items.sort(key=lambda x: x[1])",
    "sorted(names, key=len)",
    '    password = getpass.getpass("Password: ")',
    "    hf_token = cfg.hub.token",
    "KeyError: 'model.embed_tokens.weight'",
    'Missing key(s) in state_dict: "module.fc.weight".',
    'Unexpected key(s) in state_dict: "lm_head.weight".',
    "token_embedding: Embedding(50257, 768)",
    "Namespace(hf_token=None, lr=0.001, push_to_hub=False)",
    "Signature: (input, weight, bias=None) -> Tensor",
    "Generated token ids: [101, 2023, 2003, 102]",
    "tokens=[101, 2023]",
    "token='[CLS]'",
    "usage: {'prompt_tokens': 12, 'completion_tokens': 28, 'total_tokens': 40}",
    "x-ratelimit-remaining-tokens: 149000",
    "Password:",
    "Enter passphrase for key '/home/u/.ssh/id_ed25519':",
    "Permission denied (publickey,password).",
    "ssh: connect to host login-node port 22: Connection refused",
    "[rank0]: Traceback (most recent call last):",
    "[rank1]:[W501 12:00:00.000000 ProcessGroupGloo.cpp:727] Warning",
    "OPENAI_API_BASE=https://api.openai.com/v1",
    "Credentials expire at 2030-01-01T00:00:00Z",
    "key=value pairs are ignored",
    "--push_to_hub --hub_model_id team/llama-ft",
    "Using token embedding dim 4096",
    "secret_scale: 0.5",
    "--key-value-heads 8",
    "Key: layer.3.weight Value: tensor(...)",
    "password reset link sent",
    "Password: ******",
    "auth=None",
    "auth = HTTPBasicAuth(user, pw)",
    "api_key=None",
    "API key not found. Set WANDB_API_KEY.",
    "Tokens: 1024 | Time: 3.2s",
    "KEY_VALUE_SEP=:",
    "self.token_emb = nn.Embedding(V, D)",
    "--seq-len 2048 --sample-key text",
    "hf_transfer enabled",
    "os.environ['WANDB_API_KEY'] = args.wandb_key",
    "export HF_TOKEN=$(cat ~/.cache/huggingface/token)",
    "HF_TOKEN=${HF_TOKEN:-}",
    "key = f'{prefix}.{name}'",
    "token = next(it)",
    "credentials = service_account.Credentials.from_service_account_file(path)",
    "auth_token=os.getenv('HF_TOKEN')",
    "ssh-keygen -t ed25519 -f ~/.ssh/id_ed25519",
    "gpg --recv-keys 0x3F2A9C1B7E8D4F6A",
    "Signature verified with key 3F2A9C1B7E8D4F6A",
    "layer 3: key 0.12 query 0.34 value 0.56",
    "loss=1.23 tokens=204800 tok/s=51234",
    "2024-05-01T12:00:00Z session=4 epoch=2",
    "cuda:0 key_cache 1.2GiB",
    "checksum: 3f2a9c1b7e8d4f6a9b0c1d2e3f4a5b6c",
    "--token-dropout 0.1",
    "sig: SIGTERM",
    "signal: SIGUSR1 sig=10",
    "Pass 2/3 complete",
    "passphrase protected: no",
    "secret santa",
    "KeyboardInterrupt",
    "monkeypatch.setenv('HF_TOKEN', token)",
    "HF_TOKEN: unset",
    "token: null",
    "api_key: ''",
    "the Authorization header is missing",
    "Cookie jar loaded from cookies.txt",
    "[rank0]: RuntimeError: CUDA error: an illegal memory access was encountered",
    "pwd: /workspace/llama",
    # the second held-out round, kept as written
    "{'train_runtime': 1234.5, 'train_samples_per_second': 12.3, 'train_steps_per_second': "
    "0.4, 'train_loss': 1.05, 'epoch': 3.0}",
    "Trainer.fit stopped: `max_epochs=3` reached.",
    "LOCAL_RANK: 0 - CUDA_VISIBLE_DEVICES: [0,1,2,3,4,5,6,7]",
    "[2024-05-01 12:00:00,000] [INFO] [real_accelerator.py:191:get_accelerator] Setting "
    "ds_accelerator to cuda (auto detect)",
    "[INFO] [stage3.py:1999:step] [deepspeed] OVERFLOW! Rank 0 Skipping step. Attempted "
    "loss scale: 65536, reducing to 32768",
    "INFO 05-01 12:00:00 llm_engine.py:100] Initializing an LLM engine with config: model='meta-llama/"
    "Llama-3-8B', tokenizer='meta-llama/Llama-3-8B', skip_tokenizer_init=False, tokenizer_mode=auto,"
    " revision=None, trust_remote_code=False",
    'INFO: 127.0.0.1:52100 - "POST /v1/completions HTTP/1.1" 200 OK',
    "Ray dashboard at http://127.0.0.1:8265",
    "2024-05-01 12:00:00,000 INFO worker.py:1724 -- Started a local Ray instance.",
    "(TorchTrainer pid=4242) Moving model to device: cuda:0",
    "Found existing installation: torch 2.3.0",
    "Successfully installed tokenizers-0.19.1 transformers-4.41.0",
    "Requirement already satisfied: sentencepiece in ./venv/lib/python3.11/site-packages (0.2.0)",
    "GPU available: True (cuda), used: True",
    "TPU available: False, using: 0 TPU cores",
    "  | Name  | Type             | Params\n0 | model | GPT2LMHeadModel  | 124 M",
    "Epoch 0:  12%|█▏        | 120/1000 [00:30<03:40,  4.00it/s, v_num=3kx9, train_loss=2.31]",
    "attention_dropout=0.0, hidden_act='silu', key_value_heads=8, rms_norm_eps=1e-05",
    "Using sdpa attention for key/value caching",
    "torch.distributed.DistStoreError: Timed out after 901 seconds waiting for clients. 1/2 clients joined.",
    "c10d.TCPStore: key `rank_1` not found",
    "store.get('key_0') timed out",
    "Waiting for key: /torch.distributed/rank1/ready",
    "The secret to fast training is large batches",
    "We use keys and values of dimension 128",
    "tokenization took 3.2s",
    "Signal 15 (SIGTERM) received by PID 4242",
    "exitcode  : -15 (pid: 4242)",
    "error_file: /tmp/torchelastic_abc/none_x/attempt_0/1/error.json",
    "AccessDeniedException: User: arn:aws:sts::123456789012:assumed-role/trainer/i-0abc is not authorized",
    "botocore.exceptions.ClientError: An error occurred (ExpiredToken) when calling the "
    "PutObject operation: The provided token has expired.",
    "google.auth.exceptions.RefreshError: ('invalid_grant: Token has been expired or "
    "revoked.', {'error': 'invalid_grant'})",
    "huggingface_hub.utils._errors.GatedRepoError: 401 Client Error. Cannot access gated "
    "repo for url https://huggingface.co/meta-llama/Llama-3-8B/resolve/main/config.json.",
    "Access to model meta-llama/Llama-3-8B is restricted. You must have access to it "
    "and be authenticated to access it. Please log in.",
    "wandb: ERROR Error while calling W&B API: permission denied (<Response [403]>)",
    "wandb: Network error (ReadTimeout), entering retry loop.",
    "mlflow.exceptions.MlflowException: API request to endpoint /api/2.0/mlflow/runs/"
    "create failed with error code 401 != 200. Response body: 'Unauthorized'",
    "kubectl logs trainer-0 -c trainer --since=1h",
    'Events:  Warning  FailedMount  kubelet  MountVolume.SetUp failed for volume "secret-volume" '
    ': secret "wandb" not found',
    "sacct -j 4242 --format=JobID,State,ExitCode,MaxRSS",
    "scontrol show job 4242 | grep -i reason",
    "export NCCL_SOCKET_IFNAME=eth0 NCCL_DEBUG=INFO",
    "git log --oneline -1: 3f2a9c1 fix token budget",
    "md5sum ckpt.pt: d41d8cd98f00b204e9800998ecf8427e",
    "key_cache[0].shape = torch.Size([1, 8, 2048, 128])",
    "value_cache dtype=torch.bfloat16",
    "kv_cache_dtype: fp8_e5m2",
    "password = None  # set via env",
    "token_count: 4096",
    "TOKEN_LIMIT=8192",
    "PASSWORD_MIN_LENGTH=12",
    "SECRET_ROTATION_DAYS=30",
    "passwd: all authentication tokens updated successfully.",
    "sudo: a password is required",
    "[sudo] password for trainer:",
]

LOOKALIKE_ENV = [
    {"TOKENIZER_NAME": "meta-llama/Llama-3-8B", "KEY_DIR": "/data/imagenet", "MAX_TOKENS": "2048", "PWD": "/work"},
    {"WANDB_SESSION": "2", "DESKTOP_SESSION": "ubuntu", "XDG_SESSION_TYPE": "wayland", "XDG_SESSION_ID": "c2"},
    {"PASSWORD_STORE_CLIP_TIME": "45", "PASSWORD_STORE_DIR": "/home/u/.password-store"},
    {"GOOGLE_APPLICATION_CREDENTIALS": "/etc/gcp/sa.json", "CLOUDSDK_CONFIG": "/home/u/.config/gcloud"},
    {"SSH_AUTH_SOCK": "/tmp/ssh-XXXX/agent.123", "SSH_CLIENT": "10.0.0.5 52100 22"},
    {"GPG_AGENT_INFO": "/run/user/1000/gnupg/S.gpg-agent:0:1", "KRB5CCNAME": "FILE:/tmp/krb5cc_1000"},
    {"HF_HOME": "/data/hf", "HF_TOKEN_PATH": "/data/hf/token", "HF_HUB_ENABLE_HF_TRANSFER": "1"},
    {"TOKENIZERS_PARALLELISM": "false", "TRANSFORMERS_CACHE": "/data/hf/cache"},
    {"WANDB_IDENTITY_TOKEN_FILE": "/var/run/secrets/wandb/token", "WANDB_MODE": "offline"},
    {"WANDB_PROJECT": "llama-ft", "WANDB_RUN_ID": "3kx9q2ab", "WANDB_ENTITY": "team-ml"},
    {"AWS_REGION": "us-east-1", "AWS_PROFILE": "ml-training", "AWS_ROLE_ARN": "arn:aws:iam::123456789012:role/trainer"},
    {"AWS_WEB_IDENTITY_TOKEN_FILE": "/var/run/secrets/eks.amazonaws.com/serviceaccount/token"},
    {"AWS_SHARED_CREDENTIALS_FILE": "/home/u/.aws/credentials", "AWS_CONFIG_FILE": "/home/u/.aws/config"},
    {"MLFLOW_TRACKING_URI": "http://mlflow.internal:5000", "MLFLOW_TRACKING_USERNAME": "trainer"},
    {"SLURM_JOB_ID": "123456", "SLURM_JOB_NODELIST": "gpu-[001-004]", "SLURM_STEP_GPUS": "0,1,2,3"},
    {"CUDA_VISIBLE_DEVICES": "0,1,2,3", "NCCL_IB_HCA": "mlx5", "OMP_NUM_THREADS": "8"},
    {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True", "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1"},
    {"MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500", "TORCHELASTIC_RUN_ID": "none"},
    {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBECONFIG": "/home/u/.kube/config"},
    {"SECRET_NAME": "db-secret", "SECRETS_DIR": "/run/secrets", "KEY_FILE": "/etc/ssl/private/key.pem"},
    {"HOME": "/home/ubuntu", "USER": "ubuntu", "LOGNAME": "ubuntu", "SHELL": "/bin/bash"},
    {"WANDB_API_KEY": "", "HF_TOKEN": "${HF_TOKEN}", "OPENAI_API_KEY": "<your-key>"},
]

LOOKALIKE_ARGV = [
    ["mkdir", "-p", "checkpoints/run1"],
    ["pytest", "-p", "no:cacheprovider"],
    ["ssh", "-p", "2222", "host"],
    ["python", "train.py", "--session", "2"],
    ["python", "train.py", "--tokenizer", "gpt2", "--max-tokens", "4096", "--session-dir", "/s"],
    ["python", "train.py", "--use-auth-token", "True"],
    ["docker", "run", "-p", "8888:8888", "pytorch/pytorch"],
    ["python", "-u", "train.py"],
    ["torchrun", "--nproc-per-node", "8", "train.py", "--key", "input_ids"],
    ["python", "train.py", "--sort-key", "length"],
    ["wandb", "login", "--relogin"],
    ["python", "train.py", "--pad-token", "<pad>"],
    ["python", "train.py", "--token-budget", "100000", "--max-new-tokens", "256"],
    ["accelerate", "launch", "--config_file", "cfg.yaml", "train.py"],
    ["srun", "-p", "gpu", "python", "train.py"],
    ["sbatch", "-p", "a100", "job.sh"],
    ["mysql", "-u", "root", "-p"],
    ["python", "train.py", "--hub-token-path", "/secrets/hf"],
    ["python", "train.py", "--passes", "3", "--password-file", "/run/secrets/db"],
    ["python", "train.py", "--signature", "forward"],
]

LOOKALIKE_CONFIG = [
    "model:\n  name: meta-llama/Llama-3-8B\n  tokenizer: meta-llama/Llama-3-8B\n  max_tokens: 4096\n"
    "  pad_token: <pad>\n  eos_token_id: 2\ntraining:\n  lr: 3.0e-4\n  key_dim: 64\n",
    "apiVersion: v1\nkind: Pod\nspec:\n  serviceAccountName: trainer\n  imagePullSecrets:\n  - name: regcred\n"
    "  containers:\n  - name: trainer\n    env:\n    - name: WANDB_API_KEY\n      valueFrom:\n        secretKeyRef:\n"
    "          name: wandb\n          key: api-key\n    - name: WANDB_PROJECT\n      value: llama-ft\n",
    json.dumps(
        {
            "train_batch_size": 256,
            "gradient_accumulation_steps": 4,
            "zero_optimization": {"stage": 3},
            "bf16": {"enabled": True},
        },
        indent=2,
    ),
    "compute_environment: LOCAL_MACHINE\ndistributed_type: FSDP\nfsdp_config:\n  fsdp_state_dict_type: "
    "SHARDED_STATE_DICT\n"
    "num_processes: 8\n",
    "defaults:\n  - _self_\nlogger:\n  _target_: lightning.pytorch.loggers.WandbLogger\n  project: llama-ft\n",
    '[tool.trainer]\ntokenizer = "gpt2"\nmax_new_tokens = 256\nsession = 2\n',
    "dataset:\n  text_key: text\n  label_key: labels\n  cache_key: c4-en-seq2048\n",
    "auth:\n  type: oidc\n  issuer: https://login.example.com\n",
]

LOOKALIKE_RECORDS = [
    {"metrics": {"tokens_per_sec": 51234.5, "max_tokens": 4096, "loss": 1.25}, "step": 10},
    {"annotations": {"tokenizer": "gpt2", "pad_token": "<pad>"}},
    {"argv": ["train.py", "--tokenizer", "gpt2", "--session", "2"]},
    {"name": "pad_token", "value": "<pad>"},
    {"name": "WANDB_PROJECT", "value": "llama-ft"},
    {"session": 2, "key": "input_ids", "token": "Paris", "signature": "forward(x)"},
    {"frames": [{"function": "forward", "file": "/home/ubuntu/model.py", "line": 42}]},
    {"credentials": {"type": "service_account", "client_email": "trainer@p.iam.gserviceaccount.com"}},
]

LOOKALIKE_STREAM = [
    ["tokens/s: 12", "3.4 step 10\n"],
    ["step 1 lo", "ss 2.0\n", "step 2 loss 1.9\n"],
    [
        "-----BEGIN PRIVATE KEY----- is missing from key.pem\n",
        "Traceback (most recent call last):\n",
        '  File "train.py", line 3, in <module>\n',
    ],
    ["vocab: {'<pad>': 0, ", "'token': 2}\n"],
]

# The look-alikes the rules still change: each is a known limit (docs/limits.md), at most a handful.
KNOWN_LIMITS: dict[str, str] = {}


def cases() -> tuple[list[Case], list[Case]]:
    secrets = [Case("text", g, s, shape) for g, s, shape in SECRET_TEXT]
    secrets += [Case("env", g, s, ", ".join(g)) for g, s in SECRET_ENV]
    secrets += [Case("argv", g, s, " ".join(g)[:60]) for g, s in SECRET_ARGV]
    secrets += [Case("config", g, s, g.splitlines()[0][:60]) for g, s in SECRET_CONFIG]
    secrets += [Case("record", g, s, json.dumps(g)[:60]) for g, s in SECRET_RECORDS]
    secrets += [Case("stream", g, s, "".join(g)[:60].replace("\n", " ")) for g, s in SECRET_STREAM]
    looks = [Case("text", g) for g in LOOKALIKE_TEXT]
    looks += [Case("env", g) for g in LOOKALIKE_ENV]
    looks += [Case("argv", g) for g in LOOKALIKE_ARGV]
    looks += [Case("config", g) for g in LOOKALIKE_CONFIG]
    looks += [Case("record", g) for g in LOOKALIKE_RECORDS]
    looks += [Case("stream", g) for g in LOOKALIKE_STREAM]
    return secrets, looks
