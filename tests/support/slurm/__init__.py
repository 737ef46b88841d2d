"""A real one-node Slurm cluster on this machine, for tests and for trying Slurm mode by hand.

Why: batchspec's Slurm mode leans on behaviour that no double reproduces faithfully — array
tasks and their environment, ``--signal`` lead time before the time limit, ``scancel`` and
``--requeue`` semantics, output file patterns. This package runs the genuine daemons (Debian's
``slurm-wlm`` and ``munge``) so those paths can be exercised end to end, on a laptop or CI box,
without systemd and without touching the system's own Slurm configuration.

How: :class:`Cluster` owns one directory. In it, it writes ``slurm.conf`` (node = this host,
CPUs and memory read from the machine, free TCP ports, partition ``debug``), a fresh munge key,
and places every socket, pid file, log, spool and state directory. It starts ``munged``
(own key and socket), ``slurmctld`` and ``slurmd`` in the foreground as its own children, each
in a new session so a terminal's Ctrl-C does not reach them, and waits until ``sinfo`` reports
the node idle. :attr:`Cluster.env` is the environment to give Slurm clients (``sbatch``,
``squeue``, ``scancel``, ``sinfo``, ...): it carries ``SLURM_CONF``. :meth:`Cluster.stop`
cancels jobs, stops the daemons by pid (SIGTERM, then SIGKILL), then kills whatever the
daemons left behind (``slurmstepd`` and job processes, found by a marker variable in the
daemons' environment and by parentage), so nothing outlives it. It is idempotent, and a new
``start()`` in the same directory first stops whatever a crashed earlier run left there.

Modules: ``install`` (find or apt-get install the commands), ``config`` (the directory and
``slurm.conf``), ``procs`` (the process table: waiting, signalling, finding what the daemons
left), ``client`` (Slurm commands and job states), ``cluster`` (the daemons' lifecycle),
``cli`` (the command line), ``fixture`` (the tests' session-wide cluster).

Slurm behaviour seen with this harness (Slurm 22.05.8, Debian 12, as root):

- ``sacct`` has no data: accounting needs slurmdbd and a database, so it is off
  (``accounting_storage/none``). Finished jobs are recorded by ``jobcomp/filetxt`` in
  ``log/jobcomp.txt`` instead, which :meth:`Cluster.wait_for_jobs` reads.
- ``squeue`` (even ``squeue -j ID``) hides finished jobs; ``squeue -t all`` shows them until
  slurmctld's purge pass drops them, a few seconds (~7 s) after they end (``MinJobAge=2``).
- Time limits and ``--signal`` lead times are checked on slurmctld's 30-second tick: a job
  is killed up to ~30 s after its limit, and ``--signal=SIG@N`` arrives once at most N+30 s
  remain, i.e. 30 to 60 s early for N=30 (with ``--time=1`` that is right after the start).
- ``--signal=B:SIG@N`` signals only the batch shell (not ``srun`` steps, nor the shell's
  children); plain ``--signal=SIG@N`` signals only ``srun`` steps, never the batch shell or
  its other children. Either way slurmstepd writes "*** JOB n ON node CANCELLED AT ... ***"
  to the job's stderr although the job goes on. Bash runs a trap only once its foreground
  child exits: wait on a background child to react at once.
- A requeued job waits ``cred_expire`` seconds (10 here, 120 by default) before it may run.
- Submission to start takes about 2 s; :meth:`Cluster.start` takes about 1 s.

Command line (from the repository root; it needs root, and installs the packages if missing)::

    python -m tests.support.slurm start --dir /tmp/slurm   # prints export SLURM_CONF=...
    python -m tests.support.slurm status --dir /tmp/slurm
    python -m tests.support.slurm stop --dir /tmp/slurm
"""

from .base import ClusterError
from .cluster import Cluster
from .install import ensure_installed

__all__ = ["Cluster", "ClusterError", "ensure_installed"]
