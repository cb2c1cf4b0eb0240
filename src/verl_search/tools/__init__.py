"""verl tool side: `SearchTool` and `AccessTool` (verl `BaseTool`s), their retrieval client and observation
formatting.

Needs the `[verl]` extra for `search_tool` and `access_tool`; `client` and `formatting` need only aiohttp.
"""
