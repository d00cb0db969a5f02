"""Execution backends behind one runner interface (``Backend``).

- ``sbxkit.backends.docker.DockerBackend``: hardened Docker containers
  (``sbxkit._consumers.runner.run``).
- ``sbxkit.backends.sbx.SbxBackend``: Docker Sandboxes microVMs through the ``sbx`` CLI.
- ``sbxkit.backends.sbx_commands``: the pure ``sbx`` argv builders and the ``sbx ls`` parser.

Only the interface is imported here; the backends are imported from their modules, so a
profile can use the pure ``sbx_commands`` checks without loading either runner.
"""

from sbxkit.backends.base import Backend, open_backend

__all__ = ["Backend", "open_backend"]
