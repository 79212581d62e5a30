"""`towerps` as a user runs it, with one worker held before one push.

    python tests/ray/hold_harness.py RELEASE RANK STEP train --dataset fashion_mnist ...

Runs the CLI unchanged, except that worker RANK stops before its push of
STEP (workers/faults.py's Hold): it writes RELEASE.held, then waits until
the file RELEASE exists. So a test knows where the run is when it, say,
kills the driver. The hold is not part of the run's configuration: a
`--resume` of the run (the plain CLI) holds nowhere.
"""

import dataclasses
import sys

from towerps.cluster.api import cli
from towerps.workers.faults import Faults, Hold


def main() -> int:
    release, rank, step, argv = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4:]
    of = Faults.of

    def held(config) -> Faults:
        faults = of(config)
        return dataclasses.replace(faults, holds=(*faults.holds, Hold(rank, step, release)))

    Faults.of = staticmethod(held)  # what Job hands its workers (cluster/run/job.py)
    return cli.main(argv)


if __name__ == "__main__":
    sys.exit(main())
