"""Model definitions shipped with elastic-step; :func:`path_of` gives a file's path."""

import os


def path_of(name: str) -> str:
    return os.path.join(os.path.dirname(__file__), f"{name}.py")
