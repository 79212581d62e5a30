"""`towerps` as a user runs it, with one worker held before one push.

    python tests/ray/hold_harness.py RELEASE RANK STEP train --dataset fashion_mnist ...

Runs the CLI unchanged, except that worker RANK stops before its push of
STEP (towerps.testing's Hold, injected): it writes RELEASE.held, then waits until
the file RELEASE exists. So a test knows where the run is when it, say,
kills the driver. The hold is not part of the run's configuration: a
`--resume` of the run (the plain CLI) holds nowhere.
"""

import sys

from towerps.cluster.api import cli
from towerps.testing import Faults, Hold, injected


def main() -> int:
    release, rank, step, argv = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4:]
    with injected(Faults(holds=(Hold(rank, step, release),))):
        return cli.main(argv)


if __name__ == "__main__":
    sys.exit(main())
