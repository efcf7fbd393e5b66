"""The remote tier: KV chunks and entry manifests on S3-compatible object storage.

Bucket layout, under a prefix that is a team's namespace (two prefixes never see each other):

    {prefix}/kv/{fingerprint}/{entry prefix hash}/{level}/{chunk:05d}-{sha256}   chunk bytes
    {prefix}/manifests/{fingerprint}/{token_end:08d}-{entry prefix hash}.json    one per entry
    {prefix}/calibrations/{fingerprint}/{sha256}                                 codec calibrations

Chunk objects are immutable and content-addressed: the key ends with the SHA-256 of the bytes,
so writing one twice writes the same thing, and a reader checks what it got against its key.
An entry's manifest (store.shared.manifest) is written last, after every chunk it names, so a
half-uploaded entry has no manifest and nobody ever sees it. Nothing is ever read, changed
and written back: concurrent pushes from several machines can only write whole objects, and
the last complete manifest of an entry wins.

Credentials come from boto3's standard chain (AWS_* environment variables, ~/.aws/config and
credentials, instance roles); this module never receives, logs or stores them, and its error
messages say which endpoint failed and how, from error codes only. boto3 is imported on first
use, so the application starts without it when the tier is off.

This module must never import the app, llama.cpp or the codec, never return bytes that failed
their checksum, and never read or list a key outside its prefix.
"""

from __future__ import annotations

import hashlib
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass, replace
from urllib.parse import urlsplit

from ..errors import CorruptObjectError, NotFoundError, RemoteError

# A level name or fingerprint becomes part of a key: nothing that could climb out of a folder.
_SAFE_PART = re.compile(r"^[A-Za-z0-9_.-]+$")
_ACCESS_CODES = {"AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "ExpiredToken",
                 "InvalidToken", "AllAccessDisabled"}


@dataclass(frozen=True)
class RemoteConfig:
    """Where the tier lives. Never credentials: boto3 finds those itself."""

    bucket: str
    prefix: str = "kvdesk"
    endpoint_url: str | None = None  # None: AWS S3 itself
    region: str | None = None
    connect_timeout_s: float = 3.0
    read_timeout_s: float = 10.0
    max_attempts: int = 3  # per request, botocore's "standard" retry mode (with backoff)
    # A lookup on an answer's way (is this prefix shared?) waits this long, once: a bucket
    # that hangs then costs seconds, not attempts x read timeout, before the answer goes on.
    lookup_timeout_s: float = 3.0
    parallel: int = 4  # requests in flight at once

    @property
    def where(self) -> str:
        """The endpoint as shown to the user: its host only."""
        if not self.endpoint_url:
            return "AWS S3"
        parts = urlsplit(self.endpoint_url)
        try:
            port = parts.port
        except ValueError:  # (settings refuse such a port; a config made in code may not)
            return f"{parts.scheme}://{parts.netloc.rpartition('@')[2]}"
        return f"{parts.scheme}://{parts.hostname}" + (f":{port}" if port is not None else "")


def _safe(part: str) -> str:
    if not _SAFE_PART.match(part):
        raise ValueError(f"{part!r} cannot be part of a remote key")
    return part


def sha256(data: bytes | memoryview) -> str:
    return hashlib.sha256(data).hexdigest()


class RemoteTier:
    """One bucket and prefix; safe to share between threads (boto3 clients are).

    `on_retry`, where set, is told each request tried again after an attempt that failed (a
    timeout, a 5xx answer, throttling), as it happens: a hung bucket costs three patient
    attempts, and a command waiting on them should not be silent meanwhile. It may be
    called from any thread."""

    def __init__(self, config: RemoteConfig, client=None,
                 on_retry: Callable[[str], None] | None = None):
        self.config = config
        self.prefix = config.prefix.strip("/")
        self._client = client
        self._lookup_client = client
        self._lock = threading.Lock()
        self.on_retry = on_retry

    # -- layout ----------------------------------------------------------------------------

    def _key(self, *parts: str) -> str:
        return "/".join(p for p in (self.prefix, *parts) if p)

    def chunk_key(self, fingerprint: str, prefix_hash: bytes, level: str, chunk_index: int,
                  digest: str) -> str:
        return self._key("kv", _safe(fingerprint), prefix_hash.hex(), _safe(level),
                         f"{chunk_index:05d}-{digest}")

    def entry_folder(self, fingerprint: str, prefix_hash: bytes) -> str:
        return self._key("kv", _safe(fingerprint), prefix_hash.hex()) + "/"

    def manifest_key(self, fingerprint: str, token_end: int, prefix_hash: bytes) -> str:
        return self._key("manifests", _safe(fingerprint),
                         f"{token_end:08d}-{prefix_hash.hex()}.json")

    def calibration_key(self, fingerprint: str, digest: str) -> str:
        if not re.match(r"^[0-9a-f]{64}$", digest):
            raise ValueError(f"{digest!r} is not a SHA-256")
        return self._key("calibrations", _safe(fingerprint), digest)

    def manifest_folder(self, fingerprint: str) -> str:
        return self._key("manifests", _safe(fingerprint)) + "/"

    @staticmethod
    def parse_manifest_key(key: str) -> tuple[int, bytes] | None:
        """(token_end, prefix hash) a manifest key names, or None for any other key."""
        match = re.search(r"/(\d{8})-([0-9a-f]{32})\.json$", key)
        return (int(match[1]), bytes.fromhex(match[2])) if match else None

    def _own(self, key: str) -> str:
        # Another team's prefix is another namespace: never read, written or listed from here.
        if self.prefix and not key.startswith(self.prefix + "/"):
            raise ValueError(f"{key!r} is outside this tier's prefix {self.prefix!r}")
        return key

    # -- requests --------------------------------------------------------------------------

    @property
    def client(self):
        with self._lock:
            if self._client is None:
                self._client = _make_client(self.config)
                events = self._client.meta.events
                events.register("needs-retry.s3", self._attempt_failed)
                events.register("request-created.s3", self._retrying)
            return self._client

    @property
    def lookup_client(self):
        """The client of `list_folder(lookup=True)`: one attempt, a short read timeout."""
        with self._lock:
            if self._lookup_client is None:
                self._lookup_client = _make_client(replace(
                    self.config, max_attempts=1,
                    read_timeout_s=min(self.config.read_timeout_s, self.config.lookup_timeout_s)))
            return self._lookup_client

    def _attempt_failed(self, request_dict=None, caught_exception=None, response=None, **_):
        # botocore asks after every attempt whether to retry: what failed, for `_retrying`.
        if request_dict is None:
            return
        why = None
        if caught_exception is not None:
            name = type(caught_exception).__name__
            why = (f"no answer in {self.config.read_timeout_s:g} s" if name == "ReadTimeoutError"
                   else name)
        elif response is not None and response[0].status_code >= 400:
            why = f"HTTP {response[0].status_code}"
        request_dict["context"]["kvdesk_failed"] = why

    def _retrying(self, request=None, operation_name: str = "", **_):
        attempt = request.context.get("retries", {}).get("attempt", 1) if request else 1
        if attempt > 1 and self.on_retry is not None:
            why = request.context.get("kvdesk_failed")
            operation = re.sub(r"(?<!^)(?=[A-Z])", "_", operation_name).lower()  # as boto3's
            self.on_retry(f"{self.config.where}: {operation}"
                          + (f" failed ({why})" if why else " failed")
                          + f"; trying again (attempt {attempt} of {self.config.max_attempts})")

    def put(self, key: str, data: bytes | memoryview) -> None:
        self._call("put_object", key, Bucket=self.config.bucket, Key=self._own(key),
                   Body=bytes(data))

    def exists(self, key: str) -> bool:
        try:
            self._call("head_object", key, Bucket=self.config.bucket, Key=self._own(key))
        except NotFoundError:
            return False
        return True

    def list_folder(self, folder: str, *, lookup: bool = False) -> dict[str, int]:
        """{key: size} of every object under `folder` (one of the folders above); a `lookup`
        on an answer's way tries once, briefly (`lookup_client`)."""
        if not folder.endswith("/"):
            raise ValueError(f"{folder!r} is not a folder")
        self._own(folder)
        found: dict[str, int] = {}
        token = None
        while True:
            kwargs = {"Bucket": self.config.bucket, "Prefix": folder}
            if token:
                kwargs["ContinuationToken"] = token
            page = self._call("list_objects_v2", folder, lookup=lookup, **kwargs)
            found.update({o["Key"]: o["Size"] for o in page.get("Contents", ())})
            token = page.get("NextContinuationToken")
            if not page.get("IsTruncated") or not token:
                return found

    def get(self, key: str, *, nbytes: int | None = None, digest: str | None = None) -> bytes:
        """An object's bytes, checked against the size and SHA-256 given (CorruptObjectError).

        botocore retries a request that fails before its body arrives; a body that breaks off
        (a timeout, a closed connection) is fetched again here, within the same bound.
        """
        from botocore.exceptions import (
            ConnectionClosedError,
            IncompleteReadError,
            ReadTimeoutError,
            ResponseStreamingError,
        )

        broken: Exception | None = None
        for _ in range(self.config.max_attempts):
            response = self._call("get_object", key, Bucket=self.config.bucket,
                                  Key=self._own(key))
            try:
                data = response["Body"].read()
                break
            except (ReadTimeoutError, ResponseStreamingError, IncompleteReadError,
                    ConnectionClosedError) as e:
                broken = e
        else:
            raise RemoteError(f"{self.config.where} broke off reading {key} "
                              f"({type(broken).__name__}, {self.config.max_attempts} attempts)")
        if nbytes is not None and len(data) != nbytes:
            raise CorruptObjectError(key, f"{len(data)} bytes where {nbytes} were expected")
        if digest is not None and sha256(data) != digest:
            raise CorruptObjectError(key, "SHA-256 mismatch")
        return data

    def check(self) -> None:
        """Raise RemoteError unless the bucket answers with these credentials."""
        self._call("head_bucket", self.config.bucket, Bucket=self.config.bucket)

    def _call(self, operation: str, key: str, *, lookup: bool = False, **kwargs):
        from botocore.exceptions import (
            BotoCoreError,
            ClientError,
            NoCredentialsError,
            PartialCredentialsError,
        )

        try:
            client = self.lookup_client if lookup else self.client
            return getattr(client, operation)(**kwargs)
        except ClientError as e:
            raise self._client_error(e, operation, key) from None
        except (NoCredentialsError, PartialCredentialsError):
            raise RemoteError(
                "no usable AWS credentials for the remote tier: set AWS_ACCESS_KEY_ID and "
                "AWS_SECRET_ACCESS_KEY, or AWS_PROFILE, or write ~/.aws/credentials") from None
        except BotoCoreError as e:
            # Connection refused, timeouts, a dropped connection: retried by botocore already.
            raise RemoteError(f"{self.config.where} did not answer {operation} of {key} "
                              f"({type(e).__name__}, " + ("one attempt)" if lookup else
                                                          f"{self.config.max_attempts} attempts)")
                              ) from None

    def _client_error(self, e, operation: str, key: str) -> Exception:
        # Only the error code and status are shown: a server's message or response body may
        # echo request details (an access key id in a signature error).
        code = str(e.response.get("Error", {}).get("Code", ""))
        status = e.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        where, bucket = self.config.where, self.config.bucket
        if code == "NoSuchBucket" or (operation == "head_bucket" and status == 404):
            return RemoteError(f"bucket {bucket!r} does not exist at {where}")
        if code in ("NoSuchKey", "NotFound", "404") or status == 404:
            return NotFoundError(f"remote object {key} does not exist")
        if code in _ACCESS_CODES or status in (401, 403):
            return RemoteError(f"{where} refused access to bucket {bucket!r} ({code or status}); "
                               "check the AWS credentials (environment or ~/.aws)")
        return RemoteError(f"{where} answered {code or 'an error'} (HTTP {status}) to "
                           f"{operation} of {key}, {self.config.max_attempts} attempts")


def _make_client(config: RemoteConfig):
    import boto3
    from botocore.config import Config

    session = boto3.session.Session()
    region = config.region or session.region_name or ("us-east-1" if config.endpoint_url else None)
    return session.client(
        "s3",
        endpoint_url=config.endpoint_url or None,
        region_name=region,
        config=Config(
            connect_timeout=config.connect_timeout_s,
            read_timeout=config.read_timeout_s,
            retries={"mode": "standard", "total_max_attempts": config.max_attempts},
            max_pool_connections=max(10, 2 * config.parallel),
            # Path-style addressing works on every S3-compatible server (MinIO, Ceph,
            # SeaweedFS); virtual hosts need DNS for each bucket.
            s3={"addressing_style": "path" if config.endpoint_url else "auto"},
            # Objects are checked end to end against their SHA-256 here; the newer CRC
            # trailers botocore adds by default are refused by some S3-compatible servers.
            request_checksum_calculation="when_required",
            response_checksum_validation="when_required",
        ),
    )
