"""A Procrastinate app for tests/config/test_preset_procrastinate.py: its tasks run in a real worker."""
