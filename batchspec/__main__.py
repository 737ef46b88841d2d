"""``python -m batchspec`` runs the CLI (vLLM's spawned workers need the main-module guard)."""

from batchspec.cli import main

if __name__ == "__main__":
    main()
