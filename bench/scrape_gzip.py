"""What gzip costs a scrape, against the render it compresses, measured in the same run.

    .venv/bin/python bench/scrape_gzip.py [--series 75000] [--rounds 7]

The exporter in its default configuration holds `--series` sampled series (bench/exposition.py's
shape). Timed in interleaved rounds after a warm-up round, medians shown: the render
(`Telemetry.render(False)`), and gzip of its body at the level /metrics uses
(`exporter.http.server.GZIP_LEVEL`) and at zlib's default (6), with the sizes; each compressed
body must decompress to the render's.
"""

from __future__ import annotations

import argparse
import gzip
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.exposition import exporter_telemetry, interleaved, sampled_data
from exporter.http.server import GZIP_LEVEL


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--series", type=int, default=75_000)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    telemetry = exporter_telemetry(sampled_data(args.series))
    body = telemetry.render(False)
    for level in (GZIP_LEVEL, 6):
        assert gzip.decompress(gzip.compress(body, level)) == body
    medians = interleaved(
        {
            "render": lambda: telemetry.render(False),
            f"gzip level {GZIP_LEVEL}": lambda: gzip.compress(body, GZIP_LEVEL),
            "gzip level 6": lambda: gzip.compress(body, 6),
        },
        args.rounds,
    )
    render = medians["render"]
    print(f"{args.series} series, body {len(body) / 2**20:.1f} MiB")
    print("| step | median | vs the render | body |")
    print("|---|---|---|---|")
    print(f"| render | {render * 1000:.0f} ms | 1.00x | {len(body) / 2**20:.1f} MiB |")
    for level in (GZIP_LEVEL, 6):
        seconds = medians[f"gzip level {level}"]
        size = len(gzip.compress(body, level))
        print(
            f"| gzip level {level} | {seconds * 1000:.0f} ms | {seconds / render:.2f}x | "
            f"{size / 2**20:.2f} MiB ({len(body) / size:.0f}x smaller) |"
        )
    telemetry.shutdown()


if __name__ == "__main__":
    main()
