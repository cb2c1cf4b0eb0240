"""Tokenize texts for a sentence-transformers text encoder with the tokenizer's Rust backend directly.

sentence-transformers' `preprocess` calls the Hugging Face tokenizer, whose Python wrapper costs more than the
tokenization itself: on an H200 node (16 cores), 512 questions took 61.6 ms through `preprocess` and 8.8 ms through
the Rust `tokenizers.Tokenizer.encode_batch`, while the fp16 MiniLM forward pass over them took 6.0 ms
(`benchmarks/gpu_check.sh`, docs/benchmarks/gpu-check.md). `RustFeatures` builds the same tensors as `preprocess`
from `encode_batch` and is used only where it gives exactly `preprocess`'s features on a probe set, padding and
truncation included (`RustFeatures.for_model` returns None otherwise, and the encoder keeps `preprocess`).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import numpy as np

logger = logging.getLogger(__name__)

#: texts the features are checked on: spaces around, mixed case, accents, an empty-ish text, one past any limit
PROBE = ["  Who wrote The Old Man and the Sea?  ", "a", "Éire's capital city ", "x " * 600]


class RustFeatures:
    """`SentenceTransformer.preprocess(texts, prompt=prefix)`'s features from the Rust tokenizer.

    Args:
        tokenizer: a `tokenizers.Tokenizer` (copied: padding to the longest text and truncation to `max_length`
            tokens are set on the copy, never on the model's own tokenizer).
        max_length: most tokens per text, special tokens included (the model's `max_seq_length`).
        names: the tensor names `preprocess` returns (`input_ids`, `attention_mask`, `token_type_ids`, ...).
        pad_id, pad_token: the padding token.

    Calling it with `(texts, prefix)` returns a dict of int64 tensors, shape `(len(texts), longest)`, plus the
    non-tensor entries `preprocess` gave for that prefix on the probe (`modality`, `prompt_length`).
    """

    def __init__(self, tokenizer, max_length: int, names: Sequence[str], pad_id: int, pad_token: str):
        from tokenizers import Tokenizer

        self._tokenizer = Tokenizer.from_str(tokenizer.to_str())
        self._tokenizer.enable_truncation(max_length)
        self._tokenizer.enable_padding(pad_id=pad_id, pad_token=pad_token)
        self.max_length = max_length
        self.names = tuple(names)
        self._extras: dict[str, dict] = {}

    def __call__(self, texts: Sequence[str], prefix: str = "") -> dict:
        import torch

        encodings = self._tokenizer.encode_batch([(prefix + text).strip() for text in texts])
        fields = {"input_ids": "ids", "attention_mask": "attention_mask", "token_type_ids": "type_ids"}
        features = {name: torch.from_numpy(np.array([getattr(e, fields[name]) for e in encodings], dtype=np.int64))
                    for name in self.names}
        return {**features, **self._extras.get(prefix, {})}

    @classmethod
    def for_model(cls, model, max_length: int, prefixes: Sequence[str]) -> "RustFeatures | None":
        """A `RustFeatures` for a loaded `SentenceTransformer`, or None where its tokenizer has no Rust backend,
        its features have other names than `input_ids` / `attention_mask` / `token_type_ids`, or they differ from
        `model.preprocess`'s for any `PROBE` text with any of `prefixes` (reason logged)."""
        import torch

        tokenizer = getattr(model, "tokenizer", None)
        backend = getattr(tokenizer, "backend_tokenizer", None)
        if backend is None or getattr(tokenizer, "padding_side", "right") != "right":
            logger.info("query tokenization through sentence-transformers: no Rust tokenizer to call directly")
            return None
        try:
            reference = {prefix: model.preprocess(PROBE, prompt=prefix or None) for prefix in prefixes}
            names = [name for name, value in reference[prefixes[0]].items() if isinstance(value, torch.Tensor)]
            if not set(names) <= {"input_ids", "attention_mask", "token_type_ids"}:
                raise ValueError(f"features {names}")
            features = cls(backend, max_length, names, tokenizer.pad_token_id, tokenizer.pad_token)
            for prefix, expected in reference.items():
                features._extras[prefix] = {k: v for k, v in expected.items() if not isinstance(v, torch.Tensor)}
                got = features(PROBE, prefix)
                if got.keys() != expected.keys() or any(not torch.equal(got[name], expected[name]) for name in names):
                    raise ValueError(f"features differ from preprocess's with prefix {prefix!r}")
        except Exception as exc:  # any mismatch or tokenizer quirk: keep sentence-transformers' own path
            logger.info("query tokenization through sentence-transformers (%s)", exc)
            return None
        logger.info("query tokenization: the Rust tokenizer called directly (the same features as preprocess)")
        return features
