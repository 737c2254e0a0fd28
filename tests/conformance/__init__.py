"""The limen conformance suite: checks any env server against the wire contract (see README.md)."""
