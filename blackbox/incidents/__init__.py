"""The incident index: fingerprints, the SQLite store, and what run, collect and report record in it."""
