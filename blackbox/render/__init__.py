"""Renderers: each takes the report model and a sink. No analysis here."""
