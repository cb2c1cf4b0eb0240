"""`python -m verl_search.server --index DIR`: the retrieval service (see `verl_search.server.command`)."""

import sys

from verl_search.server.command import main

if __name__ == "__main__":
    sys.exit(main())
