"""A ``redis-server`` with TLS on and a password, for the ``rediss://`` tests, with
certificates made for it by ``openssl`` in a temporary directory.

design:

    ``make_ca(directory, name)`` makes a self-signed CA (``openssl req -x509 -newkey rsa:2048
    -nodes``); ``make_certificates(directory)`` a CA and a server key and certificate signed
    by it for ``subjectAltName = IP:127.0.0.1`` (what a client checks the server against),
    plus a second CA that signed nothing: a client that trusts only that one must refuse
    the server. :class:`TLSRedis` runs the server as a ``Node`` (``redis_sentinel.py``,
    stopped by PID) on a free TLS port with the plain port off (``--port 0``), client
    certificates not asked for (``--tls-auth-clients no``) and ``--requirepass``; it is
    ready once a TLS client trusting the CA gets PONG with the password.

A redis-server built without TLS does not know ``--tls-port``: the test is then skipped
with that reason (failed under CI, whose Debian package has TLS); so is a missing
``openssl`` or ``redis-server``.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple
from urllib.parse import quote

import pytest

from tests.support import HOST
from tests.support.redis_sentinel import Node, pings, running
from tests.support.redis_server import require_binary

#: The server's password: never to be seen in a log line, a health answer or an error.
SECRET = "tls-S3cret-9f1c"


class Certificates(NamedTuple):
    ca: Path  # the CA that signed the server's certificate
    cert: Path  # the server's certificate (subjectAltName IP:127.0.0.1)
    key: Path  # the server's key
    wrong_ca: Path  # a CA that signed nothing here


def _openssl(directory: Path, *args: str) -> None:
    subprocess.run([require_binary("openssl", "openssl"), *args], cwd=directory, check=True,
                   stdin=subprocess.DEVNULL, capture_output=True, timeout=60)


def make_ca(directory: Path, name: str) -> tuple[Path, Path]:
    """A self-signed CA: (its certificate, its key)."""
    _openssl(directory, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
             "-keyout", f"{name}.key", "-out", f"{name}.pem", "-subj", f"/CN={name}")
    return directory / f"{name}.pem", directory / f"{name}.key"


def make_certificates(directory: Path) -> Certificates:
    directory.mkdir(parents=True, exist_ok=True)
    ca, ca_key = make_ca(directory, "test-ca")
    wrong_ca, _ = make_ca(directory, "other-ca")
    _openssl(directory, "req", "-newkey", "rsa:2048", "-nodes", "-keyout", "server.key",
             "-out", "server.csr", "-subj", f"/CN={HOST}")
    (directory / "san.cnf").write_text(f"subjectAltName = IP:{HOST}\n")
    _openssl(directory, "x509", "-req", "-in", "server.csr", "-CA", str(ca), "-CAkey",
             str(ca_key), "-CAcreateserial", "-days", "2", "-extfile", "san.cnf",
             "-out", "server.pem")
    return Certificates(ca, directory / "server.pem", directory / "server.key", wrong_ca)


class TLSRedis:
    """One redis-server with TLS on (see the module's design note)."""

    def __init__(self, directory: Path) -> None:
        self.binary = require_binary("redis-server", "redis-server")
        self.certs = make_certificates(directory / "certs")
        self.node = Node(directory / "tls-redis", self._command, self._ready)

    def _command(self, port: int) -> list[str]:
        return [
            self.binary, "--port", "0", "--tls-port", str(port), "--bind", HOST,
            "--tls-cert-file", str(self.certs.cert), "--tls-key-file", str(self.certs.key),
            "--tls-ca-cert-file", str(self.certs.ca), "--tls-auth-clients", "no",
            "--requirepass", SECRET, "--save", "", "--appendonly", "no",
            "--dir", str(self.node.directory),
        ]

    def _ready(self, port: int) -> bool:
        return pings(port, ssl=True, ssl_ca_certs=str(self.certs.ca), password=SECRET)

    def start(self) -> None:
        try:
            self.node.start()
        except AssertionError:
            log = self.node.log()
            if "tls-port" in log or "TLS" in log:
                message = f"this redis-server has no TLS: {log.strip().splitlines()[-1]}"
                if os.environ.get("CI"):
                    pytest.fail(message)
                pytest.skip(message)
            raise

    @property
    def port(self) -> int:
        return self.node.port

    def url(self, ca: Path | None = None, password: str = SECRET) -> str:
        """``rediss://`` with the password and redis-py's own certificate parameters."""
        where = quote(str(ca or self.certs.ca), safe="/")
        return (f"rediss://:{password}@{HOST}:{self.port}/0"
                f"?ssl_ca_certs={where}&ssl_cert_reqs=required")

    def stop(self) -> None:
        self.node.stop()


@pytest.fixture(name="tls_redis")
def tls_redis_fixture(tmp_path: Path) -> Iterator[TLSRedis]:
    """A started :class:`TLSRedis`, stopped by PID at teardown."""
    with running(TLSRedis(tmp_path / "tls")) as server:
        yield server
