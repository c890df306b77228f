#!/usr/bin/env python3
"""Write worker/horovod_worker/digits_split.json: the digits' train/test split as
scikit-learn makes it, so that a rank can read the digits without importing
scikit-learn (horovod_worker.data.load_digits). tests/worker/test_data.py fails when
the file and scikit-learn disagree; run this then.

    .venv/bin/python hack/digits_split.py
"""

import json
import sys
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent.parent / "worker")]

from horovod_worker.data import DIGITS_SPLIT, digits_split  # noqa: E402

DIGITS_SPLIT.write_text(json.dumps(digits_split(), separators=(",", ":")) + "\n")
print(f"wrote {DIGITS_SPLIT}")
