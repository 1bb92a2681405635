"""The project's error types: each names what is wrong and where, so a user can fix it without a debugger.
`is_known` says which errors are reported in one line (these, the user's OS errors, an interrupt), not with a
traceback."""

import errno

# OSErrors that describe the user's files or machine rather than a bug: reported in one line, naming the path
USER_OS_ERRORS = {
    errno.ENOENT,
    errno.ENOTDIR,
    errno.EEXIST,
    errno.EISDIR,
    errno.EACCES,
    errno.EPERM,
    errno.ENOSPC,
    errno.EDQUOT,
    errno.EROFS,
    errno.EFBIG,
}


class CentralRLError(Exception):
    """Base class for every error this project raises on purpose."""


class ConfigError(CentralRLError):
    """A param is unknown, mistyped or breaks an invariant; the message names its dotted path."""


class DataError(CentralRLError):
    """An input file or row is malformed; the message names the file and line or the row id and field."""


class RetrievalError(CentralRLError):
    """A retriever cannot answer: missing index, unreachable server (the message names the URL)."""


class BackboneError(CentralRLError):
    """A backbone cannot be fetched, built or loaded; the message names the model id or directory."""


class ServiceUnavailable(RetrievalError):
    """A server (Elasticsearch, ...) did not answer after every retry; trying again later may succeed."""


class OutputError(CentralRLError):
    """An output cannot be written (disk full, quota, read-only file system); the message names its path."""


class TrackingError(CentralRLError):
    """The MLflow tracking store cannot be reached or refuses the run; the message names the URI (masked)."""


class RunError(CentralRLError):
    """A command the pipeline runs (dvc) failed; the message carries its exit code and last output lines."""


def is_known(error: BaseException | None) -> bool:
    """An error this project reports in one line: one of its own, an OSError about the user's files or machine,
    or an interrupt. Anything else is a bug and keeps its traceback."""
    return isinstance(error, (CentralRLError, KeyboardInterrupt)) or (
        isinstance(error, OSError) and error.errno in USER_OS_ERRORS
    )
