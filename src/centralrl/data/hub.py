"""Rows of a Hugging Face dataset, for `hf_dataset` question sources.

`dataset_id` is a hub id (RUC-NLPIR/FlashRAG_datasets) or a local folder laid out like a hub repository: a
README.md whose YAML `configs:` header maps config names to data files, e.g. `nq/test.jsonl`. A relative
folder is looked up under `data.root` first, so a copy of the hub repository beside the other data files
works offline. Rows come back as plain dicts; `formats` converts them (FlashRAG rows: id, question,
golden_answers, metadata). `datasets` is imported on first use only: it takes seconds to import.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from centralrl.errors import DataError

if TYPE_CHECKING:  # config.py imports the kind tables of `formats`, which imports this module
    from centralrl.config import QuestionSource


def dataset_location(dataset_id: str, root: Path) -> str:
    """`dataset_id` as `load_dataset` should see it: a folder under `root` if there is one, else unchanged.

    >>> dataset_location("RUC-NLPIR/FlashRAG_datasets", Path("/nonexistent"))
    'RUC-NLPIR/FlashRAG_datasets'
    """
    local = Path(dataset_id) if Path(dataset_id).is_absolute() else root / dataset_id
    return str(local) if local.is_dir() else dataset_id


def rows(source: QuestionSource, root: Path) -> Iterator[tuple[str, dict]]:
    """Yield (`dataset[config/split] row i`, row) for each row of the split, in dataset order."""
    import datasets  # deferred: slow to import, and only hf_dataset sources need it
    import yaml

    location = dataset_location(source.dataset_id, root)
    name = f"{source.dataset_id}[{source.dataset_config or 'default'}/{source.dataset_split}]"
    try:
        dataset = datasets.load_dataset(location, source.dataset_config, split=source.dataset_split)
    except (ValueError, OSError, yaml.YAMLError) as error:  # unknown config or split, missing files, bad README
        first_line = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise DataError(
            f"{name}: the dataset could not be loaded ({first_line}); check dataset_id, dataset_config and "
            "dataset_split of this question source"
        ) from None
    for index, row in enumerate(dataset):
        yield f"{name} row {index}", dict(row)
