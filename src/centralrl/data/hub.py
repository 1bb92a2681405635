"""Rows of a Hugging Face dataset, for `hf_dataset` question sources.

`dataset_id` is a hub id (RUC-NLPIR/FlashRAG_datasets) or a local folder laid out like a hub repository: a
README.md whose YAML `configs:` header maps config names to data files, e.g. `nq/test.jsonl`. A relative
folder is looked up under `data.root` first, so a copy of the hub repository beside the other data files
works offline. `dataset_revision` pins the hub repository's commit, tag or branch (a local copy is read as it
is). A hub id with the hub off (HF_HUB_OFFLINE=1, or HF_DATASETS_OFFLINE=1) is read from its snapshot at that
revision in the HF cache (`cached_snapshot`), as a local folder of the same layout: `datasets` itself, offline,
reads only the Arrow copies it prepared before (HF_DATASETS_CACHE), not the hub cache. `hf download --repo-type
dataset ID` puts every config's files there; an earlier online load leaves the README and the files of the configs
and splits it read, so only those load offline (`missing_data_files` names what a snapshot lacks). Rows come back
as plain dicts; `formats` converts them (FlashRAG rows: id, question, golden_answers, metadata). `datasets` is
imported on first use only: it takes seconds to import.
"""

from __future__ import annotations

import shlex
from collections.abc import Iterator, Sequence
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


def download_command(repo_id: str, repo_type: str, revision: str | None = None, files: Sequence[str] = ()) -> str:
    """The `hf download` command that puts hub repository `repo_id` at `revision` into the HF cache: only `files`
    (glob patterns) when given, else all of it.

    >>> download_command("org/set", "dataset", "v1", ["nq/test.jsonl"])
    'hf download --repo-type dataset org/set --revision v1 --include nq/test.jsonl'
    """
    kind = " --repo-type dataset" if repo_type == "dataset" else ""
    pin = f" --revision {revision}" if revision else ""
    return f"hf download{kind} {repo_id}{pin}" + "".join(f" --include {shlex.quote(file)}" for file in files)


def missing_data_files(snapshot: Path, config: str | None, split: str) -> list[str]:
    """The data files (glob patterns) that the README's `configs:` header lists for `config` (None: the default
    one) and `split` and that no file of dataset folder `snapshot` matches. [] when the header lists none for them
    or cannot be read: `datasets` then infers the layout, or its load says what is wrong."""
    import yaml
    from datasets.data_files import sanitize_patterns
    from datasets.utils.metadata import MetadataConfigs
    from huggingface_hub.repocard import metadata_load

    try:
        configs = MetadataConfigs.from_dataset_card_data(metadata_load(snapshot / "README.md") or {})
        chosen = configs.get(config or configs.get_default_config_name(), {})
        patterns = sanitize_patterns(chosen.get("data_files", [])).get(split, [])
    except (ValueError, yaml.YAMLError):
        return []
    base = snapshot / chosen.get("data_dir", "")
    return [pattern for pattern in patterns if next(base.glob(pattern), None) is None]


def _location(source: QuestionSource, root: Path, offline: bool) -> tuple[str, str | None, Path | None]:
    """What `load_dataset` reads for `source`, at which revision, and the HF cache snapshot that is (None: not one):
    a local copy as it is; offline, the hub id's snapshot in the HF cache at `dataset_revision` when there is one;
    else the hub id at `dataset_revision`."""
    location = dataset_location(source.dataset_id, root)
    if Path(location).is_dir():
        return location, None, None
    snapshot = cached_snapshot(source.dataset_id, "dataset", source.dataset_revision) if offline else None
    return (str(snapshot), None, snapshot) if snapshot else (source.dataset_id, source.dataset_revision, None)


def _cache_hint(source: QuestionSource, snapshot: Path | None) -> str:
    """After a failed offline load of `source` from the HF cache: what the cache lacks of it (no snapshot at all, or
    the split's data files) and the `hf download` that fetches that; "" when its snapshot lacks no data file."""
    where = " where the hub is reachable"
    fetch = (source.dataset_id, "dataset", source.dataset_revision)
    if snapshot is None:
        return f"; offline, the HF cache holds no copy of it: `{download_command(*fetch)}`{where}"
    files = missing_data_files(snapshot, source.dataset_config, source.dataset_split)
    lacks = f"; offline, its snapshot in the HF cache ({snapshot}) lacks {', '.join(files)}"
    return f"{lacks}: `{download_command(*fetch, files)}`{where}" if files else ""


def rows(source: QuestionSource, root: Path) -> Iterator[tuple[str, dict]]:
    """Yield (`dataset[config/split] row i`, row) for each row of the split, in dataset order."""
    import datasets  # deferred: slow to import, and only hf_dataset sources need it
    import yaml

    offline = datasets.config.HF_HUB_OFFLINE  # as `datasets` reads it: HF_DATASETS_OFFLINE, else HF_HUB_OFFLINE
    location, revision, snapshot = _location(source, root, offline)
    name = f"{source.dataset_id}[{source.dataset_config or 'default'}/{source.dataset_split}]"
    try:
        dataset = datasets.load_dataset(location, source.dataset_config, split=source.dataset_split, revision=revision)
    except (ValueError, OSError, yaml.YAMLError) as error:  # unknown config or split, missing files, bad README
        first_line = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        from_cache = snapshot or (offline and location == source.dataset_id)
        raise DataError(
            f"{name}: the dataset could not be loaded ({first_line}); check dataset_id, dataset_config and "
            f"dataset_split of this question source{_cache_hint(source, snapshot) if from_cache else ''}"
        ) from None
    for index, row in enumerate(dataset):
        yield f"{name} row {index}", dict(row)
