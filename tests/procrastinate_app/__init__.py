"""A Procrastinate app for tests/test_preset_procrastinate.py: its tasks run in a real worker."""
