"""``sbxkit mcp``: hardened sandboxes as tools for any agent that speaks the Model Context
Protocol (docs/mcp.md).

Pure cores, a trio shell, and the SDK only at the edge:

- ``options``: the profile's ``[mcp]`` table and the ``--http`` address (pure; the profile
  imports it, so it imports nothing of the SDK);
- ``arguments``, ``policy``, ``quotas``, ``shapes``, ``schemas``: tool arguments decoded and
  checked, the operator's ceilings applied, quotas counted, results and JSON schemas built
  (pure);
- ``hub``: the sandboxes a server holds for its clients — leases, lifetimes, idle removal
  (trio);
- ``server``, ``transports``: the official ``mcp`` SDK (the ``sbxkit[mcp]`` extra), over
  stdio on trio and streamable HTTP (loopback only) on asyncio through a portal.

Only ``server`` and ``transports`` import the SDK; ``sbxkit.cli`` imports them lazily.
"""
