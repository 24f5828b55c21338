"""The configuration: the typed settings (settings.py) from file, environment and flags, the
presets merged into them (presets/), the source kinds registered once (kinds.py), what a
configuration will look at (inventory.py) and the configuration as it will run (effective.py)."""
