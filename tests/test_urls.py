"""reachlimit._urls without a server: how a Redis URL is shown (``mask_url``), which of its
parts are secrets (``url_secrets``, ``scrub``), and the shape checks every taker of a URL
makes (``redis_url_problem``, ``cluster_problem``, ``sentinel_parts``).

The edges here are the ones a real URL has and a simple reading gets wrong: a password with
an unencoded ``@``, ``:``, ``,`` or ``?``, a user without a password, a port after the
user-info, blank query values, one secret inside another. Masking may hide too much, never
too little; everything that is no secret is shown as written.
"""

from __future__ import annotations

import pytest

from reachlimit._urls import (
    cluster_problem,
    mask_url,
    redis_url_problem,
    scrub,
    sentinel_parts,
    url_secrets,
)

pytestmark = pytest.mark.timeout(30)


# -- mask_url ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "masked"),
    [
        # a user without a password, then a port: nothing to hide, shown as written
        ("redis://user@host:6379/0", "redis://user@host:6379/0"),
        ("redis://user@host/0", "redis://user@host/0"),
        ("redis://user@host", "redis://user@host"),
        # an unencoded '@' or ':' in the password: all of it is hidden
        ("redis://u:p@ss@host/0", "redis://u:***@host/0"),
        ("redis://u:pa:ss@host/0", "redis://u:***@host/0"),
        # an unencoded / ? # in the password ends urlsplit's netloc early: masked all the same
        ("redis://:s3cr/et+pw==@redis.internal:6379/0", "redis://:***@redis.internal:6379/0"),
        ("redis://u:a?b#c@h/0", "redis://u:***@h/0"),
        # '://' again later in the URL (a value of the query): the password is still found
        ("redis://u:pw@host/0?client_name=a://b", "redis://u:***@host/0?client_name=a://b"),
        # only the secret query value is hidden; the others, blank ones included, stay
        ("redis://host/0?password=pw&db=1", "redis://host/0?password=***&db=1"),
        ("redis://host/0?password=pw&client_name=", "redis://host/0?password=***&client_name="),
        # no scheme before '://': its user-info is masked all the same
        ("://u:pw@host", "://u:***@host"),
        # no user-info, a port: nothing to hide, the port's ':' is no password
        ("redis://host:6379/0", "redis://host:6379/0"),
        ("redis://[::1]:6379/0", "redis://[::1]:6379/0"),
        ("rediss://host:6380/2", "rediss://host:6380/2"),
        # a password without a user, IPv6 hosts, a port after the user-info
        ("rediss://:pw@host:6380/1", "rediss://:***@host:6380/1"),
        ("redis://:pw@host:6379", "redis://:***@host:6379"),
        ("redis://user:pw@host:6379/0", "redis://user:***@host:6379/0"),
        ("redis://u:pw@[::1]:6379/0", "redis://u:***@[::1]:6379/0"),
        # percent-encoding in the password: hidden whole, as written
        ("redis://u:p%40ss@h/0", "redis://u:***@h/0"),
        ("redis://u:p%40ss@h", "redis://u:***@h"),
        # a Unix socket's URL: its password hidden, its path and query shown
        ("unix://:pw@/run/redis.sock?db=1", "unix://:***@/run/redis.sock?db=1"),
        # an '@' in the scheme's place is no user-info
        ("re@dis://host:6379/0", "re@dis://host:6379/0"),
        # several sentinels or nodes: one user-info, masked once, every host shown
        (
            "redis+sentinel://u:pw@a:26379,[::1]:26380/svc/2",
            "redis+sentinel://u:***@a:26379,[::1]:26380/svc/2",
        ),
        ("redis+cluster://:p@w@a:7000,b:7001", "redis+cluster://:***@a:7000,b:7001"),
        # every secret query argument, whatever the case of its name
        (
            "redis://h/0?PASSWORD=a&sentinel_password=b&ssl_password=c&ssl_keyfile=k",
            "redis://h/0?PASSWORD=***&sentinel_password=***&ssl_password=***&ssl_keyfile=k",
        ),
        (
            "rediss://h/0?ssl_keyfile=k.pem&ssl_password=pp",
            "rediss://h/0?ssl_keyfile=k.pem&ssl_password=***",
        ),
    ],
)
def test_mask_url_hides_the_password_and_keeps_the_rest(url: str, masked: str) -> None:
    assert mask_url(url) == masked


@pytest.mark.parametrize("value", [None, 6379, b"redis://u:pw@h", "http://[::1"])
def test_mask_url_shows_a_placeholder_for_what_is_no_url(value: object) -> None:
    """The documented placeholder, never the value echoed back (it may be a secret)."""
    assert mask_url(value) == "<unparseable url>"


# -- url_secrets and scrub ---------------------------------------------------------------------


def test_a_percent_encoded_password_is_a_secret_as_written_and_decoded() -> None:
    assert url_secrets("redis://u:p%40ss@h/0") == ["p%40ss", "p@ss"]
    assert url_secrets("redis://u:plain@h/0") == ["plain"]


def test_a_password_with_an_unencoded_question_mark_is_one_secret() -> None:
    """The rest of the password is no query: masked first, the URL has none."""
    assert url_secrets("redis://u:a?password=zz@h/0") == ["a?password=zz"]


def test_the_query_of_a_masked_password_is_no_secret() -> None:
    """The password is read before the query, then masked in place: what follows it is
    read as the URL's query again."""
    assert url_secrets("redis://u:pw@h/0?sentinel_password=sp&db=1") == ["pw", "sp"]


def test_blank_secrets_are_none() -> None:
    assert url_secrets("redis://h/0?password=&db=1") == []
    assert url_secrets("redis://u@h/0?ssl_password=k&password=") == ["k"]


def test_scrub_replaces_the_longest_secret_first() -> None:
    """A secret inside another: the longer one goes whole, no piece of it is left."""
    assert scrub("error near ab, then b", ["b", "ab"]) == "error near ***, then ***"
    assert scrub("cannot reach u:abcd@h", ["ab", "abcd"]) == "cannot reach u:***@h"


# -- redis_url_problem: the database of a query ------------------------------------------------


@pytest.mark.parametrize("url", ["redis://h/0?db=", "unix:///tmp/r.sock?db="])
def test_a_blank_database_is_a_problem(url: str) -> None:
    assert redis_url_problem(url) == "the database (db=) must be a whole number, got ''"


# -- Redis Cluster URLs ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "url",
    [
        "redis+cluster://a:7000,b:7001",
        "redis+cluster://a:7000/",
        "redis+cluster://a:7000/0",
        "redis+cluster://a:7000/0?db=0",
        "redis+cluster://a",  # the default port
        "redis+cluster://u:p,w@a:7000,b:7001",  # a ',' in the password is no node
    ],
)
def test_the_cluster_forms_that_pass(url: str) -> None:
    assert cluster_problem(url) is None
    assert redis_url_problem(url) is None


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        ("redis+cluster://a:7000/1", "a cluster has one database: no path but /0"),
        ("redis+cluster://a:7000/0/0", "a cluster has one database: no path but /0"),
        ("redis+cluster://a:7000?db=1", "a cluster has one database: db= must be 0, got '1'"),
        ("redis+cluster://a:7000?db=", "a cluster has one database: db= must be 0, got ''"),
        ("redis+cluster://a:7000,b:x", "each node's port must be a whole number from 0 to 65535"),
        ("redis+cluster://a:7000,", "it must name at least one node, host:port[,host:port...]"),
    ],
)
def test_a_bad_cluster_url_names_what_is_wrong(url: str, problem: str) -> None:
    assert cluster_problem(url) == problem
    assert redis_url_problem(url) == problem


# -- Sentinel URLs -----------------------------------------------------------------------------


def test_a_sentinel_url_without_credentials_has_none() -> None:
    where = sentinel_parts("redis+sentinel://h:1/svc")
    assert (where.username, where.password) == (None, None)


@pytest.mark.parametrize(
    ("userinfo", "username", "password"),
    [("u:", "u", None), ("u", "u", None), (":pw", None, "pw"), ("u:p:w", "u", "p:w")],
)
def test_a_sentinel_urls_user_and_password(
    userinfo: str, username: str | None, password: str | None
) -> None:
    where = sentinel_parts(f"redis+sentinel://{userinfo}@h:1/svc")
    assert (where.username, where.password) == (username, password)


def test_a_sentinel_urls_bad_database_is_shown_whole() -> None:
    with pytest.raises(ValueError) as info:
        sentinel_parts("redis+sentinel://h:1/svc/0/1")
    assert str(info.value) == (
        "the database (after the service) must be a whole number, got '0/1'"
    )


def test_sentinel_parts_takes_only_a_sentinel_url() -> None:
    with pytest.raises(ValueError) as info:
        sentinel_parts("redis://h:1/0")
    assert str(info.value) == "a Sentinel URL starts with redis+sentinel://"
