"""Rows of a Hugging Face dataset, for `hf_dataset` question sources.

`dataset_id` is a hub id (RUC-NLPIR/FlashRAG_datasets) or a local folder laid out like a hub repository: a
README.md whose YAML `configs:` header maps config names to data files, e.g. `nq/test.jsonl`. A relative
folder is looked up under `data.root` first, so a copy of the hub repository beside the other data files
works offline. `dataset_revision` pins the hub repository's commit, tag or branch (a local copy is read as it
is). A hub id with the hub off (HF_HUB_OFFLINE=1, or HF_DATASETS_OFFLINE=1) is read from its snapshot at that
revision in the HF cache (`cached_snapshot`: what `hf download --repo-type dataset ID` or an earlier online load
left there), as a local folder of the same layout: `datasets` itself, offline, reads only the Arrow copies it
prepared before (HF_DATASETS_CACHE), not the hub cache. Rows come back as plain dicts; `formats` converts them
(FlashRAG rows: id, question, golden_answers, metadata). `datasets` is imported on first use only: it takes
seconds to import.
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


def cached_snapshot(repo_id: str, repo_type: str, revision: str | None = None) -> Path | None:
    """The HF cache's snapshot folder of hub repository `repo_id` at `revision` (None: the default branch), found
    as the hub library finds it offline (`try_to_load_from_cache`, HF_HUB_CACHE), or None when the cache lacks the
    file its loader reads first: a model's config.json, a dataset's README.md (its `configs:` header)."""
    from huggingface_hub import try_to_load_from_cache

    first = "README.md" if repo_type == "dataset" else "config.json"
    try:
        found = try_to_load_from_cache(repo_id, first, revision=revision, repo_type=repo_type)
    except ValueError:  # not a hub id (HFValidationError): nothing of it can be cached
        return None
    return Path(found).parent if isinstance(found, str) else None


def _location(source: QuestionSource, root: Path, offline: bool) -> tuple[str, str | None]:
    """What `load_dataset` reads for `source`, and at which revision: a local copy as it is; offline, the hub id's
    snapshot in the HF cache at `dataset_revision` when there is one; else the hub id at `dataset_revision`."""
    location = dataset_location(source.dataset_id, root)
    if Path(location).is_dir():
        return location, None
    snapshot = cached_snapshot(source.dataset_id, "dataset", source.dataset_revision) if offline else None
    return (str(snapshot), None) if snapshot else (source.dataset_id, source.dataset_revision)


def rows(source: QuestionSource, root: Path) -> Iterator[tuple[str, dict]]:
    """Yield (`dataset[config/split] row i`, row) for each row of the split, in dataset order."""
    import datasets  # deferred: slow to import, and only hf_dataset sources need it
    import yaml

    offline = datasets.config.HF_HUB_OFFLINE  # as `datasets` reads it: HF_DATASETS_OFFLINE, else HF_HUB_OFFLINE
    location, revision = _location(source, root, offline)
    name = f"{source.dataset_id}[{source.dataset_config or 'default'}/{source.dataset_split}]"
    try:
        dataset = datasets.load_dataset(location, source.dataset_config, split=source.dataset_split, revision=revision)
    except (ValueError, OSError, yaml.YAMLError) as error:  # unknown config or split, missing files, bad README
        first_line = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        pin = f" --revision {revision}" if revision else ""
        uncached = offline and location == source.dataset_id
        hint = (
            f"; offline, the HF cache holds no copy of it: `hf download --repo-type dataset {location}{pin}` where "
            "the hub is reachable"
        )
        raise DataError(
            f"{name}: the dataset could not be loaded ({first_line}); check dataset_id, dataset_config and "
            f"dataset_split of this question source{hint if uncached else ''}"
        ) from None
    for index, row in enumerate(dataset):
        yield f"{name} row {index}", dict(row)
