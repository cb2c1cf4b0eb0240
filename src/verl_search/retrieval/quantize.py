"""The int8 OpenVINO encoder (`--encoder-backend openvino-int8`): post-training static quantisation,
calibrated on passages of the index's own corpus.

sentence-transformers' `export_static_quantized_openvino_model` (NNCF through optimum-intel) does
the quantisation; its default calibration set (GLUE SST-2) lives on the Hugging Face hub, so we
calibrate on `CALIBRATION_PASSAGES` passages spread evenly over the corpus instead (written to a
local JSONL folder that `datasets` loads). The result is cached under
`$VERL_SEARCH_CACHE/encoders/<model folder>-int8-<key>/`: the model's files linked, plus
`INT8_FILE`; `key` hashes the encoder (folder, fingerprint, its files' sizes and times) and the
calibration passages, so the index build and every server replica of one index load the same
model (the first one quantises, in tens of seconds for MiniLM; a half-written folder is never
used: it is renamed into place).

On `mini_wiki` with MiniLM: gold-title hit@5 72.0 (fp32: 71.8), about 1.25x OpenVINO fp32's
queries/s (`benchmarks/bench_encoder_backends.py`). An index built with another backend is checked
against its stored vectors when this one serves it (`dense.verify_backend`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path

from verl_search.retrieval.corpus import JsonlCorpus
from verl_search.retrieval.manifest import encoder_fingerprint
from verl_search.runtime.env import read_env

logger = logging.getLogger(__name__)

#: passages of the corpus that calibrate the quantiser (NNCF's default sample count)
CALIBRATION_PASSAGES = 300
#: the quantised model inside the cached folder (sentence-transformers' name for it)
INT8_FILE = "openvino/openvino_model_qint8_quantized.xml"


def calibration_passages(corpus: JsonlCorpus, count: int = CALIBRATION_PASSAGES) -> list[str]:
    """The `contents` of `count` passages evenly spaced over `corpus` (all of them if it is smaller)."""
    total = len(corpus)
    rows = range(total) if total <= count else [i * total // count for i in range(count)]
    return [corpus.get(row).contents for row in rows]


def int8_openvino_model(encoder_path: str | os.PathLike, calibration: Sequence[str], cache_dir: Path | None = None) -> Path:
    """The folder of `encoder_path`'s int8 OpenVINO model calibrated on `calibration`, made once.

    Args:
        encoder_path: the local model folder (sentence-transformers or plain Hugging Face).
        calibration: passage texts (with any passage prefix already put before them), e.g.
            `calibration_passages(corpus)`.
        cache_dir: where the quantised folders live (default `$VERL_SEARCH_CACHE/encoders`).

    Returns:
        a folder to load with `SentenceTransformer(folder, backend="openvino",
        model_kwargs={"file_name": INT8_FILE})`.

    Raises:
        ValueError: `calibration` is empty.
        ImportError: openvino, optimum-intel, nncf or datasets is missing (`pip install "verl-search[openvino]"`).
    """
    if not calibration:
        raise ValueError("int8 quantisation needs calibration passages; got none (is the corpus empty?)")
    source = Path(encoder_path).resolve()
    key = hashlib.sha256(f"{source}|{encoder_fingerprint(source)}".encode())
    for item in sorted(source.iterdir()):  # the weights too: a fine-tune shares its base's config.json
        if item.is_file():
            key.update(f"{item.name}:{item.stat().st_size}:{item.stat().st_mtime_ns}".encode())
    for text in calibration:
        key.update(text.encode("utf-8") + b"\0")
    root = cache_dir or read_env().cache_dir / "encoders"
    folder = root / f"{source.name}-int8-{key.hexdigest()[:16]}"
    if (folder / INT8_FILE).is_file():
        return folder
    root.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{folder.name}-", dir=root))
    try:
        _quantise(source, calibration, staging)
        try:
            os.rename(staging, folder)
        except OSError:  # another process put it there first: use theirs
            if not (folder / INT8_FILE).is_file():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return folder


def _quantise(source: Path, calibration: Sequence[str], staging: Path) -> None:
    """Link `source`'s files into `staging` and write the int8 model there."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.backend import export_static_quantized_openvino_model

    for item in source.iterdir():
        if item.name != "openvino":  # the export is written there: never through a link into `source`
            os.symlink(item.resolve(), staging / item.name)
    data = staging / "calibration"
    data.mkdir()
    with open(data / "train.jsonl", "w", encoding="utf-8") as handle:
        for text in calibration:
            handle.write(json.dumps({"text": text}) + "\n")
    logger.info("quantising %s to int8 on %d calibration passages", source, len(calibration))
    model = SentenceTransformer(str(staging), backend="openvino", device="cpu", local_files_only=True)
    export_static_quantized_openvino_model(model, None, str(staging), dataset_name=str(data),
                                           dataset_config_name="default", dataset_split="train", column_name="text")
    shutil.rmtree(data)
