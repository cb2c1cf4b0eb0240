"""The query encoder's forward pass replayed as CUDA graphs, one per padded shape.

On a GPU a small encoder's eager forward pass is bound by the host launching its kernels, not by the GPU: on an H200,
MiniLM in fp16 took 4.6 ms for one query and 6.0 ms for 512, while the same forward captured as a CUDA graph
replayed in 0.31 ms and 5.0 ms with the same outputs (`benchmarks/gpu_check.sh`, docs/benchmarks/gpu-check.md). A
lone client's request waits for that whole forward, and in the server the launching holds the interpreter lock the
HTTP handling needs.

`GraphedForward` pads a batch of tokenized queries to a *bucket*: the next power of two of queries (at least 1) and
of tokens (at least 16, always more than the longest query, so that every row has a padded position and the captured
attention takes the masked path whatever the batch holds). Each bucket is captured once, on first use (PyTorch's
`torch.cuda.graph`, after warm-up passes on a side stream, as PyTorch's CUDA graphs notes do), then replayed with the
batch copied into its static input tensors. `warm_up` captures the usual shapes when the index loads (each
capture took 150-270 ms on an H200, which a request would otherwise wait for). A new capture is checked against the
eager forward on the batch that caused it (lowest cosine >= `MIN_COSINE`); one that fails or raises turns the
graphs off for good (logged) and the encoder runs eagerly. Shapes beyond `max_tokens` (queries x tokens per bucket) or `max_graphs` run eagerly: there
the launches are a small part of the pass.

All graphs share one memory pool (`torch.cuda.graph_pool_handle`), so that a capture can reuse the intermediates'
memory of the captures before it. That is safe because they are never replayed concurrently and a graph's inputs and output
are used only between the copy into its inputs and the copy of its output out of it (`GraphedForward.__call__`, from
one thread: the server's batch worker).
"""

from __future__ import annotations

import logging
import time

logger = logging.getLogger(__name__)

#: lowest cosine of a captured graph's output to the eager forward's, per query, for the graph to be used
MIN_COSINE = 0.999
#: fewest tokens a bucket pads to
MIN_TOKENS = 16
#: token buckets `GraphedForward.warm_up` captures for every query bucket (questions of up to 63 tokens, prefix and
#: special tokens included); a longer batch's graph is captured on first use
WARM_TOKENS = (16, 32, 64)
#: `max_length` where the model gives none
MAX_LENGTH = 512


def bucket(n: int, least: int = 1) -> int:
    """The smallest power of two >= max(n, least).

    >>> [bucket(n) for n in (1, 2, 3, 64, 65)]
    [1, 2, 4, 64, 128]
    >>> bucket(17, least=16), bucket(3, least=16)
    (32, 16)
    """
    size = least
    while size < n:
        size *= 2
    return size


def pad_features(features: dict, queries: int, tokens: int, pad_id: int) -> dict:
    """`features` (int64 tensors of shape `(batch, longest)`: `input_ids`, `attention_mask`, optionally
    `token_type_ids`) padded to `(queries, tokens)`: `pad_id` ids, 0 mask and 0 type ids on the right; the extra rows
    hold one unmasked `pad_id` token so that no row is all masked. Other entries are left out (the model reads only
    these). Raises ValueError where the batch is larger than `(queries, tokens)`."""
    import torch

    batch, longest = features["input_ids"].shape
    if batch > queries or longest > tokens:
        raise ValueError(f"a batch of {batch} x {longest} tokens does not fit a {queries} x {tokens} bucket")
    padded = {}
    for name in ("input_ids", "attention_mask", "token_type_ids"):
        if name not in features:
            continue
        out = torch.full((queries, tokens), pad_id if name == "input_ids" else 0, dtype=torch.int64)
        out[:batch, :longest] = features[name]
        padded[name] = out
    padded["attention_mask"][batch:, 0] = 1
    return padded


class GraphedForward:
    """Run `forward(features) -> (batch, dim) tensor` as CUDA graphs, one per bucket (see the module docstring).

    Args:
        forward: the eager forward pass over tokenized features on the device (`SentenceEncoder`'s, normalisation
            included); it must make no host-side decision from the features' values.
        device: the CUDA device the model is on.
        pad_id: the tokenizer's padding id.
        max_length: most tokens a query may pad to (the model's `max_seq_length`; None: `MAX_LENGTH`); a batch whose
            bucket is longer runs eagerly.
        max_tokens: largest bucket captured, queries x tokens (default 65,536: 512 queries of up to 128 tokens).
        max_graphs: most graphs kept (default 48); later new shapes run eagerly.

    Calling it with features (int64 CPU tensors `(batch, longest)`, and the non-tensor entries sentence-transformers
    adds, such as `prompt_length`, which become part of a graph's key) returns the `(batch, dim)` output on the
    device, a view valid until the next call, or None where the shape is not graphed (too large, the cap reached,
    graphs turned off): then the caller runs `forward` itself.
    """

    def __init__(self, forward, device, pad_id: int, max_length: int | None, max_tokens: int = 65_536,
                 max_graphs: int = 48):
        self.forward = forward
        self.max_length = max_length or MAX_LENGTH  # a model without a max_seq_length: BERT's 512 positions
        self.device = device
        self.pad_id = int(pad_id)
        self.max_tokens = max_tokens
        self.max_graphs = max_graphs
        self.enabled = True
        self._graphs: dict[tuple, tuple] = {}  # (queries, tokens, extras) -> (graph, static inputs, static output)
        self._pool = None  # the graphs' shared memory pool, made at the first capture

    def clear(self) -> None:
        """Drop every captured graph (the model's weights moved, e.g. to another precision)."""
        self._graphs.clear()
        self._pool = None

    def warm_up(self, features_of, max_queries: int, lengths=WARM_TOKENS) -> int:
        """Capture, now, the graph of every bucket of 1, 2, 4, ... `max_queries` queries and each of `lengths` tokens
        that the limits allow, from batches of one repeated text `features_of(texts)` tokenizes to `tokens - 1`
        tokens (the real path: the encoder's own tokenization, the check against the eager forward). Returns the
        number of graphs held afterwards; stops early where a capture fails (the graphs are then off)."""
        import torch

        on_cuda = torch.device(self.device).type == "cuda"

        def reserved() -> int:
            return torch.cuda.memory_reserved(self.device) if on_cuda else 0

        started, before = time.perf_counter(), reserved()
        overhead = features_of(["word"])["input_ids"].shape[1] - 1  # special tokens and the prefix
        with torch.inference_mode():
            for tokens in lengths:
                words = tokens - 1 - overhead
                if words < 1 or tokens > self.max_length:
                    continue
                text = " ".join(["word"] * words)
                if features_of([text])["input_ids"].shape[1] != tokens - 1:  # "word" is not one token here
                    continue
                queries = 1
                while queries <= max_queries and self.enabled and queries * tokens <= self.max_tokens:
                    self(features_of([text] * queries))
                    queries *= 2
        if on_cuda:  # the eager passes' blocks, cached by the allocator, go back
            torch.cuda.empty_cache()
        logger.info("query encoder: %d CUDA graphs held after %.1f s of capture (GPU memory reserved %+.0f MB)",
                    len(self._graphs), time.perf_counter() - started,
                    (reserved() - before) / 2**20)
        return len(self._graphs)

    def __call__(self, features: dict):
        import torch

        batch, longest = features["input_ids"].shape
        queries, tokens = bucket(batch), bucket(longest + 1, MIN_TOKENS)
        extras = {name: value for name, value in features.items() if not isinstance(value, torch.Tensor)}
        key = (queries, tokens, repr(sorted(extras.items())))  # extras (prompt_length, ...) are captured as constants
        if not self.enabled or queries * tokens > self.max_tokens or tokens > self.max_length:
            return None
        entry = self._graphs.get(key)
        if entry is None:
            if len(self._graphs) >= self.max_graphs:
                return None
            entry = self._capture(key, features, extras)
            if entry is None:
                return None
        graph, inputs, output = entry
        for name, value in pad_features(features, queries, tokens, self.pad_id).items():
            inputs[name].copy_(value, non_blocking=True)
        graph.replay()
        return output[:batch]

    def _capture(self, key: tuple, features: dict, extras: dict):
        """Capture the graph of bucket `key` with `features` padded as its first input; check it against the eager
        forward. Returns `(graph, static inputs, static output)`, or None after turning the graphs off."""
        import torch

        queries, tokens, _ = key
        try:
            inputs = {name: value.to(self.device) for name, value in
                      pad_features(features, queries, tokens, self.pad_id).items()}
            stream = torch.cuda.Stream(self.device)
            stream.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(stream):
                for _ in range(3):
                    self.forward({**inputs, **extras})
            torch.cuda.current_stream(self.device).wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            if self._pool is None:
                self._pool = torch.cuda.graph_pool_handle()
            with torch.cuda.graph(graph, pool=self._pool):
                output = self.forward({**inputs, **extras})
            graph.replay()
            batch = features["input_ids"].shape[0]
            eager = self.forward({name: value.to(self.device) if isinstance(value, torch.Tensor) else value
                                  for name, value in features.items()})
            cosine = torch.nn.functional.cosine_similarity(output[:batch].float(), eager.float(), dim=1).min().item()
            if not cosine >= MIN_COSINE:
                raise ValueError(f"the graph's output differs from the eager forward's (lowest cosine {cosine:.5f})")
        except Exception as exc:  # any capture problem: the eager forward, which always works
            self.enabled = False
            self._graphs.clear()
            logger.warning("query encoder: CUDA graphs off, the forward pass runs eagerly (%d queries x %d tokens: "
                           "%s)", queries, tokens, exc)
            return None
        self._graphs[key] = (graph, inputs, output)
        logger.info("query encoder: CUDA graph for %d queries x %d tokens captured (lowest cosine %.5f)",
                    queries, tokens, cosine)
        return self._graphs[key]
