"""The image's bytecode: the CPU of importing what `serve` loads, in containers of the built
image, with the bytecode the Dockerfile writes, without the standard library's, without any.

    .venv/bin/python bench/image_bytecode.py [--runs 7] [--image localhost/queue-exporter:0.1.0]

Three containers of the image (root, so the bytecode can be deleted from two of them): as
built; with the standard library's bytecode deleted (the official base ships none); with every
.pyc deleted. In each round every container runs the same import once, in turn, and the floor,
`python -c pass` (the interpreter's own start-up), in the first; so a busy host slows all
alike. Prints the medians of the process's CPU time (user and system) and their ratios to the
image as built. The image is scripts/build-image.sh's.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import uuid

from exporter import __version__

IMPORT = (
    "import resource, exporter.commands.cli, exporter.runtime.app, exporter.runtime.build, exporter.sources.postgres.source; "
    "usage = resource.getrusage(resource.RUSAGE_SELF); print(usage.ru_utime + usage.ru_stime)"
)
FLOOR = (
    "import resource; usage = resource.getrusage(resource.RUSAGE_SELF); "
    "print(usage.ru_utime + usage.ru_stime)"
)
PODMAN = ["podman", "--storage-driver", "vfs"]
VARIANTS = {
    "as built": "true",
    "no stdlib bytecode": "find /usr/lib/python3* /usr/local/lib/python3* -name '*.pyc' -delete",
    "no bytecode": "find / -xdev -name '*.pyc' -delete",
}


def start(image: str, prepare: str) -> str:
    name = f"qe-bench-{uuid.uuid4().hex[:12]}"
    subprocess.run(
        [*PODMAN, "--runtime", "runc", "run", "--detach", "--name", name, "--user", "0",
         "--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1000:1000", "--network", "none",
         "--entrypoint", "sh", image, "-c", f"{prepare} 2>/dev/null; exec sleep infinity"],
        check=True, capture_output=True,
    )  # fmt: skip
    return name


def cpu(container: str, code: str) -> float:
    done = subprocess.run(
        [*PODMAN, "exec", container, "python", "-c", code],
        check=True, capture_output=True, text=True,
    )  # fmt: skip
    return float(done.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--image", default=f"localhost/queue-exporter:{__version__}")
    args = parser.parse_args()
    containers = {label: start(args.image, prepare) for label, prepare in VARIANTS.items()}
    try:
        first = containers["as built"]
        for container in containers.values():
            cpu(container, IMPORT)  # warm-up: the page cache
        times: dict[str, list[float]] = {label: [] for label in [*VARIANTS, "floor"]}
        for _ in range(args.runs):
            for label, container in containers.items():
                times[label].append(cpu(container, IMPORT))
            times["floor"].append(cpu(first, FLOOR))
    finally:
        for container in containers.values():
            subprocess.run([*PODMAN, "rm", "--force", "--time", "0", container], check=False,
                           capture_output=True)  # fmt: skip
    built = statistics.median(times["as built"])
    print(f"image {args.image}, {args.runs} runs, CPU of the import (median):")
    for label, values in times.items():
        median = statistics.median(values)
        print(f"  {label:20} {median:.3f} s  {median / built:.2f}x the image as built")


if __name__ == "__main__":
    main()
