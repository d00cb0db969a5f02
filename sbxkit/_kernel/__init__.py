"""Results on the kernel's evidence (docs/security.md, "The kernel's evidence"; docs/pool.md).

A sandbox on the kernel path has host FIFOs for its stdin, stdout and stderr, bind-mounted
read-only at ``/.sbxkit/io`` and opened by a few lines of shell before the payload runs
(``scripts``); its exit status comes from a pidfd of its init (``pidfd``). When the container's
PID 1 exits the kernel tears its PID namespace down: every writer of the FIFOs is gone and the
host reads EOF at once, and the pidfd reports the init's wait status — both long before
dockerd has finished its exit path and answered ``wait``.

- ``pidfd``: ``pidfd_open`` and ``PIDFD_GET_INFO`` (exit information, Linux ≥ 6.15);
- ``scripts``: the shell that wires the FIFOs, for a cold run and a parked container (pure);
- ``support``: which hosts get the kernel path, decided once (pure verdict over probed facts);
- ``fifos``: the host side of the FIFOs: make, open, sync, remove;
- ``init``: the container's init as a verified pidfd, and its exit;
- ``supervise``: a run on the kernel's evidence: stdin, capped output, the time limit, the exit.
"""
