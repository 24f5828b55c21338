"""Ready hooks: lifecycle events from a queue library with one line in the app."""
