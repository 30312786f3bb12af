"""``python -m localllm`` runs the CLI."""

import sys

from localllm.cli import main

if __name__ == "__main__":
    sys.exit(main())
