"""Shared storage for bundles: where they go under a prefix (layout), copying them there (push, upload), and
reading them and their incident records back (remote). Backends through fsspec, each an optional extra."""
