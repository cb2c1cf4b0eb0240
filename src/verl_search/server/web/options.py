"""Options of the web search backend (`verl-search serve --backend web`), declared once: the CLI flags
are generated from `WebOptions` (`verl_search.runtime.options`). Standard library only.

The API keys are never options (a flag shows in `ps` and shell history): the backend reads them from
the environment variables these options name.
"""

from __future__ import annotations

from dataclasses import dataclass, field

SERPER_URL = "https://google.serper.dev/search"
JINA_READER_URL = "https://r.jina.ai/"


@dataclass
class WebOptions:
    """Where the web backend searches and reads pages, its cache and its limits.

    Attributes:
        search_url: the Serper-compatible search endpoint (`POST {"q", "num"}`, header `X-API-KEY`).
        reader_url: the Jina-compatible reader (`GET <reader_url><page URL>`, `Authorization: Bearer`).
        search_key_env: the environment variable holding the search API key (required: a missing or
            empty one stops `serve` before the port is bound).
        reader_key_env: the environment variable holding the reader's key (optional: Jina's reader
            answers without a key, at a lower rate).
        web_cache_dir: the on-disk cache folder (default `$VERL_SEARCH_CACHE/web`).
        web_cache_mb: the cache's size bound in MiB (least recently stored out first).
        web_cache_days: how long a cached answer is served, in days (0: forever).
        upstream_concurrency: upstream requests in flight at most.
        upstream_rate: upstream requests per second at most, on average (token bucket).
        upstream_burst: the bucket's size: requests that may go at once after a quiet spell.
        upstream_retries: retries of one upstream call after a 429, a 5xx, a timeout or a connection error.
        upstream_backoff: the first backoff in seconds, doubled each retry, full jitter; a
            `Retry-After` header is followed instead when the upstream sends one.
        upstream_timeout: seconds per upstream attempt.
        request_deadline: seconds for a whole `/retrieve` or `/access` request, retries included.
    """

    search_url: str = field(default=SERPER_URL, metadata={"help": "web: Serper-compatible search endpoint"})
    reader_url: str = field(default=JINA_READER_URL, metadata={"help": "web: Jina-compatible page reader (URL prefix)"})
    search_key_env: str = field(default="SERPER_API_KEY", metadata={
        "help": "web: environment variable holding the search API key (required)"})
    reader_key_env: str = field(default="JINA_API_KEY", metadata={
        "help": "web: environment variable holding the reader key (optional)"})
    web_cache_dir: str | None = field(default=None, metadata={
        "help": "web: on-disk cache folder (default: $VERL_SEARCH_CACHE/web)"})
    web_cache_mb: float = field(default=1024.0, metadata={"help": "web: cache size bound in MiB"})
    web_cache_days: float = field(default=30.0, metadata={"help": "web: days a cached answer is served (0: forever)"})
    upstream_concurrency: int = field(default=8, metadata={"help": "web: upstream requests in flight at most"})
    upstream_rate: float = field(default=5.0, metadata={"help": "web: upstream requests per second at most (token bucket)"})
    upstream_burst: int = field(default=10, metadata={"help": "web: token-bucket size (requests at once after a pause)"})
    upstream_retries: int = field(default=3, metadata={"help": "web: retries after a 429, 5xx, timeout or connection error"})
    upstream_backoff: float = field(default=0.5, metadata={"help": "web: first retry backoff in seconds (doubled each retry)"})
    upstream_timeout: float = field(default=10.0, metadata={"help": "web: seconds per upstream attempt"})
    request_deadline: float = field(default=30.0, metadata={
        "help": "web: seconds for a whole /retrieve or /access request, retries included"})

    def __post_init__(self):
        checks = {"upstream_concurrency": self.upstream_concurrency >= 1, "upstream_rate": self.upstream_rate > 0,
                  "upstream_burst": self.upstream_burst >= 1, "upstream_retries": self.upstream_retries >= 0,
                  "upstream_backoff": self.upstream_backoff >= 0, "upstream_timeout": self.upstream_timeout > 0,
                  "request_deadline": self.request_deadline > 0, "web_cache_mb": self.web_cache_mb > 0,
                  "web_cache_days": self.web_cache_days >= 0}
        for name, ok in checks.items():
            if not ok:
                raise ValueError(f"--{name.replace('_', '-')} {getattr(self, name)!r} is out of range")
        for name in ("search_url", "reader_url"):
            if not getattr(self, name).startswith(("http://", "https://")):
                raise ValueError(f"--{name.replace('_', '-')} {getattr(self, name)!r} must be an http(s) URL")
