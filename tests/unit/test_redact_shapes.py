"""The rarer credential shapes of issue 35 (as kinds: provider formats standing alone, table cells, punctuation that
is not ASCII, URLs and documents), each beside ML look-alikes that must come out unchanged."""

from __future__ import annotations

import pytest

from blackbox._recorder.redact import REDACTED, StreamRedactor, redact_text

R32 = "3kLmN8pQrS2uVwXyZ1aB3cD5eF7gH9iJ"  # random-looking letters and digits
HEX32 = "0f1e2d3c4b5a69788796a5b4c3d2e1f0"

SECRETS = {
    "pinecone": ("pc = Pinecone('{}')", "pcsk_" + R32[:6] + "_" + R32 + R32),
    "xai": ("{}", "xai-" + R32 + R32),
    "voyage": ("vo = voyageai.Client('{}')", "pa-" + R32 + "Ab12xY9zQ_w"),
    "notion": ("{}", "secret_" + R32 + "Ab12xY9zQaw"),
    "shopify": ("{} used", "shpat_" + HEX32),
    "databricks oauth": ("{}", "dose" + HEX32),
    "twilio positional": ("Client('{}', sid)", "SK" + HEX32),
    "rich table": ("│ api_key        │ {} │", "sk3cr3t" + R32[:10]),
    "ascii table (NGC)": ("| apikey            | {}        | user settings    |", "nvapi" + R32),
    "full-width colon": ("password\uff1a{}", "hunter2x9"),
    "full-width equals": ("passwd\uff1d{}", "hunter2x9"),
    "guillemets": ("password: «{}»", "hunter2x9"),
    "guillemets after a flag": ("password «{}» rejected", "Tr0ub4dor&3"),
    "telegram URL": ("GET https://api.telegram.org/{}/sendMessage", "bot123456789:AAHdqTcvCH1vGWJxfSeofSAs0K5PALDsaw"),
    "s3 XML": ("<Code>SignatureDoesNotMatch</Code><SignatureProvided>{}</SignatureProvided>", HEX32 + HEX32),
    "go-escaped presigned URL": ('{{"u":"https://b.s3.amazonaws.com/k?X-Amz-Date=1\\u0026X-Amz-Signature={}\\u0026x=1"}}',
                                 HEX32 + HEX32),
    "docker identitytoken": ('{{"auths": {{"r.io": {{"identitytoken": "{}"}}}}}}', "idt" + R32),
}  # fmt: skip

LOOKALIKES = [
    "| key              | input_ids          |",
    "│ token            │ <pad>              │",
    "| learning_rate | 3e-4 | cosine |",
    "| tokens | 512 | 1024 |",
    "password\uff1arequired",
    "dose 0.5 mg per kg, dosed0123",
    "the task SKIPPED 0123456789abcdef0123456789abcdef",
    "TASK0123456789abcdef0123456789abcdef done",
    "secret_sauce_v2 = True",
    "model xai-grok-1 loaded",
    "pa-base-model-for-retrieval-augmented-generation-v2",
    "GET https://example.com/bot/status and robot12345:ready",
    "Private-Lines: 0",
    "the special token “<eos>” ends a sequence",
    "shpat_ is Shopify's prefix",
    "«Attention Is All You Need»",
]


@pytest.mark.parametrize("kind", sorted(SECRETS))
def test_a_rarer_shape_is_redacted(kind: str) -> None:
    template, secret = SECRETS[kind]
    out = redact_text(template.format(secret))
    assert secret not in out and REDACTED in out, out


@pytest.mark.parametrize("text", LOOKALIKES)
def test_an_ml_lookalike_is_left_alone(text: str) -> None:
    assert redact_text(text) == text


def test_a_putty_key_loses_its_private_lines_only() -> None:
    ppk = ("PuTTY-User-Key-File-3: ssh-ed25519\nEncryption: none\nComment: me@host\nPublic-Lines: 2\n"
           "AAAAC3NzaC1lZDI1NTE5AAAAIJpub1\nAAAAC3NzaC1lZDI1NTE5AAAAIJpub2\nPrivate-Lines: 2\n"
           "AAAAIBkfQ1x2y3z4A5B6C7D8E9F0G1H2\nAAAAIBkfQ1x2y3z4A5B6C7D8E9F0G1H3\nPrivate-MAC: 0123abcd\n")  # fmt: skip
    out = redact_text(ppk)
    assert "AAAAIBkfQ1x2y3z4A5B6C7D8E9F0G1H2" not in out and "AAAAIBkfQ1x2y3z4A5B6C7D8E9F0G1H3" not in out
    assert "AAAAC3NzaC1lZDI1NTE5AAAAIJpub1" in out and "Private-MAC: 0123abcd" in out


def test_a_putty_key_split_across_writes_loses_its_private_lines() -> None:
    r = StreamRedactor()
    out = r.feed("Comment: me\nPrivate-Lines: 1\n") + r.feed("AAAAIBkfQ1x2y3z4A5B6C7D8E9F0G1H2\n") + r.flush()
    assert "AAAAIBkfQ1x2y3z4A5B6C7D8E9F0G1H2" not in out and "Private-Lines: 1" in out
