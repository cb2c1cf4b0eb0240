"""`verl-search download`: fetch the published Search-R1 / FlashRAG files with `huggingface_hub`.

| name | Hugging Face repository | what lands in `--out` |
| --- | --- | --- |
| `wiki18` | dataset `PeterJinGo/wiki-18-corpus` | `wiki-18.jsonl` (21M passages, 14 GB, gunzipped) |
| `e5-index` | dataset `PeterJinGo/wiki-18-e5-index` | `e5_Flat.index` (parts joined and removed, 64 GB) |
| `e5-model` | model `intfloat/e5-base-v2` | `e5-base-v2/` |
| `datasets` | dataset `RUC-NLPIR/FlashRAG_datasets` | the seven QA sets, FlashRAG JSONL |

Before anything is fetched, the hub is probed with a 5-second connection attempt, so a machine
without internet gets a clear error at once instead of a hang.
"""

from __future__ import annotations

import gzip
import logging
import os
import shutil
import socket
from pathlib import Path
from urllib.parse import urlparse

logger = logging.getLogger(__name__)

ARTIFACTS = {
    "wiki18": ("PeterJinGo/wiki-18-corpus", "dataset", ["wiki-18.jsonl.gz"]),
    "e5-index": ("PeterJinGo/wiki-18-e5-index", "dataset", ["part_*"]),
    "e5-model": ("intfloat/e5-base-v2", "model", None),
    "datasets": ("RUC-NLPIR/FlashRAG_datasets", "dataset",
                 [f"{name}/*" for name in ("nq", "triviaqa", "popqa", "hotpotqa", "2wikimultihopqa", "musique", "bamboogle")]),
}


def hub_endpoint() -> str:
    """The hub URL (`$HF_ENDPOINT`, default https://huggingface.co)."""
    return os.environ.get("HF_ENDPOINT", "https://huggingface.co")


def check_reachable(timeout: float = 5.0) -> None:
    """Raise `ConnectionError` (with what to do) unless the hub accepts a TCP connection in `timeout` s."""
    if os.environ.get("HF_HUB_OFFLINE", "0") not in ("", "0", "false", "False"):
        raise ConnectionError("HF_HUB_OFFLINE is set: unset it to download, or copy the files to this machine")
    url = urlparse(hub_endpoint())
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        socket.create_connection((url.hostname, port), timeout=timeout).close()
    except OSError as exc:
        raise ConnectionError(
            f"cannot reach {hub_endpoint()} ({exc}). Download on a machine with internet "
            "(verl-search download NAME --out DIR) and copy DIR here; see README, 'Data'."
        ) from exc


def download(names: list[str], out: str | os.PathLike) -> list[Path]:
    """Download the named artifacts into `out`; return the paths written. `e5-index` is skipped when
    `out/e5_Flat.index` exists (its parts are removed once joined, see `join_parts`).

    Raises:
        KeyError: an unknown name (lists the known ones).
        ConnectionError: the hub is unreachable.
    """
    unknown = [n for n in names if n not in ARTIFACTS]
    if unknown:
        raise KeyError(f"unknown download(s) {unknown}; known: {sorted(ARTIFACTS)}")
    check_reachable()
    from huggingface_hub import snapshot_download

    out = Path(out)
    written = []
    for name in names:
        repo, kind, patterns = ARTIFACTS[name]
        target = out / "e5-base-v2" if name == "e5-model" else out
        if name == "e5-index" and (out / "e5_Flat.index").is_file():  # joined before (only a whole join is renamed)
            logger.info("%s is there already; not downloading its parts again", out / "e5_Flat.index")
            written.append(out / "e5_Flat.index")
            continue
        logger.info("downloading %s (%s) to %s", name, repo, target)
        snapshot_download(repo_id=repo, repo_type=kind, local_dir=target, allow_patterns=patterns)
        if name == "wiki18":
            with gzip.open(out / "wiki-18.jsonl.gz", "rb") as source, open(out / "wiki-18.jsonl", "wb") as sink:
                shutil.copyfileobj(source, sink, 1 << 24)
            written.append(out / "wiki-18.jsonl")
        elif name == "e5-index":
            written.append(join_parts(sorted(out.glob("part_*")), out / "e5_Flat.index"))
        else:
            written.append(target)
    return written


def join_parts(parts: list[Path], target: Path) -> Path:
    """Concatenate `parts` (in the order given) into `target`, removing each part once it is copied.

    The e5 index comes as `part_aa`, `part_ab`, ... (`split` output, 64 GB together): removing each part
    as soon as its bytes are in the joined file keeps the disk at the index's size plus one part, not
    twice the index. The join writes `TARGET.partial` and renames it to `target` at the end, so a
    `target` on disk is always whole; a failed join leaves the `.partial` file and the parts not yet
    copied (download again to start over).

    Raises:
        FileNotFoundError: `parts` is empty (nothing was downloaded).
    """
    if not parts:
        raise FileNotFoundError(f"no index parts to join into {target}")
    partial = target.with_name(target.name + ".partial")
    with open(partial, "wb") as sink:
        for part in parts:
            with open(part, "rb") as source:
                shutil.copyfileobj(source, sink, 1 << 24)
            sink.flush()
            os.fsync(sink.fileno())
            part.unlink()
            logger.info("joined %s into %s and removed it", part.name, partial.name)
    partial.replace(target)
    return target
