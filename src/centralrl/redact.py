"""Credentials never leave the process in clear: the one place that hides the secret part of a URL.

`redact(text)` replaces the password of every `scheme://user:password@host` inside `text` with `***` (and a
user-only `scheme://token@host`, where the user is the secret, with `***`), so a URL can be logged to MLflow,
written to an output, printed or put in an error message. Everything that leaves the process through this
project's code and may hold a URL goes through it: MLflow params, tags and texts (`centralrl.tracking`),
the plan and its preflight (`centralrl.plan`), the services' banner and errors (`centralrl.services`), the
Elasticsearch backend's errors and the index manifest, and config error messages (`centralrl.config`).
`split_credentials(url)` separates the credentials from a URL for code that must send them (as an
Authorization header) without ever putting them in a message.
"""

from __future__ import annotations

import re
from urllib.parse import unquote, urlsplit, urlunsplit

MASK = "***"
# scheme://[user[:password]]@ -- userinfo may not hold "/", "@" or whitespace (RFC 3986 percent-encodes them)
_USERINFO = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.\-]*://)(?P<user>[^:@/\s'\"]*)(?::[^@/\s'\"]*)?@")


def _mask(match: re.Match) -> str:
    has_password = ":" in match.group(0)[len(match.group("scheme")) :]
    user = match.group("user")
    return f"{match.group('scheme')}{user}:{MASK}@" if has_password and user else f"{match.group('scheme')}{MASK}@"


def redact(text: str) -> str:
    """`text` with the credentials of every URL in it masked.

    >>> redact("no answer at http://elastic:s3cret@es.example:9200/x (refused)")
    'no answer at http://elastic:***@es.example:9200/x (refused)'
    >>> redact("postgresql+psycopg2://mlflow:pw@db:5432/mlflow and https://ghp_token@github.com/o/r")
    'postgresql+psycopg2://mlflow:***@db:5432/mlflow and https://***@github.com/o/r'
    >>> redact("sqlite:///mlflow.db, mail me@example.com")
    'sqlite:///mlflow.db, mail me@example.com'
    """
    return _USERINFO.sub(_mask, text)


def has_credentials(url: str) -> bool:
    """True when `url` carries a user or password before its host.

    >>> has_credentials("http://u:p@127.0.0.1:9"), has_credentials("http://127.0.0.1:9")
    (True, False)
    """
    return redact(url) != url


def split_credentials(url: str) -> tuple[str, tuple[str, str] | None]:
    """The URL without its userinfo, and (user, password) when it had any.

    >>> split_credentials("http://u:p%40ss@127.0.0.1:5000/api")
    ('http://127.0.0.1:5000/api', ('u', 'p@ss'))
    >>> split_credentials("http://127.0.0.1:5000")
    ('http://127.0.0.1:5000', None)
    """
    parts = urlsplit(url)
    if parts.username is None and parts.password is None:
        return url, None
    host = parts.netloc.rpartition("@")[2]
    plain = urlunsplit(parts._replace(netloc=host))
    return plain, (unquote(parts.username or ""), unquote(parts.password or ""))
