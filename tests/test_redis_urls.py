"""Redis URLs whose database is not a whole number are refused, wherever a URL is taken: the
extension's ``REACHLIMIT_REDIS_URL`` (and ``redis_url=``) at ``init_app``, and
``reachlimit.redis.connect``. redis-py alone would read ``redis://host/abc`` as database 0.
Every message shows the URL with its password masked. The forms people write keep working,
and a real Redis proves the database number reaches the server."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import redis
from flask import Flask

from reachlimit._urls import redis_url_problem
from reachlimit.flask import ReachLimit
from reachlimit.redis import connect
from tests.support import HOST

pytestmark = pytest.mark.timeout(30)

SECRET = "url-secret"

#: URLs whose database (path or db=) or port is not a whole number, with the part named.
BAD = [
    ("redis://u:{secret}@host/abc", "the database (the path after the host)", "'abc'"),
    ("redis://u:{secret}@host/1x", "the database (the path after the host)", "'1x'"),
    ("rediss://:{secret}@host:6380/-1", "the database (the path after the host)", "'-1'"),
    ("redis://u:{secret}@host/%201", "the database (the path after the host)", "' 1'"),
    ("redis://u:{secret}@host/\u00b2", "the database (the path after the host)", "'\u00b2'"),
    ("redis://u:{secret}@host/0/1", "the database (the path after the host)", "'0/1'"),
    ("redis://u:{secret}@host/0?db=two", "the database (db=)", "'two'"),
    ("unix:///tmp/redis.sock?password={secret}&db=x", "the database (db=)", "'x'"),
    ("redis://u:{secret}@host:port/0", "its port", "0 to 65535"),
    ("redis://u:{secret}@host:70000/0", "its port", "0 to 65535"),
]

#: What people write: no database, a bare slash, a number, TLS, a Unix socket, IPv6.
GOOD = [
    "redis://host",
    "redis://host/",
    "redis://host/0",
    "redis://host:6379/15",
    "redis://u:{secret}@host:6379/2",
    "rediss://:{secret}@host:6380/1",
    "rediss://host",
    "unix:///tmp/redis.sock",
    "unix:///tmp/redis.sock?db=3",
    "redis://[::1]:6379/1",
    "redis://host/0?db=4",
]


def url_of(template: str) -> str:
    return template.format(secret=SECRET)


@pytest.mark.parametrize(("template", "part", "got"), BAD)
def test_the_check_names_what_is_wrong_and_never_the_url(
    template: str, part: str, got: str
) -> None:
    problem = redis_url_problem(url_of(template))
    assert problem is not None and problem.startswith(part) and got in problem, problem
    assert SECRET not in problem


@pytest.mark.parametrize("template", GOOD)
def test_the_usual_forms_pass_the_check(template: str) -> None:
    assert redis_url_problem(url_of(template)) is None


def test_a_scheme_that_is_not_redis_is_a_problem_too() -> None:
    assert redis_url_problem("http://host:6379/0") == (
        "it must start with redis://, rediss:// or unix:// (one server), "
        "redis+sentinel:// (Sentinel), redis+cluster:// (Cluster)"
    )


@pytest.mark.parametrize(("template", "part", "got"), BAD)
def test_the_extension_refuses_it_at_init_app_naming_the_key(
    template: str, part: str, got: str
) -> None:
    url = url_of(template)
    app = Flask("bad-url")
    app.config["REACHLIMIT_REDIS_URL"] = url
    rl = ReachLimit()
    with pytest.raises(ValueError) as info:
        rl.init_app(app)
    message = str(info.value)
    assert message.startswith("REACHLIMIT_REDIS_URL '"), message
    assert part in message and got in message and SECRET not in message
    assert "***" in message  # the URL is shown, its password masked
    assert "reachlimit" not in app.extensions


def test_the_constructor_argument_is_refused_the_same_way() -> None:
    with pytest.raises(ValueError) as info:
        ReachLimit(Flask("bad-arg"), redis_url=f"redis://u:{SECRET}@host/abc")
    message = str(info.value)
    assert message.startswith("redis_url (ReachLimit argument) 'redis://u:***@host/abc'")
    assert SECRET not in message


@pytest.mark.parametrize("template", GOOD)
def test_the_extension_takes_the_usual_forms(template: str) -> None:
    """init_app opens no connection, so hosts that do not exist are fine here."""
    app = Flask("good-url")
    app.config["REACHLIMIT_REDIS_URL"] = url_of(template)
    rl = ReachLimit(app)
    try:
        assert app.extensions["reachlimit"].settings.redis_url == url_of(template)
    finally:
        rl.close(app)


@pytest.mark.parametrize(("template", "part", "got"), BAD)
def test_connect_refuses_it_with_the_url_masked(template: str, part: str, got: str) -> None:
    with pytest.raises(ValueError) as info:
        connect(url_of(template))
    message = str(info.value)
    assert message.startswith("bad Redis URL '"), message
    assert part in message and got in message and SECRET not in message


def test_connect_reads_tls_and_unix_socket_urls_as_redis_py_does() -> None:
    tls = connect(f"rediss://:{SECRET}@host:6380/1")
    unix = connect("unix:///tmp/redis.sock?db=3")
    try:
        kwargs = tls.connection_pool.connection_kwargs
        assert (kwargs["host"], kwargs["port"], kwargs["db"]) == ("host", 6380, 1)
        assert tls.connection_pool.connection_class is redis.SSLConnection
        kwargs = unix.connection_pool.connection_kwargs
        assert (kwargs["path"], kwargs["db"]) == ("/tmp/redis.sock", 3)
        assert unix.connection_pool.connection_class is redis.UnixDomainSocketConnection
    finally:
        tls.close()
        unix.close()


@pytest.mark.redis
@pytest.mark.parametrize(("suffix", "database"), [("", 0), ("/", 0), ("/0", 0), ("/3", 3)])
def test_the_database_of_the_url_is_the_one_written_on_a_real_redis(
    redis_server: Any, make_client: Callable[..., Any], suffix: str, database: int
) -> None:
    client = connect(f"redis://{HOST}:{redis_server.port}{suffix}")
    other = 3 - database  # 3 or 0: the database that must stay untouched
    direct = make_client(db=database)
    elsewhere = make_client(db=other)
    key = f"url-test{suffix}"
    try:
        direct.delete(key)
        elsewhere.delete(key)
        client.set(key, b"here")
        assert direct.get(key) == b"here"
        assert elsewhere.get(key) is None
    finally:
        direct.delete(key)
        client.close()
