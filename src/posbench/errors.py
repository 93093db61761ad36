"""One error path for every command: any exception becomes one ``posbench: error:`` line and exit code 2.

A user-facing problem (bad input, missing data, unusable checkpoint) is a ``PosbenchError`` whose text
says what went wrong and what to do; OS errors name their path; anything else is named by its type.
``debug=true`` shows the traceback instead.
"""

from __future__ import annotations

import contextlib
import errno
import os
import sys
from typing import Callable, Iterable


class PosbenchError(Exception):
    """A user-facing problem: bad input, missing data, unusable checkpoint."""


class ProblemsFound(PosbenchError, ValueError):
    """Every problem the rules of a config found, as one line: the problem alone, or
    ``3 problems: (1) ...; (2) ...; (3) ...`` (numbered: a problem's own text may hold a semicolon).

    A ValueError too: a constructor given a bad config raises it, as a bad argument of Python's own does."""

    def __init__(self, problems: Iterable[str]):
        self.problems = list(problems)
        numbered = "; ".join(f"({i}) {p}" for i, p in enumerate(self.problems, 1))
        super().__init__(self.problems[0] if len(self.problems) == 1 else f"{len(self.problems)} problems: {numbered}")


def raise_problems(problems: Iterable[str]) -> None:
    """Raise ProblemsFound when a rule found any problem."""
    problems = list(problems)
    if problems:
        raise ProblemsFound(problems)


class Problems:
    """A command's problems, gathered from every rule before one ProblemsFound reports them all.

    A rule either returns its problems (``add``) or raises a PosbenchError for its first one (``run``:
    the checks of the device, the data and the like, which other code calls to stop at once)."""

    def __init__(self):
        self.found: list[str] = []

    def add(self, problems: Iterable[str]) -> None:
        self.found.extend(problems)

    def run(self, rule: Callable, *args) -> bool:
        """``rule(*args)``, its problems kept and the next rule run all the same; True when it found none."""
        try:
            rule(*args)
        except ProblemsFound as e:
            self.found.extend(e.problems)
        except PosbenchError as e:
            self.found.append(str(e))
        else:
            return True
        return False

    def raise_any(self) -> None:
        raise_problems(self.found)


class Interrupted(PosbenchError):
    """Stopped by a signal (SIGINT, SIGTERM) with the state saved: a sweep stops too, not only its job."""


class Refused(PosbenchError):
    """A command turned a folder down before working in it (busy, or holding another run): it changed nothing
    there, error.txt included."""


class RunFolderBusy(Refused):
    """Another process writes to the run folder: its error.txt is that process's, not to be touched."""


class ReaderlessStream:
    """sys.stdout or sys.stderr for a job whose reader may go first (``posbench train … | head``): once the
    pipe is closed, writing goes to /dev/null instead of raising, so the job runs to its end and its log file
    keeps every line, rather than printing a traceback for each log line (logging's handleError)."""

    def __init__(self, stream):
        self.stream = stream

    def write(self, text: str) -> int:
        return self._despite_no_reader(self.stream.write, text)

    def flush(self) -> None:
        self._despite_no_reader(self.stream.flush)

    def __getattr__(self, name: str):
        return getattr(self.stream, name)

    def _despite_no_reader(self, call, *args):
        try:
            return call(*args)
        except BrokenPipeError:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, self.stream.fileno())  # what is still buffered, and all that follows, goes there
            os.close(devnull)
            return call(*args)


def outlive_closed_pipes() -> None:
    """Install ReaderlessStream on stdout and stderr (once: main may be called again in one process)."""
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if stream is not None and not isinstance(stream, ReaderlessStream):
            setattr(sys, name, ReaderlessStream(stream))


def fail(message: str) -> int:
    print(f"posbench: error: {message}", file=sys.stderr)
    return 2


#: What to do about an OS error, by errno.
OS_ERROR_HINTS = {
    errno.ENOSPC: "free some disk space, then run the same command (train goes on from its last.pt if it saved one)",
    errno.EDQUOT: "free some space in your quota, then run the same command again",
    errno.EROFS: "the file system is read-only; write elsewhere (hydra.run.dir=DIR or hydra.sweep.dir=DIR)",
    errno.EACCES: "check its permissions, or write elsewhere (hydra.run.dir=DIR or hydra.sweep.dir=DIR)",
    errno.EPERM: "check its permissions, or write elsewhere (hydra.run.dir=DIR or hydra.sweep.dir=DIR)",
    errno.EFBIG: "the file grew past the size this process may write (ulimit -f) or the file system allows",
}


def root_os_error(e: BaseException | None) -> OSError | None:
    """The OS error behind ``e``, if any (logging, for one, wraps a folder it cannot write in a ValueError)."""
    seen = set()
    while e is not None and id(e) not in seen:
        if isinstance(e, OSError) and e.strerror:
            return e
        seen.add(id(e))
        e = e.__cause__ or e.__context__
    return None


def describe(e: BaseException) -> str:
    """Any exception as one line: what went wrong and, where we know it, what to do."""
    if isinstance(e, PosbenchError):
        return str(e)
    if isinstance(e, KeyboardInterrupt):
        return "interrupted (Ctrl-C)"
    os_error = root_os_error(e)
    if os_error is not None:
        e = os_error
        where = " -> ".join(str(f) for f in (e.filename, e.filename2) if f is not None) or "a file"
        hint = OS_ERROR_HINTS.get(e.errno, "check the path and run the same command again")
        return f"{where}: {e.strerror}; {hint}"
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else 'no message'} (unexpected; debug=true shows the traceback)"


@contextlib.contextmanager
def one_line_errors(debug: bool):
    """Turn any exception or Ctrl-C into one line on stderr and exit code 2 (the traceback with debug=true)."""
    try:
        yield
    except (Exception, KeyboardInterrupt) as e:
        message = describe(e)
        if debug:
            raise
        raise SystemExit(fail(message)) from None
