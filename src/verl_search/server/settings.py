"""Limits and batching knobs of the retrieval server (all validated on construction).

Each field is declared once, here: `verl-search serve` / `python -m verl_search.server` generate
their flags from it (`verl_search.runtime.options`), descriptions included.
"""

from __future__ import annotations

from pydantic import BaseModel, Field

from verl_search.agent_protocol.vocabulary import DEFAULT_TOPK


class ServerSettings(BaseModel):
    """Retrieval server settings.

    Attributes:
        default_topk: passages per query when a request gives no `topk` (default 3, Search-R1's).
        max_topk: largest `topk` accepted (default 100); above it is a 422.
        max_queries: most queries in one request (default 4096: Search-R1's trainer posts a whole
            GRPO step, 512 prompts x 5 rollouts = 2,560 queries, at once); above it is a 422.
        max_query_chars: longest query in characters (default 4096); above it is a 422.
        micro_batching: coalesce concurrent requests into one retriever batch (default on).
        max_batch_size: most queries in one coalesced batch (default 256). A larger request is
            answered in slices of this size, with other requests' queries interleaved (see
            `server.batcher`); with micro-batching off it runs whole, alone.
        max_wait_ms: how long, in milliseconds, the batch worker waits for more requests after the
            first one arrives (default 2 ms); requests that arrive while a batch runs are picked up
            by the next batch without waiting.
        burst_gap_ms, max_burst_wait_ms: under heavy load (the last batch was at least half of
            `max_batch_size`, from more than one request), the worker keeps gathering requests for
            the next batch while they arrive at most `burst_gap_ms` apart (default 5 ms), until the
            batch is full or `max_burst_wait_ms` (default 50 ms; 0: off) have passed, so that the
            clients it has just answered are in it (see `server.batcher`).
        cache_mb: bound of the exact-match query cache in MiB (default 0: off); see `server.cache`.
    """

    default_topk: int = Field(default=DEFAULT_TOPK, ge=1, description="passages per query when a request gives no topk")
    max_topk: int = Field(default=100, ge=1, description="largest topk accepted")
    max_queries: int = Field(default=4096, ge=1, description="most queries per request")
    max_query_chars: int = Field(default=4096, ge=1, description="longest query, in characters")
    micro_batching: bool = Field(default=True, description="coalesce concurrent requests into one batch; --no-micro-batching searches each request alone")
    max_batch_size: int = Field(default=256, ge=1, description="most queries per coalesced batch")
    max_wait_ms: float = Field(default=2.0, ge=0.0, description="wait for more requests, in milliseconds")
    burst_gap_ms: float = Field(default=5.0, ge=0.0, description="under heavy load, keep gathering requests while they arrive at most this many milliseconds apart")
    max_burst_wait_ms: float = Field(default=50.0, ge=0.0, description="under heavy load, the longest wait for a full batch, in milliseconds; 0 = off")
    cache_mb: float = Field(default=0.0, ge=0.0, description="query cache bound in MiB (LRU, exact match on normalised query, topk, index); 0 = off")
