"""Many workers: local worker processes (``run --workers N``) and Slurm array jobs. They share
nothing but the output directory."""
