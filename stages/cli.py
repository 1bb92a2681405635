"""What every stage's command line shares: its description from the module docstring, and `--params`."""

from __future__ import annotations

import argparse


def stage_parser(doc: str) -> argparse.ArgumentParser:
    """A parser whose help is the stage module's docstring (first line, then the rest) with `--params` added."""
    first, _, rest = doc.partition("\n")
    parser = argparse.ArgumentParser(description=first, epilog=rest.strip() or None,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--params", default="params.yaml", help="params file (its profile overlay is applied)")
    return parser
