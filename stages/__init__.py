"""DVC stages: one importable module per stage, each a thin `main()` that reads params and paths, calls the
library, writes files."""
