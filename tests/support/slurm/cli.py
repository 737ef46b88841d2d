"""``python -m tests.support.slurm start|status|stop --dir DIR`` (from the repository root):
a one-node cluster left running for trying ``batchspec slurm`` by hand."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from .cluster import Cluster
from .install import ensure_installed

COMMAND = f"python -m {__package__}"
"""How this command line is started (``tests.support.slurm`` from the repository root)."""


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog=COMMAND, description="A real one-node Slurm cluster on this machine (needs root)."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    for name, text in (
        ("start", "start a cluster and leave it running"),
        ("stop", "stop the cluster in DIR"),
        ("status", "show the daemons of the cluster in DIR"),
    ):
        p = sub.add_parser(name, help=text)
        p.add_argument("--dir", default="/tmp/batchspec-slurm", help="cluster directory")
    start = sub.choices["start"]
    start.add_argument("--no-install", action="store_true", help="do not apt-get install")
    start.add_argument("--timeout", type=float, default=60.0, help="startup timeout (s)")
    return parser.parse_args(argv)


def start(cluster: Cluster, install: bool) -> int:
    try:
        if install:
            ensure_installed()
        cluster.start()
    except (RuntimeError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    pids = ", ".join(f"{k} {v}" for k, v in cluster.status().items())
    print(f"# one-node Slurm cluster up in {cluster.startup_seconds:.1f}s ({pids})")
    print(f"# stop it with: {COMMAND} stop --dir {cluster.dir}")
    print(f"export SLURM_CONF={cluster.conf_path}")
    return 0


def status(cluster: Cluster) -> int:
    daemons = cluster.status()
    for name, pid in daemons.items():
        print(f"{name}: {'running, pid ' + str(pid) if pid else 'not running'}")
    if not daemons:
        print(f"no cluster in {cluster.dir}")
    return 0 if daemons and all(daemons.values()) else 1


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    cluster = Cluster(args.dir, startup_timeout=getattr(args, "timeout", 60.0), keep_dir=True)
    if args.command == "start":
        return start(cluster, install=not args.no_install)
    if args.command == "stop":
        cluster.stop()
        print(f"stopped the cluster in {cluster.dir}")
        return 0
    return status(cluster)
