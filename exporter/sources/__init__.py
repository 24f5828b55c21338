"""Sources: each samples one kind of backend on its own interval and publishes a snapshot."""
