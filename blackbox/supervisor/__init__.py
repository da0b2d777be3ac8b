"""The supervisor behind `blackbox run`: spawn the launcher, tee its output, watch heartbeats, act on stalls."""
