"""A stage for tests/test_signals.py: run through `stages.cli.run_stage` with its own Prefect server, it starts
a Prefect flow that opens an atomic write of --out, writes half of it, records the process ids it can see in
--started, and blocks until a signal stops it."""

from __future__ import annotations

import argparse
import json
import os
import time

from stages.cli import run_stage


def arguments(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--params", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--started", required=True)
    return parser.parse_args(argv)


def main() -> None:
    args = arguments()

    from prefect import flow

    from centralrl.io import atomic_write

    @flow(name="blocking-stage")
    def block() -> None:
        with atomic_write(args.out) as handle:
            handle.write('{"half": ')
            handle.flush()
            with open(args.started, "w") as marker:
                json.dump({"stage": os.getpid(), "api": os.environ["PREFECT_API_URL"]}, marker)
            while True:
                time.sleep(0.1)

    block()


if __name__ == "__main__":
    run_stage(main, arguments, prefect_server=True)
