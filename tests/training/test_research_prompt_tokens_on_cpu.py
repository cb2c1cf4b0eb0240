"""ReSearch's base-model prompt is tokenised without special tokens (branch `re-search`,
`src/verl/utils/torch_functional.py`: `tokenizer(prompt, return_tensors='pt', add_special_tokens=False)`):
`ReSearchAgentLoop` without a chat template gives the same ids, with the Qwen2.5 tokenizer (no BOS either way)
and with a Llama-style tokenizer that adds a BOS by default (built here: no Llama tokenizer ships offline)."""

import asyncio
from types import SimpleNamespace

import pytest

from tests.conftest import QWEN_TOKENIZER
from verl_search.agent_protocol import research

QUESTION = "Who was the director of the film that won the 1998 Palme d'Or?"


def llama_style_tokenizer():
    """A word-level tokenizer whose `encode` adds `<s>` first unless `add_special_tokens=False`, as Llama's
    `tokenizer.json` post-processor (`TemplateProcessing`, single `<s> $A`) does."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    words = sorted(set(research.base_prompt(QUESTION).replace(".", " . ").replace("?", " ? ").split()))
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{w: i + 3 for i, w in enumerate(words)}}
    core = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Whitespace()
    core.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    return PreTrainedTokenizerFast(tokenizer_object=core, bos_token="<s>", eos_token="</s>", unk_token="<unk>")


def loop_prompt_ids(tokenizer) -> list[int]:
    """`ReSearchAgentLoop._prompt_ids` on a row's messages, base-model path (no chat template)."""
    from verl_search.agent_loop.research import ReSearchAgentLoop

    loop = ReSearchAgentLoop.__new__(ReSearchAgentLoop)  # only what _prompt_ids reads
    loop.tokenizer, loop.use_chat_template = tokenizer, False
    loop.rollout_config = SimpleNamespace(prompt_length=512)
    return asyncio.run(loop._prompt_ids(research.messages(QUESTION)))


def researchs_ids(tokenizer) -> list[int]:
    """ReSearch's `tokenize_and_postprocess_data` on `prompt_template.format(prompt=question)`."""
    return tokenizer(research.base_prompt(QUESTION), add_special_tokens=False)["input_ids"]


@pytest.mark.parametrize("make", [lambda: __import__("transformers").AutoTokenizer.from_pretrained(str(QWEN_TOKENIZER)),
                                  llama_style_tokenizer], ids=["qwen2.5", "llama-style"])
def test_base_prompt_is_tokenised_without_special_tokens_as_research(make):
    tokenizer = make()
    ours = loop_prompt_ids(tokenizer)
    assert ours == researchs_ids(tokenizer) == research.base_prompt_ids(tokenizer, QUESTION)
    if tokenizer.bos_token_id is not None and tokenizer.encode("x")[0] == tokenizer.bos_token_id:
        assert tokenizer.encode(research.base_prompt(QUESTION))[1:] == ours  # the BOS `encode` used to add
        assert ours[0] != tokenizer.bos_token_id
