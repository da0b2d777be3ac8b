"""Thin click commands: parse, call one function of the core, render. Nothing imports this package."""
