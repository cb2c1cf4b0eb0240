"""verl tool side: `SearchTool` (verl `BaseTool`), its retrieval client and observation formatting.

Needs the `[verl]` extra for `search_tool`; `client` and `formatting` need only aiohttp.
"""
