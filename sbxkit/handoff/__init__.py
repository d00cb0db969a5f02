"""``sbxkit run`` handed to the supervisor: a command line that starts no interpreter's worth
of imports per job (issue 21, docs/operations.md "How sbxkit run reaches the supervisor").

The ``sbxkit`` command starts here with the standard library only. For ``sbxkit run`` it sends
the whole argv to the already-running supervisor of the state directory, which parses it with
the CLI's own parser, plans, claims from its pool or creates cold on the kernel path, starts the
sandbox, and hands the command line the sandbox's FIFO ends and its init's pidfd. The command
line writes stdin and reads output itself (output never passes through the supervisor), sees
the exit on the pidfd, and asks the supervisor for the verdict. Whatever the hand-off does not
serve runs on the full path (``sbxkit.cli``), which reproduces every error exactly.

This package is the command line's side; the supervisor's is ``sbxkit.supervisor.handoff``
(``serve``, ``owner``, ``resume``).

- ``scan``: what the command line reads of argv before the supervisor's parse (pure);
- ``client``: the command line's side: ``main`` (the console script), the hand-off, the run on
  the FIFOs, the output — standard library only, no trio, no ``sbxkit.cli``;
- ``fifos``: the run on the sandbox's FIFO ends and its init's pidfd;
- ``rejoin``: a handed-off run carried on in the next supervisor after a crash.

Nothing here is imported by this package's ``__init__``: the command line loads only what it
uses. The "waiting for capacity" notice it prints is ``sbxkit._util.notice``.
"""
