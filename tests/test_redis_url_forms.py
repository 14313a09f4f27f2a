"""The URL forms of a Redis beyond ``redis://``, read without a server: ``redis+sentinel://``
(the ``limits`` library's form) and ``rediss://`` with redis-py's certificate parameters.
What ``reachlimit.redis.connect`` builds from them is read off the client it returns (no
connection is opened); the servers themselves are in ``tests/test_redis_sentinel.py`` and
``tests/test_redis_tls.py``."""

from __future__ import annotations

from typing import Any

import pytest
import redis
from flask import Flask

from reachlimit._urls import mask_url, redis_url_problem, sentinel_parts, url_secrets
from reachlimit.flask import ReachLimit
from reachlimit.redis import RedisHealth, connect

pytestmark = pytest.mark.timeout(30)

SECRET = "s3-cret"


def sentinel_view(client: redis.Redis) -> tuple[str, dict[str, Any], list[dict[str, Any]]]:
    """(the service, the primary's connection options, each sentinel's options)."""
    pool: Any = client.connection_pool
    sentinels = [s.connection_pool.connection_kwargs for s in pool.sentinel_manager.sentinels]
    return pool.service_name, pool.connection_kwargs, sentinels


def test_a_sentinel_url_names_its_sentinels_service_and_database() -> None:
    where = sentinel_parts(f"redis+sentinel://u:{SECRET}@10.0.0.1:26380,[::1],s3:1/svc/4")
    assert where.hosts == [("10.0.0.1", 26380), ("::1", 26379), ("s3", 1)]
    assert (where.service, where.db, where.username, where.password) == ("svc", 4, "u", SECRET)
    assert sentinel_parts("redis+sentinel://h:1/svc").db is None


@pytest.mark.parametrize(("url", "problem"), [
    ("redis+sentinel://a:1,b:x/svc", "each sentinel's port must be a whole number"),
    ("redis+sentinel://a:1,b:99999/svc", "each sentinel's port must be a whole number"),
    ("redis+sentinel://a:1,/svc", "it must name at least one sentinel"),
    ("redis+sentinel:///svc", "it must name at least one sentinel"),
    ("redis+sentinel://a:1", "it must name the service"),
    ("redis+sentinel://a:1/", "it must name the service"),
    ("redis+sentinel://a:1/svc/x", "the database (after the service) must be a whole number"),
    ("redis+sentinel://a:1/svc/0/1", "the database (after the service) must be a whole number"),
    ("redis+sentinel://a:1/svc?db=x", "the database (db=) must be a whole number"),
])
def test_a_bad_sentinel_url_is_refused_naming_the_part_and_never_the_password(
    url: str, problem: str
) -> None:
    url = url.replace("://", f"://u:{SECRET}@", 1)
    found = redis_url_problem(url)
    assert found is not None and found.startswith(problem), found
    with pytest.raises(ValueError, match="bad Redis URL") as raised:
        connect(url)
    assert SECRET not in str(raised.value) and "u:***@" in str(raised.value)
    app = Flask(__name__)
    app.config["REACHLIMIT_REDIS_URL"] = url
    with pytest.raises(ValueError, match="REACHLIMIT_REDIS_URL") as raised:
        ReachLimit(app)
    assert SECRET not in str(raised.value)


def test_the_sentinel_urls_password_is_the_primarys_and_the_sentinels() -> None:
    client = connect(f"redis+sentinel://u:{SECRET}@127.0.0.1:1,127.0.0.1:2/svc/3")
    try:
        service, primary, sentinels = sentinel_view(client)
        assert service == "svc"
        assert (primary["username"], primary["password"], primary["db"]) == ("u", SECRET, 3)
        assert (primary["socket_timeout"], primary["socket_connect_timeout"]) == (0.5, 0.5)
        assert [(s["host"], s["port"]) for s in sentinels] == [("127.0.0.1", 1), ("127.0.0.1", 2)]
        for options in sentinels:  # bounded like the primary, with the same credentials
            assert (options["username"], options["password"]) == ("u", SECRET)
            assert (options["socket_timeout"], options["socket_connect_timeout"]) == (0.5, 0.5)
            assert options["retry"]._retries == 0
    finally:
        client.close()


@pytest.mark.parametrize(("query", "sentinel_auth"), [
    ("sentinel_password=other", ("u", "other")),
    ("sentinel_username=watcher&sentinel_password=other", ("watcher", "other")),
    ("sentinel_password=", (None, None)),  # sentinels without a password: no AUTH at all
])
def test_the_sentinels_may_have_their_own_credentials(
    query: str, sentinel_auth: tuple[str | None, str | None]
) -> None:
    url = f"redis+sentinel://u:{SECRET}@127.0.0.1:1/svc?{query}&socket_keepalive=true"
    client = connect(url)
    try:
        _, primary, sentinels = sentinel_view(client)
        assert (primary["username"], primary["password"]) == ("u", SECRET)
        assert primary["socket_keepalive"] is True  # redis-py's own reading of the query
        assert "sentinel_password" not in primary and "sentinel_username" not in primary
        assert (sentinels[0]["username"], sentinels[0]["password"]) == sentinel_auth
    finally:
        client.close()
    if "other" in query:
        assert "other" not in mask_url(url) and "sentinel_password=***" in mask_url(url)
        assert "other" in url_secrets(url) and "other" not in RedisHealth(url).where


def test_rediss_passes_redis_pys_certificate_parameters_as_it_reads_them() -> None:
    url = (f"rediss://:{SECRET}@127.0.0.1:6380/2?ssl_ca_certs=/etc/ca.pem&ssl_cert_reqs="
           "required&ssl_certfile=/etc/client.pem&ssl_keyfile=/etc/client.key")
    assert redis_url_problem(url) is None
    client = connect(url)
    try:
        pool = client.connection_pool
        assert pool.connection_class is redis.SSLConnection
        options = pool.connection_kwargs
        assert (options["ssl_ca_certs"], options["ssl_cert_reqs"]) == ("/etc/ca.pem", "required")
        assert (options["ssl_certfile"], options["ssl_keyfile"]) == (
            "/etc/client.pem", "/etc/client.key")
        assert (options["password"], options["db"], options["socket_timeout"]) == (
            SECRET, 2, 0.5)
    finally:
        client.close()
    assert mask_url(url).startswith("rediss://:***@127.0.0.1:6380/2?ssl_ca_certs=/etc/ca.pem")
    app = Flask(__name__)
    app.config["REACHLIMIT_REDIS_URL"] = url
    rl = ReachLimit(app)  # the extension takes it (no connection is opened at init_app)
    rl.close(app)


def test_a_timeout_in_a_cluster_urls_query_wins_as_it_does_for_one_server() -> None:
    """redis-py's from_url lets a query's socket_timeout win for one server; a cluster URL
    takes it the same way instead of failing at start-up (no connection is opened here)."""
    one = connect("redis://127.0.0.1:1/0?socket_timeout=2")
    assert one.connection_pool.connection_kwargs["socket_timeout"] == 2.0
    cluster = connect("redis+cluster://127.0.0.1:1,127.0.0.1:2?socket_timeout=2")
    assert type(cluster).__name__ == "ClusterClient"
    one.close()
