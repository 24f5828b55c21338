"""The command line's entry: `python -m exporter` and the queue-exporter script."""

import gc


def main() -> None:
    # The cyclic GC is off while the command line loads: start-up allocates what lives as long
    # as the process (modules, models, the configuration), which collections would walk again
    # and again (~6% of serve's start-up). cli.main turns it back on for every other command;
    # serve does once it listens (App.listen, after gc.freeze()).
    gc.disable()
    from exporter.cli import main as command_line

    command_line()


if __name__ == "__main__":
    main()
