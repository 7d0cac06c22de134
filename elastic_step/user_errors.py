"""One plain line for an error raised while running a user's model definition.

The line says where the error was raised: on a line of the user's file, or inside a library
(Keras, TensorFlow) called from a line of the user's file. Multi-line messages and terminal
colour codes become one plain line; the exception keeps its full traceback for the log (-v).
Tests: tests/unit/test_model_definition.py (errors that name the user's line).
"""

from __future__ import annotations

import re
import sysconfig
import traceback
from pathlib import Path

#: Longer messages (TensorFlow's can run to pages) are cut; -v logs them whole.
MAX_MESSAGE_CHARS = 300

_ANSI_CODE = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
#: How TensorFlow's AutoGraph begins the message of an error raised in a traced function.
_AUTOGRAPH_HEAD = "in user code:"
_LIBRARY_NAMES = {"keras": "Keras", "tensorflow": "TensorFlow", "numpy": "NumPy"}
_PACKAGE_DIRS = ("site-packages", "dist-packages")
_OWN_DIR = Path(__file__).resolve().parent
_STDLIB_DIR = Path(sysconfig.get_paths()["stdlib"]).resolve()


def plain_message(error: BaseException) -> str:
    """The error's message on one line, without colour codes, cut to MAX_MESSAGE_CHARS.
    Of TensorFlow's ``in user code:`` messages only the cause, their last line: the frames
    before it are in the traceback (-v)."""
    text = _ANSI_CODE.sub("", str(error))
    if text.lstrip().startswith(_AUTOGRAPH_HEAD):
        text = [line for line in text.splitlines() if line.strip()][-1].strip()
        text = text.removeprefix(f"{type(error).__name__}: ")
    text = " ".join(text.split())
    if len(text) > MAX_MESSAGE_CHARS:
        text = text[: MAX_MESSAGE_CHARS - 1].rstrip() + "… (-v logs it whole)"
    return text


def describe_error(error: BaseException, path: str) -> str:
    """``ValueError at line 7: ...`` when ``error`` was raised in the file ``path``;
    ``ValueError inside Keras (called from line 7): ...`` when a library raised it."""
    frames = traceback.extract_tb(error.__traceback__)
    message = plain_message(error)
    kind = type(error).__name__
    user_lines = [frame.lineno for frame in frames if frame.filename == path]
    # A function that TensorFlow traced (a feed's map) names the user's line in its message.
    user_lines += [int(n) for n in re.findall(rf'File "{re.escape(path)}", line (\d+)', str(error))]
    raised_in = frames[-1].filename if frames else None
    if raised_in == path:
        where = f" at line {user_lines[-1]}"
    else:
        library = _library_of(raised_in) if raised_in else None
        called_from = f"called from line {user_lines[-1]}" if user_lines else ""
        if library and called_from:
            where = f" inside {library} ({called_from})"
        elif library:
            where = f" inside {library}"
        else:
            where = f" ({called_from})" if called_from else ""
    return f"{kind}{where}: {message}" if message else f"{kind}{where}"


def _library_of(filename: str) -> str | None:
    """The library that holds ``filename`` (``Keras``), or None for elastic-step itself, whose
    errors about a definition say what is wrong without a place."""
    if filename.startswith("<"):  # <frozen importlib._bootstrap>
        return "Python"
    path = Path(filename).resolve()
    if path.is_relative_to(_OWN_DIR):
        return None
    for marker in _PACKAGE_DIRS:
        if marker in path.parts:
            parts = path.parts[path.parts.index(marker) + 1 :]
            top = parts[0].split(".")[0] if parts else marker
            return _LIBRARY_NAMES.get(top, top)
    if path.is_relative_to(_STDLIB_DIR):
        return "the Python standard library"
    return path.name
