"""The web search backend of the retrieval service (`verl-search serve --backend web`): the same
`/retrieve` and `/access` wire format over a Serper-compatible search API and a Jina-compatible page
reader, with a persistent cache, rate limits and retries. Needs the `[web]` extra (diskcache, aiolimiter)."""
