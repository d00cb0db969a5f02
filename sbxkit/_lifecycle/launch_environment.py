"""The environment an auto-launched supervisor starts with: a short, documented list.

Pure. The supervisor outlives the caller that launched it and serves every later caller, so it
must not carry that caller's environment (an API key in it stayed readable in
``/proc/<supervisor>/environ`` for the supervisor's whole life). It receives only what it needs:

- ``PATH``: to find ``SBXKIT_SUPERVISOR``'s executable when it is not an absolute path;
- ``PYTHONPATH``: for a ``SBXKIT_SUPERVISOR`` command's own imports (the default command runs
  isolated and is told on its command line where the caller's sbxkit is: the handshake
  compares a fingerprint of the supervision sources);
- ``SBXKIT_ENV``: the environment kind its re-check judges ``network = "bridge"`` by;
- ``SBXKIT_HOST_SLOWNESS``: how much its removal attempts are stretched on a slow host
  (sbxkit/_model/bounds.py);
- ``LANG``, ``LC_ALL``, ``LC_CTYPE``: the locale its log messages and paths are decoded in.

Everything else it needs travels on its command line: ``--state-dir`` and ``--engine-socket``
(the daemon socket its caller uses). ``HOME``, ``DOCKER_HOST``, credentials, tokens: never.
"""

from __future__ import annotations

from collections.abc import Mapping

SUPERVISOR_ENVIRONMENT = (
    "PATH",
    "PYTHONPATH",
    "SBXKIT_ENV",
    "SBXKIT_HOST_SLOWNESS",
    "LANG",
    "LC_ALL",
    "LC_CTYPE",
)


def supervisor_environment(caller: Mapping[bytes, bytes]) -> dict[bytes, bytes]:
    """The launched supervisor's whole environment, taken from the caller's (as bytes, so a
    value that is not UTF-8 passes unchanged rather than failing the launch)."""
    names = {name.encode() for name in SUPERVISOR_ENVIRONMENT}
    return {key: value for key, value in caller.items() if key in names}


__all__ = ["SUPERVISOR_ENVIRONMENT", "supervisor_environment"]
