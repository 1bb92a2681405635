"""centralrl: RL-train a central-agent multi-agent QA harness and compare which agents should train.

The library decides; `stages/` (DVC) and `flows/` (Prefect) only compose it. See docs in README.md.
"""

__version__ = "0.1.0"
