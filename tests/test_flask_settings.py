"""The extension's settings (``reachlimit._flask_settings``): the warning about a
``REACHLIMIT_*`` environment variable that is no config key, as a config typo is warned
about, with the nearest key; and REACHLIMIT_ENABLED read like every other flag.
"""

from __future__ import annotations

import logging
import os

import pytest
from flask import Flask

from reachlimit.flask import CONFIG_KEYS, ReachLimit

pytestmark = pytest.mark.timeout(30)


@pytest.fixture
def clean_environ(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """No REACHLIMIT_* variable of the test run's own environment."""
    for name in list(os.environ):
        if name.startswith("REACHLIMIT_"):
            monkeypatch.delenv(name)
    return monkeypatch


def warnings_of(caplog: pytest.LogCaptureFixture, text: str) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.levelno == logging.WARNING and text in r.getMessage()]


def test_an_environment_typo_is_warned_about_at_init_app_with_the_nearest_key(
    clean_environ: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    env = clean_environ
    env.setenv("REACHLIMIT_ACTIV", "3")  # a typo
    env.setenv("REACHLIMIT_REDIS_FALLBAK", "refuse")  # another
    env.setenv("REACHLIMIT_QQQQQQQQQQ", "1")  # near nothing
    env.setenv("REACHLIMIT_QUEUE", "4")  # a config key: never warned about
    env.setenv("REACHLIMIT_ENABLED", "false")  # the new key is a config key too
    env.setenv("REACHLIMIT_BOOT_ID", "x")  # NOT_CONFIG_KEYS: never warned about
    env.setenv("OTHER_ACTIV", "1")
    rl = ReachLimit()  # reads nothing yet: the environment is read by init_app
    with caplog.at_level(logging.WARNING, logger="reachlimit"):
        rl.init_app(Flask("env"))
    assert warnings_of(caplog, "environment variable") == [
        "unknown environment variable REACHLIMIT_ACTIV: it is no reachlimit config key; "
        "did you mean REACHLIMIT_ACTIVE?",
        "unknown environment variable REACHLIMIT_QQQQQQQQQQ: it is no reachlimit config key",
        "unknown environment variable REACHLIMIT_REDIS_FALLBAK: it is no reachlimit config "
        "key; did you mean REACHLIMIT_REDIS_FALLBACK?",
    ]


def test_a_typo_in_both_the_config_and_the_environment_is_warned_about_once(
    clean_environ: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    clean_environ.setenv("REACHLIMIT_WAITT", "2")
    app = Flask("copied")
    app.config["REACHLIMIT_WAITT"] = "2"  # an app that copies its environment in
    with caplog.at_level(logging.WARNING, logger="reachlimit"):
        ReachLimit(app)
    warned = warnings_of(caplog, "REACHLIMIT_WAITT")
    assert warned == [
        "unknown config key REACHLIMIT_WAITT: reachlimit does not read it; did you mean "
        "REACHLIMIT_WAIT?"
    ]


def test_a_clean_environment_warns_of_nothing(
    clean_environ: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    for key in CONFIG_KEYS:
        clean_environ.setenv(key, "")
    with caplog.at_level(logging.WARNING, logger="reachlimit"):
        ReachLimit(Flask("clean"))
    assert warnings_of(caplog, "unknown") == []


@pytest.mark.parametrize(
    ("value", "enabled"),
    [(True, True), (False, False), ("true", True), (" No ", False), ("0", False), ("on", True)],
)
def test_enabled_reads_like_every_flag(value: object, enabled: bool) -> None:
    app = Flask("flag")
    app.config["REACHLIMIT_ENABLED"] = value
    ReachLimit(app)
    assert app.extensions["reachlimit"].settings.enabled is enabled
    assert app.extensions["reachlimit"].enabled is enabled
    assert "REACHLIMIT_ENABLED" in CONFIG_KEYS


# -- each option's check: the whole message of a refused value -------------------------------

SCHEMES = ("redis://, rediss:// or unix:// (one server), redis+sentinel:// (Sentinel), "
           "redis+cluster:// (Cluster)")
PREFIX = "REACHLIMIT_REDIS_PREFIX must be a non-empty string without braces, got "
MESSAGE = "REACHLIMIT_REFUSAL_MESSAGE "

REFUSED = [
    ("REACHLIMIT_WAIT", True, "REACHLIMIT_WAIT must be a number of seconds > 0, got True"),
    ("REACHLIMIT_LEASE", False, "REACHLIMIT_LEASE must be a number of seconds > 0, got False"),
    ("REACHLIMIT_LEASE", "0", "REACHLIMIT_LEASE must be a number of seconds > 0, got '0'"),
    ("REACHLIMIT_LEASE", "soon", "REACHLIMIT_LEASE must be a number of seconds > 0, got 'soon'"),
    ("REACHLIMIT_REDIS_FALLBACK", "queue",
     "REACHLIMIT_REDIS_FALLBACK must be 'local' or 'refuse', got 'queue'"),
    ("REACHLIMIT_REDIS_URL", "http://h:6379",
     f"REACHLIMIT_REDIS_URL must be a {SCHEMES} URL (or empty for in-process limits), "
     "got 'http://h:6379'"),
    # The URL's password masked; a value that is no URL at all is not shown.
    ("REACHLIMIT_REDIS_URL", "http://u:secret@h:6379",
     f"REACHLIMIT_REDIS_URL must be a {SCHEMES} URL (or empty for in-process limits), "
     "got 'http://u:***@h:6379'"),
    ("REACHLIMIT_REDIS_URL", 6379,
     f"REACHLIMIT_REDIS_URL must be a {SCHEMES} URL (or empty for in-process limits), "
     "got '<unparseable url>'"),
    ("REACHLIMIT_REDIS_PREFIX", 7, PREFIX + "7"),
    ("REACHLIMIT_REDIS_PREFIX", "", PREFIX + "''"),
    ("REACHLIMIT_REDIS_PREFIX", "  ", PREFIX + "'  '"),
    ("REACHLIMIT_REDIS_PREFIX", "a{b", PREFIX + "'a{b'"),
    ("REACHLIMIT_REDIS_PREFIX", "a}b", PREFIX + "'a}b'"),
    ("REACHLIMIT_REFUSAL_MESSAGE", 7, MESSAGE + "must be a text, got 7"),
    ("REACHLIMIT_REFUSAL_MESSAGE", "Busy {who}",
     MESSAGE + "may use only the fields {budget} and {retry_after} (write {{ and }} for "
     "braces), got 'Busy {who}': KeyError: 'who'"),
    ("REACHLIMIT_REFUSAL_MESSAGE", "{budget:d}",
     MESSAGE + "may use only the fields {budget} and {retry_after} (write {{ and }} for "
     "braces), got '{budget:d}': ValueError: Unknown format code 'd' for object of type 'str'"),
]


@pytest.mark.parametrize(
    ("key", "value", "message"), REFUSED, ids=[f"{k[11:]}={v!r}" for k, v, _ in REFUSED]
)
def test_a_refused_value_is_a_value_error_naming_the_key_the_rule_and_the_value(
    key: str, value: object, message: str
) -> None:
    app = Flask("refused")
    app.config[key] = value
    with pytest.raises(ValueError) as info:
        ReachLimit(app)
    assert str(info.value) == message


def test_a_refusal_message_may_give_its_fields_a_format_of_their_type() -> None:
    text = "{budget:s} is busy; retry in {retry_after:d} s ({retry_after:02d})."
    app = Flask("formats")
    app.config["REACHLIMIT_REFUSAL_MESSAGE"] = text
    ReachLimit(app)
    assert app.extensions["reachlimit"].settings.refusal_message == text


def test_a_stale_window_of_more_than_a_day_is_warned_about_but_a_day_is_not(
    caplog: pytest.LogCaptureFixture,
) -> None:
    for stale, warned in ((86_400, False), (86_400.5, True)):
        app = Flask("stale")
        app.config["REACHLIMIT_STALE"] = stale
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="reachlimit"):
            ReachLimit(app)
        assert app.extensions["reachlimit"].settings.stale == stale
        lines = warnings_of(caplog, "more than a day")
        assert len(lines) == (1 if warned else 0), lines
        if warned:
            assert lines[0].startswith("REACHLIMIT_STALE is 86400.5 s, more than a day")


# -- the threads a gunicorn worker needs ------------------------------------------------------


@pytest.mark.parametrize(
    ("threads", "budgets", "needed"),
    [(13, [(2, 8)], 14), (10, [(2, 8), (1, 0)], 15), (1, [(1, 0)], 5)],
)
def test_too_few_threads_are_warned_about_with_the_figures(
    caplog: pytest.LogCaptureFixture, threads: int, budgets: list[tuple[int, int]], needed: int
) -> None:
    from reachlimit._flask_settings import warn_threads

    with caplog.at_level(logging.WARNING, logger="reachlimit"):
        warn_threads(threads, budgets)
        warn_threads(needed, budgets)  # enough: nothing to say
        warn_threads(None, budgets)  # not gunicorn: nothing to say
    [line] = warnings_of(caplog, "thread")
    assert line.startswith(
        f"gunicorn runs {threads} thread(s) per worker, fewer than active + queue + 4 = "
        f"{needed} (over the app's {len(budgets)} budget(s)): "
    )
    assert line.endswith(f"; start gunicorn with --threads {needed} or more")


def test_retry_after_takes_a_whole_number_from_one_or_auto() -> None:
    from reachlimit._flask_settings import RETRY_AFTER_AUTO, read_settings

    def retry_after(raw: object) -> object:
        return read_settings({"REACHLIMIT_RETRY_AFTER": raw}, {}).retry_after

    assert retry_after(1) == 1 and retry_after(" 3 ") == 3 and retry_after("+2") == 2
    assert retry_after(" AUTO ") == RETRY_AFTER_AUTO
    for bad in (0, "0", True, 1.5, "\u20032", "２"):  # an em space, a full-width digit
        with pytest.raises(ValueError, match="REACHLIMIT_RETRY_AFTER must be a whole number "
                                             ">= 1 or 'auto'"):
            retry_after(bad)
