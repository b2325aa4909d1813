"""A bench/ worker process that holds a known amount of memory, to check the benchmarks'
memory readings (bench/common.py) against it: `python -m tests.support.memory_worker --mb 64`.

It answers like bench/memory.py's workers (one `JSON {...}` line, read by run_worker).
"""

from __future__ import annotations

import argparse
import sys

from bench import common


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mb", type=int, default=64)
    parser.add_argument("--fail", action="store_true", help="exit with an error, no answer")
    args = parser.parse_args()
    if args.fail:
        print("worker: failing on purpose", file=sys.stderr)
        raise SystemExit(3)
    common.settle()
    before = common.rss_bytes()
    block = bytearray(args.mb * 2**20)
    block[::4096] = b"x" * len(range(0, len(block), 4096))  # every page resident
    held, uss_held = common.rss_bytes(), common.uss_bytes()
    del block
    common.settle()
    common.worker_reply(
        {"before": before, "held": held, "uss_held": uss_held, "after": common.rss_bytes()}
    )


if __name__ == "__main__":
    main()
