"""The configuration: the typed settings (settings.py) from file, environment and flags, the
presets merged into them (presets/), and what a configuration will look at (inventory.py)."""
