"""Hostile input: whatever a client sends to the API, the answer is one of a few statuses, is
JSON, and never shows a traceback or a server path.

design:

    test_generated_requests_get_only_json_answers ... Hypothesis, 1,200 requests (derandomized,
        no example database) through Flask's test client: pubkeys of every length and
        alphabet (hex of any case and length, Unicode digits and letters, percent-encoded and
        double-encoded bytes, separators, NUL), ``days`` of every shape (huge, negative,
        fractional, exponent, NaN, Unicode digits, empty, repeated), unknown parameters, long
        URLs, odd methods; on /api/nodes/<pubkey>/reach, /api/nodes, /api/health and unrouted
        /api paths
    test_real_server_sample ......................... a seeded sample of the same kind of
        requests, written byte for byte on raw sockets to the real service under gunicorn
    test_protocol_garbage_is_refused_by_gunicorn .... malformed HTTP: gunicorn answers it
        itself (4xx, plain text, never the app, never a traceback), and keeps serving

The contract for a request that reaches the app: status 200, 400, 404, 405 or 429;
``Content-Type: application/json`` and a body that parses (HEAD: no body); an error body is
``{"error": <one of the service's fixed sentences>}`` (plus ``retryAfter`` on a 429), so no
input is ever echoed; no body holds "Traceback", 'File "', or a server path.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import random
import socket
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import webapp.db
from tests.support import HOST, ROOT
from tests.support.gunicorn_server import reach_service, serving

ALLOWED = {200, 400, 404, 405, 429}
#: Every sentence an error body may carry: fixed texts, so no input is ever reflected.
ERROR_SENTENCES = {
    "invalid pubkey: expected 64 hex chars",
    "Not found",
    "Method not allowed",
    "invalid limit: expected a whole number",
    "invalid offset: expected a whole number",
    "Too many reports are being built right now; please retry shortly.",
    "Waited too long for a free build slot; please retry shortly.",
}
LEAKS = (b"Traceback", b'File "', b"/work", b"/tmp", b"/home", b"site-packages",
         str(ROOT).encode())
METHODS = ["GET"] * 6 + ["HEAD", "POST", "PUT", "DELETE", "PATCH", "TRACE", "PROPFIND", "FOO"]

#: Figures printed at the end of the generated test.
SEEN: Counter[str] = Counter()


def check_answer(method: str, url: str, status: int, content_type: str, body: bytes,
                 extra: tuple[bytes, ...] = ()) -> None:
    """The contract of the module docstring, for one answer."""
    where = f"{method} {url[:200]!r} -> {status} {content_type!r} {body[:200]!r}"
    assert status in ALLOWED, where
    assert content_type.split(";")[0].strip() == "application/json", where
    for leak in LEAKS + extra:
        assert leak not in body, where
    if method == "HEAD":
        assert body == b"", where
        return
    data = json.loads(body)
    if status == 200:
        assert isinstance(data, dict), where
        return
    assert isinstance(data, dict) and data.get("error") in ERROR_SENTENCES, where
    assert set(data) <= {"error", "retryAfter"}, where


# -- generated input -----------------------------------------------------------------------

_FULLWIDTH_HEX = "０１２３４５６７８９ａｂｃｄｅｆＡＢＣＤＥＦ"
_OTHER_DIGITS = "٠١٢٣٤٥٦٧٨٩۰۱۲۳۴۵۶۷۸۹०१२३४५६७८९߀߁๑๒𝟎𝟏𝟐𝟗"
_ODD = " \t\n\r\x00\x7f/\\?#%&=+;:.,'\"<>`{}|^~[]@!$*()é€😀\u200b\ufeff"


def _encode(text: str, how: str) -> str:
    if how == "quote":
        return quote(text, safe="")
    if how == "double":
        return quote(quote(text, safe=""), safe="")
    if how == "all":  # every byte percent-encoded, even the unreserved ones
        return "".join(f"%{b:02X}" for b in text.encode("utf-8", "surrogatepass"))
    return quote(text, safe="-._~!$'()*+,;=:@")  # "mostly raw": sub-delims left as they are


def pubkeys(known: list[str]) -> st.SearchStrategy[str]:
    hexchars = "0123456789abcdefABCDEF"
    return st.one_of(
        st.sampled_from(known),
        st.sampled_from(known).map(str.upper),
        st.text(alphabet=hexchars, min_size=0, max_size=130),
        st.integers(60, 68).flatmap(lambda n: st.text(alphabet=hexchars, min_size=n,
                                                      max_size=n)),
        st.text(alphabet=hexchars + _FULLWIDTH_HEX + _OTHER_DIGITS, min_size=64, max_size=64),
        st.builds(lambda k, i, c: k[:i] + c + k[i + 1:], st.sampled_from(known),
                  st.integers(0, 63), st.sampled_from(list(_ODD + _FULLWIDTH_HEX))),
        st.text(min_size=0, max_size=80),
        st.text(alphabet=_ODD, max_size=20),
        st.builds(lambda k: k + "/..", st.sampled_from(known)),
        st.just("." * 64), st.just(".."), st.just("%00" * 22),
    )


def days_values() -> st.SearchStrategy[str]:
    return st.one_of(
        st.integers(-10**6, 10**6).map(str),
        st.integers(-(10**400), 10**400).map(str),
        st.floats(allow_nan=True, allow_infinity=True).map(repr),
        st.sampled_from(["", " ", "7.5", "1e308", "-0", "+30", "0x1e", "nan", "inf", "-inf",
                         "٣", "７", "𝟑", " 12 ", "1_0", "三", "0" * 500 + "9", "9" * 5000]),
        st.text(max_size=30),
    )


@st.composite
def requests(draw: st.DrawFn, known: list[str]) -> tuple[str, str]:
    method = draw(st.sampled_from(METHODS))
    key = _encode(draw(pubkeys(known)), draw(st.sampled_from(["quote", "double", "all", "raw"])))
    shape = draw(st.sampled_from(
        ["reach"] * 8 + ["reach/", "reach/x", "REACH", "node", "nodes", "health", "other"]))
    if shape == "reach":
        path = f"/api/nodes/{key}/reach"
    elif shape == "reach/":
        path = f"/api/nodes/{key}/reach/"
    elif shape == "reach/x":
        path = f"/api/nodes/{key}/reach/{key}"
    elif shape == "REACH":
        path = f"/api/nodes/{key}/REACH"
    elif shape == "node":
        path = f"/api/nodes/{key}"
    elif shape == "nodes":
        path = "/api/nodes"
    elif shape == "health":
        path = "/api/health"
    else:
        path = "/api/" + key
    params: list[str] = []
    for _ in range(draw(st.integers(0, 4))):
        name = draw(st.sampled_from(["days", "days", "limit", "offset", "q", "x", "DAYS",
                                     "days[]", "", "%00", "\u00e9"]))
        value = _encode(draw(days_values()), draw(st.sampled_from(["quote", "all"])))
        params.append(f"{quote(name, safe='')}={value}")
    if draw(st.booleans()):
        params.append("pad=" + "A" * draw(st.integers(1000, 30_000)))  # a long URL
    if draw(st.booleans()):
        params.append(draw(st.sampled_from(["&", "&&", "=", "days", "days=", "==7", ";days=3"])))
    url = path + ("?" + "&".join(params) if params else "")
    return method, url


@pytest.fixture
def known_keys(reach_demo_db: Path) -> list[str]:
    conn = webapp.db.open_readonly(reach_demo_db)
    try:
        return [row[0] for row in conn.execute("SELECT public_key FROM nodes ORDER BY 1")][:40]
    finally:
        conn.close()


GENERATED = 1200


def test_generated_requests_get_only_json_answers(
    reach_app_factory: Any, reach_demo_db: Path, known_keys: list[str],
) -> None:
    app = reach_app_factory()
    client = app.test_client()
    db_path = str(reach_demo_db).encode()
    SEEN.clear()

    @settings(max_examples=GENERATED, derandomize=True, database=None, deadline=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(req=requests(known_keys))
    def check(req: tuple[str, str]) -> None:
        method, url = req
        response = client.open(url, method=method)
        SEEN["requests"] += 1
        SEEN[f"{method if method in ('GET', 'HEAD') else 'other'} {response.status_code}"] += 1
        check_answer(method, url, response.status_code, response.content_type or "",
                     response.get_data(), (db_path,))
        if method == "GET" and response.status_code == 200 and "/reach" in url:
            report = response.get_json()
            assert 1 <= report["window"]["days"] <= 30
            assert len(report["node"]["pubkey"]) == 64

    check()
    print(f"\n[hostile, test client] {SEEN['requests']} requests: "
          f"{dict(sorted((k, v) for k, v in SEEN.items() if k != 'requests'))}")
    assert SEEN["requests"] >= 1000
    # Every interesting answer was really produced, not just the 400s.
    assert SEEN["GET 200"] and SEEN["GET 400"] and SEEN["GET 404"] and SEEN["other 405"]


def test_options_is_answered_with_json(reach_app_factory: Any, known_keys: list[str]) -> None:
    client = reach_app_factory().test_client()
    for url in ("/api/health", "/api/nodes", f"/api/nodes/{known_keys[0]}/reach"):
        response = client.open(url, method="OPTIONS")
        assert response.content_type.split(";")[0] == "application/json", (url, response)
        assert "GET" in response.get_json()["allow"]
        assert "GET" in response.headers["Allow"]


# -- the real server -------------------------------------------------------------------------


def raw_request(port: int, data: bytes, method: str, timeout: float = 10.0
                ) -> tuple[int, str, bytes]:
    """Write ``data`` as it is and read one HTTP answer."""
    with socket.create_connection((HOST, port), timeout=timeout) as sock:
        sock.sendall(data)
        response = http.client.HTTPResponse(sock, method=method)
        response.begin()
        body = response.read()
        return response.status, response.getheader("Content-Type") or "", body


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory, reach_demo_db: Path) -> Iterator[int]:
    """The real service under gunicorn (webapp/gunicorn.conf.py, 1 worker, 16 threads): its
    port. Stopped by its PID (SIGTERM, then SIGKILL) with a check that its worker is gone."""
    server = reach_service(
        tmp_path_factory.mktemp("hostile-gunicorn"), reach_demo_db, "hostile",
        workers_env=None, stripped_env=("REACH_", "REACHLIMIT_", "GUNICORN_"),
    )
    with serving(server, check_log=False):
        yield server.port


#: gunicorn's own limit on the request line (limit_request_line): beyond it, gunicorn - not
#: the app - answers (414). The app contract is checked on requests within it.
REQUEST_LINE_LIMIT = 4094
SAMPLE = 200


@pytest.mark.gunicorn
def test_real_server_sample(service: int, reach_demo_db: Path, known_keys: list[str]) -> None:
    rng = random.Random(20261129)
    seen: Counter[str] = Counter()
    db_path = str(reach_demo_db).encode()
    for _ in range(SAMPLE):
        method, url = _sample(rng, known_keys)
        line = f"{method} {url} HTTP/1.1"
        assert len(line) <= REQUEST_LINE_LIMIT
        data = f"{line}\r\nHost: {HOST}\r\nConnection: close\r\n\r\n".encode("ascii")
        status, content_type, body = raw_request(service, data, method)
        seen[f"{method if method in ('GET', 'HEAD') else 'other'} {status}"] += 1
        check_answer(method, url, status, content_type, body, (db_path,))
    print(f"\n[hostile, gunicorn] {SAMPLE} requests: {dict(sorted(seen.items()))}")
    assert seen["GET 200"] and seen["GET 400"] and seen["GET 404"]


def _sample(rng: random.Random, known: list[str]) -> tuple[str, str]:
    """A request like the generated ones, from a seeded ``random.Random``, ASCII on the wire
    (every non-ASCII byte percent-encoded) and within gunicorn's request-line limit."""
    method = rng.choice(METHODS)
    hexchars = "0123456789abcdefABCDEF"
    kind = rng.randrange(8)
    if kind == 0:
        key = rng.choice(known)
    elif kind == 1:
        key = rng.choice(known).upper()
    elif kind == 2:
        key = "".join(rng.choice(hexchars) for _ in range(rng.randrange(0, 130)))
    elif kind == 3:
        key = "".join(rng.choice(hexchars + _FULLWIDTH_HEX + _OTHER_DIGITS) for _ in range(64))
    elif kind == 4:
        k = rng.choice(known)
        i = rng.randrange(64)
        key = k[:i] + rng.choice(_ODD + _FULLWIDTH_HEX) + k[i + 1:]
    elif kind == 5:
        key = "".join(chr(rng.randrange(1, 0x3000)) for _ in range(rng.randrange(1, 40)))
    elif kind == 6:
        key = rng.choice(["..", ".", "%00", "a/b", "\x00" * 3, " " * 64])
    else:
        key = rng.choice(known) + rng.choice(["/..", "%2F..", "\x00"])
    encoded = _encode(key, rng.choice(["quote", "double", "all", "raw"]))
    path = rng.choice([f"/api/nodes/{encoded}/reach"] * 6 + [
        f"/api/nodes/{encoded}", "/api/nodes", "/api/health", f"/api/{encoded}"])
    days = rng.choice(["", "7", "-3", "31", "10" * 300, "7.5", "nan", "%00", "%D9%A3",
                       "%EF%BC%97", "1e9", "+5", "%20%2012"])
    query = rng.choice(["", f"?days={days}", f"?days={days}&days=2", f"?x=1&days={days}&y",
                        f"?limit={days}&offset={days}", f"?q={encoded}", "?&&=&"])
    url = path + query
    budget = REQUEST_LINE_LIMIT - len(method) - len(" HTTP/1.1") - 1
    if len(url) > budget:
        url = path[: budget // 2]  # still a valid request, just shorter
    elif rng.random() < 0.2:
        url += ("&" if "?" in url else "?") + "pad=" + "B" * max(0, budget - len(url) - 6)
    return method, url


@pytest.mark.gunicorn
def test_protocol_garbage_is_refused_by_gunicorn(service: int) -> None:
    """Requests that are not valid HTTP never reach the app: gunicorn itself answers with a
    4xx (or closes), never a 5xx, never a traceback; the service keeps answering."""
    garbage = [
        b"GET /api/nodes/" + "é".encode() * 64 + b"/reach HTTP/1.1\r\nHost: x\r\n\r\n",
        b"GET /api/health?" + b"a" * 9000 + b" HTTP/1.1\r\nHost: x\r\n\r\n",
        b"GET /api/health HTTP/1.1\r\nHost: x\r\nX: " + b"b" * 9000 + b"\r\n\r\n",
        b"G\x00T /api/health HTTP/1.1\r\nHost: x\r\n\r\n",
        b"GET /api/health HTTP/9.9\r\nHost: x\r\n\r\n",
        b"GET /api/health\r\n\r\n",
        b"GET  /api/health  HTTP/1.1\r\nHost: x\r\n\r\n",
        b"GET /api/health HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n",
        b"GET /api/health HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n",
        b"GET /api/health HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip, chunked, x\r\n\r\n",
        b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + b"\x00" * 40,  # a TLS hello
        b"GET /api/health HTTP/1.1\r\nHost: x\r\n" + b"H: v\r\n" * 200 + b"\r\n",
    ]
    seen: Counter[str] = Counter()
    for data in garbage:
        with socket.create_connection((HOST, service), timeout=10) as sock:
            sock.sendall(data)
            with contextlib.suppress(ConnectionResetError):
                sock.shutdown(socket.SHUT_WR)
            answer = b""
            with contextlib.suppress(ConnectionResetError):
                while chunk := sock.recv(65536):
                    answer += chunk
        status = int(answer.split(b" ", 2)[1]) if answer.startswith(b"HTTP/") else 0
        seen[str(status) if status else "closed"] += 1
        assert status == 0 or 400 <= status < 500 or status == 501, (data[:60], answer[:200])
        for leak in LEAKS:
            assert leak not in answer, (data[:60], answer[:300])
    print(f"\n[hostile, protocol garbage] {len(garbage)} requests: {dict(sorted(seen.items()))}")
    get = b"GET /api/health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    assert raw_request(service, get, "GET")[0] == 200
