"""Errors that the command line turns into one clear message and an exit code.
Tests: tests/e2e/test_bad_input.py (InputError: one line, exit 2) and
tests/e2e/test_hardening.py (a failed job: exit 1)."""


class ElasticStepError(Exception):
    """Base class of the errors elastic-step reports to its user."""

    exit_code = 1


class InputError(ElasticStepError):
    """Bad user input: a missing or malformed file, a wrong flag value, a bad model definition.

    The message names what is wrong (the file, row and column, or the flag and the rule it broke).
    """

    exit_code = 2


class ModelDefinitionError(InputError):
    """The user's model definition file is broken; the message names the file and the problem."""

    def __init__(self, path: str, problem: str) -> None:
        super().__init__(f"model definition {path}: {problem}")
        self.path = path
        self.problem = problem


class JobFailedError(ElasticStepError):
    """The training job failed, for example a task failed more often than its retry limit."""

    exit_code = 1
