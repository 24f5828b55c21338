"""What a configuration will look at: sources and their targets, presets, key groups, streams.

`serve` logs it at start, `check-config` prints it first and ends with its one-line verdict, and a
configuration with nothing in it is refused before anything starts: an exporter sampling
nothing looks healthy while it reports nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

from exporter.config.kinds import KINDS, SourceTarget, counted
from exporter.config.settings import Config

NOTHING_TO_DO = (
    "nothing to sample or consume: name a preset (--preset NAME or QUEUE_EXPORTER_PRESET; "
    "`queue-exporter presets` lists them) with its backend (--redis-url URL or "
    "QUEUE_EXPORTER_REDIS_URL, --postgres-dsn DSN for attune), event streams "
    "(--events-stream KEY), or a configuration file with key groups, SQL collectors or "
    "streams (--config FILE or QUEUE_EXPORTER_CONFIG; docs/configuration.md)"
)


@dataclass(frozen=True)
class Inventory:
    presets: tuple[str, ...]
    sources: tuple[SourceTarget, ...]
    key_groups: tuple[str, ...]  # "system pattern (type, state)"
    streams: tuple[str, ...]  # "key (format, group)"
    sql_collectors: tuple[str, ...]
    native_readers: tuple[str, ...]  # the systems whose own records are read
    # "system signal: why": what a system does not record, so nothing serves it
    not_recorded: tuple[str, ...] = ()

    @property
    def empty(self) -> bool:
        return not self.sources

    def verdict(self, warnings: int = 0) -> str:
        """One line: "OK: 2 sources, 7 key groups, 1 stream, 3 SQL collectors" (and the native
        readers, when there are any); "OK with 2 warnings: ..." when something answered but
        not as the configuration means (the warnings are named on lines of their own)."""
        counts = [
            counted(len(self.sources), "source"),
            counted(len(self.key_groups), "key group"),
            counted(len(self.streams), "stream"),
            counted(len(self.sql_collectors), "SQL collector"),
        ]
        if self.native_readers:
            counts.append(counted(len(self.native_readers), "native reader"))
        verdict = "OK" if not warnings else f"OK with {counted(warnings, 'warning')}"
        return f"{verdict}: {', '.join(counts)}"

    def lines(self) -> list[str]:
        """The report, one fact a line, for the log and check-config."""
        lines = [f"presets: {', '.join(self.presets) or 'none'}"]
        lines += [f"source {s.kind}: {s.target} ({s.what})" for s in self.sources]
        lines += [f"key group {group}" for group in self.key_groups]
        lines += [f"events stream {stream}" for stream in self.streams]
        lines += [f"SQL collector {collector}" for collector in self.sql_collectors]
        lines += [f"native reader {system}" for system in self.native_readers]
        lines += [f"not recorded by {entry}" for entry in self.not_recorded]
        return lines


def take(config: Config) -> Inventory:
    """What each source kind of the configuration will look at (config/kinds.py)."""
    parts = [kind.inventory(config) for kind in KINDS]
    return Inventory(
        presets=tuple(ref if isinstance(ref, str) else ref.name for ref in config.presets),
        sources=tuple(source for part in parts for source in part.sources),
        key_groups=tuple(group for part in parts for group in part.key_groups),
        streams=tuple(stream for part in parts for stream in part.streams),
        sql_collectors=tuple(collector for part in parts for collector in part.sql_collectors),
        native_readers=tuple(reader for part in parts for reader in part.native_readers),
        not_recorded=tuple(
            f"{system} {signal}: {why}"
            for system, signals in sorted(config.not_recorded.items())
            for signal, why in signals.items()
        ),
    )
