"""The retrieval HTTP service: `create_app`, its settings and the `/retrieve` wire schemas."""
