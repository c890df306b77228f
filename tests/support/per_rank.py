"""Start the trainer with "{rank}" in its arguments replaced by this process's rank.

horovodrun starts the same command everywhere; the training tests use this to
give ranks different seeds (the broadcast must make them equal) and different
output directories (only rank 0 may write).
"""

import os
import sys

rank = os.environ.get("HOROVOD_RANK") or os.environ.get("OMPI_COMM_WORLD_RANK") or "0"
args = [arg.replace("{rank}", rank) for arg in sys.argv[1:]]
os.execv(sys.executable, [sys.executable, "-m", "horovod_worker.train", *args])
