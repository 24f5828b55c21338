"""The command line's entry: `python -m exporter` and the queue-exporter script."""

import gc
import signal


def main() -> None:
    # SIGHUP's default action ends the process: ignored from the first line on, until serve
    # installs its handler that says so in the log (App.run_until_signalled); cli.main gives
    # every other command its default back.
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    # The cyclic GC is off while the command line loads: start-up allocates what lives as long
    # as the process (modules, models, the configuration), which collections would walk again
    # and again (~6% of serve's start-up). cli.main turns it back on for every other command;
    # serve does once it listens (App.listen, after gc.freeze()).
    gc.disable()
    from exporter.commands.cli import main as command_line

    command_line()


if __name__ == "__main__":
    main()
