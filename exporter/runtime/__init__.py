"""The running process: the wiring of sources, store and HTTP (app.py), what a configuration
builds (build.py), and the signals the main thread acts on."""
