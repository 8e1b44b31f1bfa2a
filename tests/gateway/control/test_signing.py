import base64
import hashlib
import hmac

import pytest

from gateway.control.signing import WebhookSigner, WebhookVerificationError


def test_signature_is_hmac_sha256_over_id_timestamp_body() -> None:
    signer = WebhookSigner("s3cret")
    body = b'{"type":"call.started"}'
    headers = signer.headers(body, msg_id="msg_1", at=1_700_000_000)
    expected = hmac.new(b"s3cret", b"msg_1.1700000000." + body, hashlib.sha256).digest()
    assert headers == {
        "webhook-id": "msg_1",
        "webhook-timestamp": "1700000000",
        "webhook-signature": "v1," + base64.b64encode(expected).decode(),
    }


def test_whsec_secret_is_base64_and_verifies_with_the_reference_library() -> None:
    secret = "whsec_" + base64.b64encode(b"k" * 24).decode()
    signer = WebhookSigner(secret)
    body = b"{}"
    headers = signer.headers(body)
    signer.verify(body, headers)
    with pytest.raises(WebhookVerificationError):
        signer.verify(b"{ }", headers)
    with pytest.raises(WebhookVerificationError):
        WebhookSigner("other").verify(body, headers)


def test_empty_secret_is_refused() -> None:
    with pytest.raises(ValueError):
        WebhookSigner("")
