"""Adapters: one module per foreign format or tool (/proc, host facts, GPUs). Nothing else parses them."""
