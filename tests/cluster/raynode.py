"""One Ray node on 127.0.0.1, as ``ray start --block`` runs it: ``python -m tests.cluster.raynode``.

``ray start`` maps 127.0.0.1 to the host's outward address (meant for real clusters, where
other hosts must reach the node) and then binds Ray's servers to every interface. The tests
keep Ray on loopback: this launcher starts the same ``ray._private.node.Node`` ``ray start``
starts (and ``ray.cluster_utils.Cluster``, Ray's own multi-node-on-one-host harness, starts),
with the node address 127.0.0.1 — so its gRPC servers bind 127.0.0.1 only — and the head
without the autoscaler monitor. The environment (tests/cluster/cluster.py) turns off
everything of Ray that phones out.

It writes the node's id and its processes' pids to ``--info`` once the node is up, reaps its
children (a killed raylet must not linger as a zombie its workers take for alive), and on
SIGTERM kills the node's processes and exits.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--head", action="store_true")
    parser.add_argument("--address", help="the head's GCS address (worker nodes)")
    parser.add_argument("--port", type=int, default=6379, help="the GCS port (head)")
    parser.add_argument("--name", required=True)
    parser.add_argument("--temp-dir", required=True)
    parser.add_argument("--resources", default="{}")
    parser.add_argument("--num-cpus", type=int, default=0)
    parser.add_argument("--info", required=True)
    args = parser.parse_args()

    import ray._private.node
    import ray._private.parameter

    params: dict[str, object] = {
        "node_ip_address": "127.0.0.1",
        "node_name": args.name,
        "num_cpus": args.num_cpus,
        "num_gpus": 0,
        "resources": json.loads(args.resources),
        "object_store_memory": 80 * 1024 * 1024,
        "temp_dir": args.temp_dir,
        "include_log_monitor": False,
        "dashboard_agent_listen_port": None,
    }
    if args.head:
        params.update(gcs_server_port=args.port, include_dashboard=False, no_monitor=True)
    else:
        params.update(gcs_address=args.address)
    node = ray._private.node.Node(
        ray._private.parameter.RayParams(**params),
        head=args.head,
        shutdown_at_exit=False,
        spawn_reaper=False,
    )

    def stop(*_: object) -> None:
        node.kill_all_processes(check_alive=False, allow_graceful=False)
        sys.exit(0)

    signal.signal(signal.SIGTERM, stop)
    pids = {
        kind: [info.process.pid for info in infos] for kind, infos in node.all_processes.items()
    }
    info = {"node_id": node.node_id, "gcs": node.gcs_address, "pids": pids, "pid": os.getpid()}
    with open(args.info + ".tmp", "w") as handle:
        json.dump(info, handle)
    os.rename(args.info + ".tmp", args.info)
    while True:
        time.sleep(0.2)
        node.dead_processes()  # polls, i.e. reaps


if __name__ == "__main__":
    main()
