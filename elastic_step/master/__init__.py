"""The master: hands out tasks, runs and replaces workers and PS, and persists its state."""
