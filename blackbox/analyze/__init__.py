"""Analysis: a pure function from bundle to the report model. Never prints, never imports the collector."""
