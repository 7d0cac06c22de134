"""The file store's lease: an flock held for the owner's lifetime, and a fencing token file.

The OS releases an flock when its process dies, however it dies, so the next master takes
over at once. The lock's file descriptor is not inherited by the processes the master starts
(Python opens files close-on-exec), so a surviving worker cannot keep the lease alive.

The token file holds the last token given out. Each acquire increments it under the flock;
an owner that finds a token other than its own there (on a shared file system whose locks were
lost, a successor took over) is fenced.
Tests: tests/unit/test_state_store.py (the lease: a second process, a superseded token).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import time

from elastic_step.master.state_store.api import (
    StateStoreError,
    StateStoreFencedError,
    StateStoreLockedError,
)
from elastic_step.master.state_store.local_files import write_atomic

LOCK_FILE = "lock"
TOKEN_FILE = "token"
_POLL_FIRST_S = 0.01
_POLL_MAX_S = 0.2


class FileLease:
    def __init__(self, directory: str) -> None:
        self._dir = directory
        self._lock_path = os.path.join(directory, LOCK_FILE)
        self._token_path = os.path.join(directory, TOKEN_FILE)
        self._fd: int | None = None
        self.token = 0

    def acquire(self, owner: str, timeout_s: float) -> int:
        if not timeout_s >= 0:
            raise ValueError(f"timeout_s must be >= 0, got {timeout_s}")
        if self._fd is not None:
            raise StateStoreError(f"{self._dir}: the lease is already held by this store")
        try:
            fd = os.open(self._lock_path, os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as e:
            raise StateStoreError(f"cannot open the lease {self._lock_path}: {e}") from e
        try:
            self._lock(fd, timeout_s)
            token = self.read_token() + 1
            write_atomic(self._token_path, f"{token}\n".encode())
            # Who holds it, for the next contender's message; informational, so no fsync.
            holder = {"owner": owner, "pid": os.getpid(), "host": socket.gethostname()}
            os.ftruncate(fd, 0)
            os.pwrite(fd, json.dumps({**holder, "token": token}).encode(), 0)
        except OSError as e:
            os.close(fd)  # closing releases the flock
            raise StateStoreError(f"cannot take the lease in {self._dir}: {e}") from e
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd
        self.token = token
        return token

    def _lock(self, fd: int, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        pause = _POLL_FIRST_S
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return
            except BlockingIOError:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise StateStoreLockedError(
                        f"{self._dir} is held by {self.holder()}; waited {timeout_s:g} s for it"
                    ) from None
                time.sleep(min(pause, left))
                pause = min(pause * 2, _POLL_MAX_S)

    def holder(self) -> str:
        """The holder as the lock file names it, for messages."""
        try:
            with open(self._lock_path) as f:
                info = json.loads(f.read())
            return f"{info['owner']} (pid {info['pid']} on {info['host']}, token {info['token']})"
        except (OSError, ValueError, KeyError, TypeError):
            return "another owner"  # none yet, or it is being written

    def read_token(self) -> int:
        try:
            with open(self._token_path) as f:
                text = f.read()
        except FileNotFoundError:
            return 0
        except OSError as e:
            raise StateStoreError(f"cannot read the fencing token {self._token_path}: {e}") from e
        try:
            return int(text)
        except ValueError:
            raise StateStoreError(
                f"fencing token {self._token_path} holds {text[:40]!r}, not an integer"
            ) from None

    def check(self) -> None:
        """Raises StateStoreFencedError unless the token file still holds this owner's token."""
        current = self.read_token()
        if current != self.token:
            raise StateStoreFencedError(
                f"{self._dir}: this owner lost the lease: its token is {self.token}, the job's "
                f"is now {current}; it must stop writing"
            )

    def release(self) -> None:
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        with contextlib.suppress(OSError, StateStoreError):
            if self.read_token() == self.token:  # a successor's name stays
                os.ftruncate(fd, 0)
        os.close(fd)
