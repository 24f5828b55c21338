"""The bottom floor: logging, strict models, nesting bounds, the number and time checks, escaping.

Imports nothing else of the exporter; every other package may import it."""
