"""Provider formats: tokens that say what they are by their prefix and shape (gitleaks' rule set), found
without a telling name; and AWS key pairs. Stdlib only; imports common and names."""

from __future__ import annotations

import re
from typing import Dict, List, Set, Tuple

from .common import _TOKEN_CHARS, REDACTED, Span

# --- token formats with anchors ---------------------------------------------------------------------------------
# Provider prefixes and shapes, learned from gitleaks' rule set (config/gitleaks.toml). Each pattern starts with its
# literal prefix (a fast search) and runs only when its needle is in the text; the word boundary before it is
# checked in Python, never by scanning back.
_E = r"(?![A-Za-z0-9_\-])"
_B = "A-Za-z0-9_\\-"  # not inside a longer word: checked before the token is read, so a run of a prefix
# (`eyJeyJeyJ…`) is read once from its start, not once from each of its prefixes (which would be quadratic)


def _bounded(pattern: str) -> re.Pattern[str]:
    """`pattern` that starts only where a word starts. A pattern opening with a literal character keeps it first
    (the engine's fast search for it) and checks the character before it right after."""
    chars = _B + "/" if pattern.startswith("1//") else _B
    first = pattern[0]
    if first.isalnum() and pattern[1:2] not in ("{", "*", "+", "?"):
        return re.compile(first + "(?<![" + chars + "]" + first + ")" + pattern[1:])
    return re.compile("(?<![" + chars + "])(?:" + pattern + ")")


_FORMATS: List[Tuple[Tuple[str, ...], re.Pattern[str]]] = [
    (needles, _bounded(pattern))
    for needles, pattern in (
        (("akia", "asia", "abia", "acca", "a3t"), r"(?:AKIA|ASIA|ABIA|ACCA|A3T[A-Z0-9])[A-Z0-9]{16}(?![A-Z0-9])"),
        (("hf_",), r"hf_[A-Za-z0-9]{30,}" + _E),  # Hugging Face
        (("api_org_",), r"api_org_[A-Za-z0-9]{30,}" + _E),
        (("ghp_", "gho_", "ghu_", "ghs_", "ghr_"), r"gh[pousr]_[A-Za-z0-9]{30,}" + _E),  # GitHub
        (("pat",), r"github_pat_[A-Za-z0-9_]{22,}" + _E),
        (("glpat-", "gldt-", "glrt-", "glptt-", "glcbt-", "glft-", "glsoat-", "gloas-"),
         r"gl(?:pat|dt|rt|ptt|cbt|ft|soat|oas)-[A-Za-z0-9_\-.]{20,}" + _E),  # GitLab
        (("oxa-", "oxb-", "oxp-", "oxo-", "oxs-", "oxr-", "oxe-", "app-"),
         r"(?:xox[abposre]|xapp)-[A-Za-z0-9\-]{10,}" + _E),  # Slack
        (("sk-",), r"sk-(?:proj-|ant-|svcacct-|admin-)?[A-Za-z0-9_\-]{20,}" + _E),  # OpenAI / Anthropic
        (("sk_", "rk_", "whsec_"), r"(?:(?:sk|rk)_(?:live|test|prod)_[A-Za-z0-9]{10,}|whsec_[A-Za-z0-9+/=]{20,})" + _E),
        (("aiza",), r"AIza[0-9A-Za-z_\-]{35}" + _E),  # Google API key
        (("ya29.",), r"ya29\.[0-9A-Za-z_\-.]{20,}" + _E),  # Google OAuth access token
        (("//",), r"1//0[0-9A-Za-z_\-]{30,}" + _E),  # Google OAuth refresh token
        (("gocspx-",), r"GOCSPX-[A-Za-z0-9_\-]{20,}" + _E),  # Google OAuth client secret
        (("eyj",), r"eyJ[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]*" + _E),  # JWT
        (("eyj",), r"eyJhcGlfYWRkcmVzcyI6[A-Za-z0-9+/=]{20,}"),  # Neptune API token (base64 JSON)
        (("_v1_",), r"(?:wandb_v1_[A-Za-z0-9_]{20,}|do[opr]_v1_[a-f0-9]{64})" + _E),  # W&B, DigitalOcean
        (("local-",), r"local-[0-9a-f]{40}" + _E),  # W&B local server key
        (("q~",), r"[A-Za-z0-9_~.]{3}[0-9]Q~[A-Za-z0-9_~.\-]{31,34}" + _E),  # Azure AD client secret
        (("dapi",), r"dapi[a-f0-9]{32}(?:-[0-9])?" + _E),  # Databricks
        (("npm_",), r"npm_[A-Za-z0-9]{36}" + _E),
        (("pypi-",), r"pypi-AgE[A-Za-z0-9_\-]{50,}"),
        (("sg.",), r"SG\.[A-Za-z0-9_\-]{16,}\.[A-Za-z0-9_\-]{16,}" + _E),  # SendGrid
        (("r8_",), r"r8_[A-Za-z0-9]{30,}" + _E),  # Replicate
        (("gsk_",), r"gsk_[A-Za-z0-9]{40,}" + _E),  # Groq
        (("pplx-",), r"pplx-[A-Za-z0-9]{40,}" + _E),  # Perplexity
        (("hvs.", "hvb."), r"hv[sb]\.[A-Za-z0-9_\-]{24,}" + _E),  # Vault
        (("glc_", "glsa_"), r"gl(?:c|sa)_[A-Za-z0-9+/=_]{32,}" + _E),  # Grafana
        (("pat",), r"dckr_pat_[A-Za-z0-9_\-]{20,}" + _E),  # Docker Hub
        (("lin_api_",), r"lin_api_[A-Za-z0-9]{30,}" + _E),  # Linear
        (("ntn_",), r"ntn_[A-Za-z0-9]{40,}" + _E),  # Notion
        (("pcsk_",), r"pcsk_[A-Za-z0-9_]{40,}" + _E),  # Pinecone
        (("ai-",), r"xai-[A-Za-z0-9]{40,}" + _E),  # xAI
        (("pa-",), r"pa-(?=[A-Za-z0-9_\-]{0,42}[0-9])(?=[A-Za-z0-9_\-]{0,42}[A-Z])[A-Za-z0-9_\-]{40,}" + _E),  # Voyage
        (("secret_",), r"secret_[A-Za-z0-9]{43}" + _E),  # Notion (an internal integration's token)
        (("shpat_", "shpca_", "shppa_", "shpss_"), r"shp(?:at|ca|pa|ss)_[a-fA-F0-9]{32}" + _E),  # Shopify
        (("dose",), r"dose[a-f0-9]{32}(?:-[0-9])?" + _E),  # Databricks OAuth secret
        (tuple("sk" + c for c in "0123456789abcdef"), r"SK[0-9a-fA-F]{32}" + _E),  # Twilio API key
        (("/bot",), r"(?<=/)bot[0-9]{5,12}:[A-Za-z0-9_\-]{30,}" + _E),  # Telegram bot token in a URL path
        (("age-secret-key-",), r"AGE-SECRET-KEY-1[0-9A-Z]{58}"),
        (("ls0tls1crudjti",), r"LS0tLS1CRUdJTi[A-Za-z0-9+/=]{16,}"),  # base64 of `-----BEGIN`, checked below
    )
]  # fmt: skip
_PRIVATE_B64 = ("UFJJVkFURSBLRV", "BSSVZBVEUgS0VZ", "QUklWQVRFIEtFW")  # "PRIVATE KEY" in base64, each alignment


def _format_ok(text: str, m: re.Match[str]) -> bool:
    token = m.group(0)
    if m.start() and text[m.start() - 1] in (_TOKEN_CHARS if token[:1] != "1" else _TOKEN_CHARS | {"/"}):
        return False  # inside a longer word
    if token.startswith("LS0tLS1CRUdJTi"):
        return any(p in token[:120] for p in _PRIVATE_B64)  # a private key, not a certificate or public key
    if token.startswith("sk-"):
        parts = [p for p in re.split(r"[-_]", token[3:]) if p]
        return not (len(parts) >= 2 and all(p.isalpha() and p.islower() and len(p) <= 15 for p in parts))
    return True


_BY_NEEDLE: Dict[str, List[int]] = {}  # needle -> the formats it opens, in their order
for _i, (_needles, _) in enumerate(_FORMATS):
    for _n in _needles:
        _BY_NEEDLE.setdefault(_n, []).append(_i)


def _formats(text: str, found: Set[str]) -> List[Span]:
    spans: List[Span] = []
    for i in sorted({i for n in found for i in _BY_NEEDLE.get(n, ())}):
        pattern = _FORMATS[i][1]
        spans.extend((m.start(), m.end(), REDACTED) for m in pattern.finditer(text) if _format_ok(text, m))
    return spans


_AWS_ID = re.compile(r"(?:AKIA|ASIA)[A-Z0-9]{16}(?![A-Z0-9])")
_AWS_SECRET = re.compile(r"(?<![A-Za-z0-9+/])[A-Za-z0-9+/]{40}(?![A-Za-z0-9+/=])")


def _aws_pairs(text: str) -> List[Span]:
    """An AWS key id's secret (40 characters of base64, mixed case) on the id's line or the next."""
    spans: List[Span] = []
    done = 0
    for m in _AWS_ID.finditer(text):
        start = max(done, text.rfind("\n", 0, m.start()) + 1)
        end = text.find("\n", m.end())
        end = len(text) if end < 0 else text.find("\n", end + 1)
        end = len(text) if end < 0 else end
        if start >= end:
            continue
        for s in _AWS_SECRET.finditer(text, start, end):
            if any(c.isupper() for c in s.group()) and any(c.islower() for c in s.group()):
                spans.append((s.start(), s.end(), REDACTED))
        done = end
    return spans
