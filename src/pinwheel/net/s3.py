"""S3's request signing (AWS Signature Version 4, header form).

Moved from ``compile.objbackends``: the object store's S3 backend signs with it.
"""

from __future__ import annotations

import datetime
import hashlib
import hmac
import urllib.parse


def _quote(text: str) -> str:
    return urllib.parse.quote(text, safe="/-_.~")


def sigv4_headers(
    method: str, url: str, *, region: str, access_key: str, secret_key: str,
    token: str | None, payload_sha256: str, now: datetime.datetime,
) -> dict[str, str]:  # fmt: skip
    """The headers that sign ``method url`` for S3 (AWS Signature Version 4, header form)."""
    parts = urllib.parse.urlsplit(url)
    amz_date = now.strftime("%Y%m%dT%H%M%SZ")
    day = amz_date[:8]
    headers = {
        "host": parts.netloc,
        "x-amz-content-sha256": payload_sha256,
        "x-amz-date": amz_date,
    }
    if token:
        headers["x-amz-security-token"] = token
    names = sorted(headers)
    query = "&".join(
        f"{_quote(k).replace('/', '%2F')}={_quote(v).replace('/', '%2F')}"
        for k, v in sorted(urllib.parse.parse_qsl(parts.query, keep_blank_values=True))
    )
    canonical = "\n".join([
        method, parts.path or "/", query,
        "".join(f"{n}:{headers[n].strip()}\n" for n in names),
        ";".join(names), payload_sha256,
    ])  # fmt: skip
    scope = f"{day}/{region}/s3/aws4_request"
    to_sign = "\n".join(
        ["AWS4-HMAC-SHA256", amz_date, scope, hashlib.sha256(canonical.encode()).hexdigest()]
    )
    key = ("AWS4" + secret_key).encode()
    for part in (day, region, "s3", "aws4_request"):
        key = hmac.new(key, part.encode(), hashlib.sha256).digest()
    signature = hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()
    headers["Authorization"] = (
        f"AWS4-HMAC-SHA256 Credential={access_key}/{scope}, "
        f"SignedHeaders={';'.join(names)}, Signature={signature}"
    )
    del headers["host"]  # urllib sends it from the URL
    return headers


_EMPTY_SHA = hashlib.sha256(b"").hexdigest()
